"""The cache key is the units' content keys, handed to Prefect only while every manifest on disk verifies;
the executor runs only what is due and says why."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("prefect")

from core.manifest import Manifest, StageOutput  # noqa: E402
from core.stage import Unit  # noqa: E402
from tasks.calls import Batch, Call, check_done, execute, why_not_done  # noqa: E402
from tasks.stages import ManifestCachePolicy, cache_key  # noqa: E402


def never(*args, **kwargs):
    raise AssertionError("the stage function ran although its output was done")


def write_stage(out_dir: Path, text: str = "hello\n", stage: str = "demo", upstream=()) -> Manifest:
    with StageOutput(out_dir, stage, params={"x": 1}, upstream=upstream) as out:
        with out.open_text("a.txt") as f:
            f.write(text)
    return out.manifest


def rewrite(out_dir: Path, *args, upstream=(), **kwargs) -> Manifest:
    return write_stage(out_dir, "rewritten\n", upstream=upstream)


class Store:
    def __init__(self, keys: set[str]) -> None:
        self.keys = keys

    def exists(self, key: str) -> bool:
        return key in self.keys


def _key(batch: Batch, known: set[str] = frozenset()) -> str | None:
    ctx = SimpleNamespace(result_store=Store(set(known)))
    return ManifestCachePolicy().compute_key(ctx, {"batch": batch, "workers": 1}, {})


def _unit(out_dir: Path, **kw) -> Unit:
    base = {"stage": "demo", "key": "k1", "shard": "", "out_dir": str(out_dir), "run": never, "pass_upstream": False}
    return Unit(**{**base, **kw})


def test_key_follows_the_manifest_on_disk(tmp_path: Path) -> None:
    unit = _unit(tmp_path / "demo" / "k1")
    batch = Batch(calls=(Call(units=(unit,)),))
    assert _key(batch) == cache_key(batch)  # not done, no record: a normal miss
    write_stage(Path(unit.out_dir))
    assert check_done(unit) is not None
    assert _key(batch, {cache_key(batch)}) == cache_key(batch)  # done: Prefect may use its record
    (Path(unit.out_dir) / "a.txt").write_text("HELLO\n")  # same size, other md5
    assert check_done(unit) is None
    redo = _key(batch, {cache_key(batch)})
    assert redo.startswith(cache_key(batch) + "-redo-")  # a record exists but the files changed: not trusted
    assert _key(Batch(calls=(Call(units=(unit,), force=frozenset({"demo"})),))) is None
    other = Batch(calls=(Call(units=(_unit(tmp_path / "x", shard="part-00001-of-00500"),)),))
    assert cache_key(other) != cache_key(batch)


def test_execute_skips_done_work_and_checks_upstream(tmp_path: Path) -> None:
    up = write_stage(tmp_path / "up", stage="up")
    unit = _unit(tmp_path / "down", upstream_dirs=(str(tmp_path / "up"),), pass_upstream=True)
    write_stage(tmp_path / "down", "x", upstream=[up])
    [row] = execute(Call(units=(unit,)))
    assert row["cached"]  # `never` would have raised: nothing ran
    write_stage(tmp_path / "up", text="changed\n", stage="up")  # upstream redone with other bytes
    assert why_not_done(unit) == (None, "built from other upstream outputs")


def test_a_redo_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The log names the file: an md5 mismatch in it, or its absence; a first run is not news."""
    unit = _unit(tmp_path / "d", run=rewrite)
    write_stage(tmp_path / "d")
    (tmp_path / "d" / "a.txt").write_text("HELLO\n")  # same size: only the md5 tells
    with caplog.at_level(logging.INFO, logger="tasks.calls"):
        [row] = execute(Call(units=(unit,)))
    assert not row["cached"] and row["why"].startswith("md5 mismatch for " + str(tmp_path / "d" / "a.txt"))
    assert f"demo: running (md5 mismatch for {tmp_path / 'd' / 'a.txt'}" in caplog.text
    (tmp_path / "d" / "a.txt").unlink()
    [row] = execute(Call(units=(unit,)))
    assert row["why"] == f"{tmp_path / 'd' / 'a.txt'} is missing (listed in {tmp_path / 'd' / '_manifest.json'})"


def test_a_same_size_edit_is_found_without_rehashing_everything(tmp_path: Path) -> None:
    """Stat records: an untouched file is not re-hashed, an edited one (mtime/ctime changed) is."""
    import os

    unit = _unit(tmp_path / "d")
    write_stage(tmp_path / "d")
    assert check_done(unit) is not None
    f = tmp_path / "d" / "a.txt"
    st = f.stat()
    f.write_text("HELLO\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime back, ctime moved
    assert why_not_done(unit)[1].startswith("md5 mismatch")


def test_a_stage_dir_symlinked_out_of_the_work_dir_is_refused(tmp_path: Path) -> None:
    from core.errors import InputError

    work, outside = tmp_path / "work", tmp_path / "elsewhere"
    (work / "demo").mkdir(parents=True)
    outside.mkdir()
    (work / "demo" / "k").symlink_to(outside)
    unit = _unit(work / "demo" / "k")
    with pytest.raises(InputError, match="outside the work dir"):
        execute(Call(units=(unit,), root=str(work)))
