"""Hostile archives are refused before anything is written."""

from __future__ import annotations

import io
import tarfile

import pytest

from core.errors import InputError
from preprocessing.text.archive import safe_extract_tar


def _tar(path, members):
    with tarfile.open(path, "w:gz") as tf:
        for name, data, kind in members:
            info = tarfile.TarInfo(name)
            if kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def test_regular_archive_extracts(tmp_path):
    _tar(tmp_path / "ok.tgz", [("results/part-00000-of-00500", b"a\n", "f"), ("results/eval.txt", b"b\n", "f")])
    names = safe_extract_tar(tmp_path / "ok.tgz", tmp_path / "out")
    assert sorted(names) == ["results/eval.txt", "results/part-00000-of-00500"]
    assert (tmp_path / "out/results/eval.txt").read_bytes() == b"b\n"


@pytest.mark.parametrize("bad", [("../evil", b"x", "f"), ("/tmp/evil-abs", b"x", "f"),
                                 ("a/../../evil", b"x", "f"), ("link", "/etc/passwd", "sym")])
def test_escaping_members_are_refused_before_writing(tmp_path, bad):
    _tar(tmp_path / "bad.tgz", [("results/ok.txt", b"fine", "f"), bad])
    with pytest.raises(InputError, match="bad.tgz") as e:
        safe_extract_tar(tmp_path / "bad.tgz", tmp_path / "out")
    assert repr(bad[0]) in str(e.value)
    assert not (tmp_path / "out").exists()  # nothing was written, not even the harmless member
    assert not (tmp_path / "evil").exists()


def test_not_a_tar(tmp_path):
    (tmp_path / "x.tgz").write_bytes(b"not a tar")
    with pytest.raises(InputError, match="not a readable tar archive"):
        safe_extract_tar(tmp_path / "x.tgz", tmp_path / "out")
