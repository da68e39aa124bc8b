"""Lay a data set out for another project's trainer: a tree of symlinks (no data is copied).

  bertpipe export-dataset --layout samsung OUT     # Samsung MLPerf: OUT/train/{128,256,384,512}/part_<k>_of_<N>.hdf5
  bertpipe export-dataset --layout nvidia OUT      # NVIDIA DeepLearningExamples: OUT/train/training_<bin>_part_<k>_of_<N>.hdf5
  bertpipe export-dataset --layout habana OUT      # Habana Model-References bert / deepspeed-bert: as nvidia

The data set is the one `bertpipe run` last built in --work-dir (its last_run.json: train_dir, eval_hdf5,
vocab). Every layout gets OUT/train (the trainer's --input_dir), OUT/eval/part_eval_10k.hdf5 (--eval_dir: the
MLPerf trainers take the files whose name contains "part"), OUT/vocab.txt, and OUT/bertpipe_export.json
(what was exported, from where). Samsung's trainer sorts the entries of its input dir by int(name), so
OUT/train holds the four bin folders and nothing else. NVIDIA's and Habana's read every file of one flat
folder whose name contains "training"; shards without rows are left out there (their RandomSampler refuses
an empty file), and every other shard of the four bins is linked. Links are absolute: OUT can live anywhere,
and shows the data set as it was when exported (export again after a new `bertpipe run`).

A non-empty OUT that is not a previous export is refused unless --overwrite, which replaces its train/,
eval/, vocab.txt and bertpipe_export.json (and nothing else). A previous export is replaced without it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path

LAYOUTS = ("samsung", "nvidia", "habana")
MARKER = "bertpipe_export.json"
EVAL_NAME = "part_eval_10k.hdf5"  # NVIDIA's published name; contains "part" as the MLPerf eval readers want
OURS = ("train", "eval", "vocab.txt", MARKER)
_PART = re.compile(r"^part_(\d+)_of_(\d+)\.hdf5$")
_TMP = ".tmp-export-"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="folder to build the symlink tree in (created if missing)")
    p.add_argument("--layout", required=True, choices=LAYOUTS,
                   help="samsung: int-named bin folders; nvidia/habana: one flat folder of *training* files")
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=Path, default=Path("work"),
                   help="the work dir of the `bertpipe run` whose data set to export (default: work, as bertpipe run)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace train/, eval/ and vocab.txt of an OUT that is not a previous export (default: refuse)")


def run(args: argparse.Namespace) -> int:
    from core.errors import InputError

    if not args.out.strip():
        raise InputError("OUT is an empty string; give the folder to build the symlink tree in")
    train_dir, eval_file, vocab = _dataset(args.work_dir)
    shards = _shards(train_dir)
    for inside in (args.work_dir.resolve(), train_dir):
        if Path(args.out).resolve().is_relative_to(inside):
            raise InputError(f"OUT {args.out} is inside {inside}, the data set it would export; choose a folder "
                             "outside the work dir")
    out = _check_out(Path(args.out), args.overwrite)
    links, skipped = _plan(args.layout, shards, eval_file, vocab)
    info = {"layout": args.layout, "work_dir": str(args.work_dir.resolve()), "train_dir": str(train_dir),
            "eval_hdf5": str(eval_file) if eval_file else None, "vocab": str(vocab) if vocab else None,
            "train_files": sum(1 for name in links if name.startswith("train/")), "empty_shards_left_out": skipped,
            "exported": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _build(out, links, info)
    n = info["train_files"]
    print(f"{out}/train: {n} shard links ({args.layout} layout{f', {skipped} empty shards left out' if skipped else ''})"
          " -> the trainer's input dir")
    print(f"{out}/eval/{EVAL_NAME} -> the trainer's eval dir" if eval_file else
          f"no eval file: {args.work_dir}'s last run made none (run its eval stages to get one)")
    if vocab:
        print(f"{out}/vocab.txt")
    return 0


# -- what to export -----------------------------------------------------------------------------------
def _dataset(work: Path) -> tuple[Path, Path | None, Path | None]:
    """(train_dir, eval file or None, vocab or None) of the work dir's last run, checked to exist."""
    from core.errors import InputError
    from tasks.workdir import last_run

    if not work.is_dir():
        raise InputError(f"--work-dir {work} is not a folder; give the work dir of a `bertpipe run`")
    out = last_run(work).get("outputs", {})
    if not out:
        raise InputError(f"--work-dir {work} has no run summary ({work}/last_run.json); run `bertpipe run --work-dir "
                         f"{work}` first")
    if "train_dir" not in out:
        raise InputError(f"{work}/last_run.json names no train_dir (its last run made no 4-bin output); run "
                         f"`bertpipe run --work-dir {work}` to finish the data set")
    train = Path(out["train_dir"])
    if not train.is_dir():
        raise InputError(f"train_dir {train} (from {work}/last_run.json) does not exist; run `bertpipe run "
                         f"--work-dir {work}` again to rebuild it")
    eval_file = Path(out["eval_hdf5"]) if out.get("eval_hdf5") else None
    if eval_file is not None and not eval_file.is_file():
        raise InputError(f"eval_hdf5 {eval_file} (from {work}/last_run.json) does not exist; run `bertpipe run "
                         f"--work-dir {work}` again to rebuild it")
    vocab = Path(out["vocab"]) if out.get("vocab") and Path(out["vocab"]).is_file() else None
    return train.resolve(), eval_file.resolve() if eval_file else None, vocab.resolve() if vocab else None


