"""NVIDIA's hdf5_md5.py as a library function, the published .chk lists that ship with bertpipe, and
`bertpipe verify --against`."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import nvidia_reference as ref  # noqa: E402

from core.errors import InputError  # noqa: E402
from preprocessing.nvidia_md5 import CHK_DIR, PUBLISHED, hdf5_md5, read_chk, resolve_chk, verify_against  # noqa: E402


@pytest.mark.parametrize("name", ["eval_100.hdf5", "nvidia_varlength/eval_100_varlength.numpy1.hdf5"])
def test_digest_equals_the_script(golden, name):
    """Padded rows hash with their zeros, vlen rows as they are; any chunk size gives the script's digest."""
    want = ref.hdf5_md5(golden / name)
    assert hdf5_md5(golden / name) == hdf5_md5(golden / name, chunk_rows=7) == want


def test_digest_of_an_empty_file_and_errors(tmp_path):
    with h5py.File(tmp_path / "empty.hdf5", "w") as f:
        f.create_dataset("input_ids", (0,), dtype=h5py.vlen_dtype(np.dtype("int16")))
    assert hdf5_md5(tmp_path / "empty.hdf5") == ref.hdf5_md5(tmp_path / "empty.hdf5")  # md5 of "[]"
    with h5py.File(tmp_path / "noids.hdf5", "w") as f:
        f.create_dataset("segment_ids", data=np.zeros(3, "i1"))
    with pytest.raises(InputError, match="noids.hdf5 has no input_ids"):
        hdf5_md5(tmp_path / "noids.hdf5")
    (tmp_path / "text.hdf5").write_text("not hdf5")
    with pytest.raises(InputError, match="text.hdf5 is not a readable HDF5"):
        hdf5_md5(tmp_path / "text.hdf5")


def test_chk_format(tmp_path):
    p = tmp_path / "x.chk"
    p.write_text("part_00000_of_00002.hdf5\t0123456789ABCDEF0123456789abcdef\n\npart_00001_of_00002.hdf5 "
                 "fedcba9876543210fedcba9876543210\n")
    assert read_chk(p) == {"part_00000_of_00002.hdf5": "0123456789abcdef0123456789abcdef",
                           "part_00001_of_00002.hdf5": "fedcba9876543210fedcba9876543210"}
    p.write_text("part_00000_of_00002.hdf5\tnot-an-md5\n")
    with pytest.raises(InputError, match="x.chk line 1: .* is not 'name<TAB>md5'"):
        read_chk(p)


@pytest.mark.parametrize("against", sorted(PUBLISHED))
def test_shipped_lists(against):
    """Each list that ships parses, names every shard once and in NVIDIA's naming; the eval list is the one line
    NVIDIA publishes."""
    path = CHK_DIR / PUBLISHED[against]
    if not path.is_file():
        pytest.skip(f"{path.name} is not shipped (see {CHK_DIR / 'README.md'})")
    chk = read_chk(path)
    assert resolve_chk(against) == path
    if against == "nvidia-eval":
        assert chk == {"part_eval_10k.hdf5": "611d8bae26646145e1c33338a27ba124"}
    else:
        assert sorted(chk) == [f"part_{k:05d}_of_04320.hdf5" for k in range(4320)]
        assert len(set(chk.values())) == 4320
        assert path.read_text().count("\n") == 4320


def test_verify_against(golden, tmp_path, monkeypatch):
    from bertpipe.cli import main

    d = tmp_path / "shards"
    d.mkdir()
    for k, name in enumerate(["eval_100.hdf5", "nvidia_varlength/eval_100_varlength.numpy1.hdf5"]):
        (d / f"part_{k:05d}_of_00002.hdf5").write_bytes((golden / name).read_bytes())
    good = tmp_path / "good.chk"
    good.write_text("".join(f"{p.name}\t{ref.hdf5_md5(p)}\n" for p in sorted(d.iterdir())))
    assert [r.ok for r in verify_against(d, read_chk(good), workers=2)] == [True, True]
    monkeypatch.chdir(tmp_path)
    assert main(["verify", "--against", str(good), "--dir", str(d)]) == 0
    bad = tmp_path / "bad.chk"
    bad.write_text(good.read_text().replace(ref.hdf5_md5(d / "part_00001_of_00002.hdf5"), "0" * 32)
                   + "part_00002_of_00002.hdf5\t" + "1" * 32 + "\n")
    res = verify_against(d, read_chk(bad))
    assert [(r.name, r.ok, bool(r.actual)) for r in res] == [("part_00000_of_00002.hdf5", True, True),
                                                             ("part_00001_of_00002.hdf5", False, True),
                                                             ("part_00002_of_00002.hdf5", False, False)]
    assert main(["verify", "--against", str(bad), "--dir", str(d)]) == 1
    assert main(["verify", "--against", "nvidia-9999", "--dir", str(d)]) == 2
    assert main(["verify", "--dir", str(d)]) == 2  # --dir needs --against
