"""Bad input to the text stages: one clear error naming the path, and no manifest written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertpipe.cli import main
from core.errors import ChecksumError, InputError
from core.manifest import MANIFEST_NAME, FileEntry, Manifest, md5_file
from preprocessing.text.pipeline import TextConfig, run_text_stages
from preprocessing.text.split_eval import SplitEvalConfig, run_split_eval

CFG = TextConfig(num_test_articles=2, workers=1)
ROOT = Path(__file__).resolve().parents[3]


def _extracted(tmp_path: Path, files: dict[str, bytes]) -> Path:
    root = tmp_path / "extracted"
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


DOC = (b'<doc id="1" url="u" title="A">\nA\n\nFirst sentence here. Second one.\n</doc>\n'
       b'<doc id="2" url="u" title="B">\nB\n\nAnother article. With two sentences.\n</doc>\n')


def _no_outputs(out: Path) -> None:
    assert not (out / MANIFEST_NAME).exists()
    assert not list(out.glob("part-*"))


def test_missing_input_folder(tmp_path: Path) -> None:
    missing, out = tmp_path / "nope", tmp_path / "out"
    with pytest.raises(InputError, match=str(missing)):
        run_text_stages(missing, out, CFG)
    _no_outputs(out)


def test_empty_extractor_folder(tmp_path: Path) -> None:
    root = _extracted(tmp_path, {"AA/notes.txt": b"x", "AA/wiki_0": b"y"})  # nothing named wiki_??
    out = tmp_path / "out"
    with pytest.raises(InputError, match=rf"{root}.*holds no \*/wiki_\?\? files"):
        run_text_stages(root, out, CFG)
    _no_outputs(out)


def test_input_path_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "wiki_00"
    f.write_bytes(DOC)
    with pytest.raises(InputError, match=f"{f} is not a directory"):
        run_text_stages(f, tmp_path / "out", CFG)


def test_output_folder_under_a_file(tmp_path: Path) -> None:
    """Works as root too (chmod does not stop root): a path through a regular file cannot be created."""
    root = _extracted(tmp_path, {"AA/wiki_00": DOC})
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    out = blocker / "results"
    with pytest.raises(InputError, match=f"cannot create output folder {out}"):
        run_text_stages(root, out, CFG)
    assert blocker.read_text() == "a file, not a folder"


# The text stages in a child python that has lost root's way past permission bits: the capability bounding set
# drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (prctl PR_CAPBSET_DROP), then the child execs itself, so that its
# permitted and effective sets no longer hold them (as root, exec gives the bounding set). It prints its
# effective set, then the InputError's message.
_WITHOUT_DAC_OVERRIDE = r"""
import ctypes, os, sys
if sys.argv[1] == "drop":
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            sys.exit(f"cannot drop capability {cap}: {os.strerror(ctypes.get_errno())}")
    os.execv(sys.executable, [sys.executable, "-c", sys.argv[2], "run", *sys.argv[2:]])  # (argv as this one's)
from pathlib import Path
from core.errors import InputError
from preprocessing.text.pipeline import TextConfig, run_text_stages
print([x.split()[1] for x in open("/proc/self/status") if x.startswith("CapEff:")][0], flush=True)
try:
    run_text_stages(Path(sys.argv[3]), Path(sys.argv[4]), TextConfig(num_test_articles=2, workers=1))
except InputError as e:
    print(e)
    sys.exit(3)
"""


def test_read_only_output_folder(tmp_path: Path) -> None:
    """As a user, and as root: as root (which writes into read-only folders) the stages run in a child that has lost
    CAP_DAC_OVERRIDE, so the folder's mode binds it as it binds a user."""
    root = _extracted(tmp_path, {"AA/wiki_00": DOC})
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        if not os.access(out, os.W_OK):
            with pytest.raises(InputError, match=f"{out} is not writable"):
                run_text_stages(root, out, CFG)
        else:
            r = subprocess.run([sys.executable, "-c", _WITHOUT_DAC_OVERRIDE, "drop", _WITHOUT_DAC_OVERRIDE, str(root),
                                str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
            if r.returncode == 1 and r.stderr.startswith("cannot drop capability"):
                pytest.skip(f"this process writes into read-only folders and cannot give that up: {r.stderr.strip()}")
            cap_eff, *msg = r.stdout.splitlines()
            assert not int(cap_eff, 16) & 0b110, cap_eff  # the child had neither capability
            assert r.returncode == 3 and msg == [f"output folder {out} is not writable; choose another --out"], (
                r.returncode, r.stdout, r.stderr[-2000:])
    finally:
        out.chmod(0o700)
    _no_outputs(out)


def test_output_is_the_input_folder(tmp_path: Path) -> None:
    root = _extracted(tmp_path, {"AA/wiki_00": DOC})
    with pytest.raises(InputError, match="is the input folder"):
        run_text_stages(root, root, CFG)
    assert sorted(p.name for p in root.rglob("*")) == ["AA", "wiki_00"]


def test_undecodable_extractor_file(tmp_path: Path) -> None:
    root = _extracted(tmp_path, {"AA/wiki_00": DOC, "AA/wiki_01": DOC[:40] + b"\xff\xfe" + DOC[40:]})
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"wiki_01 is not valid UTF-8 \(byte offset 40\)"):
        run_text_stages(root, out, TextConfig(num_test_articles=2, workers=2))
    _no_outputs(out)
    assert not [p for p in out.rglob("*") if p.is_file()]  # temporary files removed too


def test_more_test_articles_than_a_file_holds(tmp_path: Path) -> None:
    root = _extracted(tmp_path, {"AA/wiki_00": DOC})  # 3 "articles": 2 real + the empty trailing one
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"wiki_00.3: 10000 test articles .* holds only 3"):
        run_text_stages(root, out, TextConfig(workers=1))
    _no_outputs(out)