def _shards(train: Path) -> dict[int, list[Path]]:
    """bin -> its part_<k>_of_<N>.hdf5 files in k order, all present and of their recorded sizes."""
    from core.errors import InputError
    from core.manifest import MANIFEST_NAME, verify_manifest
    from core.schema import BIN_BOUNDS

    for d in (train.parent, train):  # the bins stage's manifest: beside data/ (or, in older runs, inside)
        if (d / MANIFEST_NAME).is_file():
            verify_manifest(d, check_md5=False)  # every file there, of its size (`bertpipe verify` re-hashes)
            break
    bins: dict[int, list[Path]] = {}
    for b in BIN_BOUNDS:
        parts: dict[int, Path] = {}
        totals = set()
        for p in (train / str(b)).iterdir() if (train / str(b)).is_dir() else ():
            if m := _PART.match(p.name):
                parts[int(m.group(1))] = p
                totals.add(int(m.group(2)))
        if len(totals) != 1 or sorted(parts) != list(range(totals.pop())):
            raise InputError(f"{train}/{b}/ does not hold a complete set of part_<k>_of_<N>.hdf5 shards; run "
                             "`bertpipe run` on the work dir again to rebuild the bins")
        bins[b] = [parts[k] for k in sorted(parts)]
    return bins


def _rows(path: Path) -> int:
    """Rows of one shard (0 for an empty one, with zero-length datasets or none)."""
    import h5py

    from core.errors import InputError
    from core.schema import H5_ERRORS

    try:
        with h5py.File(path, "r") as f:
            return int(f["input_ids"].shape[0]) if "input_ids" in f else 0
    except H5_ERRORS as exc:
        raise InputError(f"cannot read HDF5 shard {path} ({type(exc).__name__}: {exc}); run `bertpipe verify` on "
                         "the work dir and re-run what it names") from exc


def _plan(layout: str, shards: dict[int, list[Path]], eval_file: Path | None,
          vocab: Path | None) -> tuple[dict[str, Path], int]:
    """(name under OUT -> absolute target, empty shards left out)."""
    links: dict[str, Path] = {}
    skipped = 0
    for b, files in shards.items():
        n = len(files)
        for k, f in enumerate(files):
            if layout == "samsung":
                links[f"train/{b}/part_{k}_of_{n}.hdf5"] = f
            elif _rows(f):
                links[f"train/training_{b}_part_{k:05d}_of_{n:05d}.hdf5"] = f
            else:
                skipped += 1
    if eval_file is not None:
        links[f"eval/{EVAL_NAME}"] = eval_file
    if vocab is not None:
        links["vocab.txt"] = vocab
    return links, skipped


# -- the output folder ----------------------------------------------------------------------------------
def _marker(out: Path) -> dict | None:
    try:
        d = json.loads((out / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("layout") in LAYOUTS else None


def _check_out(out: Path, overwrite: bool) -> Path:
    from core.errors import InputError

    if out.exists() and not out.is_dir():
        raise InputError(f"OUT {out} is a file; give a folder (new, empty, or a previous export-dataset output)")
    if not out.exists():
        parent = next(p for p in out.absolute().parents if p.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise InputError(f"cannot create OUT {out}: {parent} is not a writable folder; choose another path")
        return out
    if not os.access(out, os.W_OK):
        raise InputError(f"OUT {out} is read-only; choose a writable folder")
    entries = sorted(p.name for p in out.iterdir() if not p.name.startswith(_TMP))
    if entries and _marker(out) is None and not overwrite:
        shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
        raise InputError(f"OUT {out} is not empty ({shown}) and is not a previous export-dataset output; choose an "
                         "empty or new folder, or add --overwrite to replace its train/, eval/ and vocab.txt")
    return out


def _remove(p: Path) -> None:
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)


def _build(out: Path, links: dict[str, Path], info: dict) -> None:
    """Links built in a temporary folder inside OUT, then moved into place; the marker says "ours" first."""
    from core.manifest import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(_TMP + "*"):  # a killed export's leftovers
        _remove(stale)
    tmp = out / f"{_TMP}{os.getpid()}"
    try:
        tmp.mkdir()
        for name, target in links.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, tmp / name)
        atomic_write_text(out / MARKER, json.dumps({**info, "complete": False}, indent=1) + "\n")
        for name in OURS[:-1]:
            _remove(out / name)
            if (tmp / name).exists() or (tmp / name).is_symlink():
                os.replace(tmp / name, out / name)
        atomic_write_text(out / MARKER, json.dumps({**info, "complete": True}, indent=1) + "\n")
    finally:
        _remove(tmp)
