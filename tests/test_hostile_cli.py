"""A generated hostile command-line suite: every command x every class of bad input (issue 15).

Classes: a missing path, an empty one, a directory for a file, a file for a directory, a path under a
file, a symlink loop, a name too long, an unreadable input (a FIFO, which would block a reader, and a file of mode 000: bertpipe honours
mode bits even as root, which these tests run as), a read-only output folder or file (mode bits), an
output that is an input by each spelling (the same string, ``./``, ``..``, absolute, a symlink, a hard
link), an output folder that is an input folder, an output that would replace an input inside its folder,
a folder that already holds another data set (needs --overwrite), and every numeric flag of every command
at 0 / negative / nan / inf / huge (generated from the parsers: a flag whose ``type`` is a bare int or
float fails the suite).

Each case runs ``bertpipe.cli.main(argv)`` in-process (cwd = a sandbox) and asserts: exit 2, exactly one
line on stderr naming the flag (or the positional's name), no traceback, and the sandbox unchanged: every
file's md5, and no file or folder created or removed (so no temp file either). A few cases run the real
entry point in a subprocess, timed, and prove that nothing heavy (Prefect, torch, DeepSpeed) was imported.
"""

from __future__ import annotations

import bz2
import contextlib
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertpipe.cli import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[1]

# -- the sandbox ---------------------------------------------------------------------------------------
TEXT = "The first sentence of a document.\nThe second one here.\n\nAnother document starts.\nIt ends.\n"


