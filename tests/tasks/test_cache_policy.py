"""The cache key is the stage content key, handed to Prefect only while the manifest on disk verifies."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("prefect")

from preprocessing.manifest import StageOutput  # noqa: E402
from tasks.calls import StageCall, check_done, execute  # noqa: E402
from tasks.stages import ManifestCachePolicy, cache_key  # noqa: E402


def write_stage(out_dir: Path, text: str = "hello\n", stage: str = "demo"):
    with StageOutput(out_dir, stage, params={"x": 1}) as out:
        with out.open_text("a.txt") as f:
            f.write(text)
    return out.manifest


class Store:
    def __init__(self, keys: set[str]) -> None:
        self.keys = keys

    def exists(self, key: str) -> bool:
        return key in self.keys


def _key(call: StageCall, known: set[str] = frozenset()) -> str | None:
    ctx = SimpleNamespace(result_store=Store(set(known)))
    return ManifestCachePolicy().compute_key(ctx, {"call": call, "workers": 1}, {})


def test_key_follows_the_manifest_on_disk(tmp_path: Path) -> None:
    call = StageCall(stage="demo", key="k1", out_dir=str(tmp_path / "demo" / "k1"),
                     func="tests_tasks_fake:never", pass_upstream=False)
    assert _key(call) == cache_key(call) == "bertpipe-demo-k1-all"  # not done, no record: a normal miss
    write_stage(Path(call.out_dir))
    assert check_done(call) is not None
    assert _key(call, {cache_key(call)}) == cache_key(call)  # done: Prefect may use its record
    (Path(call.out_dir) / "a.txt").write_text("HELLO\n")  # same size, other md5
    assert check_done(call) is None
    redo = _key(call, {cache_key(call)})
    assert redo.startswith(cache_key(call) + "-redo-")  # a record exists but the files changed: not trusted
    assert _key(StageCall(**{**call.__dict__, "force": True})) is None
    assert cache_key(StageCall(**{**call.__dict__, "shard": "part-00001-of-00500"})).endswith("-part-00001-of-00500")


def test_execute_skips_done_work_and_checks_upstream(tmp_path: Path) -> None:
    up = write_stage(tmp_path / "up", stage="up")
    call = StageCall(stage="demo", key="k", out_dir=str(tmp_path / "down"), func="tests_tasks_fake:never",
                     upstream_dirs=(str(tmp_path / "up"),))
    with StageOutput(call.out_dir, "demo", upstream=[up]) as out:
        with out.open_text("b.txt") as f:
            f.write("x")
    result, logs = execute(call)
    assert result["cached"] and logs == []  # the module in func does not even exist: nothing ran
    write_stage(tmp_path / "up", text="changed\n", stage="up")  # upstream redone with other bytes
    assert check_done(call) is None


def test_a_stage_dir_symlinked_out_of_the_work_dir_is_refused(tmp_path: Path) -> None:
    from preprocessing.errors import InputError

    work, outside = tmp_path / "work", tmp_path / "elsewhere"
    (work / "demo").mkdir(parents=True)
    outside.mkdir()
    (work / "demo" / "k").symlink_to(outside)
    call = StageCall(stage="demo", key="k", out_dir=str(work / "demo" / "k"), func="tests_tasks_fake:never",
                     pass_upstream=False, root=str(work))
    with pytest.raises(InputError, match="outside the work dir"):
        execute(call)
