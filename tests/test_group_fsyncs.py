"""The target stages that write many files in one call (chop, shuffle, pack-nvidia, pack-habana) start each file's
writeback as it closes and wait for the disk once, at the call's end (core.manifest.late_fsyncs): no file's fsync
waits between two files' writes, every file is fsynced before the call returns (before any manifest lists it), and
the bytes are those of files fsynced one by one."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import core.manifest.writes as writes
from core.manifest import late_fsyncs, md5_then_fsync, sync_fd

sys.path.insert(0, str(Path(__file__).resolve().parent / "preprocessing"))  # the shared helpers
import nvidia_reference as ref  # noqa: E402


def _spy(monkeypatch) -> list[tuple[str, str]]:
    """(event, file) of every fsync, writeback start and manifest write, in order (fsyncs run in threads too)."""
    events: list[tuple[str, str]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(writes.os, "fsync", fsync)
    monkeypatch.setattr(writes, "start_writeback", lambda fd: events.append(
        ("writeback", os.readlink(f"/proc/self/fd/{fd}"))))
    import core.manifest.output as output
    real_atomic = output.atomic_write_text

    def atomic(path, text, **kw):
        events.append(("manifest", str(path)))
        real_atomic(path, text, **kw)

    monkeypatch.setattr(output, "atomic_write_text", atomic)
    return events


def _base(p: str) -> str:
    """A file's final name from its path or its temporary name (``.NAME.tmp-PID``)."""
    name = Path(p).name
    return name[1:].split(".tmp-")[0] if ".tmp-" in name else name


def test_late_fsyncs_start_writeback_and_md5_then_fsync_waits_once(tmp_path: Path, monkeypatch) -> None:
    events = _spy(monkeypatch)
    files = [tmp_path / f"f{i}.bin" for i in range(5)]
    with late_fsyncs():
        for i, p in enumerate(files):
            with open(p, "wb") as f:
                f.write(bytes([i]) * (100_000 + i))
                f.flush()
                sync_fd(f.fileno())
    assert [k for k, _ in events] == ["writeback"] * 5, "inside the block nothing waits for the disk"
    md5s = md5_then_fsync(files)
    assert md5s == [hashlib.md5(p.read_bytes()).hexdigest() for p in files]
    assert sorted(_base(p) for k, p in events if k == "fsync") == sorted(p.name for p in files)
    events.clear()
    with open(tmp_path / "after.bin", "wb") as f:  # after the block: fsynced when closed, as always
        sync_fd(f.fileno())
    assert [k for k, _ in events] == ["fsync"]


def test_md5_then_fsync_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="gone.bin"):
        md5_then_fsync([tmp_path / "gone.bin"])


def _parts(d: Path, width: int, preds: int) -> list[Path]:
    rng = np.random.default_rng(5)
    return [ref.write_padded(d / f"part-{i:05d}-of-00500.hdf5",
                             ref.padded_rows(rng.integers(20, width + 1, 300).tolist(), i, width, preds))
            for i in range(2)]


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> list[Path]:
    return _parts(tmp_path_factory.mktemp("parts"), 512, 76)


@pytest.fixture(scope="module")
def parts_128(tmp_path_factory) -> list[Path]:
    """At 128 tokens the packers' recipe takes a second (at 512, a minute)."""
    return _parts(tmp_path_factory.mktemp("parts128"), 128, 20)


def _check(events: list[tuple[str, str]], data_names: set[str], groups: int = 1) -> None:
    """Every HDF5 file's writeback started as it closed and every data file (the index lists too) fsynced before
    the manifest; the disk waited for once per group of files: the events run writebacks, then fsyncs, at most
    ``groups`` times (one by one, a file's fsync would come between every two files' writes)."""
    assert data_names
    manifest = max(i for i, (k, _) in enumerate(events) if k == "manifest")
    before = [(k, _base(p)) for k, p in events[:manifest] if _base(p) in data_names]
    started = {n for k, n in before if k == "writeback"}
    synced = {n for k, n in before if k == "fsync"}
    hdf5 = {n for n in data_names if not n.endswith(".lst")}  # the index lists are small text files: fsynced only
    assert hdf5 <= started, sorted(hdf5 - started)[:3]
    assert data_names <= synced, sorted(data_names - synced)[:3]
    waits = sum(1 for (k, _), (k2, _) in zip(before, before[1:], strict=False) if k == "fsync" and k2 == "writeback") + 1
    assert waits <= groups, f"the disk waited for {waits} times in {groups} group(s)"


def test_chop_and_shuffle_wait_for_the_disk_once_per_group(parts, tmp_path: Path, monkeypatch) -> None:
    from preprocessing.nvidia.chop import ChopConfig, run_nvidia_chop
    from preprocessing.nvidia.shuffle import ShuffleConfig, input_files, run_nvidia_shuffle

    plain = run_nvidia_chop(parts, tmp_path / "plain", ChopConfig(num_shards=6, varlength=True))
    events = _spy(monkeypatch)
    chop = run_nvidia_chop(parts, tmp_path / "chop", ChopConfig(num_shards=6, varlength=True))
    _check(events, {f.name for f in chop.files})
    assert [f.md5 for f in chop.files] == [f.md5 for f in plain.files]
    for f in chop.files:  # the manifest's md5s are the files'
        assert hashlib.md5((tmp_path / "chop" / f.name).read_bytes()).hexdigest() == f.md5
    events.clear()
    shuf = run_nvidia_shuffle(input_files(tmp_path / "chop"), tmp_path / "shuf", ShuffleConfig(index_lists=True))
    _check(events, {f.name for f in shuf.files})


@pytest.mark.parametrize("stage", ["pack_nvidia", "pack_habana"])
def test_packers_wait_for_the_disk_once_per_group(stage: str, parts_128, tmp_path: Path, monkeypatch) -> None:
    if stage == "pack_nvidia":  # 8 shards in 4 groups (at least 4 a worker)
        from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia

        def run(out: Path):
            return run_pack_nvidia(parts_128, out, PackNvidiaConfig(max_seq_length=128, shards_num=8))
    else:  # one group of files
        from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana

        def run(out: Path):
            return run_pack_habana(parts_128, out, HabanaPackConfig(max_sequence_length=128,
                                                                    max_predictions_per_sequence=20),
                                   manifest_name=f"../{out.name}.manifest.json")
    plain = run(tmp_path / "plain")
    events = _spy(monkeypatch)
    m = run(tmp_path / "out")
    _check(events, {Path(f.name).name for f in m.files if not f.name.endswith(".json")},
           groups=4 if stage == "pack_nvidia" else 1)
    assert [f.md5 for f in m.files] == [f.md5 for f in plain.files]