def _build_sandbox(s: Path) -> None:
    from preprocessing.mlperf.tfrecord import write_records

    (s / "in").mkdir()
    (s / "in" / "x.txt").write_text(TEXT)
    (s / "in" / "vocab.txt").write_text("\n".join(["[PAD]", *(f"[unused{i}]" for i in range(99)), "[UNK]", "[CLS]",
                                                   "[SEP]", "[MASK]", "the", "a", "."]) + "\n")
    write_records(s / "in" / "x.tf", [b"not an example"])
    (s / "in" / "x.hdf5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 64)
    (s / "in" / "cfg.json").write_text("{}")
    for d, name, data in (("hd", "part-00000.hdf5", b"\x89HDF\r\n\x1a\n"), ("tfd", "part-00000", b"")):
        (s / d).mkdir()
        (s / d / name).write_bytes(data)
    (s / "hd2").mkdir()  # hd2/part-00000.hdf5 is a hard link to hd/part-00000.hdf5: packing hd into hd2 replaces it
    os.link(s / "hd" / "part-00000.hdf5", s / "hd2" / "part-00000.hdf5")
    (s / "ext" / "AA").mkdir(parents=True)
    (s / "ext" / "AA" / "wiki_00").write_text('<doc id="1" url="u" title="T">\nT\n\nSome text.\n</doc>\n')
    (s / "dump.xml.bz2").write_bytes(bz2.compress(b"<mediawiki></mediawiki>\n"))
    (s / "work").mkdir()
    (s / "runout" / "checkpoints").mkdir(parents=True)
    (s / "tf1").mkdir()
    (s / "tf1" / "model.ckpt.index").write_bytes(b"\0" * 16)
    (s / "tf1" / "model.ckpt.data-00000-of-00001").write_bytes(b"\0" * 16)
    (s / "afile").write_text("a plain file\n")
    (s / "adir").mkdir()
    os.mkfifo(s / "fifo")
    (s / "noread").write_text("mode 000\n")
    os.chmod(s / "noread", 0)
    (s / "noread_dir").mkdir()
    os.chmod(s / "noread_dir", 0)
    (s / "ro").mkdir()
    os.chmod(s / "ro", 0o555)
    (s / "ro_file").write_text("mode 444\n")
    os.chmod(s / "ro_file", 0o444)
    (s / "other").mkdir()  # a folder that holds another data set
    (s / "other" / "_manifest.json").write_text(json.dumps({"stage": "someone_else", "key": "k", "files": []}))
    (s / "other" / "vocab.txt").write_text("[PAD]\n")
    os.symlink("loop2", s / "loop1")
    os.symlink("loop1", s / "loop2")
    (s / "links").mkdir()
    for rel in INPUT_FILES:
        name = rel.replace("/", "_")
        os.symlink(s / rel, s / "links" / f"{name}.sym")
        os.link(s / rel, s / "links" / f"{name}.hard")
    for rel in INPUT_DIRS:
        os.symlink(s / rel, s / "links" / f"{rel}.dsym")


INPUT_FILES = ("in/x.txt", "in/vocab.txt", "in/x.tf", "in/x.hdf5", "dump.xml.bz2")
INPUT_DIRS = ("hd", "tfd", "ext", "work", "runout", "in")


def spellings(rel: str, sandbox: Path, is_dir: bool = False) -> dict[str, str]:
    """The same file or folder, spelled six ways."""
    head, _, tail = rel.rpartition("/")
    out = {"same": rel, "dot": f"./{rel}", "dotdot": f"{head}/../{rel}" if head else f"../{sandbox.name}/{rel}",
           "abs": str(sandbox / rel)}
    if is_dir:
        out["symlink"] = f"links/{rel}.dsym"
    else:
        out["symlink"] = f"links/{rel.replace('/', '_')}.sym"
        out["hardlink"] = f"links/{rel.replace('/', '_')}.hard"
    return out


# -- what each command reads and writes ----------------------------------------------------------------
# argv: a command line that is valid up to what the cases break; ("flag" or positional index) -> kind.
SPECS: dict[str, dict] = {
    "create-pretraining-data": dict(
        argv=["--input_file", "in/x.txt", "--output_file", "out/x.tf", "--vocab_file", "in/vocab.txt"],
        inputs={"--input_file": "file", "--vocab_file": "file"}, outputs={"--output_file": "file"}),
    "pick-eval-samples": dict(
        argv=["--input_tfrecord", "in/x.tf", "--output_tfrecord", "out/e.tf", "--num_examples_to_pick", "1"],
        inputs={"--input_tfrecord": "file"}, outputs={"--output_tfrecord": "file"}),
    "tfrecord-to-hdf5": dict(argv=["--input", "in/x.tf", "--output", "out/x.hdf5"],
                             inputs={"--input": "file"}, outputs={"--output": "any"}),
    "pack-varlength": dict(argv=["--input", "in/x.hdf5", "--output", "out/p.hdf5"],
                           inputs={"--input": "file"}, outputs={"--output": "any"}),
    "pack-nvidia": dict(argv=["--input_hdf5", "hd", "--output_hdf5", "out/packed", "--shards_num", "2"],
                        inputs={"--input_hdf5": "path"}, outputs={"--output_hdf5": "dir"}, dataset=True),
    "pack-habana": dict(argv=["--input_dir", "hd", "--output_dir", "out/packed"],
                        inputs={"--input_dir": "dir"}, outputs={"--output_dir": "dir"}, dataset=True),
    "split-4bins": dict(argv=["--input_dir", "hd", "--output_dir", "out/4bins", "--n_output_shards", "2"],
                        inputs={"--input_dir": "dir"}, outputs={"--output_dir": "dir"}, dataset=True),
    "chop-hdf5": dict(argv=["--input_hdf5_dir", "hd", "--output_hdf5_dir", "out/chop", "--num_shards", "2"],
                      inputs={"--input_hdf5_dir": "dir"}, outputs={"--output_hdf5_dir": "dir"}),
    "shuffle-samples": dict(argv=["--input_hdf5", "hd", "--output_hdf5", "out/shuf"],
                            inputs={"--input_hdf5": "dir"}, outputs={"--output_hdf5": "dir"}, dataset=True),
    "pick-eval-samples-varlength": dict(
        argv=["--input_hdf5_file", "in/x.hdf5", "--output_hdf5_file", "out/e.hdf5", "--num_examples_to_pick", "1"],
        inputs={"--input_hdf5_file": "file"}, outputs={"--output_hdf5_file": "file"}),
    "vocab": dict(argv=["--input", "in/x.txt", "--out", "out/vocab", "--vocab-size", "200"],
                  inputs={"--input": "file"}, outputs={"--out": "dir"}, dataset=True),
    "extract": dict(argv=["--dump", "dump.xml.bz2", "--out", "out/text", "--processes", "1"],
                    inputs={"--dump": "file"}, outputs={"--out": "dir"}, dataset=True),
    "clean": dict(argv=["--extracted", "ext", "--out", "out/clean", "--workers", "1"],
                  inputs={"--extracted": "dir"}, outputs={"--out": "dir"}, dataset=True),
    "segment": dict(argv=["--input", "ext", "--out", "out/seg", "--workers", "1"],
                    inputs={"--input": "dir"}, outputs={"--out": "dir"}, dataset=True),
    "split-eval": dict(argv=["--input", "ext", "--out", "out/split", "--workers", "1"],
                       inputs={"--input": "dir"}, outputs={"--out": "dir"}, dataset=True),
    "gather": dict(argv=["--input", "ext", "--out", "out/parts"],
                   inputs={"--input": "dir"}, outputs={"--out": "dir"}, dataset=True),
    "text": dict(argv=["--extracted", "ext", "--out", "out/results", "--workers", "1"],
                 inputs={"--extracted": "dir"}, outputs={"--out": "dir"}, dataset=True),
    "download": dict(argv=["dump.xml.bz2", "--out", "out/dl"], inputs={0: "file"}, outputs={"--out": "dir"},
                     dataset=True, names={0: "source"}),
    "status": dict(argv=["--work-dir", "work"], inputs={"--work-dir": "dir"}, outputs={}),
    "verify": dict(argv=["--work-dir", "work"], inputs={"--work-dir": "dir"}, outputs={}),
    "train": dict(argv=["--train-dir", "hd", "--output-dir", "out/train", "--dry-run"],
                  inputs={"--train-dir": "path", "--eval-file": "file", "--deepspeed-config": "file"},
                  outputs={"--output-dir": "dir"}, empty_means_none=("--eval-file",)),
    "export-hf": dict(argv=["runout", "out/hf"], inputs={0: "dir"}, outputs={1: "dir"},
                      names={0: "OUTPUT_DIR", 1: "HF_DIR"}),
    "import-tf": dict(argv=["tf1/model.ckpt", "--out-safetensors", "out/w.safetensors"],
                      inputs={0: "path", "--config": "file"}, outputs={"--out-safetensors": "file", "--out-hf": "dir"},
                      names={0: "TF_CHECKPOINT"}, empty_means_none=("--out-hf",)),
    "run": dict(argv=["--work-dir", "out/w"], inputs={"--vocab": "file", "--text-dir": "dir"},
                outputs={"--work-dir": "dir"}),
    "demo": dict(argv=["--work-dir", "out/demo", "--no-train"], inputs={}, outputs={"--work-dir": "dir"}),
    "export-dataset": dict(argv=["out/ds", "--layout", "samsung", "--work-dir", "work"],
                           inputs={"--work-dir": "dir"}, outputs={}),
}

# classes of a bad input path -> value (relative to the sandbox)
BAD_INPUT_FILE = {"missing": "nothere.txt", "empty": "", "dir-for-file": "adir", "under-a-file": "afile/x",
                  "fifo": "fifo", "unreadable": "noread", "symlink-loop": "loop1"}
BAD_INPUT_PATH = {"missing": "nothere", "empty": "", "under-a-file": "afile/x", "fifo": "fifo"}  # file or folder
BAD_INPUT_DIR = {"missing": "nothere", "empty": "", "file-for-dir": "afile", "under-a-file": "afile/x",
                 "unreadable": "noread_dir", "symlink-loop": "loop1"}
BAD_OUTPUT_FILE = {"dir-for-file": "adir", "under-a-file": "afile/x", "read-only-folder": "ro/x.out",
                   "read-only-file": "ro_file", "empty": "", "name-too-long": "n" * 300}
BAD_OUTPUT_ANY = {k: v for k, v in BAD_OUTPUT_FILE.items() if k != "dir-for-file"}  # a file, or into a folder
BAD_OUTPUT_DIR = {"file-for-dir": "afile", "under-a-file": "afile/sub", "read-only-folder": "ro/sub",
                  "read-only": "ro", "empty": "", "name-too-long": "n" * 300}


def _set(argv: list[str], slot, value: str) -> list[str]:
    argv = list(argv)
    if isinstance(slot, int):
        pos = [i for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or not argv[i - 1].startswith("-")
                                                                            or argv[i - 1] in ("--dry-run",))]
        argv[pos[slot]] = value
        return argv
    if slot in argv:
        argv[argv.index(slot) + 1] = value
        return argv
    return argv + [f"{slot}={value}"]


