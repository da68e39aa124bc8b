"""The artifact/manifest library: streaming md5, atomic outputs, manifest written last, verification."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from core.errors import ChecksumError, ManifestError
from core.manifest import (
    MANIFEST_NAME,
    StageOutput,
    is_done,
    load_manifest,
    md5_file,
    stage_key,
    verify_manifest,
)


def test_md5_known_answers(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"")
    assert md5_file(p) == "d41d8cd98f00b204e9800998ecf8427e"
    p.write_bytes(b"The quick brown fox jumps over the lazy dog")
    assert md5_file(p) == "9e107d9d372bb6826bd81d3542a419d6"
    big = bytes(range(256)) * 9000  # spans several read chunks
    p.write_bytes(big)
    assert md5_file(p, chunk=4096) == hashlib.md5(big).hexdigest()


def test_stage_output_records_streaming_md5_and_writes_manifest_last(tmp_path):
    out = tmp_path / "stage"
    with StageOutput(out, "demo", params={"a": 1}) as st:
        with st.open_text("sub/a.txt") as f:
            f.write("héllo\r\nworld\n")
            assert not (out / "sub" / "a.txt").exists()  # temp name while writing
            assert not (out / MANIFEST_NAME).exists()
        with st.open("b.bin") as f:
            f.write(b"\x00" * 10)
        st.count("documents", 3)
        assert not (out / MANIFEST_NAME).exists()
    m = verify_manifest(out)
    assert (out / "sub" / "a.txt").read_bytes() == "héllo\r\nworld\n".encode()
    assert m.file("sub/a.txt").md5 == hashlib.md5("héllo\r\nworld\n".encode()).hexdigest()
    assert m.file("b.bin").bytes == 10
    assert m.counters == {"documents": 3}
    assert json.loads((out / MANIFEST_NAME).read_text())["digest"] == m.digest
    assert not list(out.rglob(".*.tmp-*"))


def test_failed_stage_leaves_no_manifest_and_no_temp_files(tmp_path):
    out = tmp_path / "stage"
    with pytest.raises(RuntimeError), StageOutput(out, "demo") as st:
        with st.open("a.bin") as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    assert load_manifest(out) is None
    assert not (out / "a.bin").exists()
    assert not list(out.rglob(".*.tmp-*"))


def test_redo_removes_old_manifest_before_writing(tmp_path):
    out = tmp_path / "stage"
    with StageOutput(out, "demo") as st, st.open("a.bin") as f:
        f.write(b"one")
    with pytest.raises(KeyError), StageOutput(out, "demo") as st:
        raise KeyError("killed half-way")
    assert load_manifest(out) is None  # a half-redone stage is never "done"


def test_verify_names_file_expected_and_actual_md5(tmp_path):
    out = tmp_path / "stage"
    with StageOutput(out, "demo") as st, st.open("a.bin") as f:
        f.write(b"abc")
    expected = hashlib.md5(b"abc").hexdigest()
    (out / "a.bin").write_bytes(b"abd")
    with pytest.raises(ChecksumError) as e:
        verify_manifest(out)
    msg = str(e.value)
    assert str(out / "a.bin") in msg and expected in msg and hashlib.md5(b"abd").hexdigest() in msg
    assert is_done(out) is None
    (out / "a.bin").unlink()
    with pytest.raises(ManifestError, match="a.bin is missing"):
        verify_manifest(out)


def test_stage_key_depends_on_params_code_and_upstream():
    k = stage_key("s", "1", {"x": 1}, ["u"])
    assert k == stage_key("s", "1", {"x": 1}, ["u"])
    assert len({k, stage_key("s", "2", {"x": 1}, ["u"]), stage_key("s", "1", {"x": 2}, ["u"]),
                stage_key("s", "1", {"x": 1}, ["v"])}) == 4


def test_digest_is_stable_across_reruns(tmp_path):
    digests = []
    for i in range(2):
        with StageOutput(tmp_path / f"s{i}", "demo", params={"p": 1}) as st, st.open("a") as f:
            f.write(b"same bytes")
        digests.append(load_manifest(tmp_path / f"s{i}").digest)
    assert digests[0] == digests[1]


def test_refuses_path_escaping_stage_dir(tmp_path):
    with pytest.raises(ValueError, match="refusing to write '../evil'.*'..' component"), \
            StageOutput(tmp_path / "s", "demo") as st:
        with st.open("../evil") as f:
            f.write(b"x")


def test_symlinked_stage_dir_escaping_the_work_dir_is_refused(tmp_path):
    from core.errors import InputError

    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    (work / "tfrecord").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InputError, match="outside the work dir"), StageOutput(work / "tfrecord" / "k", "s", root=work):
        pass
    assert not list(outside.iterdir())
    with StageOutput(work / "ok" / "k", "s", root=work) as st, st.open("a") as f:  # a normal dir is fine
        f.write(b"x")


def test_stat_records_spare_rehashing_untouched_files_and_catch_edited_ones(tmp_path, monkeypatch) -> None:
    """verify_manifest(trust_stat=True) re-hashes only files whose size/mtime/ctime/inode changed since the
    md5 was last known; a same-size edit with the old mtime put back still changes the ctime."""
    import os

    import core.manifest as mf

    with mf.recording_stats(), mf.StageOutput(tmp_path / "s", "demo") as out:
        for name in ("a.bin", "b.bin"):
            with out.open(name) as f:
                f.write(os.urandom(4096))
    assert (tmp_path / "s" / mf.STAT_NAME).is_file()
    hashed = []
    real = mf.md5_file
    monkeypatch.setattr(mf, "md5_file", lambda p, *a: hashed.append(Path(p).name) or real(p, *a))
    mf.verify_manifest(tmp_path / "s", trust_stat=True)
    assert hashed == []  # nothing changed: no file read
    b = tmp_path / "s" / "b.bin"
    st = b.stat()
    data = bytearray(b.read_bytes())
    data[0] ^= 1
    b.write_bytes(bytes(data))
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(mf.ChecksumError, match="b.bin"):
        mf.verify_manifest(tmp_path / "s", trust_stat=True)
    assert hashed == ["b.bin"]
    mf.verify_manifest(tmp_path / "s", check_md5=False)  # sizes only: the edit goes unseen, by request


def test_every_bertpipe_error_crosses_a_pickle_intact() -> None:
    """Errors raised in pool or Dask workers reach the parent through pickle: same type, message and fields."""
    import errno
    import inspect
    import pickle

    import core.errors as errors

    samples = {
        errors.ChecksumError: errors.ChecksumError("/w/part-1", "a" * 32, "b" * 32, hint="re-run it"),
        errors.DiskFullError: errors.DiskFullError(errno.ENOSPC, "disk full writing /w/x: free some space"),
    }
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.BertpipeError) and c.__module__ == errors.__name__]
    assert errors.ChecksumError in classes and len(classes) >= 6
    for cls in classes:
        exc = samples.get(cls) or cls(f"{cls.__name__}: /w/file is bad; re-run the stage")
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is cls and str(back) == str(exc)
        assert vars(back) == vars(exc)


def test_deferred_md5_writes_what_two_stages_one_after_the_other_write(tmp_path) -> None:
    """deferred_md5: both stages' files hashed at the end, manifests written then (the upstream's first), equal to
    the manifests of the same two stages run one after the other; an error in the block leaves no manifest."""
    from core.manifest import deferred_md5, load_manifest

    def two_stages(root: Path) -> list:
        with StageOutput(root / "a", "tfrecord", params={"x": 1}) as a:
            with a.open("part-0") as f:
                f.write(b"tf" * 70001)
        with StageOutput(root / "b", "hdf5", params={"y": 2}, upstream=[a.manifest]) as b:
            (root / "b").mkdir(exist_ok=True)
            (root / "b" / "part-0.hdf5").write_bytes(b"h5" * 90001)
            b.add_file("part-0.hdf5")
            with b.open("side.txt") as f:
                f.write(b"s" * 10)
        return [a.manifest, b.manifest]

    plain = two_stages(tmp_path / "plain")
    with deferred_md5():
        deferred = two_stages(tmp_path / "deferred")
        assert not (tmp_path / "deferred" / "a" / MANIFEST_NAME).exists()  # not before the block ends
    for p, d, sub in zip(plain, deferred, "ab", strict=True):
        on_disk = load_manifest(tmp_path / "deferred" / sub)
        for m in (d, on_disk):
            assert (m.key, m.digest, m.upstream, m.files) == (p.key, p.digest, p.upstream, p.files)
    assert deferred[1].upstream == {f"tfrecord:{plain[0].key}": plain[0].digest}
    assert all(f.md5 == hashlib.md5((tmp_path / "plain" / s / f.name).read_bytes()).hexdigest()
               for m, s in zip(plain, "ab", strict=True) for f in m.files)

    with pytest.raises(RuntimeError, match="boom"), deferred_md5():
        two_stages(tmp_path / "failed")
        raise RuntimeError("boom")
    assert not list((tmp_path / "failed").rglob(MANIFEST_NAME))
