"""core.manifest.md5_files: the md5 of many files side by side (core/_native/md5.c) equals hashlib's, with
every kernel the CPU can run, for every size around MD5's 64-byte blocks and the reader's 256 KiB pieces."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ChecksumError
from core.manifest import _MD5, FileCheck, md5_file, md5_files, verify_files

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
PIECE = 256 << 10  # md5.c's MD5_CHUNK
#: sizes at MD5's edges (55/56: the length still fits the last block; 63/64/65) and the reader's read pieces
EDGES = [0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 1000, PIECE - 1, PIECE, PIECE + 1, MIB - 1, MIB,
         MIB + 1, 2 * MIB + 55, 3 * MIB + 64]


def native():
    mod = _MD5.load()
    if mod is None:
        if shutil.which(os.environ.get("CC") or "cc") and os.environ.get("BERTPIPE_NATIVE", "1") != "0":
            pytest.fail(f"a C compiler exists but the md5 extension is unavailable: {_MD5.reason}")
        pytest.skip(_MD5.reason)
    return mod


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("md5")
    rng = random.Random(7)
    sizes = EDGES + [rng.randrange(0, 3 * MIB) for _ in range(21)]  # 43 files: more than 16 lanes, twice
    out = []
    for i, n in enumerate(sizes):
        p = d / f"f{i:02d}"
        p.write_bytes(rng.randbytes(n))
        out.append(p)
    return out


def hashlib_md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


def test_every_kernel_equals_hashlib_for_any_number_of_files(files) -> None:
    mod = native()
    want = [hashlib_md5(p) for p in files]
    kernels = mod.kernels()
    assert kernels[:3] == ["scalar x1", "scalar x2", "scalar x3"]
    for k in kernels:
        for n in (1, 2, 3, 5, 17, len(files)):
            assert mod.md5_files([str(p) for p in files[:n]], k) == want[:n], (k, n)
        # lanes that start together and end together, and one file many times (each lane reads its own copy)
        assert mod.md5_files([str(files[-1])] * 20, k) == [want[-1]] * 20, k


def test_mapped_files_hash_as_read_ones_with_every_kernel(files, tmp_path) -> None:
    """mapped=True (a stage's own outputs: files of 1 MiB or more hashed where they lie in the page cache): the same
    digests as hashlib with every kernel, the mapped files side by side with read ones (under 1 MiB) in one job,
    when the job narrows for its last files, and an error still names its file with every lane cleaned up."""
    mod = native()
    want = [hashlib_md5(p) for p in files]
    assert sum(p.stat().st_size >= MIB for p in files) >= 8  # mapped and read files among the lanes
    for k in mod.kernels():
        for n in (1, 2, 9, 17, len(files)):
            assert mod.md5_files([str(p) for p in files[:n]], k, mapped=True) == want[:n], (k, n)
    assert mod.md5_files([str(p) for p in files], mapped=True) == want
    # the public function: written=True maps; its results are md5_file's
    assert md5_files(files, written=True) == want
    # one long mapped file outliving 16 short ones: the job narrows, the mapped lane's state moves with it
    long_one = tmp_path / "long"
    long_one.write_bytes(random.Random(3).randbytes(5 * MIB + 17))
    paths = [str(p) for p in files[:16]] + [str(long_one)]
    assert mod.md5_files(paths, mapped=True) == want[:16] + [hashlib_md5(long_one)]
    missing = tmp_path / "gone.bin"
    with pytest.raises(FileNotFoundError) as e:
        mod.md5_files([str(long_one), str(missing), str(files[-1])], mapped=True)
    assert str(missing) in str(e.value)


def test_kernel_choice_follows_the_number_of_files() -> None:
    mod = native()
    assert mod.kernel_for(1) == "scalar x1"
    # two files: two scalar streams side by side, or the 8-lane AVX-512VL kernel where the CPU has it (its vector
    # steps have the scalar ones' latency, MD5's bound, so even two busy lanes of eight run faster)
    assert mod.kernel_for(2) == ("avx512vl x8" if "avx512vl x8" in mod.kernels() else "scalar x2")
    if "avx512vl x8" in mod.kernels():
        assert mod.kernel_for(8) == "avx512vl x8"
    if "avx512f x16" in mod.kernels():
        # past 8 files the 16-lane kernel hashes them in one round; the 8-lane one would take the 9th and 10th
        # after the first 8, alone (10 buffers of 15 MB: 0.045 s on 8 lanes against 0.026 s on 16)
        assert [mod.kernel_for(n) for n in (9, 10, 11)] == ["avx512f x16"] * 3
    wide = mod.kernel_for(64)
    assert wide in mod.kernels()
    if "avx512f x16" in mod.kernels():
        assert wide == "avx512f x16"
    with pytest.raises(ValueError, match="not available"):
        mod.md5_files([], "no such kernel")


def test_the_last_files_move_to_a_narrower_kernel_with_their_state(tmp_path) -> None:
    """A few long files among many short ones: once the short ones are done and no file is left to start, the long
    ones go on in a narrower kernel (16 lanes to 8, or 8 to scalar), each lane's state moved with its file: the
    digests stay hashlib's whichever lanes the long files had."""
    mod = native()
    rng = random.Random(11)
    for n_long, n_short in ((1, 15), (3, 13), (5, 20), (9, 7), (2, 6)):
        paths = [tmp_path / f"l{n_long}_{n_short}_{i}" for i in range(n_long + n_short)]
        long_at = set(rng.sample(range(len(paths)), n_long))  # the long files anywhere among the lanes
        for i, p in enumerate(paths):
            p.write_bytes(rng.randbytes(3 * MIB + rng.randrange(200) if i in long_at else rng.randrange(64, 9000)))
        assert mod.md5_files([str(p) for p in paths]) == [hashlib_md5(p) for p in paths], (n_long, n_short)
    # the lanes take the largest files first, so the first lane holds the longest file: here a later lane's file
    # outlives it (lane 1 takes the 1.9 MiB file once its 2 MiB one ends, lane 0's 3 MiB one ends first), and its
    # state moves to the front when the job narrows to one lane
    sizes = [2 * MIB] * 7 + [int(1.9 * MIB)] + [3 * MIB] + [2 * MIB] * 8
    paths = [tmp_path / f"m{i}" for i in range(len(sizes))]
    for p, n in zip(paths, sizes, strict=True):
        p.write_bytes(rng.randbytes(n + rng.randrange(64)))
    assert mod.md5_files([str(p) for p in paths]) == [hashlib_md5(p) for p in paths]


def test_md5_files_is_md5_file_of_each_with_and_without_the_extension(files) -> None:
    want = [md5_file(p) for p in files]
    assert md5_files(files) == want
    assert md5_files([]) == []
    assert md5_files(files[:1]) == want[:1]
    # BERTPIPE_NATIVE=0: the plain path, same digests
    code = ("import sys, json; from core.manifest import md5_files, _MD5; "
            "print(json.dumps([md5_files(sys.argv[1:]), _MD5.module is None]))")
    env = dict(os.environ, BERTPIPE_NATIVE="0")
    res = subprocess.run([sys.executable, "-c", code, *map(str, files[:6])], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    import json

    digests, plain = json.loads(res.stdout)
    assert digests == want[:6] and plain


def test_an_unreadable_file_is_named(files, tmp_path) -> None:
    native()
    missing = tmp_path / "gone.bin"
    with pytest.raises(FileNotFoundError) as e:
        md5_files([files[3], missing, files[4]])
    assert str(missing) in str(e.value)
    with pytest.raises(IsADirectoryError):
        md5_files([files[3], tmp_path])


def test_verify_files_names_the_first_file_that_changed(files, tmp_path) -> None:
    copies = []
    for p in files[:6]:
        q = tmp_path / p.name
        shutil.copy(p, q)
        copies.append(q)
    checks = [FileCheck(q, md5_file(q), q.stat().st_size, True, "listed in a test") for q in copies]
    verify_files(checks)  # intact: no error
    victim = copies[4]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    with pytest.raises(ChecksumError) as e:
        verify_files(checks)
    assert str(victim) in str(e.value) and checks[4].md5 in str(e.value)
    # a file not due for hashing is only checked for its size
    verify_files([FileCheck(c.path, c.md5, c.size, c.path != victim, c.what) for c in checks])


@pytest.mark.parametrize("cc", ["gcc", "clang"])
def test_the_kernels_build_with_gcc_and_clang_alike(cc, files, tmp_path, monkeypatch) -> None:
    """core/_native/md5.c compiles with either compiler (they spell vector shuffles differently: GCC's
    __builtin_shuffle, Clang's __builtin_shufflevector) and every kernel of either build gives hashlib's digests."""
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    from core import native

    monkeypatch.setenv("CC", cc)
    target = tmp_path / f"_md5_native_{cc}.so"
    native.compile_extension(ROOT / "core" / "_native" / "md5.c", target, "test")
    mod = native.load_file("core._md5_native", target)
    want = [hashlib_md5(p) for p in files]
    for k in mod.kernels():
        assert mod.md5_files([str(p) for p in files], k) == want, (cc, k)
    assert mod.md5_files([str(p) for p in files]) == want


def test_buffers_hash_as_files_with_every_kernel_and_without_the_extension(files, monkeypatch) -> None:
    """md5_buffers: the packers' images, hashed from memory side by side, equal hashlib's digests for every size
    around the block and piece edges, bytes, memoryviews and uint8 arrays alike, in the given order."""
    import numpy as np

    from core.manifest import md5_buffers

    mod = native()
    bufs = [p.read_bytes() for p in files]
    kinds = [b if i % 3 == 0 else memoryview(bytearray(b)) if i % 3 == 1 else np.frombuffer(b, np.uint8)
             for i, b in enumerate(bufs)]
    want = [hashlib.md5(b).hexdigest() for b in bufs]
    assert md5_buffers(kinds) == want
    for k in mod.kernels():
        for n in (1, 2, 5, 17, len(kinds)):
            assert mod.md5_buffers(kinds[:n], k) == want[:n], (k, n)
    assert md5_buffers([]) == [] and md5_buffers(kinds[:1]) == want[:1]
    monkeypatch.setenv("BERTPIPE_NATIVE", "0")
    monkeypatch.setattr(_MD5, "module", None)
    monkeypatch.setattr(_MD5, "reason", "")
    assert md5_buffers(kinds[:7]) == want[:7]


def test_a_strided_buffer_is_refused() -> None:
    import numpy as np

    mod = native()
    with pytest.raises((BufferError, ValueError)):
        mod.md5_buffers([np.arange(100, dtype=np.uint8)[::2], b"x"])