def _name(spec: dict, slot) -> str:
    return spec.get("names", {}).get(slot, slot) if isinstance(slot, int) else slot


def _input_paths(spec: dict) -> list[str]:
    """The sandbox inputs of the spec's valid command line (files and folders)."""
    out = []
    for slot in spec["inputs"]:
        argv = spec["argv"]
        if isinstance(slot, int):
            out.append(_value(argv, slot))
        elif slot in argv:
            out.append(argv[argv.index(slot) + 1])
    return out


def _value(argv: list[str], slot: int) -> str:
    probe = _set(argv, slot, "\0")
    return argv[probe.index("\0")]


def _cases() -> list[tuple[str, str, list[str], str]]:
    """(id, command, argv, text the error line must contain)."""
    cases = []
    for cmd, spec in SPECS.items():
        argv = spec["argv"]
        for slot, kind in spec["inputs"].items():
            classes = {"file": BAD_INPUT_FILE, "dir": BAD_INPUT_DIR, "path": BAD_INPUT_PATH}[kind]
            for cls, value in classes.items():
                if cls == "empty" and slot in spec.get("empty_means_none", ()):
                    continue  # an empty value is documented as "none" (e.g. --eval-file '': no evaluation)
                cases.append((f"{cmd}-in{_name(spec, slot)}-{cls}", cmd, _set(argv, slot, value), _name(spec, slot)))
        for slot, kind in spec["outputs"].items():
            classes = {"file": BAD_OUTPUT_FILE, "dir": BAD_OUTPUT_DIR, "any": BAD_OUTPUT_ANY}[kind]
            for cls, value in classes.items():
                if cls == "empty" and (isinstance(slot, int) or slot in spec.get("empty_means_none", ())):
                    continue
                cases.append((f"{cmd}-out{_name(spec, slot)}-{cls}", cmd, _set(argv, slot, value), _name(spec, slot)))
            # the output is one of the inputs (files: the file; folders: the folder), by every spelling
            for src in _input_paths(spec):
                src_is_dir = src.rstrip("/") in INPUT_DIRS
                if src_is_dir != (kind == "dir") and kind != "any" or (src not in INPUT_FILES and src not in INPUT_DIRS):
                    continue
                for how, spelled in spellings(src, Path("/SANDBOX"), src_is_dir).items():
                    cases.append((f"{cmd}-out{_name(spec, slot)}-is-input-{src}-{how}", cmd,
                                  _set(argv, slot, spelled), _name(spec, slot)))
            if kind == "dir" and spec.get("dataset"):
                cases.append((f"{cmd}-out{_name(spec, slot)}-another-dataset", cmd, _set(argv, slot, "other"),
                              "--overwrite"))
    # an output folder + name that would replace an input inside its folder
    cases += [
        ("cpd-output_dir-suffix-empty-replaces-input", "create-pretraining-data",
         ["--input_file", "in/x.txt", "--output_dir", "in", "--output_suffix=", "--vocab_file", "in/vocab.txt"],
         "--output_dir"),
        ("cpd-output_dir-suffix-escapes", "create-pretraining-data",
         ["--input_file", "in/x.txt", "--output_dir", "out", "--output_suffix=/../../x", "--vocab_file",
          "in/vocab.txt"], "--output_suffix"),
        ("cpd-output_file-is-the-vocab", "create-pretraining-data",
         ["--input_file", "in/x.txt", "--output_file", "in/vocab.txt", "--vocab_file", "in/vocab.txt"],
         "--output_file"),
        ("cpd-output_file-twice", "create-pretraining-data",
         ["--input_file", "in/x.txt", "--output_file", "out/a.tf,./out/a.tf", "--vocab_file", "in/vocab.txt"],
         "--output_file"),
        ("pack-varlength-glob-into-folder-with-hardlinked-input", "pack-varlength",
         ["--input", "hd/part*", "--output", "hd2"], "--output"),
        ("tfrecord-to-hdf5-dir-into-itself", "tfrecord-to-hdf5", ["--input", "tfd", "--output", "tfd"], "--output"),
        ("vocab-out-holds-a-vocab", "vocab", ["--input", "in/x.txt", "--out", "in"], "--overwrite"),
        ("download-url-with-space", "download", ["https://example.com/a b.bz2", "--out", "out/dl"], "%20"),
        ("download-url-with-control", "download", ["https://example.com/a\tb;c.bz2", "--out", "out/dl"], "source"),
        ("download-filename-with-slash", "download", ["dump.xml.bz2", "--out", "out/dl", "--filename", "../x"],
         "--filename"),
        ("run-pretrain-train-dir-missing", "run", ["pretrain", "--work-dir", "out/w", "--train-dir", "nothere"],
         "--train-dir"),
        ("run-pretrain-eval-file-dir", "run", ["pretrain", "--work-dir", "out/w", "--train-dir", "hd",
                                               "--eval-file", "adir"], "--eval-file"),
        ("run-e2e-output-dir-file", "run", ["e2e", "--work-dir", "out/w", "--output-dir", "afile"], "--output-dir"),
        ("run-e2e-model-unknown", "run", ["e2e", "--work-dir", "out/w", "--model", "huge"], "--model"),
        ("train-output-dir-is-train-dir", "train", ["--train-dir", "hd", "--output-dir", "./hd", "--dry-run"],
         "--output-dir"),
        ("export-hf-into-the-run", "export-hf", ["runout", "./runout"], "HF_DIR"),
    ]
    return cases


