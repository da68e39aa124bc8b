"""NVIDIA's hdf5_md5.py as a library function, the published .chk lists that ship with bertpipe, and
`bertpipe verify --against`."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402
import vendor_scripts as vs  # noqa: E402

from core.errors import InputError  # noqa: E402
from preprocessing.nvidia import chop as nvidia_chop  # noqa: E402
from preprocessing.nvidia import md5 as nvidia_md5  # noqa: E402
from preprocessing.nvidia import shuffle as nvidia_shuffle  # noqa: E402
from preprocessing.nvidia.md5 import CHK_DIR, PUBLISHED, hdf5_md5, read_chk, resolve_chk, verify_against  # noqa: E402

#: The lists that ship (preprocessing/nvidia/nvidia_chk/README.md): file, md5 of the whole file as committed, first and
#: last line of the source. A list edited by hand, truncated or replaced fails here.
SHIPPED = {
    "nvidia-4320": ("4320_shards_varlength.chk", "0240361a5ca3f945ae5a81fc30c8e6cf",
                    "part_00000_of_04320.hdf5\te25b1a34b8d14179b2774d1dbf3b7561",
                    "part_04319_of_04320.hdf5\t478d03bc59e973f768a340dd35279323"),
    "nvidia-4320-shuffled": ("4320_shards_varlength_shuffled.chk", "6b740b99e4042500934a98482dd7f75a",
                             "part_00000_of_04320.hdf5\ta0592b1f501328540c6fe8404a1c7f81",
                             "part_04319_of_04320.hdf5\t40fed5d528ee7472f15c64608b0982d3"),
    "nvidia-4320-v1.1": ("4320_shards_varlength_v1.1.chk", "9fc35f3f241c939a10bc3f703f1dd5ab",
                         "part_00000_of_04320.hdf5\te25b1a34b8d14179b2774d1dbf3b7561",
                         "part_04319_of_04320.hdf5\t76985d700c2ea35390a32549492fe914"),
    "nvidia-2048": ("2048_shards_varlength.chk", "f1d1ad660560d2b62f3c3818bf2361fc",
                    "part_00000_of_02048.hdf5\tac517231f748d9ae0dad04cce21ab01d",
                    "part_02047_of_02048.hdf5\t7460162aaa6952ee5192e6fb3c5d5805"),
    "nvidia-eval": ("eval_varlength.chk", "b2feddc2a83409843d5f56c2143af81e",
                    "part_eval_10k.hdf5\t611d8bae26646145e1c33338a27ba124", None),
}
#: Where each shipped list comes from in ../shared/reference (the vendors' folders; README there and in nvidia_chk).
SOURCE = {"nvidia-4320": "nvidia-v3.1/input_preprocessing/4320_shards_varlength.chk",
          "nvidia-4320-shuffled": "nvidia-v3.1/input_preprocessing/4320_shards_varlength_shuffled.chk",
          "nvidia-4320-v1.1": "nvidia-v1.1/input_preprocessing/4320_shards_varlength.chk",
          "nvidia-2048": "nvidia-v3.1/input_preprocessing/2048_shards_varlength.chk",
          "nvidia-eval": "nvidia-v3.1/input_preprocessing/eval_varlength.chk"}


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


def test_every_published_name_is_shipped(monkeypatch, tmp_path):
    """The names --against knows are exactly the lists that ship, each paired with the chop rule that made it; a list
    missing from an installation is refused in one line naming the file and what to do, never made up."""
    assert set(PUBLISHED) == set(SHIPPED) == set(nvidia_md5.RULE_OF)
    assert {n: PUBLISHED[n] for n in SHIPPED} == {n: v[0] for n, v in SHIPPED.items()}
    assert sorted(p.name for p in CHK_DIR.glob("*.chk")) == sorted(v[0] for v in SHIPPED.values())
    assert nvidia_md5.RULE_OF == {"nvidia-4320": "v3.1", "nvidia-4320-shuffled": "v3.1", "nvidia-4320-v1.1": "v1.1",
                                  "nvidia-2048": "v1.1", "nvidia-eval": None}
    monkeypatch.setattr(nvidia_md5, "CHK_DIR", tmp_path)
    with pytest.raises(InputError, match=r"^--against nvidia-2048: the list 2048_shards_varlength.chk is not "
                                         r"shipped with this bertpipe .*give the path of a \.chk file instead$"):
        resolve_chk("nvidia-2048")


@pytest.mark.parametrize("against", sorted(SHIPPED))
def test_shipped_lists_name_their_source(against):
    """The README beside the lists gives each one's row: its ``--against`` name, the file, where it comes from
    (the round's repository, the file name there) and the md5 of the file that ships (test_shipped_lists checks the
    file against that md5; test_shipped_lists_are_the_vendors_files against the vendors' copy)."""
    rows = [line for line in (CHK_DIR / "README.md").read_text().splitlines() if line.startswith(f"| `{against}` |")]
    assert len(rows) == 1, rows
    row = rows[0]
    name, md5 = SHIPPED[against][:2]
    folder, source = SOURCE[against].split("/input_preprocessing/")
    repo = {"nvidia-v3.1": "mlcommons/training_results_v3.1", "nvidia-v1.1": "mlcommons/training_results_v1.1"}[folder]
    assert f"| `{name}` |" in row and f"`{md5}`" in row and source in row
    assert repo in row or "both folders above" in row


@vs.needs_reference("nvidia-v3.1/input_preprocessing", "nvidia-v1.1/input_preprocessing")
def test_shipped_lists_are_the_vendors_files():
    """Each shipped list is byte for byte the file in the vendors' folder (../shared/reference) its README names."""
    for against, rel in SOURCE.items():
        assert (CHK_DIR / PUBLISHED[against]).read_bytes() == (vs.REFERENCE / rel).read_bytes(), against


@pytest.mark.parametrize("against", sorted(SHIPPED))
def test_shipped_lists(against):
    """Each list that ships parses and is byte for byte the file committed; the 4,320-shard lists name every shard
    once, in order, as the chop and shuffle stages name their files; the eval list is the one line NVIDIA
    publishes."""
    name, md5, first, last = SHIPPED[against]
    path = CHK_DIR / name
    assert resolve_chk(against) == path
    data = path.read_bytes()
    assert hashlib.md5(data).hexdigest() == md5
    lines = data.decode("ascii").split("\n")
    assert lines[-1] == "" and lines[0] == first and (last is None or lines[-2] == last)
    chk = read_chk(path)
    if against == "nvidia-eval":
        assert chk == {"part_eval_10k.hdf5": "611d8bae26646145e1c33338a27ba124"}
        return
    n = 2048 if against == "nvidia-2048" else 4320
    names = [nvidia_chop.shard_name(k, n) for k in range(n)]
    assert names == [nvidia_shuffle.shard_name(k, n) for k in range(n)]
    assert [line.split("\t")[0] for line in lines[:-1]] == names  # n lines, in order, nothing else
    assert list(chk) == names and len(set(chk.values())) == n
    assert all(len(line) == 57 for line in lines[:-1])  # name<TAB>32 lowercase hex digits, no stray spaces


def test_the_shuffled_list_is_not_the_chopped_one():
    """Shuffling moves rows across shards: no shard of the shuffled set hashes like a chopped one."""
    chopped = set(read_chk(CHK_DIR / PUBLISHED["nvidia-4320"]).values())
    shuffled = set(read_chk(CHK_DIR / PUBLISHED["nvidia-4320-shuffled"]).values())
    assert len(chopped) == len(shuffled) == 4320 and not chopped & shuffled


def _made_up_shards(golden, d: Path, against: str) -> list[Path]:
    """Two real shards (golden files) under the names the stage behind ``against`` gives its first two files."""
    name = nvidia_shuffle.shard_name if against == "nvidia-4320-shuffled" else nvidia_chop.shard_name
    d.mkdir()
    out = []
    for k, src in enumerate(["eval_100.hdf5", "nvidia_varlength/eval_100_varlength.numpy1.hdf5"]):
        out.append(d / name(k, 4320))
        out[-1].write_bytes((golden / src).read_bytes())
    return out


@pytest.mark.parametrize("against", ["nvidia-4320", "nvidia-4320-shuffled"])
def test_verify_against_a_published_name(golden, tmp_path, monkeypatch, capsys, against):
    """--against <name> reads the list of that name: a made-up folder whose list agrees exits 0; the same list with
    one line changed names that shard alone and exits 1."""
    from bertpipe.cli import main

    shards = _made_up_shards(golden, tmp_path / "shards", against)
    lists = tmp_path / "chk"
    lists.mkdir()
    monkeypatch.setattr(nvidia_md5, "CHK_DIR", lists)
    monkeypatch.chdir(tmp_path)
    good = "".join(f"{p.name}\t{ref.hdf5_md5(p)}\n" for p in shards)
    (lists / PUBLISHED[against]).write_text(good)
    assert main(["verify", "--against", against, "--dir", str(tmp_path / "shards")]) == 0
    capsys.readouterr()
    wrong = ref.hdf5_md5(shards[0])[::-1]
    (lists / PUBLISHED[against]).write_text(good.replace(ref.hdf5_md5(shards[0]), wrong))
    assert main(["verify", "--against", against, "--dir", str(tmp_path / "shards")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"BAD  {shards[0].name}: hdf5_md5 {ref.hdf5_md5(shards[0])}, {PUBLISHED[against]} lists {wrong}"]


def test_verify_against_the_shipped_shuffled_list(golden, tmp_path, monkeypatch, capsys):
    """The shipped list itself: a made-up shard under NVIDIA's first shuffled name is reported with NVIDIA's digest,
    every other listed shard as missing, exit 1."""
    from bertpipe.cli import main

    shards = _made_up_shards(golden, tmp_path / "shards", "nvidia-4320-shuffled")
    monkeypatch.chdir(tmp_path)
    assert main(["verify", "--against", "nvidia-4320-shuffled", "--dir", str(tmp_path / "shards")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"BAD  part_00000_of_04320.hdf5: hdf5_md5 {ref.hdf5_md5(shards[0])}, "
                      "4320_shards_varlength_shuffled.chk lists a0592b1f501328540c6fe8404a1c7f81")
    assert out[1] == (f"BAD  part_00001_of_04320.hdf5: hdf5_md5 {ref.hdf5_md5(shards[1])}, "
                      "4320_shards_varlength_shuffled.chk lists c4ec4cc268d8e3b8b68064bcb36fd04f")
    assert out[2:] == [f"BAD  4,318 listed shard(s) missing from {tmp_path / 'shards'}: part_00002_of_04320.hdf5, "
                       "part_00003_of_04320.hdf5, part_00004_of_04320.hdf5, ... (4,315 more; -v lists all)"]
    assert main(["verify", "--against", "nvidia-2048", "--dir", str(tmp_path / "shards")]) == 1  # ships: all missing


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


# -- no false "all match" (issue 33, item 3) ----------------------------------------------------------------------------
def _folder_and_list(golden, tmp_path: Path) -> tuple[Path, Path]:
    d = tmp_path / "shards"
    d.mkdir()
    for k, name in enumerate(["eval_100.hdf5", "nvidia_varlength/eval_100_varlength.numpy1.hdf5"]):
        (d / f"part_{k:05d}_of_00002.hdf5").write_bytes((golden / name).read_bytes())
    chk = tmp_path / "good.chk"
    chk.write_text("".join(f"{p.name}\t{ref.hdf5_md5(p)}\n" for p in sorted(d.iterdir())))
    return d, chk


def _verify(argv: list[str], capsys) -> tuple[int, list[str], str]:
    from bertpipe.cli import main

    capsys.readouterr()
    rc = main(["verify", *argv])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


@pytest.mark.parametrize("name", ["../../x.hdf5", "/etc/x.hdf5", "sub/x.hdf5", "..", "a\\b.hdf5"])
def test_a_list_naming_a_path_outside_the_folder_is_refused(name, golden, tmp_path, capsys):
    d, chk = _folder_and_list(golden, tmp_path)
    outside = tmp_path / "x.hdf5"
    outside.write_bytes((d / "part_00000_of_00002.hdf5").read_bytes())
    chk.write_text(chk.read_text() + f"{name}\t{ref.hdf5_md5(outside)}\n")
    rc, out, err = _verify(["--against", str(chk), "--dir", str(d)], capsys)
    assert rc == 2 and "is not a file name" in err and "all match" not in err, err


def test_a_list_one_line_short_or_an_extra_shard_fails(golden, tmp_path, capsys):
    d, chk = _folder_and_list(golden, tmp_path)
    assert _verify(["--against", str(chk), "--dir", str(d)], capsys)[0] == 0
    short = tmp_path / "short.chk"
    short.write_text(chk.read_text().splitlines()[0] + "\n")  # a list one line short
    rc, out, err = _verify(["--against", str(short), "--dir", str(d)], capsys)
    assert rc == 1 and out == [f"BAD  1 entry of {d} not in short.chk (a trainer reading the folder would take them "
                               "for data): part_00001_of_00002.hdf5"] and "1 unlisted" in err, (out, err)
    (d / "part_00002_of_00002.hdf5").write_bytes((d / "part_00000_of_00002.hdf5").read_bytes())  # an extra shard
    rc, out, err = _verify(["--against", str(chk), "--dir", str(d)], capsys)
    assert rc == 1 and "part_00002_of_00002.hdf5" in out[0] and "all match" not in err


def test_a_listed_shard_that_is_a_link_is_not_followed(golden, tmp_path, capsys):
    import os

    d, chk = _folder_and_list(golden, tmp_path)
    real = tmp_path / "elsewhere.hdf5"
    (d / "part_00001_of_00002.hdf5").rename(real)
    os.symlink(real, d / "part_00001_of_00002.hdf5")
    rc, out, err = _verify(["--against", str(chk), "--dir", str(d)], capsys)
    assert rc == 1 and out == [f"BAD  part_00001_of_00002.hdf5: a symbolic link (to {real}), never followed"], out


def test_many_mismatches_print_a_summary_and_v_prints_all(golden, tmp_path, capsys, monkeypatch):
    for var in ("BERTPIPE_LOG_EXAMPLES", "BERTPIPE_VERBOSE"):  # -v sets them for child processes: restored after
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)
    d, chk = _folder_and_list(golden, tmp_path)
    lines = [f"part_{k:05d}_of_00040.hdf5\t{'0' * 32}\n" for k in range(40)]
    for k in range(15):  # 15 present with other digests, 25 missing
        (d / f"part_{k:05d}_of_00040.hdf5").write_bytes((d / "part_00000_of_00002.hdf5").read_bytes())
    for p in d.glob("part_*_of_00002.hdf5"):
        p.unlink()
    chk.write_text("".join(lines))
    rc, out, err = _verify(["--against", str(chk), "--dir", str(d)], capsys)
    assert rc == 1 and len(out) == 12, out  # 10 mismatches, the missing summary, "... 5 more"
    assert out[-1].startswith("...  5 more mismatch(es)") and "15 differ, 25 missing" in err
    rc, out, err = _verify(["--against", str(chk), "--dir", str(d), "-v"], capsys)
    assert rc == 1 and sum(ln.startswith("BAD  part_") for ln in out) == 15 and "part_00039_of_00040.hdf5" in out[15]
