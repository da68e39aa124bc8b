"""Lay a data set out for another project's trainer: a tree of symlinks (no data is copied).

  bertpipe export-dataset --layout samsung OUT        # Samsung MLPerf: OUT/train/{128,256,384,512}/part_<k>_of_<N>.hdf5
  bertpipe export-dataset --layout habana OUT         # Habana bert / deepspeed-bert, unpacked: OUT/train/training_*.hdf5
  bertpipe export-dataset --layout nvidia-dle OUT     # NVIDIA DeepLearningExamples' HDF5 trainer: as habana
  bertpipe export-dataset --layout nvidia OUT         # NVIDIA's MLPerf trainer v1.1+: variable-length part_*.hdf5
  bertpipe export-dataset --layout nvidia-packed OUT  # NVIDIA's MLPerf trainer --packed_samples: part_*.hdf5 packs
  bertpipe export-dataset --layout habana-packed OUT  # Habana's trainer, packed mode: OUT/train + train_metadata.json

The data set is the one `bertpipe run` last built in --work-dir (its last_run.json outputs). Each layout lays
out the folder of one target of that run (`bertpipe run --target`): samsung, habana and nvidia-dle the 4-bin set
(samsung-4bins, padded rows); nvidia NVIDIA's variable-length shards (nvidia-4320, else nvidia-varlength, else
nvidia-2048, else nvidia-4320-v1.1, else nvidia-2048-varlength; --target picks one); nvidia-packed and habana-packed
their packed sets (habana-packed: habana-packed's, else habana-packed-raw's, the same packs uncompressed, else
habana-packed-narrow's, the same values in narrow integer types; --target picks one). A layout whose target the run did not build is refused in one line naming the --target to build: no layout hands padded
rows to a reader that expects variable-length ones (NVIDIA's MLPerf trainer sets its attention mask from the row's
length).

Every layout gets OUT/train (the trainer's --input_dir), OUT/eval/part_eval_10k.hdf5 (--eval_dir: the MLPerf
trainers take the files whose name contains "part"; the variable-length eval file for the NVIDIA layouts, the
padded one otherwise), OUT/vocab.txt, and OUT/bertpipe_export.json (what was exported, from where);
habana-packed also OUT/train_metadata.json (Habana's trainer reads <input_dir>_metadata.json). Samsung's trainer
sorts the entries of its input dir by int(name), so OUT/train holds the four bin folders and nothing else.
Habana's and DeepLearningExamples' unpacked readers take every file of one flat folder whose name contains
"training"; NVIDIA's MLPerf trainer the files whose name contains "part"; Habana's packed mode every file. Shards
without rows are left out of the flat layouts (the trainers' RandomSampler refuses an empty file). Links are
absolute: OUT can live anywhere, and shows the data set as it was when exported (export again after a new
`bertpipe run`).

It deletes only links it made. The marker (format "bertpipe-export", version 2) records every link with its
target, the folders it made, and the folder it was written for. Before changing anything, every entry of
OUT's train/, eval/ and vocab.txt must be accounted for: a link the marker records with that target (or the
very link the export would make), a folder it records. Anything else - a real file, a foreign link or
folder, a work dir - is refused in one line naming it, --overwrite or not; so is a marker that cannot be
read, names paths outside those three, or was written for another folder (a copy). Each link is checked
again just before it is removed (still a link, the recorded target, reached from OUT without following a
symlink). The rest of OUT is never touched. A version-1 marker (which recorded no links) is read as owning
the links into its recorded train_dir, eval file and vocab, and nothing else.

--overwrite lets OUT be a non-empty folder that is not an export: the export goes in beside what it holds.
--replace-copies is for OUT being your own copy of an export (`cp -rL`): a real file where a link goes is
replaced by the link when its bytes equal the file the link points to (compared in full), and refused
otherwise; a marker written for another folder, and real folders where the export puts its folders, are
accepted (a real file where no link goes is still refused).

OUT is refused when it is a symlink, is or lies inside a work dir or stage output (a folder holding
.bertpipe.lock, last_run.json, _manifest.json, _dropped.json or .verified.json, or a <name>.manifest.json
beside it), or holds one directly or in train/ or eval/, or holds the exported work dir or its files.

The marker is written first (what is there now and what is to come, "complete": false), last again (the
links made). A killed export leaves only what the marker accounts for (and, under --replace-copies, the
copies not yet replaced), and the next export finishes it.
Two exports into one OUT at once: the second refuses (a lock on the folder).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import stat
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from preprocessing.targets import TARGETS

MARKER = "bertpipe_export.json"
FORMAT = "bertpipe-export"
VERSION = 2  # 1: no "format"/"version", no record of the links
EVAL_NAME = "part_eval_10k.hdf5"  # NVIDIA's published name; contains "part" as the MLPerf eval readers want
#: The top-level names an export owns in OUT (folders: with all below them); nothing else of OUT is touched.
ROOTS = {"train": "dir", "eval": "dir", "vocab.txt": "file", "train_metadata.json": "file"}
METADATA = "train_metadata.json"  # habana-packed: Habana's trainer reads <input_dir>_metadata.json beside OUT/train
_BINS = ("128", "256", "384", "512")
_PART = re.compile(r"^part_(\d+)_of_(\d+)\.hdf5$")
#: Habana's packed sets, in preprocessing/targets.py's order (preferred first): the script's gzip, then the same
#: packs uncompressed, then in narrow dtypes (its trainer reads them alike)
_HABANA_PACKED = tuple(t.name for t in TARGETS if t.name.startswith("habana-packed"))


@dataclass(frozen=True)
class Layout:
    """A trainer's layout: the targets (preprocessing/targets.py) whose folder it lays out, preferred first; how
    (``bins``: Samsung's int-named bin folders; ``flat``: the bins' shards in one folder as training_*; ``files``: the
    target folder's files matching ``files``, under their own names); and the metadata file linked beside train/."""

    name: str
    targets: tuple[str, ...]
    kind: str
    help: str
    files: str = ""
    metadata: str = ""  # the last_run.json output folder's sibling file: <folder>_metadata.json


LAYOUT_SPECS: tuple[Layout, ...] = (
    Layout("samsung", ("samsung-4bins",), "bins", "Samsung's MLPerf trainer: the int-named bin folders"),
    Layout("habana", ("samsung-4bins",), "flat", "Habana Model-References bert, unpacked (--enable_packed_data_mode "
           "False): one flat folder of *training* files, padded rows"),
    Layout("nvidia-dle", ("samsung-4bins",), "flat", "NVIDIA DeepLearningExamples' HDF5 trainer: as habana"),
    Layout("nvidia", ("nvidia-4320", "nvidia-varlength", "nvidia-2048", "nvidia-4320-v1.1", "nvidia-2048-varlength"),
           "files",
           "NVIDIA's MLPerf trainer (training_results v1.1 and later): its variable-length part_* shards",
           files=r"^part_\d+_of_\d+\.hdf5$"),
    Layout("nvidia-packed", ("nvidia-packed",), "files", "NVIDIA's MLPerf trainer with --packed_samples: its packed "
           "part_* shards", files=r"^part_\d+\.hdf5$"),
    Layout("habana-packed", _HABANA_PACKED, "files", "Habana's "
           "trainer in packed mode (its default): the packed files (habana-packed's, else habana-packed-raw's: the "
           "same packs uncompressed, else habana-packed-narrow's: the same values in narrow integer types) and "
           "train_metadata.json", files=r"^mixed_strategies_part_\d+\.hdf5$", metadata="_metadata.json"),
)
LAYOUT_BY_NAME = {lay.name: lay for lay in LAYOUT_SPECS}
LAYOUTS = tuple(LAYOUT_BY_NAME)
_MARKER_TMP = re.compile(r"^\.bertpipe_export\.json\.tmp-\d+$")  # a killed marker write's temp file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="folder to build the symlink tree in (created if missing; not a "
                   "symlink, not in a work dir)")
    p.add_argument("--layout", required=True, choices=LAYOUTS,
                   help="; ".join(f"{lay.name}: {lay.help}" for lay in LAYOUT_SPECS).replace("%", "%%"))
    p.add_argument("--target", help="which of the run's targets the layout lays out, where it lays out more than one "
                   "(nvidia: nvidia-4320, nvidia-varlength, nvidia-2048, nvidia-4320-v1.1 or nvidia-2048-varlength; "
                   "habana-packed: habana-packed, habana-packed-raw or habana-packed-narrow; default: the first of those the run built)")
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=Path, default=Path("work"),
                   help="the work dir of the `bertpipe run` whose data set to export (default: work, as bertpipe run)")
    p.add_argument("--overwrite", action="store_true",
                   help="allow an OUT that is not empty and not a previous export: the export goes in beside its "
                   "files (it still never replaces or deletes a file, link or folder it did not make)")
    p.add_argument("--replace-copies", action="store_true",
                   help="OUT is your own copy of an export (e.g. cp -rL): replace each real file whose bytes equal "
                   "the data set's file by a link to it (read in full); a file that differs is refused")


