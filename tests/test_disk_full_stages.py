"""Real stages that run out of disk (EFBIG under RLIMIT_FSIZE, as `ulimit -f`): exit status 2 and one error
line naming the file and saying to free space and re-run; no manifest and no temporary debris; the re-run
without the limit writes the bytes of an unlimited run (the golden files).

Each stage is the real CLI in a subprocess: ``bertpipe text`` (StageOutput text files), ``bertpipe
tfrecord-to-hdf5`` (an h5py write: HDF5 reports the full disk as OSError, then RuntimeError when closing)
and ``bertpipe create-pretraining-data --output_file`` (a plain buffered file without a manifest).
"""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.manifest import MANIFEST_NAME, md5_file, verify_manifest

BERTPIPE = str(Path(sys.executable).parent / "bertpipe")


def _bertpipe(*args: object, limit: int | None = None) -> subprocess.CompletedProcess:
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the CLI ignores it too; the write then fails with EFBIG
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([BERTPIPE, *map(str, args), "-q"], capture_output=True, text=True, preexec_fn=pre,
                          timeout=300)


def _assert_disk_full(r: subprocess.CompletedProcess, command: str, out_dir: Path) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1, r.stderr  # one clear line, no traceback
    msg = lines[0]
    assert msg.startswith(f"bertpipe {command}: error: the file-size limit was reached while writing {out_dir}/"), msg
    assert "Free space" in msg and "re-run" in msg, msg
    assert "Traceback" not in r.stderr


def _files(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()) if d.exists() else []


def test_text_stage_hits_efbig_then_rerun_gives_golden_bytes(golden: Path, tmp_path: Path) -> None:
    src, out = golden / "text_chain", tmp_path / "text"
    args = ("text", "--extracted", src / "text", "--out", out, "--num-test-articles", "20", "--workers", "1")
    r = _bertpipe(*args, limit=200_000)  # part-00000-of-00500 is 1.9 MB, eval.txt 635 kB
    _assert_disk_full(r, "text", out)
    assert _files(out) == []  # no manifest, no partial outputs, no .tmp- debris

    r = _bertpipe(*args)
    assert r.returncode == 0, r.stderr
    m = verify_manifest(out)
    assert sorted(f.name for f in m.files) == ["eval.md5", "eval.txt", "part-00000-of-00500"]
    for name in ("part-00000-of-00500", "eval.txt", "eval.md5"):
        assert md5_file(out / name) == md5_file(src / name), name
    assert _files(out) == sorted([MANIFEST_NAME, "eval.md5", "eval.txt", "part-00000-of-00500"])


def test_hdf5_stage_hits_efbig_then_rerun_gives_the_unlimited_bytes(golden: Path, tmp_path: Path) -> None:
    src = golden / "eval_100.tfrecord"
    out, free = tmp_path / "h5", tmp_path / "free"
    r = _bertpipe("tfrecord-to-hdf5", "--input", src, "--output", f"{out}/", limit=100_000)  # the HDF5 is 364 kB
    _assert_disk_full(r, "tfrecord-to-hdf5", out)
    assert "eval_100.tfrecord.hdf5" in r.stderr
    assert _files(out) == []

    assert _bertpipe("tfrecord-to-hdf5", "--input", src, "--output", f"{out}/").returncode == 0
    assert _bertpipe("tfrecord-to-hdf5", "--input", src, "--output", f"{free}/").returncode == 0
    verify_manifest(out)
    assert md5_file(out / "eval_100.tfrecord.hdf5") == md5_file(free / "eval_100.tfrecord.hdf5")
    assert _files(out) == [MANIFEST_NAME, "eval_100.tfrecord.hdf5"]
    import h5py

    if (h5py.version.version, h5py.version.hdf5_version) == ("3.14.0", "1.14.6"):  # the golden file's library
        assert md5_file(out / "eval_100.tfrecord.hdf5") == md5_file(golden / "eval_100.hdf5")


@pytest.mark.parametrize("impl", ["auto", "plain"])
def test_create_pretraining_data_file_hits_efbig_without_debris(golden: Path, shared_data: Path, tmp_path: Path,
                                                                impl: str) -> None:
    out = tmp_path / "out" / "sample_128.tfrecord"
    args = ("create-pretraining-data", "--input_file", golden / "text_chain" / "part-00000-of-00500",
            "--output_file", out, "--vocab_file", shared_data / "vocab.txt", "--max_seq_length", "128",
            "--max_predictions_per_seq", "20", "--dupe_factor", "2", "--impl", impl)
    r = _bertpipe(*args, limit=1_000_000)  # the TFRecord is 6.7 MB
    _assert_disk_full(r, "create-pretraining-data", out.parent)
    assert str(out) in r.stderr
    assert _files(out.parent) == []  # the temporary .sample_128.tfrecord.tmp-<pid> is gone too

    assert _bertpipe(*args).returncode == 0
    assert md5_file(out) == md5_file(golden / "sample_128.tfrecord")
    assert _files(out.parent) == ["sample_128.tfrecord"]


def test_disk_full_errno_sees_through_h5py_errors() -> None:
    from core.manifest import disk_full_errno

    try:  # what h5py raises: the failed write, then a failure to close the file while handling it
        try:
            raise OSError(27, "Can't synchronously write data (file write failed: ..., 'File too large')")
        except OSError:
            raise RuntimeError("Can't decrement id ref count (unable to extend file properly)")  # noqa: B904
    except RuntimeError as exc:
        assert disk_full_errno(exc) == 27
    assert disk_full_errno(RuntimeError("unable to extend file properly, errno = 28, error message = ...")) == 28
    assert disk_full_errno(OSError(2, "No such file")) is None
    assert disk_full_errno(ValueError("errno = 28")) is None  # only OSError / RuntimeError are looked at