def _numeric_cases() -> list[tuple[str, str, list[str], str]]:
    """Every numeric flag of every command (found in its parser), at values outside its range."""
    cases = []
    for cmd in COMMANDS:
        parser, _ = build_parser(cmd)
        argv = SPECS[cmd]["argv"]
        for action in parser._actions:
            bounds = getattr(action.type, "bounds", None)
            if bounds is None or not action.option_strings:
                continue
            kind, lo, hi, lo_open, hi_open = bounds
            flag = action.option_strings[-1]
            bad = ["nan", "inf", "-inf"] if kind is float else ["nan", "inf", "1.5", "99999999999999999999999"]
            if lo is not None:
                bad += [str(kind(lo)) if lo_open else str(kind(lo) - 1), str(kind(lo) - 5)]
                if lo > 0 and not lo_open:
                    bad.append("0")
            if hi is not None:
                bad.append(str(kind(hi) + 1) if kind is int else repr(float(hi) * 2 + 1))
            for v in dict.fromkeys(bad):
                cases.append((f"{cmd}{flag}={v}", cmd, [*argv, f"{flag}={v}"], flag))
    return cases


ALL_CASES = _cases()
NUMERIC_CASES = _numeric_cases()


# -- running a case ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    s = tmp_path_factory.mktemp("hostile")
    _build_sandbox(s)
    yield s
    for p in (s / "noread_dir", s / "ro"):
        os.chmod(p, 0o755)