def test_every_article_withheld_is_refused(tmp_path: Path) -> None:
    """All 3 articles to eval leaves an empty .4, on which do_gather crashes: a clear error instead."""
    root = _extracted(tmp_path, {"AA/wiki_00": DOC})
    out = tmp_path / "out"
    with pytest.raises(InputError, match=r"wiki_00.4 holds 0 characters"):
        run_text_stages(root, out, TextConfig(num_test_articles=3, workers=1))
    _no_outputs(out)


def test_upstream_manifest_mismatch(tmp_path: Path) -> None:
    root = _extracted(tmp_path, {"AA/wiki_00": DOC})
    good = FileEntry("AA/wiki_00", len(DOC), md5_file(root / "AA/wiki_00"))
    bad = FileEntry("AA/wiki_00", len(DOC), "0" * 32)
    run_text_stages(root, tmp_path / "ok", CFG, upstream=[Manifest("extract", files=[good])])
    with pytest.raises(ChecksumError, match=rf"{root / 'AA/wiki_00'}: expected 0{{32}}, got {good.md5}"):
        run_text_stages(root, tmp_path / "out", CFG, upstream=[Manifest("extract", files=[bad])])
    _no_outputs(tmp_path / "out")


def test_split_eval_stage_alone_rejects_missing_inputs(tmp_path: Path) -> None:
    root = _extracted(tmp_path, {"AA/wiki_00": DOC})  # no .3 files
    with pytest.raises(InputError, match=r"holds no \*/wiki_\?\?\.3 files"):
        run_split_eval(root, tmp_path / "out", SplitEvalConfig(num_test_articles=1))


def test_cli_prints_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope"
    assert main(["text", "--extracted", str(missing), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bertpipe text: error: ") and str(missing) in err[-1]


def test_rerun_replaces_outputs(tmp_path: Path) -> None:
    root = _extracted(tmp_path, {"AA/wiki_00": DOC, "AB/wiki_00": DOC})
    out = tmp_path / "out"
    m1 = run_text_stages(root, out, CFG)
    (out / "part-00000-of-00500").write_text("tampered")
    m2 = run_text_stages(root, out, TextConfig(num_test_articles=2, workers=2))
    assert m1.digest == m2.digest
    assert md5_file(out / "part-00000-of-00500") == m1.file("part-00000-of-00500").md5
    shutil.rmtree(out)


def test_ordered_map_keeps_order_with_a_small_window() -> None:
    from core.pools import ordered_map

    items = [-5, 3, -2, 0, 7, -1, 4]
    assert list(ordered_map(abs, items, workers=2, window=2)) == [abs(x) for x in items]
    assert list(ordered_map(abs, items, workers=1)) == [abs(x) for x in items]


def test_nul_character_is_flagged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """GNU grep's binary-file handling makes clean.sh unreproducible on a NUL: kept, but warned and counted."""
    root = _extracted(tmp_path, {"AA/wiki_00": DOC.replace(b"First sentence", b"First\x00sentence")})
    with caplog.at_level("WARNING"):
        m = run_text_stages(root, tmp_path / "out", CFG)
    assert m.counters["files_with_nul"] == 1
    assert any("wiki_00 contains a NUL character" in r.getMessage() for r in caplog.records)


def test_stage_commands_never_write_into_their_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _extracted(tmp_path, {"AA/wiki_00": DOC, "AA/wiki_00.2": DOC})
    assert main(["segment", "--input", str(root), "--out", str(root)]) == 2
    assert "is the input folder" in capsys.readouterr().err
    assert sorted(p.name for p in (root / "AA").iterdir()) == ["wiki_00", "wiki_00.2"]