def run(args: argparse.Namespace) -> int:
    from core.errors import InputError

    if not args.out.strip():
        raise InputError("OUT is an empty string; give the folder to build the symlink tree in")
    layout = LAYOUT_BY_NAME[args.layout]
    target, train_dir, eval_file, vocab = _dataset(args.work_dir, layout, getattr(args, "target", None))
    metadata = _metadata(train_dir, layout)
    out = _out_folder(args.out)
    _refuse_work_dirs(out, args.work_dir.resolve(), train_dir, [eval_file, vocab, metadata])
    if layout.kind == "files":
        links, skipped = _plan_files(_listed(train_dir, layout), eval_file, vocab)
    else:
        links, skipped = _plan(args.layout, _shards(train_dir), eval_file, vocab)
    if metadata is not None:
        links[METADATA] = metadata
    planned = {name: str(target) for name, target in links.items()}
    info = {"layout": args.layout, "target": target, "work_dir": str(args.work_dir.resolve()),
            "train_dir": str(train_dir), "eval_hdf5": str(eval_file) if eval_file else None,
            "vocab": str(vocab) if vocab else None,
            "train_files": sum(1 for name in links if name.startswith("train/")), "empty_shards_left_out": skipped,
            "exported": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with _locked(out) as (fd, out_id):
        rec = _read_marker(out, out_id)
        if rec.other_folder and not args.replace_copies:
            raise InputError(f"{out / MARKER} was written for {rec.other_folder}, not {out} (a copy, or a stale "
                             "marker): if OUT is your own copy of that export, add --replace-copies; else move the "
                             "marker away and clear OUT's train/, eval/ and vocab.txt yourself, or choose another OUT")
        entries = sorted(n for n in os.listdir(out) if not _MARKER_TMP.match(n))
        if entries and not rec.version and not (args.overwrite or args.replace_copies):
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise InputError(f"OUT {out} is not empty ({shown}) and is not a previous export-dataset output; choose "
                             "an empty or new folder, or add --overwrite to export beside what it holds (nothing of "
                             "it is replaced or deleted)")
        todo = _check(out, planned, rec, args.replace_copies)
        head = {"format": FORMAT, "version": VERSION, "out": str(out), "out_id": out_id, **info}
        copies = _apply(out, fd, planned, todo, head)
    n = info["train_files"]
    print(f"{out}/train: {n} shard links ({args.layout} layout of {target}"
          f"{f', {skipped} empty shards left out' if skipped else ''}) -> the trainer's input dir")
    if metadata is not None:
        print(f"{out}/{METADATA} (avg_seq_per_sample, beside the input dir)")
    print(f"{out}/eval/{EVAL_NAME} -> the trainer's eval dir" if eval_file else
          f"no eval file: {args.work_dir}'s last run made none (run its eval stages to get one)")
    if vocab:
        print(f"{out}/vocab.txt")
    if copies:
        print(f"{copies} copied files replaced by links to the same bytes (--replace-copies)")
    return 0


@contextmanager
def _locked(out: Path):
    """OUT (created if missing) held by this export alone: (its fd, [st_dev, st_ino])."""
    import fcntl

    from core.errors import InputError

    out.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"another export-dataset is writing OUT {out} now; wait for it to finish, then "
                             "export again") from None
        st = os.fstat(fd)
        yield fd, [st.st_dev, st.st_ino]
    finally:
        os.close(fd)


