"""preprocessing/scratch.py: record batches appended past the page cache (O_DIRECT), padded to a block, read back
whole; the same bytes through the page cache where the file system refuses O_DIRECT or it is turned off."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from preprocessing import scratch
from preprocessing.scratch import ALIGN, MIN_PAD, RecordWriter, next_block, padded_size, read_whole


@pytest.mark.parametrize(("n", "size"), [(0, 0), (1, ALIGN), (ALIGN - MIN_PAD, ALIGN), (ALIGN - MIN_PAD + 1, 2 * ALIGN),
                                         (ALIGN - 1, 2 * ALIGN), (ALIGN, ALIGN), (ALIGN + 1, 2 * ALIGN)])
def test_padding_is_none_or_room_for_a_header(n, size):
    assert padded_size(n) == size
    assert next_block(0) == ALIGN and next_block(ALIGN - 1) == ALIGN and next_block(ALIGN) == 2 * ALIGN


def _batches():
    rng = np.random.default_rng(3)
    # sizes that end a batch on a boundary, just short of one (padding < MIN_PAD: a block more) and anywhere
    for n in (ALIGN, ALIGN - 5, 10_000, 1, 3 * ALIGN - MIN_PAD, 70_001):
        a = rng.integers(1, 2**15, size=n // 2, dtype=np.int16)
        yield [np.array([len(a), 0, 0, 0], dtype=np.int64)[:1], a, np.ones(n % 2, dtype=np.int8)]


def _expected(batches):
    out = b""
    for arrays in batches:
        data = b"".join(np.ascontiguousarray(x).tobytes() for x in arrays)
        out += data + b"\0" * (padded_size(len(data)) - len(data))
    return out


def test_batches_round_trip_aligned_and_padded(tmp_path):
    batches = list(_batches())
    p = tmp_path / "b00000.t00000"
    with RecordWriter() as w:
        w.PIECE = 2 * ALIGN  # batches cut into pieces of two blocks, written while the next is copied
        sizes = [w.append(p, arrays) for arrays in batches]
    assert all(s % ALIGN == 0 for s in sizes) and p.stat().st_size == sum(sizes)
    got = read_whole(p)
    assert got.ctypes.data % ALIGN == 0
    assert got.tobytes() == _expected(batches)
    with RecordWriter() as w:
        assert w.append(p, [np.zeros(0, np.int8)]) == 0  # nothing to write
    assert p.stat().st_size == sum(sizes)


def test_small_batches_to_many_files_share_a_buffer_and_keep_each_files_order(tmp_path, monkeypatch):
    """The scatter at the full set's ~300 buckets: small batches to many files, interleaved. They are copied back
    to back into one buffer and handed to the writer thread together (not a hand-over a batch); one that does not
    fit goes on in the next buffer. Each file gets its own batches, in order, padded."""
    handed = []
    real = scratch._append_blocks

    def count(view, segs, direct):
        handed.append(len(segs))
        return real(view, segs, direct)

    monkeypatch.setattr(scratch, "_append_blocks", count)
    batches = list(_batches())
    files = [tmp_path / f"b{k:05d}.t00000" for k in range(5)]
    sent: dict = {f: [] for f in files}
    with RecordWriter() as w:
        w.PIECE = 8 * ALIGN
        for r in range(4):
            for k, f in enumerate(files):
                arrays = batches[(r + k) % len(batches)]
                w.append(f, arrays)
                sent[f].append(arrays)
    for f in files:
        assert f.read_bytes() == _expected(sent[f]) == read_whole(f).tobytes(), f.name
    assert sum(handed) > len(handed) > 0  # several batches a hand-over
    assert max(handed) > 1


def test_append_records_writes_what_append_writes(tmp_path):
    """Many batches given as byte runs, gathered into the buffers by one C call a buffer: each file's bytes are
    append's, batches that do not fit the room left go on in the next buffer, and a batch larger than a buffer
    is refused."""
    from preprocessing import pack_fast

    if pack_fast.native() is None:
        pytest.skip(pack_fast._NATIVE.reason)
    batches = list(_batches())
    files = [f"b{k:05d}.t00000" for k in range(4)]
    plan = [(files[(r * 3) % 4], batches[r % len(batches)]) for r in range(17)]
    (tmp_path / "one").mkdir()
    (tmp_path / "many").mkdir()
    with RecordWriter() as w:
        w.PIECE = 24 * ALIGN
        for name, arrays in plan:
            w.append(tmp_path / "one" / name, arrays)
    keep = [[np.ascontiguousarray(a) for a in arrays] for _, arrays in plan]
    width = max(len(k) for k in keep)
    addrs = np.zeros((len(plan), width), np.uint64)
    lens = np.zeros((len(plan), width), np.int64)
    for i, arrays in enumerate(keep):
        for j, a in enumerate(arrays):
            addrs[i, j], lens[i, j] = a.ctypes.data, a.nbytes
    with RecordWriter() as w:
        w.PIECE = 24 * ALIGN
        w.append_records([tmp_path / "many" / name for name, _ in plan[:9]], addrs[:9], lens[:9])
        w.append(tmp_path / "many" / plan[9][0], plan[9][1])  # mixed with append: the order kept
        w.append_records([tmp_path / "many" / name for name, _ in plan[10:]], addrs[10:], lens[10:])
        with pytest.raises(ValueError, match="larger than a buffer"):
            w.PIECE = 2 * ALIGN
            w.append_records([tmp_path / "many" / "big"], addrs[5:6], lens[5:6])
        w.PIECE = 24 * ALIGN
    for name in files:
        assert (tmp_path / "many" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    assert not (tmp_path / "many" / "big").exists()


def test_the_page_cache_path_writes_the_same_bytes(tmp_path, monkeypatch):
    batches = list(_batches())
    direct = tmp_path / "direct"
    with RecordWriter() as w:
        for arrays in batches:
            w.append(direct, arrays)
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "0")
    assert not scratch.direct_io_enabled()
    cached = tmp_path / "cached"
    with RecordWriter() as w:
        for arrays in batches:
            w.append(cached, arrays)
    assert cached.read_bytes() == direct.read_bytes() == read_whole(cached).tobytes()


def test_a_file_system_that_refuses_o_direct_gets_the_same_bytes(tmp_path, monkeypatch):
    """tmpfs refuses O_DIRECT at open (EINVAL); some file systems take the flag and refuse the write: both fall
    back to the page cache, and both are read back through it."""
    if not scratch._O_DIRECT:
        pytest.skip("no O_DIRECT on this platform")
    batches = list(_batches())
    want = _expected(batches)
    real_open, real_write, real_preadv, real_close = os.open, os.write, os.preadv, os.close
    direct_fds: set[int] = set()

    def refuse_open(path, flags, mode=0o777):
        if flags & scratch._O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", refuse_open)
    p = tmp_path / "refused-at-open"
    with RecordWriter() as w:
        for arrays in batches:
            w.append(p, arrays)
    assert p.read_bytes() == want and read_whole(p).tobytes() == want

    def track_open(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        if flags & scratch._O_DIRECT:
            direct_fds.add(fd)
            tried.append(fd)
        return fd

    def refuse_write(fd, data):
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    def refuse_read(fd, bufs, offset):
        if fd in direct_fds:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_preadv(fd, bufs, offset)

    def track_close(fd):
        direct_fds.discard(fd)  # the number may come back for the page-cache open
        return real_close(fd)

    tried: list[int] = []
    monkeypatch.setattr(os, "open", track_open)
    monkeypatch.setattr(os, "close", track_close)
    monkeypatch.setattr(os, "write", refuse_write)
    monkeypatch.setattr(os, "preadv", refuse_read)
    q = tmp_path / "refused-at-write"
    with RecordWriter() as w:
        for arrays in batches:
            w.append(q, arrays)
    assert q.read_bytes() == want and read_whole(q).tobytes() == want
    assert len(tried) == len(batches) + 1 and not direct_fds  # tried by each append and the read, closed


def test_other_errors_are_raised(tmp_path, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    w = RecordWriter()
    w.append(tmp_path / "x", [np.ones(10, np.int8)])  # on its way: the error comes with the wait
    with pytest.raises(OSError) as exc:
        w.close()
    assert exc.value.errno == errno.ENOSPC
    w.close()  # closed: nothing left to raise


def test_direct_scratch_only_when_larger_than_memory_or_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("BERTPIPE_DIRECT_IO", raising=False)
    monkeypatch.setattr(scratch, "memory_available", lambda: 8 << 30)
    assert not scratch.use_direct(tmp_path, 1 << 30)  # fits: left to the page cache
    assert scratch.use_direct(tmp_path, 5 << 30) == bool(scratch._O_DIRECT)  # over half the memory
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "0")
    assert not scratch.use_direct(tmp_path, 100 << 30)
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "1")
    assert scratch.use_direct(tmp_path, 1) == bool(scratch._O_DIRECT)
    assert not list(tmp_path.iterdir())  # the probe removed
    monkeypatch.setattr(scratch, "memory_available", lambda: 0)
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "auto")
    assert not scratch.use_direct(tmp_path, 100 << 30)  # memory unknown: the page cache


def test_a_page_cache_writer_appends_the_arrays_as_they_are(tmp_path):
    batches = list(_batches())
    p = tmp_path / "cached"
    with RecordWriter(direct=False) as w:
        for arrays in batches:
            w.append(p, arrays)
    assert p.read_bytes() == b"".join(np.ascontiguousarray(x).tobytes() for arrays in batches for x in arrays)


def test_read_whole_into_a_given_aligned_buffer(tmp_path):
    """read_whole(into=...) reads the file into the start of the caller's aligned array (a reused buffer) and
    refuses one too small or off a block boundary."""
    from preprocessing import pack_fast

    data = np.random.default_rng(3).integers(0, 256, 3 * scratch.ALIGN + 100, dtype=np.uint8)
    p = tmp_path / "f"
    p.write_bytes(data.tobytes())
    space = pack_fast.Space()
    buf = scratch.aligned_from(space, "b", 5 * scratch.ALIGN)
    assert buf.ctypes.data % scratch.ALIGN == 0 and len(buf) == 5 * scratch.ALIGN
    got = scratch.read_whole(p, into=buf)
    assert got.ctypes.data == buf.ctypes.data and got.tobytes() == data.tobytes()
    again = scratch.aligned_from(space, "b", 4 * scratch.ALIGN)
    assert again.ctypes.data == buf.ctypes.data  # the same memory, call after call
    with pytest.raises(ValueError, match="needs an aligned uint8 array"):
        scratch.read_whole(p, into=buf[:scratch.ALIGN])
    with pytest.raises(ValueError, match="needs an aligned uint8 array"):
        scratch.read_whole(p, into=buf[1:])