def snapshot(root: Path) -> dict[str, str]:
    """Every path under ``root`` -> md5 (files), 'dir', 'link' or 'other' (a FIFO)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "link:" + os.readlink(p)
            elif p.is_dir():
                out[rel] = "dir"
            elif p.is_file():
                out[rel] = hashlib.md5(p.read_bytes()).hexdigest()
            else:
                out[rel] = "other"
    return out


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``bertpipe.cli.main(argv)`` in this process: (exit status, stdout, stderr); warnings logged count."""
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setLevel(logging.WARNING)
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    finally:
        logging.getLogger().removeHandler(handler)
    return rc, out.getvalue(), err.getvalue()


def check_refusal(sandbox: Path, cmd: str, argv: list[str], must_name: str, monkeypatch) -> str:
    argv = [a.replace("/SANDBOX", str(sandbox)) if a.startswith("/SANDBOX") else a for a in argv]
    argv = [a.replace("../SANDBOX/", f"../{sandbox.name}/") for a in argv]
    monkeypatch.chdir(sandbox)
    before = snapshot(sandbox)
    t0 = time.perf_counter()
    rc, out, err = run_cli([cmd, *argv])
    dt = time.perf_counter() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err + out, err
    assert rc == 2, f"exit {rc}, stderr: {err!r}"
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err!r}"
    assert must_name in lines[0], f"{must_name!r} not named in {lines[0]!r}"
    assert snapshot(sandbox) == before, "the sandbox changed (an input modified, or a file/folder created)"
    return lines[0] + f" [{dt:.2f} s]"


