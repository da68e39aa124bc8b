"""preprocessing.packing.ImageOutputs: the packers' HDF5 files built in memory by HDF5's core driver (its memory a
reused buffer, through file-image callbacks in preprocessing/_pack_native), written in one go (past the page cache
where asked, behind the caller: by a writer thread) and hashed from memory. The same bytes as HDF5's own file driver writes (packing.h5_reserved), for
variable-length, contiguous and gzip'd datasets and either superblock; a file larger than its buffer; more files
than the md5 lanes; an error inside the block or a full disk at the write leave no file and a working arena."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path

import h5py
import numpy as np
import pytest

from core.errors import DiskFullError
from core.manifest import md5_then_fsync
from preprocessing import pack_fast, packing, scratch
from preprocessing.hdf5_io import h5_create, libhdf5


def _usable() -> None:
    if pack_fast.native() is None or libhdf5() is None:
        pytest.skip("the packing C extension or HDF5's library is not at hand (ImageOutputs falls back)")


def _write(f: h5py.File, seed: int = 0, rows: int = 3000) -> None:
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 700, rows)
    ds = f.create_dataset("v", (rows,), dtype=h5py.vlen_dtype(np.int16))
    flat = rng.integers(-30000, 30000, int(lens.sum())).astype(np.int16)
    ds[:] = np.array(np.split(flat, np.cumsum(lens)[:-1]), dtype=object)
    f.create_dataset("a", data=rng.integers(0, 30000, (rows, 64)).astype(np.int32), compression="gzip")
    f.create_dataset("b", data=rng.integers(0, 2, (rows, 512)).astype(np.int8))


def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


def _references(tmp_path: Path, seeds) -> list[str]:
    """``ref<i>.h5`` written by HDF5's own driver from each seed (400 rows): their md5s."""
    want = []
    for i, seed in enumerate(seeds):
        with packing.h5_reserved(tmp_path / f"ref{i}.h5", 32 << 20) as f:
            _write(f, seed, rows=400)
        want.append(_md5(tmp_path / f"ref{i}.h5"))
    return want


def _held_disk(monkeypatch):
    """A slow disk: every image write waits until the returned event is set."""
    go = threading.Event()
    real = scratch.write_all

    def slow(fd, path, view, direct):
        assert go.wait(30)
        return real(fd, path, view, direct)

    monkeypatch.setattr(scratch, "write_all", slow)
    return go


@pytest.mark.parametrize("direct", [False, True])
def test_the_same_bytes_as_hdf5s_own_driver_and_md5s_from_memory(tmp_path, direct):
    _usable()
    want = []
    for i in range(3):
        with packing.h5_reserved(tmp_path / f"ref{i}.h5", 64 << 20) as f:
            _write(f, i)
        want.append(_md5(tmp_path / f"ref{i}.h5"))
    out = packing.ImageOutputs(pack_fast.Space(), direct=direct)
    for i in range(3):
        with out.create(tmp_path / f"t{i}.tmp", 64 << 20) as f:
            assert f.driver == "core"
            _write(f, i)
        out.rename(tmp_path / f"t{i}.tmp", tmp_path / f"img{i}.h5")
    known = out.md5s()  # the held images hashed, and every write (behind) and rename done
    assert [_md5(tmp_path / f"img{i}.h5") for i in range(3)] == want
    assert not list(tmp_path.glob("t*.tmp"))
    assert {Path(p).name: m for p, m in known.items()} == {f"img{i}.h5": want[i] for i in range(3)}
    paths = [tmp_path / f"img{i}.h5" for i in range(3)]
    assert md5_then_fsync(paths, known) == want
    with h5py.File(paths[1], "r") as f:  # and h5py reads it back
        assert f["b"].shape == (3000, 512) and f["v"].dtype.metadata["vlen"] == np.int16