# -- what to export -----------------------------------------------------------------------------------
def _dataset(work: Path, layout: Layout, target: str | None = None) -> tuple[str, Path, Path | None, Path | None]:
    """(target, its folder, its eval file or None, vocab or None) of the work dir's last run, checked to exist.

    The target is ``target`` (one of the layout's), else the first of the layout's targets the run built; a layout
    none of whose targets the run built is refused naming the ``--target`` to build."""
    from core.errors import InputError
    from preprocessing.targets import BY_NAME
    from tasks.workdir import last_run

    if not work.is_dir():
        raise InputError(f"--work-dir {work} is not a folder; give the work dir of a `bertpipe run`")
    out = last_run(work).get("outputs", {})
    if not out:
        raise InputError(f"--work-dir {work} has no run summary ({work}/last_run.json); run `bertpipe run --work-dir "
                         f"{work}` first")
    built = [t for t in layout.targets if BY_NAME[t].train in out]
    if target is not None:
        if target not in layout.targets:
            raise InputError(f"--target {target}: the {layout.name} layout lays out {' or '.join(layout.targets)}; "
                             "choose one of those (or another --layout)")
        if target not in built:
            raise InputError(f"--target {target}: the last run of {work} did not build it ({work}/last_run.json names "
                             f"no {BY_NAME[target].train}); run `bertpipe run --work-dir {work} --target {target}` "
                             "(with the run's other --target flags) first")
        built = [target]
    if not built:
        others = [t for t, spec in BY_NAME.items() if spec.train in out]
        want = layout.targets[1] if layout.name == "nvidia" else layout.targets[0]  # nvidia-varlength: v1.1's set
        raise InputError(f"--layout {layout.name} needs the folder of --target {' or '.join(layout.targets)}, which "
                         f"the last run of {work} did not build (it built {', '.join(others) or 'no target folder'}); "
                         f"run `bertpipe run --work-dir {work} --target {want}` (with the run's other --target flags), "
                         "then export again")
    spec = BY_NAME[built[0]]
    train = Path(out[spec.train])
    if not train.is_dir():
        raise InputError(f"{spec.train} {train} (from {work}/last_run.json) does not exist; run `bertpipe run "
                         f"--work-dir {work}` again to rebuild it")
    eval_file = Path(out[spec.eval]) if out.get(spec.eval) else None
    if eval_file is not None and not eval_file.is_file():
        raise InputError(f"{spec.eval} {eval_file} (from {work}/last_run.json) does not exist; run `bertpipe run "
                         f"--work-dir {work}` again to rebuild it")
    vocab = Path(out["vocab"]) if out.get("vocab") and Path(out["vocab"]).is_file() else None
    return built[0], train.resolve(), eval_file.resolve() if eval_file else None, vocab.resolve() if vocab else None