@pytest.mark.parametrize("cmd,argv,must_name", [c[1:] for c in ALL_CASES], ids=[c[0] for c in ALL_CASES])
def test_bad_path_is_refused_in_one_line(sandbox, cmd, argv, must_name, monkeypatch):
    check_refusal(sandbox, cmd, argv, must_name, monkeypatch)


@pytest.mark.parametrize("cmd,argv,must_name", [c[1:] for c in NUMERIC_CASES], ids=[c[0] for c in NUMERIC_CASES])
def test_bad_number_is_refused_at_parse_time(sandbox, cmd, argv, must_name, monkeypatch):
    check_refusal(sandbox, cmd, argv, must_name, monkeypatch)


def test_the_suite_is_big_and_covers_every_command():
    assert len(ALL_CASES) + len(NUMERIC_CASES) >= 300
    assert set(SPECS) == set(COMMANDS), "a command without a hostile-CLI spec"
    assert {c[1] for c in ALL_CASES} == set(COMMANDS)
    numeric_cmds = {c[1] for c in NUMERIC_CASES}
    assert {"create-pretraining-data", "gather", "run", "train", "demo", "tfrecord-to-hdf5"} <= numeric_cmds


def test_every_numeric_flag_has_a_range():
    """No command takes a bare int or float: every number goes through core.numbers.number (bounds)."""
    bare = []
    for cmd in COMMANDS:
        parser, _ = build_parser(cmd)
        bare += [f"{cmd} {a.option_strings[0]}" for a in parser._actions if a.type in (int, float)]
    assert not bare, f"numeric flags without a range: {bare}"


# -- valid use still works (the checks refuse only what they should) ----------------------------------
def test_existing_output_that_is_not_an_input_is_replaced(sandbox, tmp_path, monkeypatch, golden):
    """As the reference scripts do: an existing output file that is no input is simply overwritten."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "eval.tf"
    out.write_bytes(b"old")
    rc, _, err = run_cli(["pick-eval-samples", "--input_tfrecord", str(golden / "eval_100.tfrecord"),
                          "--output_tfrecord", str(out), "--num_examples_to_pick", "10"])
    assert rc == 0, err
    assert out.stat().st_size > 3
    assert [p.name for p in tmp_path.iterdir()] == ["eval.tf"]  # no temp file left


def test_overwrite_replaces_a_folder_holding_a_vocab(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "part").write_text(TEXT * 50)
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "vocab.txt").write_text("[PAD]\n")
    rc, _, err = run_cli(["vocab", "--input", "part", "--out", "v", "--vocab-size", "120"])
    assert rc == 2 and "--overwrite" in err and (tmp_path / "v" / "vocab.txt").read_text() == "[PAD]\n"
    rc, _, err = run_cli(["vocab", "--input", "part", "--out", "v", "--vocab-size", "120", "--overwrite"])
    assert rc == 0, err
    assert (tmp_path / "v" / "vocab.txt").read_text().startswith("[PAD]\n[unused0]")
    # a re-run into its own output needs no flag
    rc, _, err = run_cli(["vocab", "--input", "part", "--out", "v", "--vocab-size", "120"])
    assert rc == 0, err


def test_empty_tfrecord_is_still_accepted(tmp_path, monkeypatch):
    """Empty inputs that the reference accepts stay accepted (an empty TFRecord converts to an empty HDF5)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.tf").write_bytes(b"")
    rc, _, err = run_cli(["tfrecord-to-hdf5", "--input", "empty.tf", "--output", "empty.hdf5"])
    assert rc == 0, err
    assert (tmp_path / "empty.hdf5").is_file()