def test_a_file_larger_than_its_buffer_moves_to_malloced_memory(tmp_path):
    _usable()
    with packing.h5_reserved(tmp_path / "ref.h5", 64 << 20) as f:
        _write(f, 5)
    out = packing.ImageOutputs(None, direct=True)
    views = []

    class Spy:  # the C module, image_view's answers recorded
        def __getattr__(self, name):
            return getattr(pack_fast.native(), name)

        def image_view(self):
            views.append(pack_fast.native().image_view())
            return views[-1]

    out.mod = Spy()
    with out.create(tmp_path / "img.h5", 4096) as f:  # far too small a bound: the image outgrows the buffer
        _write(f, 5)
    assert views and views[0][2] is False  # not in the buffer: malloc'd
    got = out.md5s()[str(tmp_path / "img.h5")]
    assert _md5(tmp_path / "img.h5") == _md5(tmp_path / "ref.h5") == got


def test_more_files_than_lanes_are_hashed_in_batches_without_reusing_a_held_buffer(tmp_path, monkeypatch):
    _usable()
    monkeypatch.setattr(packing.ImageOutputs, "LANES", 3)
    space = pack_fast.Space()
    out = packing.ImageOutputs(space, direct=False)
    names = []
    for i in range(8):
        with out.create(tmp_path / f"f{i}.h5", 32 << 20) as f:
            _write(f, 10 + i, rows=500 + 100 * i)
        names.append(tmp_path / f"f{i}.h5")
        assert len(out.held) <= 3
    assert sorted(k for k in space._bufs if k.startswith("h5-image")) == ["h5-image-0", "h5-image-1", "h5-image-2"]
    got = out.md5s()
    assert [got[str(p)] for p in names] == [_md5(p) for p in names]
    # and by bytes: images hashed as soon as they hold HELD_BYTES (the stage's memory bound), whatever the lanes
    monkeypatch.setattr(packing.ImageOutputs, "LANES", 8)
    monkeypatch.setattr(packing.ImageOutputs, "HELD_BYTES", 1)
    out = packing.ImageOutputs(pack_fast.Space(), direct=False)
    for i in range(3):
        with out.create(tmp_path / f"g{i}.h5", 32 << 20) as f:
            _write(f, 30 + i, rows=300)
        assert out.held == []
    got = out.md5s()
    assert [got[str(tmp_path / f"g{i}.h5")] for i in range(3)] == [_md5(tmp_path / f"g{i}.h5") for i in range(3)]


