"""Inside core.manifest.deferred_md5, a closed file's writeback is started at once and its fsync waits for the block's
end (core.manifest.writes.sync_fd): every file is still fsynced before any manifest lists it, and outside a block
files are fsynced when closed, as always."""

from __future__ import annotations

import os
from pathlib import Path

import core.manifest.writes as writes
from core.manifest import StageOutput, deferred_md5, load_manifest
from preprocessing.hdf5_io import h5_create, stage_file


def _spy(monkeypatch, events: list[tuple[str, str]]) -> None:
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(writes.os, "fsync", fsync)
    monkeypatch.setattr(writes, "start_writeback", lambda fd: events.append(("writeback", os.readlink(
        f"/proc/self/fd/{fd}"))))
    real_atomic = writes.atomic_write_text

    def atomic(path, text, **kw):
        events.append(("manifest", str(path)))
        real_atomic(path, text, **kw)

    import core.manifest.output as output
    monkeypatch.setattr(output, "atomic_write_text", atomic)


def _write(out: StageOutput) -> None:
    with out.open("a.bin") as f:
        f.write(b"x" * 100_000)
    with stage_file(out, "b.hdf5") as tmp, h5_create(tmp) as h5:
        h5["d"] = list(range(10))


def test_in_a_deferred_block_files_are_fsynced_at_its_end_before_their_manifest(tmp_path: Path, monkeypatch):
    events: list[tuple[str, str]] = []
    _spy(monkeypatch, events)
    with deferred_md5():
        for shard in ("s0", "s1"):
            with StageOutput(tmp_path / shard, "st") as out:
                _write(out)
        inside = list(events)
    assert [e for e in inside if e[0] == "fsync"] == [], "no file is waited for inside the block"
    assert sorted(Path(p).name.split(".tmp")[0].lstrip(".") for k, p in inside if k == "writeback") == \
        ["a.bin", "a.bin", "b.hdf5", "b.hdf5"]
    after = events[len(inside):]
    first_manifest = next(i for i, e in enumerate(after) if e[0] == "manifest")
    synced = {p for k, p in after[:first_manifest] if k == "fsync"}
    assert synced >= {str((tmp_path / s / n).resolve()) for s in ("s0", "s1") for n in ("a.bin", "b.hdf5")}
    assert all(load_manifest(tmp_path / s) is not None for s in ("s0", "s1"))


def test_outside_a_block_a_file_is_fsynced_when_closed(tmp_path: Path, monkeypatch):
    events: list[tuple[str, str]] = []
    _spy(monkeypatch, events)
    with StageOutput(tmp_path / "s", "st") as out:
        _write(out)
    kinds = [k for k, _ in events]
    assert "writeback" not in kinds
    data = [i for i, (k, p) in enumerate(events) if k == "fsync" and ("a.bin" in p or "b.hdf5" in p)]
    assert len(data) == 2, "each file fsynced once, when closed"
    assert max(data) < kinds.index("manifest")


def test_many_files_are_fsynced_side_by_side_and_an_error_names_its_file(tmp_path: Path, monkeypatch):
    import threading

    files = []
    for i in range(40):
        p = tmp_path / f"f{i}"
        p.write_bytes(b"x" * 10)
        files.append(p)
    threads: set[int] = set()
    real = os.fsync

    def fsync(fd: int) -> None:
        threads.add(threading.get_ident())
        if os.readlink(f"/proc/self/fd/{fd}").endswith("f17"):
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(writes.os, "fsync", fsync)
    import pytest

    with pytest.raises(OSError) as err:
        writes.fsync_paths(files)
    assert err.value.errno == 28 and err.value.filename == str(files[17])
    assert len(threads) > 1, "the fsyncs ran side by side"