# -- the real entry point, timed ------------------------------------------------------------------------
PROBE = ("import sys, time\nt0, c0 = time.perf_counter(), time.process_time()\nfrom bertpipe.cli import main\n"
         "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
         "heavy = sorted(m for m in ('prefect', 'torch', 'deepspeed', 'tensorflow') if m in sys.modules); "
         "print(rc, round(time.perf_counter() - t0, 3), round(time.process_time() - c0, 3), ','.join(heavy) or '-', "
         "file=sys.stderr)")


@pytest.mark.parametrize("argv,must_name", [
    (["run", "e2e", "--work-dir", "out/w", "--max-steps", "-5"], "--max-steps"),
    (["run", "--work-dir", "afile"], "--work-dir"),
    (["run", "pretrain", "--work-dir", "out/w", "--train-dir", "nothere"], "--train-dir"),
    (["run", "--work-dir", "out/w", "--vocab", "adir"], "--vocab"),
    (["train", "--train-dir", "hd", "--nproc", "0"], "--nproc"),
    (["train", "--train-dir", "hd", "--max-steps", "0"], "--max-steps"),
    (["train", "--train-dir", "nothere", "--output-dir", "out/t"], "--train-dir"),
    (["create-pretraining-data", "--input_file", "in/x.txt", "--output_file", "./in/../in/x.txt",
      "--vocab_file", "in/vocab.txt"], "--output_file"),
], ids=["run-e2e-max-steps", "run-work-dir-file", "run-pretrain-train-dir", "run-vocab-dir", "train-nproc-0",
        "train-max-steps-0", "train-train-dir-missing", "cpd-output-is-input"])
def test_real_entry_point_refuses_before_anything_heavy(sandbox, argv, must_name):
    before = snapshot(sandbox)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=sandbox, capture_output=True, text=True,
                       env=env, timeout=120)
    wall = time.perf_counter() - t0
    lines = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 2, p.stderr  # the refusal, then the probe's own line
    assert must_name in lines[0]
    rc, seconds, cpu, heavy = lines[1].split()
    assert rc == "2" and heavy == "-", lines[1]  # refused before Prefect / torch / DeepSpeed were imported
    # < 1 s of work (CPU time: the shared test machine's load stretches wall time); wall time bounded too
    assert float(cpu) < 1.0 and float(seconds) < 10, f"refusal: {cpu} s CPU, {seconds} s wall in-process " \
        f"({wall:.2f} s with interpreter start)"
    assert snapshot(sandbox) == before


def test_python_m_bertpipe_one_line(sandbox):
    p = subprocess.run([sys.executable, "-m", "bertpipe", "gather", "--input", "ext", "--out", "out/g",
                        "--num-outputs", "-4"], cwd=sandbox, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "--num" in p.stderr, p.stderr


# -- the tracebacks the issue listed, each now one line ----------------------------------------------------
def test_tfrecord_length_header_past_the_end_is_one_line(tmp_path, monkeypatch):
    """A length header of 0x7fff... made count_records seek past 2**63 (OverflowError)."""
    import struct

    from core.errors import RecordError
    from preprocessing.mlperf.tfrecord import count_records

    for length in (0x7FFFFFFFFFFFFFFF, 0xFFFFFFFFFFFFFF00, 40):
        bad = tmp_path / f"bad{length}.tf"
        bad.write_bytes(struct.pack("<Q", length) + b"\0" * 12)
        with pytest.raises(RecordError, match="past the end of the file"):
            count_records(bad)
        monkeypatch.chdir(tmp_path)
        rc, _, err = run_cli(["pick-eval-samples", "--input_tfrecord", bad.name, "--output_tfrecord", "o.tf",
                              "--num_examples_to_pick", "1"])
        assert rc == 2 and len(err.strip().splitlines()) == 1 and bad.name in err, err
        assert not (tmp_path / "o.tf").exists()


def test_work_dir_lock_with_a_file_in_the_way(tmp_path):
    from core.errors import InputError
    from core.lock import LOCK_NAME, WorkDirLock

    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="cannot use .* as a work dir"), WorkDirLock(tmp_path / "f" / "pretrain"):
        pass
    (tmp_path / "w" / LOCK_NAME).mkdir(parents=True)  # a folder where the lock file belongs
    with pytest.raises(InputError, match="cannot create the lock file"), WorkDirLock(tmp_path / "w"):
        pass


