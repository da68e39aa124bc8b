"""Issue 21: no manifest records the md5 of an HDF5 file HDF5 has not finished writing.

With h5py's default (weak) file-close degree, closing a file is postponed while any id of it is still referenced,
and anything that holds a Python frame (a sampling profiler, a debugger, Dask's call-stack view) keeps the locals
of the writer's functions alive after they return. Each writer here runs while a thread samples every thread's
frames (``sys._current_frames()``) and holds each sample 0.2 s, as in the issue; afterwards, with every frame let
go, each file the manifest lists must have the size and md5 recorded, and read back complete. Before the fix,
split-4bins recorded a wrong md5 for about a third of its shards this way (its close left dataset ids held).
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from core.errors import BertpipeError
from core.manifest import Manifest, md5_file
from preprocessing import hdf5_io as hio
from preprocessing.hdf5_io import h5_close_for_good, h5_create, h5_open_new
from preprocessing.mlperf import cpd_fast
from preprocessing.mlperf import split_4bins as s4


class FrameHolder(threading.Thread):
    """Samples every thread's frames every ``every`` s and keeps each sample ``hold`` s (a sampling profiler)."""

    def __init__(self, every: float = 0.003, hold: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.every, self.hold = every, hold
        self.stop = threading.Event()
        self.samples = 0

    def run(self) -> None:
        held: collections.deque = collections.deque()
        while not self.stop.is_set():
            now = time.monotonic()
            held.append((now, sys._current_frames()))
            self.samples += 1
            while now - held[0][0] > self.hold:
                held.popleft()
            time.sleep(self.every)
        held.clear()


@pytest.fixture
def frames_held() -> Iterator[FrameHolder]:
    t = FrameHolder()
    t.start()
    yield t
    t.stop.set()
    t.join()


def _released(t: FrameHolder) -> None:
    """Every sample let go (and with it every id it kept alive), so the files are what HDF5 finally left."""
    assert t.samples > 0
    t.stop.set()
    t.join()
    gc.collect()


def _every_file_as_recorded(m: Manifest, d: Path) -> list[Path]:
    assert m.files
    paths = [d / e.name for e in m.files]
    wrong = [e.name for e, p in zip(m.files, paths, strict=True) if (p.stat().st_size, md5_file(p)) != (e.bytes, e.md5)]
    assert not wrong, f"{len(wrong)} of {len(paths)} files are not what the manifest says, e.g. {wrong[:3]}"
    for p in paths:
        with h5py.File(p, "r") as f:  # complete: every dataset reads back
            for name in f:
                f[name][()]
    return paths


def _rows(p: Path) -> int:
    with h5py.File(p, "r") as f:
        return len(f["next_sentence_labels"])


# -- each writer, with the frames held --------------------------------------------------------------------
def _split(golden: Path, shared_data: Path, out: Path) -> tuple[Manifest, Path]:
    """16 shards of sample.hdf5: shards of bins 128-384 are built in memory (HDF5's core driver), bin 512's on
    disk, so both of split-4bins' writers run."""
    m = s4.run_split_4bins([golden / "sample.hdf5"], out, s4.Split4BinsConfig(n_output_shards=16), workers=1)
    sizes = [e.bytes for e in m.files]
    assert min(sizes) <= s4.IN_MEMORY_BYTES < max(sizes)
    return m, out


def _tfrecord_to_hdf5(golden: Path, shared_data: Path, out: Path) -> tuple[Manifest, Path]:
    from preprocessing.mlperf.tfrecord_to_hdf5 import HDF5Config, run_tfrecord_to_hdf5

    return run_tfrecord_to_hdf5(golden / "eval_100.tfrecord", out, HDF5Config(batch_size=8),
                                output_name="eval_100.hdf5"), out


def _tfrecord_to_hdf5_many(golden: Path, shared_data: Path, out: Path) -> tuple[Manifest, Path]:
    from preprocessing.mlperf.tfrecord_to_hdf5 import HDF5Config, run_tfrecord_to_hdf5_many

    return run_tfrecord_to_hdf5_many([golden / "eval_100.tfrecord", golden / "edge.tfrecord"], out,
                                     HDF5Config(batch_size=32)), out


def _pack_varlength(golden: Path, shared_data: Path, out: Path) -> tuple[Manifest, Path]:
    from preprocessing.nvidia.varlength import PackConfig, run_pack_varlength

    return run_pack_varlength([golden / "eval_100.hdf5"], out, PackConfig(chunk_rows=8)), out


def _fused(golden: Path, shared_data: Path, out: Path) -> tuple[Manifest, Path]:
    """The DAG's fused tfrecord+hdf5 call (the HDF5 filled from the C engine, md5s taken side by side)."""
    from core.stage import Unit
    from preprocessing.mlperf.create_pretraining_data import (
        CreatePretrainingDataConfig,
        run_create_pretraining_data,
    )
    from preprocessing.mlperf.tfrecord_to_hdf5 import HDF5Config, run_fused, run_tfrecord_to_hdf5

    text = golden / "edge_input.txt"
    name = text.name
    cfg = CreatePretrainingDataConfig(vocab_file=str(shared_data / "vocab.txt"), do_lower_case=True,
                                      max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
    tf_dir = out / "tfrecord"
    tf = Unit(stage="tfrecord", key="k", shard=name, out_dir=str(tf_dir), run=run_create_pretraining_data,
              args=([str(text)],), kwargs={"cfg": cfg, "output_name": name})
    h5 = Unit(stage="hdf5", key="k", shard=name, out_dir=str(out / "hdf5"), run=run_tfrecord_to_hdf5,
              args=(str(tf_dir / name),), upstream_dirs=(str(tf_dir),),
              kwargs={"cfg": HDF5Config(max_seq_length=128, max_predictions_per_seq=20, batch_size=16),
                      "output_name": name + ".hdf5"})
    tf_m, h5_m = run_fused(tf, h5)
    assert tf_m.file(name).md5 == md5_file(tf_dir / name)  # the TFRecord hashed beside it: closed, too
    return h5_m, out / "hdf5"


WRITERS: dict[str, Callable[[Path, Path, Path], tuple[Manifest, Path]]] = {
    "split_4bins": _split, "tfrecord_to_hdf5": _tfrecord_to_hdf5, "tfrecord_to_hdf5_many": _tfrecord_to_hdf5_many,
    "pack_varlength": _pack_varlength, "fused_tfrecord_hdf5": _fused,
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_manifest_is_the_closed_file_while_frames_are_held(writer: str, golden: Path, shared_data: Path,
                                                           tmp_path: Path, frames_held: FrameHolder) -> None:
    if writer == "fused_tfrecord_hdf5" and not cpd_fast.available():
        pytest.skip("the C extension cannot be built here: no fused call")
    m, d = WRITERS[writer](golden, shared_data, tmp_path / "out")
    _released(frames_held)
    paths = _every_file_as_recorded(m, d)
    if writer == "split_4bins":
        assert sum(_rows(p) for p in paths) == m.counters["rows"] == _rows(golden / "sample.hdf5")


def test_split_shards_are_fsynced_before_the_manifest(golden: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard's writeback starts as it closes; the sub-group's md5s are taken while the disk writes them, then
    their fsyncs wait (side by side), all before the manifest."""
    import core.manifest.writes as writes

    synced: list[Path] = []
    started: list[str] = []
    real = writes.fsync_paths

    def fsync_paths(paths):
        paths = [Path(p) for p in paths]
        assert not (tmp_path / "_manifest.json").exists(), "fsynced before the manifest is written"
        synced.extend(paths)
        real(paths)

    monkeypatch.setattr(writes, "fsync_paths", fsync_paths)
    monkeypatch.setattr(writes, "start_writeback", lambda fd: started.append(os.readlink(f"/proc/self/fd/{fd}")))
    m = s4.run_split_4bins([golden / "eval_100.hdf5"], tmp_path, s4.Split4BinsConfig(n_output_shards=2), workers=1)
    assert sorted(synced) == sorted(tmp_path / e.name for e in m.files)
    # started under the temporary names, as each closed (before its rename)
    assert sorted(Path(p).name[1:].split(".tmp-")[0] for p in started) == sorted(Path(e.name).name for e in m.files)


# -- the helper itself -----------------------------------------------------------------------------------
def _fill(f: h5py.File) -> list:
    a = f.create_dataset("a", (300, 512), dtype="i4")
    a[:] = np.arange(300 * 512, dtype="i4").reshape(300, 512)
    v = f.create_dataset("v", (3,), dtype=h5py.vlen_dtype(np.dtype("i2")))
    v[0], v[2] = np.arange(5, dtype="i2"), np.arange(2, dtype="i2")
    f.attrs["x"] = 1
    return [a, v, a.id, f["a"], h5py.File(f.id)]  # what a frame could hold: datasets, their ids, the file again


@pytest.mark.parametrize("kw", [{}, {"in_memory": True}, {"libver": "latest", "track_order": True}])
def test_h5_create_writes_the_bytes_h5py_file_writes(tmp_path: Path, kw: dict) -> None:
    plain = {("driver" if k == "in_memory" else k): ("core" if k == "in_memory" else v) for k, v in kw.items()}
    with h5py.File(tmp_path / "a.h5", "w", **plain) as f:
        _fill(f)
    with h5_create(tmp_path / "b.h5", **kw) as f:
        assert f.id.get_access_plist().get_fclose_degree() == h5py.h5f.CLOSE_STRONG
        _fill(f)
    assert (tmp_path / "a.h5").read_bytes() == (tmp_path / "b.h5").read_bytes()


def test_a_weak_close_with_ids_held_leaves_an_unfinished_file(tmp_path: Path) -> None:
    """The failure the tests above look for (split-4bins' old close): size and md5 change once the ids go."""
    p = tmp_path / "weak.h5"
    f = h5py.File(p, "w", driver="core", backing_store=True)
    held = _fill(f)[:3]
    f.id.close()
    early = (p.stat().st_size, md5_file(p))
    del held
    gc.collect()
    assert (p.stat().st_size, md5_file(p)) != early


@pytest.mark.parametrize("in_memory", [False, True])
def test_h5_create_closes_for_good_with_ids_held(tmp_path: Path, in_memory: bool) -> None:
    p = tmp_path / "x.h5"
    before = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_ALL)
    with h5_create(p, in_memory=in_memory) as f:
        held = _fill(f)
    at_close = (p.stat().st_size, md5_file(p))
    assert not any(h.id.valid for h in held[:2]) and not held[2].valid and not held[4].id.valid
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_ALL) == before  # nothing of it left open
    del held
    gc.collect()  # the stale ids go quietly
    assert (p.stat().st_size, md5_file(p)) == at_close
    with h5py.File(p, "r") as f:
        assert f["a"][299, 511] == 300 * 512 - 1 and list(f["v"][0]) == [0, 1, 2, 3, 4]


def test_h5_create_on_an_error_closes_and_raises(tmp_path: Path) -> None:
    before = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_ALL)
    with pytest.raises(KeyError), h5_create(tmp_path / "x.h5") as f:
        _fill(f)
        raise KeyError("stop")
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_ALL) == before


def test_a_file_open_twice_is_not_taken_as_closed(tmp_path: Path) -> None:
    p = tmp_path / "x.h5"
    f = h5_open_new(p)
    f.create_dataset("z", (3,))
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_fclose_degree(h5py.h5f.CLOSE_STRONG)  # the only degree HDF5 lets a second open use
    other = h5py.File(h5py.h5f.open(bytes(p), h5py.h5f.ACC_RDONLY, fapl=fapl))
    try:
        with pytest.raises(BertpipeError, match=f"{p}: the HDF5 file cannot be closed for good"):
            h5_close_for_good(f)
    finally:
        other.close()
    with pytest.raises(BertpipeError, match="closed already"):
        h5_close_for_good(f)


def test_h5_create_fsyncs_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    monkeypatch.setattr(hio, "fsync_file", lambda p: synced.append(str(p)))
    with h5_create(tmp_path / "x.h5") as f:
        f.create_dataset("z", data=[1, 2])
    with h5_create(tmp_path / "y.h5", fsync=False) as f:
        f.create_dataset("z", data=[1, 2])
    assert synced == [str(tmp_path / "x.h5")]