def _metadata(train: Path, layout: Layout) -> Path | None:
    """The metadata file the layout links beside OUT/train (``<folder>_metadata.json`` beside the target folder)."""
    from core.errors import InputError

    if not layout.metadata:
        return None
    path = train.parent / f"{train.name}{layout.metadata}"
    if not path.is_file():
        raise InputError(f"{path} (the metadata beside {train}) does not exist; run `bertpipe run` on the work dir "
                         "again to rebuild it")
    return path


def _manifest_of(folder: Path):  # -> (Manifest, the folder its names are relative to)
    """The manifest of the stage that wrote ``folder`` (in it, or one level up), every file there of its size."""
    from core.errors import InputError
    from core.manifest import MANIFEST_NAME, verify_manifest

    for d in (folder, folder.parent):
        if (d / MANIFEST_NAME).is_file():
            return verify_manifest(d, check_md5=False), d  # every file there, of its size (`bertpipe verify` re-hashes)
    raise InputError(f"{folder} has no stage manifest (in it or beside it); run `bertpipe run` on the work dir again")


def _listed(folder: Path, layout: Layout) -> list[Path]:
    """The files of ``folder`` its manifest lists whose names match the layout's pattern, sorted by name."""
    from core.errors import InputError

    m, base = _manifest_of(folder)
    rel = folder.relative_to(base).as_posix()
    pattern = re.compile(layout.files)
    names = sorted(PurePosixPath(f.name).name for f in m.files if str(PurePosixPath(f.name).parent) == rel
                   and pattern.match(PurePosixPath(f.name).name))
    if not names:
        raise InputError(f"{folder} holds no files of the {layout.name} layout; run `bertpipe run` on the work dir "
                         "again to rebuild it")
    return [folder / n for n in names]


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