def test_run_pretrain_work_dir_file_is_one_line(sandbox, monkeypatch):
    """`run pretrain --work-dir FILE` locked FILE/pretrain (NotADirectoryError in the lock)."""
    msg = check_refusal(sandbox, "run", ["pretrain", "--work-dir", "afile", "--train-dir", "hd"], "--work-dir",
                        monkeypatch)
    assert "is a file" in msg


def test_verify_and_status_outside_a_work_dir(sandbox, monkeypatch, tmp_path):
    """verify on a folder that is not a work dir (or on /) must not say "all verify"; a last_run.json
    holding a list is not a traceback."""
    monkeypatch.chdir(sandbox)
    for wd in ("/", "in", "ext"):
        rc, out, err = run_cli(["verify", "--work-dir", wd])
        assert rc == 2 and "holds no stage outputs" in err and "all verify" not in out + err, (wd, err)
    (tmp_path / "last_run.json").write_text("[1, 2]")
    rc, out, err = run_cli(["status", "--work-dir", str(tmp_path)])
    assert "Traceback" not in err and rc == 0 and "no stage outputs yet" in out, err


def _h5(path: Path, widths: dict[str, int], rows: int = 4) -> None:
    import h5py
    import numpy as np

    with h5py.File(path, "w") as h:
        for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids"):
            h.create_dataset(k, data=np.zeros((rows, widths.get(k, 128 if "masked" not in k else 20)), "i4"))
        h.create_dataset("next_sentence_labels", data=np.zeros((rows,), "i1"))


def test_training_shard_of_the_wrong_width_is_refused_before_launch(tmp_path):
    """A shard whose datasets disagree on their width failed with an IndexError inside a rank."""
    from core.errors import InputError
    from pretrain.data import discover_shards

    _h5(tmp_path / "ok.hdf5", {})
    assert sum(s.rows for shards in discover_shards(tmp_path / "ok.hdf5").values() for s in shards) == 4
    for i, widths in enumerate(({"input_mask": 64}, {"masked_lm_ids": 19}, {"masked_lm_positions": 200,
                                                                             "masked_lm_ids": 200})):
        _h5(tmp_path / f"bad{i}.hdf5", widths)
        with pytest.raises(InputError, match="mismatched widths"):
            discover_shards(tmp_path / f"bad{i}.hdf5")


def test_truncated_checkpoint_is_one_line(tmp_path, monkeypatch):
    """export-hf and --resume read DeepSpeed's torch.save files: a cut-off one is named, not a RuntimeError."""
    torch = pytest.importorskip("torch")
    from core.errors import InputError
    from pretrain import checkpoint as ckpt

    d = ckpt.checkpoint_dir(tmp_path / "run") / "7"
    d.mkdir(parents=True)
    (d.parent / "latest").write_text("7")
    torch.save({"module": {"w": torch.ones(1000)}}, d / "mp_rank_00_model_states.pt")
    ckpt.check_checkpoint_files(tmp_path / "run", "7")  # complete: accepted
    data = (d / "mp_rank_00_model_states.pt").read_bytes()
    (d / "mp_rank_00_model_states.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated or damaged"):
        ckpt.check_checkpoint_files(tmp_path / "run", "7")
    with pytest.raises(InputError, match="truncated or damaged"):
        ckpt.weights_only_load(d / "mp_rank_00_model_states.pt")
    ckpt.write_run_config(tmp_path / "run", "7", {"hidden_size": 64}, {})
    monkeypatch.chdir(tmp_path)
    rc, _, err = run_cli(["export-hf", "run", "hf"])
    assert rc == 2 and "mp_rank_00_model_states.pt is truncated" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "hf").exists()


def test_cli_turns_sigterm_into_exit_143_and_restores_the_handler():
    """In-process: a SIGTERM during a command unwinds it (finally blocks run) and exits 143."""
    import signal

    from bertpipe import cli

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(cli.Terminated):
        cli._on_sigterm(signal.SIGTERM, None)
    signal.signal(signal.SIGTERM, before)
    assert signal.getsignal(signal.SIGTERM) is before
