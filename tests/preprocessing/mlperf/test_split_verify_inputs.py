"""verify_inputs (what split-4bins, tfrecord-to-hdf5 and pick-eval-samples check their inputs with): a file the DAG
recorded as hashed (.verified.json, same stat) is not read again; a file changed since is, and is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import core.manifest.format as manifest  # the room whose verify reads files
from core.errors import ChecksumError, ManifestError
from core.manifest import StageOutput, recording_stats
from preprocessing.hdf5_io import verify_inputs


def _upstream(d: Path, stats: bool) -> manifest.Manifest:
    def write() -> manifest.Manifest:
        with StageOutput(d, "tfrecord") as out, out.open("part-00000") as f:
            f.write(b"x" * 1000)
        return out.manifest

    if stats:
        with recording_stats():
            return write()
    return write()


def test_recorded_inputs_are_not_rehashed_and_changed_ones_are_caught(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    m = _upstream(tmp_path / "tf", stats=True)
    calls = []
    real = manifest.md5_file
    monkeypatch.setattr(manifest, "md5_file", lambda p, *a: calls.append(p) or real(p, *a))
    verify_inputs([tmp_path / "tf" / "part-00000"], [m])
    assert calls == []  # stat unchanged since its md5 was recorded: not read
    p = tmp_path / "tf" / "part-00000"
    p.write_bytes(b"y" * 1000)  # same size, other bytes (new mtime/ctime)
    with pytest.raises(ChecksumError):
        verify_inputs([p], [m])
    assert calls == [p]


def test_without_records_every_input_is_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = _upstream(tmp_path / "tf", stats=False)
    p = tmp_path / "tf" / "part-00000"
    st = p.stat()
    p.write_bytes(b"z" * 1000)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only the md5 tells
    with pytest.raises(ChecksumError):
        verify_inputs([p], [m])


@pytest.mark.parametrize("workers", [1, 2])
def test_many_inputs_are_hashed_side_by_side_and_a_changed_one_is_named(tmp_path: Path, workers: int) -> None:
    """Several inputs: their md5s are due together (on ``workers`` processes); the one that changed is named,
    across the pool's pickle, with the recorded and the actual md5."""
    d = tmp_path / "tf"
    with StageOutput(d, "tfrecord") as out:
        for i in range(7):
            with out.open(f"part-{i:05d}") as f:
                f.write(bytes([i]) * (1000 + 4099 * i))
    m = out.manifest
    paths = [d / f"part-{i:05d}" for i in range(7)]
    verify_inputs(paths, [m], workers=workers)  # intact
    victim = paths[5]
    st = victim.stat()
    victim.write_bytes(b"\xff" * st.st_size)
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ChecksumError) as e:
        verify_inputs(paths, [m], workers=workers)
    want = next(f.md5 for f in m.files if f.name == victim.name)
    assert e.value.path == str(victim) and e.value.expected == want and str(victim) in str(e.value)
    paths[2].unlink()
    with pytest.raises(ManifestError, match="part-00002 is missing"):  # presence and size before any md5
        verify_inputs(paths, [m], workers=workers)
