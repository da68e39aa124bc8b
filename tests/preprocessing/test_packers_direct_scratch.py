"""The packers' scratch past the page cache (``preprocessing.packing.save_array(direct=True)`` and
``read_slices``): the arrays round-trip whole and in slices, ``np.load`` still reads them, a file system without
``O_DIRECT`` gets the same bytes through the page cache, and pack-nvidia and pack-habana write the same files
with their scratch saved either way (the gathers read each file as it was saved)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402

from core.errors import BertpipeError  # noqa: E402
from preprocessing import pack_fast, scratch  # noqa: E402
from preprocessing.packing import read_slices, save_array  # noqa: E402

CASES = [(0, np.int16), (1, np.int8), (4095, np.int8), (5000, np.int16), (3_000_001, np.int16), (1_234_567, np.int64)]


def _arrays(tmp_path: Path, direct: bool) -> dict[Path, np.ndarray]:
    rng = np.random.default_rng(1)
    out = {}
    for i, (n, dt) in enumerate(CASES):
        a = rng.integers(-100, 100, n).astype(dt)
        p = tmp_path / f"a{i}_{int(direct)}.npy"
        save_array(p, a, direct=direct)
        out[p] = a
    return out


@pytest.mark.parametrize("mode", ["1", "0"])
def test_an_array_on_a_block_boundary_is_written_from_where_it_is(tmp_path, monkeypatch, mode):
    """A pack_fast.Space buffer starts on a block boundary; save_array(direct=True) writes its whole blocks from
    the array itself (no copy through the bounce buffer), the rest through it: the same file as any other array's,
    np.load and read_slices read it back."""
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", mode)
    space = pack_fast.Space()
    writes = []
    real = scratch.write_all
    monkeypatch.setattr(scratch, "write_all", lambda fd, path, view, d: (
        writes.append((np.frombuffer(view, np.uint8).ctypes.data if len(view) else 0, len(view))),
        real(fd, path, view, d))[1])
    rng = np.random.default_rng(3)
    for i, (n, dt) in enumerate([(10_000, np.int16), (4096, np.int8), (4095, np.int8), (3, np.int64)]):
        a = space.get(f"b{i}", n, dt)
        assert a.ctypes.data % scratch.ALIGN == 0
        a[...] = rng.integers(-100, 100, n)
        writes.clear()
        save_array(tmp_path / f"s{i}.npy", a, direct=True)
        save_array(tmp_path / f"c{i}.npy", a.copy()[:], direct=True)
        assert (tmp_path / f"s{i}.npy").read_bytes() == (tmp_path / f"c{i}.npy").read_bytes()
        assert np.array_equal(np.load(tmp_path / f"s{i}.npy"), a)
        whole = a.nbytes // scratch.ALIGN * scratch.ALIGN
        from_array = [w for w in writes if w[0] == a.ctypes.data]
        assert from_array == ([(a.ctypes.data, whole)] if whole else []), writes
        got = read_slices([(tmp_path / f"s{i}.npy", 1, n)], pack_fast.Space(), "r")
        assert np.array_equal(got[0], a[1:])


@pytest.mark.parametrize("mode", ["1", "0"])
def test_direct_arrays_round_trip_whole_and_in_slices(tmp_path, monkeypatch, mode):
    """``BERTPIPE_DIRECT_IO=0``: no ``O_DIRECT`` anywhere, the same file layout through the page cache."""
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", mode)
    arrays = {**_arrays(tmp_path, True), **_arrays(tmp_path, False)}
    for p, a in arrays.items():
        direct = p.stem.endswith("_1")
        assert np.array_equal(np.load(p), a)  # numpy reads a direct file as any other
        if direct:
            assert os.path.getsize(p) == scratch.ALIGN + a.nbytes
            assert np.load(p, mmap_mode="r").offset == scratch.ALIGN
        assert not list(tmp_path.glob(".*tmp*"))
    rng = np.random.default_rng(2)
    slices = []
    for p, a in arrays.items():
        for _ in range(6):
            x = int(rng.integers(0, len(a) + 1))
            slices.append((p, x, int(rng.integers(x, len(a) + 1))))
        slices.append((p, 0, len(a)))
    reads = []
    real = scratch.read_range
    monkeypatch.setattr(scratch, "read_range", lambda *a, **k: (reads.append(a[0]), real(*a, **k))[1])
    got = read_slices(slices, pack_fast.Space(), "x")
    for (p, x, y), g in zip(slices, got, strict=True):
        assert g.dtype == arrays[p].dtype and np.array_equal(g, arrays[p][x:y]), (p, x, y)
    # only the direct files are read (past the page cache); the others are views of their maps
    assert reads and {Path(r).stem.endswith("_1") for r in reads} == {True}
    with pytest.raises(BertpipeError, match="asked for 3..2"):
        read_slices([(next(iter(arrays)), 3, 2)], pack_fast.Space(), "x")


def test_slices_are_read_several_at_once_and_a_failed_read_is_raised(tmp_path, monkeypatch):
    """read_slices reads the direct files' slices up to READ_THREADS at once (a full-size group: ~1 MB from each
    of 500 parts), each into its own place; one read that fails is raised (after the others end), and with
    READ_THREADS 1 the same values come one read at a time."""
    import threading

    from preprocessing import packing

    arrays = _arrays(tmp_path, True)
    slices = [(p, len(a) // 3, len(a)) for p, a in arrays.items()] * 3
    threads = set()
    real = scratch.read_range

    def spy(*a, **k):
        threads.add(threading.get_ident())
        return real(*a, **k)

    monkeypatch.setattr(scratch, "read_range", spy)
    got = read_slices(slices, pack_fast.Space(), "x")
    assert all(np.array_equal(g, arrays[p][x:y]) for (p, x, y), g in zip(slices, got, strict=True))
    assert len(threads) > 1 and threading.get_ident() not in threads
    monkeypatch.setattr(packing, "READ_THREADS", 1)
    threads.clear()
    again = read_slices(slices, pack_fast.Space(), "x")
    assert all(np.array_equal(a, b) for a, b in zip(got, again, strict=True))
    assert threads == {threading.get_ident()}
    monkeypatch.setattr(packing, "READ_THREADS", 4)
    bad = next(p for p, a in arrays.items() if len(a) > 100)

    def failing(path, *a, **k):
        if Path(path) == bad:
            raise OSError(5, "Input/output error", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(scratch, "read_range", failing)
    with pytest.raises(OSError, match="Input/output error") as e:
        read_slices(slices, pack_fast.Space(), "x")
    assert e.value.filename == str(bad)


def _md5s(folder: Path) -> dict[str, str]:
    """Every output file's md5, and the manifest's entries (its ``seconds`` are the run's own: not compared)."""
    got = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
           if p.is_file() and p.name != "_manifest.json"}
    manifest = folder / "_manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        got["_manifest.json"] = json.dumps({k: v for k, v in m.items() if k != "seconds"}, sort_keys=True)
    return got