def test_images_are_hashed_before_one_more_of_the_same_size_would_pass_the_bound(tmp_path, monkeypatch):
    """The held images never pass the bound by an image: hashed when one more of the last one's size would not fit
    (a bound of 2.5 images: 2 held, where hashing once past it held 3)."""
    _usable()
    want = _references(tmp_path, [80] * 4)  # one seed: files of one size
    size = os.path.getsize(tmp_path / "ref0.h5")
    monkeypatch.setattr(packing.ImageOutputs, "HELD_BYTES", size * 5 // 2)
    out = packing.ImageOutputs(pack_fast.Space(), direct=False)
    held = []
    with out:
        for i in range(4):
            with out.create(tmp_path / f"img{i}.h5", 32 << 20) as f:
                _write(f, 80, rows=400)
            held.append(len(out.held))
        got = out.md5s()
    assert held == [1, 0, 1, 0]
    assert [got[str(tmp_path / f"img{i}.h5")] for i in range(4)] == want


def test_a_caller_may_hold_more_bytes_than_the_default_before_hashing(tmp_path, monkeypatch):
    """``held_bytes``: the instance's bound, not the class default (pack-habana's raw files: 16 of 33 MB)."""
    _usable()
    monkeypatch.setattr(packing.ImageOutputs, "LANES", 8)
    monkeypatch.setattr(packing.ImageOutputs, "HELD_BYTES", 1)
    out = packing.ImageOutputs(pack_fast.Space(), direct=False, held_bytes=1 << 30)
    assert out.held_bytes == 1 << 30
    for i in range(3):
        with out.create(tmp_path / f"g{i}.h5", 32 << 20) as f:
            _write(f, 40 + i, rows=300)
    assert len(out.held) == 3  # the class's 1 byte would have hashed each alone
    got = out.md5s()
    assert out.held == []
    assert [got[str(tmp_path / f"g{i}.h5")] for i in range(3)] == [_md5(tmp_path / f"g{i}.h5") for i in range(3)]
    assert packing.ImageOutputs(pack_fast.Space()).held_bytes == 1


def test_pack_habana_holds_up_to_the_lanes_of_uncompressed_files_within_its_bound():
    _usable()
    from preprocessing.habana import pack as hp

    raw = hp.HabanaPackConfig(compression="none")
    layout = hp.packed_layout(1000, raw)
    assert layout is not None
    lanes = packing.ImageOutputs.LANES
    # small files: never below the default; large ones: as many as the lanes take, up to the bound
    assert hp.held_bytes(1000, raw) == max(packing.ImageOutputs.HELD_BYTES, lanes * layout.size)
    big = hp.packed_layout(20000, raw).size
    assert lanes * big > packing.ImageOutputs.HELD_BYTES
    assert hp.held_bytes(20000, raw) == min(hp.HELD_BYTES_MAX, lanes * big)
    assert hp.held_bytes(200000, raw) == hp.HELD_BYTES_MAX
    assert hp.held_bytes(20000, hp.HabanaPackConfig(compression="gzip")) == packing.ImageOutputs.HELD_BYTES


def test_superblock_sizes_for_old_and_new_formats(tmp_path):
    for libver in ("earliest", "latest"):
        p = tmp_path / f"{libver}.h5"
        with h5py.File(p, "w", libver=libver) as f:
            _write(f, 1, rows=200)
        assert packing.image_size(p.read_bytes()) == p.stat().st_size, libver
    with pytest.raises(Exception, match="superblock"):
        packing.image_size(b"not an HDF5 file" * 8)


def test_an_error_inside_the_block_leaves_no_file_and_the_arena_free(tmp_path):
    _usable()
    out = packing.ImageOutputs(pack_fast.Space(), direct=True)
    with pytest.raises(RuntimeError, match="inside"), out.create(tmp_path / "x.h5", 1 << 20) as f:
        f.create_dataset("a", data=np.zeros(10))
        raise RuntimeError("inside")
    assert not (tmp_path / "x.h5").exists() and out.held == []
    assert pack_fast.native().image_view()[1] == 0  # the arena forgotten
    with out, out.create(tmp_path / "y.h5", 1 << 20) as f:  # and the next file is fine (written when `out` ends)
        f.create_dataset("a", data=np.arange(10))
    with h5py.File(tmp_path / "y.h5", "r") as f:
        assert f["a"][-1] == 9


def test_a_full_disk_at_the_write_is_a_plain_error(tmp_path, monkeypatch):
    _usable()

    def full(fd, path, view, direct):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(scratch, "write_all", full)
    monkeypatch.setattr(packing.ImageOutputs, "BEHIND", False)  # written before create returns: raised there
    out = packing.ImageOutputs(None, direct=True)
    with pytest.raises(OSError) as e, out.create(tmp_path / "x.h5", 1 << 20) as f:
        _write(f, 2, rows=100)
    assert e.value.errno == errno.ENOSPC
    assert out.held == [] and pack_fast.native().image_view()[1] == 0


def test_a_full_disk_behind_is_raised_naming_the_file_and_its_rename_is_not_done(tmp_path, monkeypatch):
    """Written behind: the error comes at md5s() (or wait, or the with block's end), as core.manifest's
    DiskFullError naming the file, after every write in flight ended; the rename queued after it is not done, so
    the final name never holds a partial file. The other files are written and renamed."""
    _usable()
    real = scratch.write_all

    def full_for_one(fd, path, view, direct):
        if Path(path).name == "b.tmp":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, path, view, direct)

    monkeypatch.setattr(scratch, "write_all", full_for_one)
    out = packing.ImageOutputs(pack_fast.Space(), direct=True)
    for name in "abc":
        with out.create(tmp_path / f"{name}.tmp", 1 << 20) as f:
            _write(f, 2, rows=100)
        out.rename(tmp_path / f"{name}.tmp", tmp_path / f"{name}.h5")
    with pytest.raises(DiskFullError, match=r"no space left on the device while writing .*b\.tmp"):
        out.md5s()
    assert (tmp_path / "a.h5").exists() and (tmp_path / "c.h5").exists()
    assert not (tmp_path / "b.h5").exists()
    out.close()
    assert out._writer is None


