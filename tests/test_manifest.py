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
    import core.manifest.format as mfmt  # the room whose verify reads files

    real = mfmt.md5_file
    monkeypatch.setattr(mfmt, "md5_file", lambda p, *a: hashed.append(Path(p).name) or real(p, *a))
    mf.verify_manifest(tmp_path / "s", trust_stat=True)
    assert hashed == []  # nothing changed: no file read
    b = tmp_path / "s" / "b.bin"
    st = b.stat()
    data = bytearray(b.read_bytes())
    data[0] ^= 1
    b.write_bytes(bytes(data))
    os.utime(b, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ChecksumError, match="b.bin"):
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


# -- what a manifest, a marker or a link may make bertpipe do (issue 23) -------------------------------------
def _stage(d: Path, files: dict[str, bytes]) -> dict:
    with StageOutput(d, "demo", params={"p": 1}) as st:
        for name, data in files.items():
            with st.open(name) as f:
                f.write(data)
    return json.loads((d / MANIFEST_NAME).read_text())


def _rewrite(d: Path, m: dict) -> None:
    from core.manifest import Manifest

    if isinstance(m.get("files"), list):
        try:
            m["digest"] = Manifest.from_dict(m).digest  # a careful forger: a valid digest (when the rest is valid)
        except (ValueError, TypeError, KeyError):
            pass
    (d / MANIFEST_NAME).write_text(json.dumps(m))