def _plan_files(files: list[Path], eval_file: Path | None, vocab: Path | None) -> tuple[dict[str, Path], int]:
    """(name under OUT -> absolute target, empty files left out): each file under its own name in train/."""
    links: dict[str, Path] = {}
    skipped = 0
    for f in files:
        if _rows(f):
            links[f"train/{f.name}"] = f
        else:
            skipped += 1
    if eval_file is not None:
        links[f"eval/{EVAL_NAME}"] = eval_file
    if vocab is not None:
        links["vocab.txt"] = vocab
    return links, skipped


# -- the output folder ----------------------------------------------------------------------------------
def _step(what: str, rel: str) -> None:
    """Called before each change to OUT (test hook: raising here stops the export there, as a kill would)."""


def _work_marks() -> tuple[str, ...]:
    """Names whose presence makes a folder (part of) a bertpipe work dir or stage output."""
    from core.lock import LOCK_NAME
    from core.manifest import DROPPED_NAME, MANIFEST_NAME, STAT_NAME

    return (LOCK_NAME, "last_run.json", MANIFEST_NAME, DROPPED_NAME, STAT_NAME)


def _marks_in(d: Path) -> str | None:
    return next((m for m in _work_marks() if os.path.lexists(d / m)), None)


def _out_folder(text: str) -> Path:
    """OUT as an absolute real path; refused when it is a symlink, a file, or not writable/creatable."""
    from core.errors import InputError

    p = Path(text)
    if p.is_symlink():
        raise InputError(f"OUT {text} is a symlink (to {os.readlink(p)}); give the folder itself "
                         f"({p.resolve()}), so that what export-dataset records and removes is plainly inside it")
    absolute = Path(os.path.abspath(p))
    if absolute.exists() and not absolute.is_dir():
        raise InputError(f"OUT {text} is a file; give a folder (new, empty, or a previous export-dataset output)")
    if not absolute.exists():
        parent = next(a for a in absolute.parents if a.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise InputError(f"cannot create OUT {text}: {parent} is not a writable folder; choose another path")
    elif not os.access(absolute, os.W_OK):
        raise InputError(f"OUT {text} is read-only; choose a writable folder")
    return absolute.resolve()


def _refuse_work_dirs(out: Path, work: Path, train: Path, files: list[Path | None]) -> None:
    """OUT must not be, lie inside or hold a work dir or stage output, nor hold the data set it links to."""
    from core.errors import InputError

    for inside in (work, train):
        if out.is_relative_to(inside):
            raise InputError(f"OUT {out} is inside {inside}, the data set it would export; choose a folder "
                             "outside the work dir")
    for held in (work, train, *(f for f in files if f is not None)):
        if held.is_relative_to(out):
            raise InputError(f"OUT {out} holds {held}, part of the data set it would export; choose a folder "
                             "that does not hold the work dir")
    never = "export-dataset never writes or deletes in one: choose a folder outside it"
    for a in (out, *out.parents):
        if a.is_dir() and (mark := _marks_in(a)):
            where = "is" if a == out else "is inside"
            raise InputError(f"OUT {out} {where} {a}, a bertpipe work dir or stage output (it holds {mark}); {never}")
        if a.name and os.path.lexists(a.parent / f"{a.name}.manifest.json"):
            where = "is" if a == out else "is inside"
            raise InputError(f"OUT {out} {where} {a}, a bertpipe stage output ({a.name}.manifest.json beside it); "
                             f"{never}")
    if out.is_dir():
        for child in sorted(out.iterdir()):
            if child.is_dir() and not child.is_symlink() and (mark := _marks_in(child)):
                raise InputError(f"OUT {out} holds {child}, a bertpipe work dir or stage output (it holds {mark}); "
                                 "export-dataset never writes or deletes in one: move it, or choose another OUT")


def _valid_name(name: object, kind: str) -> bool:
    """A normalized relative path under one of ROOTS (a link: a file root or below a folder root)."""
    if not isinstance(name, str) or not name or "\0" in name or "\\" in name:
        return False
    pp = PurePosixPath(name)
    if str(pp) != name or pp.is_absolute() or ".." in pp.parts or pp.parts[0] not in ROOTS:
        return False
    if ROOTS[pp.parts[0]] == "file":
        return kind == "link" and len(pp.parts) == 1
    return kind == "dir" or len(pp.parts) > 1


@dataclass
class _Recorded:
    """What OUT's marker says export-dataset made there (version 0: no marker)."""

    version: int = 0
    links: dict[str, set[str]] = field(default_factory=dict)  # name -> the targets its link may have
    dirs: set[str] = field(default_factory=set)
    other_folder: str = ""  # the folder the marker was written for, when that is not OUT (a copy)
    v1: tuple[str, str | None, str | None] | None = None  # version 1: (train_dir, eval_hdf5, vocab)

    def owns(self, name: str, target: str) -> bool:
        if target in self.links.get(name, ()):
            return True
        if self.v1 is None:
            return False
        train, eval_file, vocab = self.v1
        if name == "vocab.txt":
            return target == vocab
        if name == f"eval/{EVAL_NAME}":
            return target == eval_file
        folder, base = os.path.split(target)
        return (name.startswith("train/") and bool(_PART.match(base)) and os.path.dirname(folder) == train
                and os.path.basename(folder) in _BINS)


def _read_marker(out: Path, out_id: list[int]) -> _Recorded:
    from core.errors import InputError

    path = out / MARKER
    what = (f"export-dataset cannot tell which files in {out} are its own: move the marker away and clear "
            f"{out}'s train/, eval/ and vocab.txt yourself, or choose another OUT")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return _Recorded()
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path} is not a file (a {'symlink' if stat.S_ISLNK(st.st_mode) else 'folder or other'}); "
                         + what)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"{path} is not a readable export-dataset marker ({type(exc).__name__}); {what}") from None

    def bad(why: str) -> InputError:
        return InputError(f"{path} is damaged or not export-dataset's ({why}); {what}")

    if not isinstance(d, dict):
        raise bad("not a JSON object")
    if "format" not in d and d.get("layout") in LAYOUTS and isinstance(d.get("train_dir"), str):
        ev, voc = d.get("eval_hdf5"), d.get("vocab")  # version 1: no record of its links
        if not all(x is None or isinstance(x, str) for x in (ev, voc)):
            raise bad("eval_hdf5 or vocab is not a path")
        return _Recorded(1, {}, {"train", "eval", *(f"train/{b}" for b in _BINS)}, "", (d["train_dir"], ev, voc))
    if d.get("format") != FORMAT:
        raise bad(f"no \"format\": \"{FORMAT}\"")
    v = d.get("version")
    if isinstance(v, int) and not isinstance(v, bool) and v > VERSION:
        raise InputError(f"{path} was written by a newer bertpipe (marker version {v}; this one reads up to "
                         f"{VERSION}); export with that version, or choose another OUT")
    if v != VERSION:
        raise bad(f"version {v!r}")
    links, previous, dirs = d.get("links"), d.get("previous", {}), d.get("dirs")
    if not isinstance(links, dict) or not isinstance(previous, dict) or not isinstance(dirs, list):
        raise bad("links, previous or dirs missing or of the wrong type")
    rec = _Recorded(VERSION)
    for table in (links, previous):
        for name, target in table.items():
            if not _valid_name(name, "link"):
                raise bad(f"entry {name!r} is not a path inside OUT's train/, eval/ or vocab.txt")
            if not isinstance(target, str) or not os.path.isabs(target) or "\0" in target:
                raise bad(f"the target of {name!r} is not an absolute path")
            rec.links.setdefault(name, set()).add(target)
    for name in dirs:
        if not _valid_name(name, "dir") or name in rec.links:
            raise bad(f"folder entry {name!r} is not a folder path inside OUT's train/ or eval/")
        rec.dirs.add(name)
    written_for, written_id = d.get("out"), d.get("out_id")
    if not isinstance(written_for, str) or not isinstance(written_id, list):
        raise bad("no out / out_id")
    if written_for != str(out) and written_id != out_id:  # neither the same path nor the same folder (moved)
        rec.other_folder = written_for
    return rec