def test_writes_behind_never_reuse_a_buffer_before_its_write_and_the_caller_goes_on(tmp_path, monkeypatch):
    """A slow disk: each write starts only when the test lets it. The caller builds the next files meanwhile (no
    file on disk yet); a held buffer is not filled again before its write is done (else the bytes would differ);
    the final names appear only after their writes."""
    _usable()
    want = _references(tmp_path, range(40, 45))
    go = _held_disk(monkeypatch)
    monkeypatch.setattr(packing.ImageOutputs, "LANES", 2)  # slot 0 comes back at the third file
    out = packing.ImageOutputs(pack_fast.Space(), direct=True)
    for i in range(2):
        with out.create(tmp_path / f"t{i}.tmp", 32 << 20) as f:
            _write(f, 40 + i, rows=400)
        out.rename(tmp_path / f"t{i}.tmp", tmp_path / f"img{i}.h5")
    assert not list(tmp_path.glob("img*.h5"))  # both still waiting for the disk: the caller went on
    threading.Timer(0.3, go.set).start()  # the third file waits for slot 0's write, then the disk is let go
    with out:
        for i in range(2, 5):
            with out.create(tmp_path / f"t{i}.tmp", 32 << 20) as f:
                _write(f, 40 + i, rows=400)
            out.rename(tmp_path / f"t{i}.tmp", tmp_path / f"img{i}.h5")
        got = out.md5s()
    assert [_md5(tmp_path / f"img{i}.h5") for i in range(5)] == want
    assert [got[str(tmp_path / f"img{i}.h5")] for i in range(5)] == want


def test_without_the_extension_the_files_are_hdf5s_own(tmp_path, monkeypatch):
    with h5_create(tmp_path / "mem.h5", in_memory=True) as f:
        _write(f, 3, rows=300)
    monkeypatch.setattr(pack_fast, "native", lambda: None)
    out = packing.ImageOutputs(None, direct=True)
    with out.create(tmp_path / "x.h5", 32 << 20) as f:
        assert f.driver == "sec2"
        _write(f, 3, rows=300)
    assert _md5(tmp_path / "x.h5") == _md5(tmp_path / "mem.h5")
    assert out.md5s() == {}  # hashed from the page cache by md5_then_fsync instead
    assert md5_then_fsync([tmp_path / "x.h5"], out.md5s()) == [_md5(tmp_path / "x.h5")]


def test_direct_writes_fall_back_where_the_file_system_refuses_them(tmp_path, monkeypatch):
    """A file system without O_DIRECT (tmpfs): scratch.open_for_write gives a page-cache descriptor, same bytes."""
    _usable()
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "0")
    with packing.h5_reserved(tmp_path / "ref.h5", 32 << 20) as f:
        _write(f, 4, rows=300)
    with packing.ImageOutputs(None, direct=True) as out, out.create(tmp_path / "x.h5", 32 << 20) as f:
        _write(f, 4, rows=300)
    assert _md5(tmp_path / "x.h5") == _md5(tmp_path / "ref.h5")
    assert os.path.getsize(tmp_path / "x.h5") == os.path.getsize(tmp_path / "ref.h5")