@pytest.fixture(scope="module")
def padded_inputs(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("direct-in")
    rng = np.random.default_rng(11)
    files = []
    for k in range(3):
        lengths = rng.integers(1, 129, 1500 + 300 * k).tolist()
        files.append(ref.write_padded(d / f"wiki_training_{k}.hdf5",
                                      ref.padded_rows(lengths, k, max_seq_length=128, max_pred=20)))
    return files


def _spy_reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    real = scratch.read_range
    monkeypatch.setattr(scratch, "read_range", lambda *a, **k: (reads.append(str(a[0])), real(*a, **k))[1])
    return reads


def test_pack_nvidia_writes_the_same_shards_with_its_scratch_past_the_page_cache(padded_inputs, tmp_path, monkeypatch):
    from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia

    cfg = PackNvidiaConfig(max_seq_length=128, shards_num=3)
    got = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("BERTPIPE_DIRECT_IO", mode)
        reads = _spy_reads(monkeypatch)
        run_pack_nvidia(padded_inputs, tmp_path / mode, cfg, workers=1)
        got[mode] = _md5s(tmp_path / mode)
        # the groups read the scratch's big arrays past the page cache only when the plan chose it
        assert bool(reads) == (mode == "1") and all("_ids.npy" in r or "_seg.npy" in r or "_pos.npy" in r
                                                       or "_mlm.npy" in r for r in reads)
    assert got["0"] == got["1"] and any(n.startswith("part_") for n in got["0"])


@pytest.mark.parametrize("dtypes", ["script", "narrow"])
def test_pack_habana_writes_the_same_files_with_its_scratch_past_the_page_cache(padded_inputs, tmp_path, monkeypatch,
                                                                               dtypes):
    from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana

    cfg = HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20, compression="none",
                           dtypes=dtypes)
    got = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("BERTPIPE_DIRECT_IO", mode)
        reads = _spy_reads(monkeypatch)
        run_pack_habana(padded_inputs, tmp_path / mode, cfg, manifest_name=f"../{mode}.manifest.json")
        got[mode] = _md5s(tmp_path / mode)
        assert bool(reads) == (mode == "1")
    assert got["0"] == got["1"] and got["0"]


def test_scratch_maps_are_kept_until_the_file_changes_or_is_forgotten(tmp_path):
    """packing.scratch_map: a group's np.load of each input's scratch files, kept in the process (the same map the
    next time); a file saved again (a new inode) is mapped anew, never the old values; forget_scratch_maps drops
    a folder's maps (their files' space freed once removed)."""
    from preprocessing import packing

    p = tmp_path / "s" / "a.npy"
    p.parent.mkdir()
    save_array(p, np.arange(10, dtype=np.int16))
    m = packing.scratch_map(p)
    assert packing.scratch_map(p) is m and np.array_equal(m, np.arange(10))
    save_array(p, np.arange(5, 15, dtype=np.int16))
    m2 = packing.scratch_map(p)
    assert m2 is not m and np.array_equal(m2, np.arange(5, 15))
    other = tmp_path / "b.npy"
    save_array(other, np.zeros(3, np.int8))
    kept = packing.scratch_map(other)
    packing.forget_scratch_maps(tmp_path / "s")
    assert str(p) not in packing._MAPS and packing.scratch_map(other) is kept
    packing.forget_scratch_maps()
    assert not packing._MAPS