@dataclass
class _Todo:
    remove: list[tuple[str, str, object]] = field(default_factory=list)  # (name, "link"|"copy", target|stat key)
    present: dict[str, str] = field(default_factory=dict)  # name -> target of each link of ours now in OUT
    dirs: set[str] = field(default_factory=set)  # folders now in OUT that are ours
    keep: set[str] = field(default_factory=set)  # links already as planned


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _same_content(path: Path, st: os.stat_result, target: str) -> bool:
    """The regular file ``path`` holds the same bytes as ``target`` (a copy of it, or a hard link to it)."""
    try:
        tst = os.stat(target)
    except OSError:
        return False
    if not stat.S_ISREG(tst.st_mode) or tst.st_size != st.st_size:
        return False
    if (tst.st_dev, tst.st_ino) == (st.st_dev, st.st_ino):
        return True
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as a, open(target, "rb") as b:
        while chunk := a.read(1 << 20):
            if chunk != b.read(len(chunk)):
                return False
    return True


def _check(out: Path, planned: dict[str, str], rec: _Recorded, replace_copies: bool) -> _Todo:
    """Account for every entry of OUT's train/, eval/ and vocab.txt, or refuse naming the first that is not ours."""
    from core.errors import InputError

    todo = _Todo()
    planned_dirs = {str(p) for n in planned for p in PurePosixPath(n).parents if str(p) != "."}
    leave = f"export-dataset deletes only the links it made: move it out of {out}, or choose another OUT"

    def visit(rel: str) -> None:
        p = out / rel
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(p)
            if rec.owns(rel, target) or planned.get(rel) == target:  # ours, or exactly the link it would make
                todo.present[rel] = target
                if planned.get(rel) == target:
                    todo.keep.add(rel)
                else:
                    todo.remove.append((rel, "link", target))
                return
            said = " or ".join(sorted(rec.links.get(rel, ()))) or "no link there"
            raise InputError(f"{p} is a symlink export-dataset did not make (to {target}; {MARKER} records {said}); "
                             + leave)
        if stat.S_ISDIR(st.st_mode):
            if mark := _marks_in(p):
                raise InputError(f"{p} is a bertpipe work dir or stage output (it holds {mark}); export-dataset never "
                                 "deletes inside one: move it out of OUT, or choose another OUT")
            if rel not in rec.dirs and not (replace_copies and rel in planned_dirs):
                raise InputError(f"{p}/ is a folder export-dataset did not make; " + leave)
            todo.dirs.add(rel)
            for child in sorted(os.listdir(p)):
                visit(f"{rel}/{child}")
            return
        if stat.S_ISREG(st.st_mode):
            if replace_copies and rel in planned:
                if _same_content(p, st, planned[rel]):
                    todo.remove.append((rel, "copy", _stat_key(st)))
                    return
                raise InputError(f"{p} is a file that differs from {planned[rel]}, the file its link would point "
                                 f"to (not a copy of this data set); {leave}")
            hint = ("" if replace_copies else f" (or, if {out} is your own copy of this export, add --replace-copies: "
                    "files equal to the data set's are then replaced by links)")
            raise InputError(f"{p} is a file, not a link export-dataset made; {leave}{hint}")
        raise InputError(f"{p} is not a file, folder or link; " + leave)

    for root in ROOTS:
        visit(root)
    return todo


