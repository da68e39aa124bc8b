"""preprocessing.packing.h5_reserved: the packers' files written by HDF5's own driver with their disk space reserved
first. The same bytes as a file built in memory (hdf5_io.h5_create); where the file system cannot reserve, built in
memory; a disk that fills between the probe and the reservation fails in one plain OSError, the HDF5 file closed
without a crash (HDF5 failing a write of its own crashed the process) and nothing of it left to the caller but the
empty path it removes."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

from preprocessing import packing
from preprocessing.hdf5_io import h5_create

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fallocate(2) is Linux's")


def _write(f: h5py.File) -> None:
    f.create_dataset("a", data=np.arange(100_000, dtype=np.int32).reshape(1000, 100), compression="gzip")
    ds = f.create_dataset("v", (3,), dtype=h5py.vlen_dtype(np.int16))
    ds[0], ds[1], ds[2] = np.arange(5, dtype=np.int16), np.arange(0, dtype=np.int16), np.arange(700, dtype=np.int16)
    f.create_dataset("b", data=np.ones((300, 7), np.int8))


def _md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


def test_reserved_writes_the_bytes_of_a_file_built_in_memory_and_gives_the_rest_back(tmp_path):
    with h5_create(tmp_path / "mem.h5", in_memory=True) as f:
        _write(f)
    with packing.h5_reserved(tmp_path / "res.h5", 50 << 20) as f:
        _write(f)
    assert _md5(tmp_path / "res.h5") == _md5(tmp_path / "mem.h5")
    st = os.stat(tmp_path / "res.h5")
    assert st.st_blocks * 512 < (4 << 20)  # the 50 MB reserved past the end were given back


def test_without_fallocate_the_file_is_built_in_memory(tmp_path, monkeypatch):
    with h5_create(tmp_path / "mem.h5", in_memory=True) as f:
        _write(f)

    def cannot(fd: int, size: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "not here")

    monkeypatch.setattr(packing, "_fallocate", cannot)
    with packing.h5_reserved(tmp_path / "res.h5", 1 << 20) as f:
        assert f.driver == "core"
        _write(f)
    assert _md5(tmp_path / "res.h5") == _md5(tmp_path / "mem.h5")


def test_a_full_disk_at_the_probe_is_a_plain_error(tmp_path, monkeypatch):
    def full(fd: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packing, "_fallocate", full)
    with pytest.raises(OSError) as e, packing.h5_reserved(tmp_path / "x.h5", 1 << 20) as f:
        _write(f)
    assert e.value.errno == errno.ENOSPC


def test_a_disk_that_fills_after_the_probe_closes_the_file_without_a_crash(tmp_path):
    """In a process of its own (a crash would show as a signal): the probe's reservation succeeds, the real one
    fails; the OSError comes out of the ``with``, HDF5's file is closed (its writes went to memory), the process
    exits 0 after removing the file as the packers do, and the path's bytes on disk never grew past the
    superblock."""
    code = textwrap.dedent(f"""
        import errno, os, sys
        from pathlib import Path
        import numpy as np
        from preprocessing import packing
        real, calls = packing._fallocate, []
        def second_fails(fd, size):
            calls.append(size)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, size)
        packing._fallocate = second_fails
        p = Path({str(tmp_path / "x.h5")!r})
        try:
            with packing.h5_reserved(p, 1 << 20) as f:
                f.create_dataset("a", data=np.zeros(10))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
            size = os.path.getsize(p)
            p.unlink()
            print("refused", size)
            sys.exit(0)
        sys.exit("no error")
    """)
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    said, size = r.stdout.split()
    assert said == "refused" and int(size) <= 4096, r.stdout
    assert not (tmp_path / "x.h5").exists()