@pytest.mark.parametrize("mutate,why", [
    (lambda m: m.pop("files"), "no 'files' key"),
    (lambda m: m.__setitem__("files", []), "'files' list is empty"),
    (lambda m: m["files"][0].__setitem__("name", "../../victim"), "'..' component"),
    (lambda m: m["files"][0].__setitem__("name", "/etc/passwd"), "absolute path"),
    (lambda m: m["files"][0].__setitem__("name", "..\\x"), "backslash"),
    (lambda m: m["files"][0].__setitem__("name", "a//b"), "empty, '.' or '..'"),
    (lambda m: m["files"][0].__setitem__("name", "C:x"), "drive letter"),
    (lambda m: m["files"][0].__setitem__("name", "a\nb"), "control character"),
    (lambda m: m["files"][0].__setitem__("name", ".verified.json"), "keeps for itself"),
    (lambda m: m["files"][0].__setitem__("name", ".a.tmp-12"), "keeps for itself"),
    (lambda m: m["files"][0].__setitem__("bytes", True), "not an integer"),
    (lambda m: m["files"][0].__setitem__("bytes", 1.5), "not an integer"),
    (lambda m: m["files"][0].__setitem__("md5", "X" * 32), "32 lowercase hex"),
    (lambda m: m["files"][0].__setitem__("extra", 1), "exactly name, bytes and md5"),
    (lambda m: m["files"].append("a"), "exactly name, bytes and md5"),
    (lambda m: m.__setitem__("stage", ""), "'stage' is empty"),
    (lambda m: m.__setitem__("key", 5), "'key' is a int"),
    (lambda m: m.__setitem__("params", []), "'params' is a list"),
    (lambda m: m.__setitem__("upstream", {"a": 1}), "'upstream' maps"),
    (lambda m: m.__setitem__("format", 9), "format 9"),
    (lambda m: m.__setitem__("seconds", "1"), "'seconds' is a str"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_a_manifest_off_its_schema_is_corrupt_in_one_line(tmp_path, mutate, why):
    from core.errors import ManifestCorrupt

    d = tmp_path / "s"
    m = _stage(d, {"a": b"x", "b": b"y"})
    mutate(m)
    _rewrite(d, m)
    with pytest.raises(ManifestCorrupt, match="is corrupt") as e:
        load_manifest(d)
    assert why in str(e.value) and str(d / MANIFEST_NAME) in str(e.value) and "\n" not in str(e.value)
    assert is_done(d) is None


def test_a_manifest_edited_without_its_digest_and_unparseable_ones_are_corrupt(tmp_path):
    from core.errors import ManifestCorrupt

    d = tmp_path / "s"
    m = _stage(d, {"a": b"x"})
    m["files"][0]["bytes"] = 5
    (d / MANIFEST_NAME).write_text(json.dumps(m))  # digest left as it was
    with pytest.raises(ManifestCorrupt, match="digest"):
        load_manifest(d)
    for text in ("{", "[1]", "null", "\udcff"):
        (d / MANIFEST_NAME).write_bytes(text.encode("utf-8", "surrogateescape"))
        with pytest.raises(ManifestCorrupt, match="is corrupt"):
            load_manifest(d)


def test_manifests_and_outputs_are_never_read_through_a_link(tmp_path):
    from core.errors import ManifestCorrupt

    d, victim = tmp_path / "s", tmp_path / "victim"
    victim.mkdir()
    _stage(d, {"sub/a": b"abc"})
    (victim / "a").write_bytes(b"abc")
    (d / "sub" / "a").unlink()
    (d / "sub" / "a").symlink_to(victim / "a")  # same bytes, outside
    with pytest.raises(ManifestError, match="symbolic link"):
        verify_manifest(d)
    (d / "sub" / "a").unlink()
    (d / "sub").rmdir()
    (victim / "sub").mkdir()
    (victim / "sub" / "a").write_bytes(b"abc")
    (d / "sub").symlink_to(victim / "sub")  # a link where the output's folder belongs
    with pytest.raises(ManifestError, match="sub is a symbolic link"):
        verify_manifest(d)
    (d / "m.json").write_bytes((d / MANIFEST_NAME).read_bytes())
    (d / MANIFEST_NAME).unlink()
    (d / MANIFEST_NAME).symlink_to(d / "m.json")
    with pytest.raises(ManifestCorrupt, match="symbolic link, which is never followed"):
        load_manifest(d)
    (d / MANIFEST_NAME).unlink()
    import os

    os.mkfifo(d / MANIFEST_NAME)  # would block a plain read
    with pytest.raises(ManifestCorrupt, match="not a plain file"):
        load_manifest(d)


def test_drop_records_what_it_dropped_and_a_record_that_does_not_match_is_ignored(tmp_path):
    from core.manifest import DROPPED_NAME, drop_files, dropped_info

    d = tmp_path / "w" / "s"
    m = _stage(d, {"a": b"x" * 10, "b/c": b"y" * 5})
    assert drop_files(d, "--keep training", root=tmp_path / "w") == 15
    info = json.loads((d / DROPPED_NAME).read_text())
    assert info["format"] == 2 and info["manifest"] == m["digest"]
    assert info["files"] == [["a", 10, hashlib.md5(b"x" * 10).hexdigest()], ["b/c", 5, hashlib.md5(b"y" * 5).hexdigest()]]
    assert dropped_info(d) == info and not (d / "a").exists()
    for bad in ({**info, "format": 1}, {**info, "manifest": "0" * 32}, {**info, "files": info["files"][:1]},
                {"files": 2, "bytes": 15, "why": "x", "when": "y"}, [1]):
        (d / DROPPED_NAME).write_text(json.dumps(bad))
        assert dropped_info(d) is None, bad
        assert is_done(d) is None  # the files are checked as usual: missing


def test_drop_refuses_outside_the_work_dir_and_links_on_the_way_and_unlinks_links_unfollowed(tmp_path):
    from core.manifest import drop_files

    work, victim = tmp_path / "w", tmp_path / "victim"
    _stage(victim / "s", {"a": b"x", "sub/b": b"y"})
    work.mkdir()
    (work / "tf").symlink_to(victim)  # a stage folder that is a link out of the work dir
    with pytest.raises(ManifestError, match="outside the work dir .*nothing was deleted"):
        drop_files(work / "tf" / "s", "--keep training", root=work)
    assert (victim / "s" / "a").read_bytes() == b"x"
    (work / "tf").unlink()
    _stage(work / "s", {"a": b"x", "sub/b": b"y"})
    import shutil

    shutil.rmtree(work / "s" / "sub")
    (work / "s" / "sub").symlink_to(victim / "s" / "sub")  # a link where an output's folder belongs
    with pytest.raises(ManifestError, match="sub is a symbolic link.*nothing was deleted"):
        drop_files(work / "s", "--keep training", root=work)
    assert (work / "s" / "a").exists() and (victim / "s" / "sub" / "b").read_bytes() == b"y"
    (work / "s" / "sub").unlink()
    (work / "s" / "sub").mkdir()
    (work / "s" / "sub" / "b").symlink_to(victim / "s" / "sub" / "b")  # the output itself a link: the link goes
    drop_files(work / "s", "--keep training", root=work)
    assert not (work / "s" / "sub" / "b").is_symlink() and (victim / "s" / "sub" / "b").read_bytes() == b"y"


def test_a_redo_removes_links_and_folders_where_outputs_belong_without_following_them(tmp_path):
    import shutil

    d, victim = tmp_path / "s", tmp_path / "victim"
    _stage(d, {"a": b"x", "sub/b": b"y"})
    victim.mkdir()
    (victim / "keep").write_bytes(b"mine")
    (d / "a").unlink()
    (d / "a").mkdir()  # a folder where an output belongs
    (d / "a" / "inside").write_bytes(b"z")
    shutil.rmtree(d / "sub")
    (d / "sub").symlink_to(victim)  # a link where an output's folder belongs
    assert is_done(d) is None
    _stage(d, {"a": b"x", "sub/b": b"y"})  # redone: writes inside the stage folder
    assert (d / "a").read_bytes() == b"x" and not (d / "sub").is_symlink()
    assert sorted(p.name for p in victim.iterdir()) == ["keep"] and is_done(d) is not None


def test_debris_sweep_does_not_follow_linked_folders(tmp_path):
    from core.manifest import remove_debris

    d, victim = tmp_path / "s", tmp_path / "victim"
    victim.mkdir()
    (victim / ".x.tmp-123").write_bytes(b"mine")
    d.mkdir()
    (d / "link").symlink_to(victim)
    (d / ".y.tmp-5").write_bytes(b"debris")
    remove_debris(d)
    assert (victim / ".x.tmp-123").exists() and not (d / ".y.tmp-5").exists()


def test_stat_records_of_another_shape_are_ignored(tmp_path):
    from core.manifest import STAT_NAME, read_stat_records, recording_stats

    d = tmp_path / "s"
    with recording_stats():
        _stage(d, {"a": b"x"})
    good = read_stat_records(d)
    assert set(good) == {"a"}
    (d / STAT_NAME).write_text(json.dumps({**good, "../v": good["a"], "/abs": good["a"], "b": "x",
                                           "c": [1, 2, 3, "4", "0" * 32], "d": [1, 2, 3, 4, "nothex"]}))
    assert read_stat_records(d) == good
    (d / STAT_NAME).write_text("[1]")
    assert read_stat_records(d) == {}


def test_core_manifest_is_rooms_of_one_purpose_each():
    """Issue 32 item 2: the manifest format, safe writes, deletion guards and the stage writer are modules of their
    own (each near 400 lines at most); ``from core.manifest import X`` keeps working for every name."""
    import core.manifest as facade
    from core.manifest import format as fmt
    from core.manifest import guards, output, writes

    root = Path(facade.__file__).parent
    for room in (fmt, writes, guards, output):
        assert len(Path(room.__file__).read_text().splitlines()) <= 440, room.__name__
    for name in ("Manifest", "verify_manifest", "load_manifest", "output_problem", "md5_files"):
        assert getattr(facade, name) is getattr(fmt, name)
    for name in ("atomic_write_text", "raise_if_disk_full", "fault_point", "gate"):
        assert getattr(facade, name) is getattr(writes, name)
    for name in ("check_inside", "clear_links", "begin_redo", "drop_files", "remove_debris"):
        assert getattr(facade, name) is getattr(guards, name)
    assert facade.StageOutput is output.StageOutput and facade.deferred_md5 is output.deferred_md5
    assert (root.parent / "_native" / "md5.c").is_file()  # the md5 C core is found from its new place