def _open_parent(out_fd: int, rel: str) -> tuple[int, str]:
    """(fd of the folder holding ``rel``, reached from OUT without following any symlink; its last name)."""
    *folders, name = rel.split("/")
    fd = os.dup(out_fd)
    try:
        for part in folders:
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _apply(out: Path, out_fd: int, planned: dict[str, str], todo: _Todo, head: dict) -> int:
    """Make OUT hold exactly the planned links; returns the number of copies replaced by links.

    Order: the marker first records every link of ours now in OUT and every one to come (complete: false),
    then links and copies are removed (each checked again: the same link, or the same file, still there,
    reached without following a symlink), folders no longer needed removed if empty, new folders and links
    made, and the final marker written last. Stopped anywhere, OUT holds only what the marker accounts for,
    so the next export (any layout) picks up from there.
    """
    from core.errors import InputError
    from core.manifest import atomic_write_text

    planned_dirs = {str(p) for n in planned for p in PurePosixPath(n).parents if str(p) != "."}
    depth = lambda rel: rel.count("/")  # noqa: E731
    previous = {n: t for n, t in todo.present.items() if planned.get(n) != t}
    _step("marker", MARKER)
    atomic_write_text(out / MARKER, json.dumps({**head, "complete": False, "dirs": sorted(todo.dirs | planned_dirs),
                                                "links": planned, "previous": previous}, indent=1) + "\n")
    copies = 0
    rel = ""
    try:
        for rel, kind, expected in sorted(todo.remove, key=lambda r: -depth(r[0])):
            _step("unlink", rel)
            fd, name = _open_parent(out_fd, rel)
            try:
                try:
                    st = os.lstat(name, dir_fd=fd)
                except FileNotFoundError:
                    continue
                same = (stat.S_ISLNK(st.st_mode) and os.readlink(name, dir_fd=fd) == expected if kind == "link"
                        else stat.S_ISREG(st.st_mode) and _stat_key(st) == expected)
                if not same:
                    raise InputError(f"{out / rel} changed while exporting (it is no longer the "
                                     f"{'link' if kind == 'link' else 'copy'} checked); nothing of it was removed: "
                                     "see what changed it, then export again")
                os.unlink(name, dir_fd=fd)
                copies += kind == "copy"
            finally:
                os.close(fd)
        for rel in sorted(todo.dirs - planned_dirs, key=depth, reverse=True):
            _step("rmdir", rel)
            fd, name = _open_parent(out_fd, rel)
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                raise InputError(f"{out / rel}/ is not empty after its links were removed (something was added "
                                 "while exporting); move that out and export again") from None
            finally:
                os.close(fd)
        for rel in sorted(planned_dirs - todo.dirs, key=depth):
            _step("mkdir", rel)
            fd, name = _open_parent(out_fd, rel)
            try:
                os.mkdir(name, dir_fd=fd)
            finally:
                os.close(fd)
        for rel, target in planned.items():
            if rel in todo.keep:
                continue
            _step("symlink", rel)
            fd, name = _open_parent(out_fd, rel)
            try:
                os.symlink(target, name, dir_fd=fd)
            finally:
                os.close(fd)
    except OSError as exc:
        raise InputError(f"cannot export into {out / rel}: {exc.strerror or exc}; {out} is half-exported (what is "
                         "there is recorded in its marker): fix that and run the same export again") from None
    _step("marker", MARKER)
    atomic_write_text(out / MARKER, json.dumps({**head, "complete": True, "dirs": sorted(planned_dirs),
                                                "links": planned}, indent=1) + "\n")
    return copies