def test_images_built_in_the_callers_spare_memory_then_in_its_space(tmp_path, monkeypatch):
    """A spare (pack-nvidia: its group's dead read buffer): images are built there one after another, no buffer of
    the space is made while they fit, held images there do not count towards HELD_BYTES, a full spare is hashed and
    used again (after its writes, which the slow disk here holds back), and an image that does not fit goes to the
    space. The same bytes and md5s throughout."""
    _usable()
    want = _references(tmp_path, range(60, 66))
    size = os.path.getsize(tmp_path / "ref0.h5")
    go = _held_disk(monkeypatch)
    monkeypatch.setattr(packing.ImageOutputs, "HELD_BYTES", 1)  # would hash each image alone, were it the space's
    space = pack_fast.Space()
    whole = -(-size // scratch.ALIGN) * scratch.ALIGN  # what an image takes of the spare
    spare = scratch.aligned_empty(3 * whole + size + scratch.ALIGN)  # a 4th with a bound of size + ALIGN: no room
    out = packing.ImageOutputs(space, direct=True, spare=spare)
    threading.Timer(0.3, go.set).start()
    held = []
    with out:
        for i in range(6):
            with out.create(tmp_path / f"t{i}.tmp", size + scratch.ALIGN) as f:
                _write(f, 60 + i, rows=400)
            out.rename(tmp_path / f"t{i}.tmp", tmp_path / f"img{i}.h5")
            held.append(len(out.held))
        assert held == [1, 2, 3, 1, 2, 3]  # hashed only when the spare is full
        assert not any(k.startswith("h5-image") for k in space._bufs)  # all in the spare
        with out.create(tmp_path / "big.tmp", len(spare)) as f:  # more than the whole spare: the space's buffer
            _write(f, 66, rows=400)
        assert [k for k in space._bufs if k.startswith("h5-image")] == ["h5-image-0"]
        got = out.md5s()
    assert [_md5(tmp_path / f"img{i}.h5") for i in range(6)] == want
    assert [got[str(tmp_path / f"img{i}.h5")] for i in range(6)] == want
    assert got[str(tmp_path / "big.tmp")] == _md5(tmp_path / "big.tmp")


def test_images_fill_several_spares_asking_for_what_images_took_of_their_bounds(tmp_path, monkeypatch):
    """Several spares (pack-nvidia: its group's three read buffers): each image goes to the first with room for it;
    the first image, before any was made, needs its whole bound, the later ones what the images took of theirs so
    far (and 1/16 more): a loose bound (a disk reservation's) does not keep an image out of a spare it fits."""
    _usable()
    want = _references(tmp_path, range(70, 75))
    size = max(os.path.getsize(tmp_path / f"ref{i}.h5") for i in range(5))
    monkeypatch.setattr(packing.ImageOutputs, "HELD_BYTES", 1)
    space = pack_fast.Space()
    whole = -(-size // scratch.ALIGN) * scratch.ALIGN
    spares = [scratch.aligned_empty(whole + size // 8 + 2 * scratch.ALIGN) for _ in range(2)]  # one image each
    out = packing.ImageOutputs(space, direct=False, spare=spares + [None])
    assert len(out.spares) == 2
    held = []
    with out:
        for i in range(5):
            with out.create(tmp_path / f"img{i}.h5", 3 * size) as f:  # a bound three times the file
                _write(f, 70 + i, rows=400)
            held.append(len(out.held))
        # the 1st: no share known yet, its bound fits no spare (the space's buffer, hashed at once: HELD_BYTES 1);
        # the 2nd and 3rd: one in each spare; the 4th: both full, so the two held are hashed and it takes the first
        assert held == [0, 1, 2, 1, 2]
        assert [k for k in space._bufs if k.startswith("h5-image")] == ["h5-image-0"]
        assert 0.25 < out._fill <= 0.34
        got = out.md5s()
    assert [_md5(tmp_path / f"img{i}.h5") for i in range(5)] == want
    assert [got[str(tmp_path / f"img{i}.h5")] for i in range(5)] == want


def _contiguous(f: h5py.File, values: dict[str, np.ndarray]) -> None:
    for name, v in values.items():
        f.create_dataset(name, data=v, dtype=v.dtype)


@pytest.mark.parametrize("direct", [False, True])
def test_laid_out_files_are_the_bytes_hdf5_writes_for_those_values(tmp_path, direct):
    """ImageOutputs.create_laid_out: the layout taken once for a shape (packing.image_layout), the values written
    straight into the image, file after file: each file the bytes HDF5's own driver writes for its values."""
    _usable()
    rng = np.random.default_rng(7)
    shapes = {"ids": ((900, 512), np.int16), "mask": ((900, 512), np.int8), "pos": ((900, 79), np.int32),
              "w": ((900, 3), np.int64)}

    def values(seed):
        r = np.random.default_rng(seed)
        return {k: r.integers(-100, 100, s).astype(dt) for k, (s, dt) in shapes.items()}

    layout = packing.image_layout(("test", 900), lambda f: _contiguous(f, {k: np.zeros(s, dt) for k, (s, dt)
                                                                           in shapes.items()}), list(shapes))
    assert layout is not None and [d[0] for d in layout.datasets] == list(shapes)
    assert packing.image_layout(("test", 900), None, list(shapes)) is layout  # taken once a key
    out = packing.ImageOutputs(pack_fast.Space(), direct=direct)
    want = []
    for i in range(3):
        v = values(i)
        with packing.h5_reserved(tmp_path / f"ref{i}.h5", 16 << 20) as f:
            _contiguous(f, v)
        want.append(_md5(tmp_path / f"ref{i}.h5"))
        with out.create_laid_out(tmp_path / f"t{i}.tmp", layout) as arrays:
            assert {k: (a.shape, a.dtype) for k, a in arrays.items()} == {k: (s, np.dtype(dt)) for k, (s, dt)
                                                                          in shapes.items()}
            arrays["ids"][...] = rng.integers(0, 5, shapes["ids"][0])  # garbage first: every byte is the caller's
            for k, a in arrays.items():
                a[...] = v[k]
        out.rename(tmp_path / f"t{i}.tmp", tmp_path / f"img{i}.h5")
    known = out.md5s()
    assert [_md5(tmp_path / f"img{i}.h5") for i in range(3)] == want
    assert {Path(p).name: m for p, m in known.items()} == {f"img{i}.h5": want[i] for i in range(3)}
    with h5py.File(tmp_path / "img2.h5", "r") as f:
        np.testing.assert_array_equal(f["pos"][:], values(2)["pos"])


def test_no_layout_for_compressed_datasets_and_odd_offsets_laid_out_too(tmp_path):
    """image_layout is None where a dataset's values cannot be written straight (gzip'd: chunked). A dataset that
    HDF5's small-data aggregator puts at an offset that is not a multiple of its type's size gets an unaligned
    array, filled (by the packers' C gather through an aligned buffer) to the same bytes HDF5 writes."""
    _usable()
    gz = packing.image_layout(("test-gz",), lambda f: f.create_dataset("a", data=np.zeros((64, 64), np.int32),
                                                                       compression="gzip"), ["a"])
    assert gz is None
    v = {"a": np.array([1, 2, 3], np.int8), "b": np.array([[70000, -5, 9]] * 2, np.int32)}
    odd = packing.image_layout(("test-odd",), lambda f: _contiguous(f, {k: np.zeros_like(x) for k, x in v.items()}),
                               list(v))
    assert odd is not None and dict((d[0], d[1]) for d in odd.datasets)["b"] % 4  # "b" right after "a"'s 3 bytes
    with packing.h5_reserved(tmp_path / "ref.h5", 1 << 20) as f:
        _contiguous(f, v)
    out = packing.ImageOutputs(pack_fast.Space())
    with out.create_laid_out(tmp_path / "img.h5", odd) as arrays:
        assert not arrays["b"].flags.aligned
        arrays["a"][...] = v["a"]
        pack_fast.gather_runs([v["b"].reshape(-1)], None, np.array([0]), np.array([6]), np.int32, out=arrays["b"],
                              space=pack_fast.Space())
    assert out.md5s()[str(tmp_path / "img.h5")] == _md5(tmp_path / "img.h5") == _md5(tmp_path / "ref.h5")
    empty = packing.image_layout(("test-empty",), lambda f: _contiguous(f, {"a": np.zeros((0, 4), np.int16)}), ["a"])
    assert empty is not None and empty.datasets[0][2] == (0, 4)
