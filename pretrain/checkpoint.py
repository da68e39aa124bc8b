"""Checkpoints: DeepSpeed's own files plus what exact resume needs and DeepSpeed does not keep.

Layout under ``OUTPUT_DIR/checkpoints/``::

    latest                          tag of the newest complete checkpoint, written by bertpipe (temp name +
                                    rename) after the tag's completion record; DeepSpeed's own (truncating)
                                    write of it is off
    <step>/mp_rank_00_model_states.pt, *_optim_states.pt    DeepSpeed (weights, ZeRO fp32 partitions,
                                                            optimizer moments, lr scheduler)
    <step>/bertpipe_config.json     model config + run settings; a resume with another model is refused
    <step>/bertpipe_rank<r>.pt      per rank: RNG states, the data sampler's position and the samples
                                    trained (MLPerf's count: sequences for packed rows; plain tensors
                                    and ints, read back with ``torch.load(weights_only=True)``)
    <step>/bertpipe_complete.json   the completion record, written last (after every rank's files, temp name +
                                    rename): every file of the tag with its size and md5

**Complete** (:func:`tag_problem`) means: the tag is a plain folder name inside ``checkpoints/`` (never a
path such as ``../x``, never a symlink), its completion record lists the config, the model states and a
rank file per rank of the run, and every listed file is there with its size (and md5, where verified).
Checkpoints written before completion records existed are checked by structure instead: the config, the
model states and one rank file per rank, every ``.pt`` with an intact zip directory.

**Resume** (:func:`start_point`): ``latest`` when it names a complete checkpoint; when it is missing,
empty, damaged (a path, a symlink, unreadable) or names an incomplete one, the newest complete checkpoint,
said in one line; when the run has checkpoints but none is complete, a refusal. A start without
``--resume`` over a run's checkpoints is refused unless ``--overwrite`` (:func:`discard_run`).
**Pruning** (:func:`prune_checkpoints`) removes only tag folders the run made, never the newest complete
one nor the one ``latest`` names.

Every file is read with ``torch.load(weights_only=True)``, DeepSpeed's too: its own loader passes
``weights_only=False`` (a full pickle load), so :func:`safe_deepspeed_loads` replaces it on the engine with
one that allows only the few plain DeepSpeed classes its checkpoints hold (:data:`DEEPSPEED_SAFE_GLOBALS`).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InputError

CONFIG_NAME = "bertpipe_config.json"
COMPLETE_NAME = "bertpipe_complete.json"
LATEST_NAME = "latest"
STATE_VERSION = 1
#: "format" of bertpipe_config.json in tags that get a completion record (absent: written before them)
CHECKPOINT_FORMAT = 2
#: what DeepSpeed copies next to the tags (removed with the run by --overwrite)
RECOVERY_SCRIPTS = ("zero_to_fp32.py", "zero_to_torch.py")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def tag_name_problem(tag: Any) -> str:
    """Why ``tag`` cannot be a checkpoint tag (a plain folder name: letters, digits, ``_.-``), or ""."""
    if not isinstance(tag, str) or not _TAG.fullmatch(tag) or tag in (".", ".."):
        return f"{tag!r} is not a checkpoint tag (a plain folder name inside checkpoints/)"
    return ""


def tag_dir(output_dir: str | Path, tag: str) -> Path:
    """``checkpoints/<tag>``, refusing a tag that is a path or a folder that leads out of ``checkpoints/``.

    Raises:
        InputError: naming the tag.
    """
    root = checkpoint_dir(output_dir)
    problem = tag_name_problem(tag)
    d = root / str(tag)
    if not problem and d.is_symlink():
        problem = f"checkpoint {d} is a symbolic link"
    if problem:
        raise InputError(f"{problem}; checkpoints are read only from folders inside {root}")
    return d


def read_latest(output_dir: str | Path) -> tuple[str | None, str]:
    """(the tag ``checkpoints/latest`` names, "") or (None, why not: "is missing", "is empty", "is damaged
    (...)"). The file is never followed out of ``checkpoints/``: a path, a symlink, or bytes that are not a
    tag make it damaged."""
    f = checkpoint_dir(output_dir) / LATEST_NAME
    if f.is_symlink():
        return None, "is damaged (a symbolic link)"
    if not f.exists():
        return None, "is missing"
    if not f.is_file():
        return None, "is damaged (not a file)"
    try:
        with open(f, "rb") as fh:
            raw = fh.read(257)
        text = raw.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"is damaged (unreadable: {exc})"
    if not text:
        return None, "is empty"
    problem = tag_name_problem(text)
    if problem or len(raw) > 256:
        return None, f"is damaged (it holds {text[:60]!r}, not a checkpoint tag)"
    return text, ""


def latest_tag(output_dir: str | Path) -> str | None:
    """The tag ``checkpoints/latest`` names when that is a plain tag name (see :func:`read_latest`), else None.

    It may still be incomplete: :func:`newest_complete` / :func:`start_point` check that."""
    return read_latest(output_dir)[0]


def write_latest(output_dir: str | Path, tag: str) -> None:
    """``checkpoints/latest`` := ``tag``, atomically (temp name, fsync, rename): a kill never leaves it empty."""
    from core.manifest import atomic_write_text

    if tag_name_problem(tag):
        raise ValueError(tag_name_problem(tag))
    atomic_write_text(checkpoint_dir(output_dir) / LATEST_NAME, tag)


def rank_state_path(output_dir: str | Path, tag: str, rank: int) -> Path:
    return checkpoint_dir(output_dir) / tag / f"bertpipe_rank{rank}.pt"


def write_run_config(output_dir: str | Path, tag: str, model_cfg: dict[str, Any], run: dict[str, Any]) -> None:
    """Rank 0: the model config and run settings next to DeepSpeed's files."""
    d = checkpoint_dir(output_dir) / tag
    d.mkdir(parents=True, exist_ok=True)
    (d / CONFIG_NAME).write_text(json.dumps({"format": CHECKPOINT_FORMAT, "model": model_cfg, "run": run}, indent=2,
                                            sort_keys=True))


def check_model_config(output_dir: str | Path, tag: str, model_cfg: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint written for another model shape.

    Raises:
        InputError: naming the checkpoint and the differing fields.
    """
    path = checkpoint_dir(output_dir) / tag / CONFIG_NAME
    try:
        saved = json.loads(path.read_text())["model"]
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"checkpoint {path.parent} has no readable {CONFIG_NAME} ({exc}); it was not "
                         "written by bertpipe train or is incomplete: remove it or use another --output-dir") from exc
    diffs = [f"{k}: checkpoint {saved.get(k)!r} vs this run {model_cfg.get(k)!r}"
             for k in sorted(set(saved) | set(model_cfg)) if saved.get(k) != model_cfg.get(k)]
    if diffs:
        raise InputError(f"checkpoint {path.parent} was written for another model config ({'; '.join(diffs)}); "
                         "resume it with the same --model/--model-config, or use another --output-dir")


def save_rank_state(output_dir: str | Path, tag: str, rank: int, step: int, rng: dict, data: dict,
                    eval_pending: bool = False, samples: int | None = None) -> None:
    """Per-rank RNG + data position (``torch.save`` of plain tensors, ints and strings); ``eval_pending``: the
    eval of this step was stopped (SIGTERM) and runs first on resume; ``samples``: the MLPerf samples trained
    to this step, all ranks (sequences: a packed run's steps hold a varying number; absent in checkpoints
    written before it was kept)."""
    import torch

    path = rank_state_path(output_dir, tag, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    extra = {} if samples is None else {"samples": int(samples)}
    torch.save({"version": STATE_VERSION, "step": int(step), "rng": rng, "data": data,
                "eval_pending": bool(eval_pending), **extra}, tmp)
    tmp.replace(path)


def check_torch_file(path: str | Path) -> None:
    """Refuse a ``torch.save`` file that is cut off or damaged, cheaply: its zip central directory (at the
    end of the file) must be readable. A checkpoint truncated by a full disk or a kill fails here, naming it."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise InputError(f"{path} is truncated or damaged ({exc}); that checkpoint is incomplete: delete its "
                         "folder (or write an older tag into checkpoints/latest) and run again") from None


def check_checkpoint_files(output_dir: str | Path, tag: str) -> None:
    """Every ``.pt`` file of checkpoint ``tag`` is complete (see :func:`check_torch_file`)."""
    d = checkpoint_dir(output_dir) / tag
    files = sorted(d.glob("*.pt")) if d.is_dir() else []
    if not files:
        raise InputError(f"{d} holds no checkpoint files (*.pt); it is incomplete: delete it (or write an older "
                         "tag into checkpoints/latest) and run again")
    for p in files:
        check_torch_file(p)


def load_rank_state(output_dir: str | Path, tag: str, rank: int) -> dict[str, Any]:
    """Read what :func:`save_rank_state` wrote, with ``weights_only=True``."""
    import torch

    path = rank_state_path(output_dir, tag, rank)
    if not path.is_file():
        raise InputError(f"{path} is missing: the checkpoint was written by fewer ranks or is incomplete; "
                         "resume with the same number of ranks")
    check_torch_file(path)
    state = torch.load(path, weights_only=True)
    if state.get("version") != STATE_VERSION:
        raise InputError(f"{path}: unknown state version {state.get('version')!r} (expected {STATE_VERSION})")
    return state


#: DeepSpeed classes found in its ZeRO checkpoints (loss scaler, ZeRO stage enum, fp32 fragment address):
#: plain data, safe to rebuild. Anything else in a checkpoint makes the load fail.
DEEPSPEED_SAFE_GLOBALS = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def weights_only_load(path: str | Path, map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)`` that also accepts :data:`DEEPSPEED_SAFE_GLOBALS`.

    A file with any other Python object (e.g. a crafted pickle) is refused with an InputError naming it.
    """
    import importlib

    import torch

    allowed = []
    for module, name in DEEPSPEED_SAFE_GLOBALS:
        try:
            allowed.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # another DeepSpeed release: that class is not needed
            pass
    check_torch_file(path)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        if type(exc).__name__ == "UnpicklingError" or "Weights only load failed" in str(exc):
            first = str(exc).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
            raise InputError(f"{path}: refused to load: it holds objects other than tensors and plain data "
                             f"({first}); bertpipe loads checkpoints with torch.load(weights_only=True)") from None
        raise


def safe_deepspeed_loads(engine: Any) -> None:
    """Make ``engine.load_checkpoint`` read its files with :func:`weights_only_load` (no full pickle load)."""
    ce = getattr(engine, "checkpoint_engine", None)
    if ce is not None and hasattr(ce, "load"):
        ce.load = lambda path, map_location=None: weights_only_load(path, map_location)


def tag_files(output_dir: str | Path, tag: str) -> list[str]:
    """The files of checkpoint ``tag`` (paths relative to its folder, sorted), its completion record excepted."""
    d = tag_dir(output_dir, tag)
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*")
                  if p.is_file() and not p.is_symlink() and p.name != COMPLETE_NAME and ".tmp" not in p.name)


def describe_files(output_dir: str | Path, tag: str, names: list[str]) -> dict[str, dict[str, Any]]:
    """``{name: {"size", "md5"}}`` of some files of checkpoint ``tag`` (each rank hashes its share)."""
    from core.manifest import md5_files

    d = tag_dir(output_dir, tag)
    paths = [d / n for n in names]
    return {n: {"size": p.stat().st_size, "md5": m} for n, p, m in zip(names, paths, md5_files(paths), strict=True)}


def write_completion(output_dir: str | Path, tag: str, step: int, world_size: int,
                     files: dict[str, dict[str, Any]]) -> Path:
    """Rank 0, once every rank's files of ``tag`` are written: the completion record (temp name + rename)."""
    from core.manifest import atomic_write_text

    path = tag_dir(output_dir, tag) / COMPLETE_NAME
    atomic_write_text(path, json.dumps({"format": CHECKPOINT_FORMAT, "tag": tag, "step": int(step),
                                        "world_size": int(world_size), "files": files,
                                        "written": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=1, sort_keys=True))
    return path


def _required(world: int) -> list[str]:
    return [CONFIG_NAME, "mp_rank_00_model_states.pt"] + [f"bertpipe_rank{r}.pt" for r in range(world)]


def _legacy_problem(d: Path, config: dict[str, Any]) -> str:
    """Structure of a tag written before completion records: config, model states, a rank file per rank,
    the ZeRO files one per rank if any, every .pt with an intact zip directory."""
    import zipfile

    world = (config.get("run") or {}).get("world_size")
    if not isinstance(world, int) or world < 1:
        return f"{CONFIG_NAME} records no world_size"
    missing = [n for n in _required(world) if not (d / n).is_file()]
    if missing:
        return f"{', '.join(missing)} missing"
    zero = sorted(p.name for p in d.glob("*zero_pp_rank_*_optim_states.pt"))
    if zero and len(zero) != world:
        return f"{len(zero)} ZeRO optimizer files for {world} ranks"
    for p in sorted(d.glob("*.pt")):
        try:
            with zipfile.ZipFile(p) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError):
            return f"{p.name} is truncated or damaged"
    return ""


def tag_problem(output_dir: str | Path, tag: str, *, md5: bool = False) -> str:
    """Why checkpoint ``tag`` is not complete ("" when it is). ``md5``: also check every file's md5 (reads
    them all); without it, the sizes."""
    try:
        d = tag_dir(output_dir, tag)
    except InputError as exc:
        return str(exc).split(";")[0]
    if not d.is_dir():
        return f"there is no folder {d}"
    try:
        config = json.loads((d / CONFIG_NAME).read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as exc:
        return f"no readable {CONFIG_NAME} ({exc.__class__.__name__})"
    record_path = d / COMPLETE_NAME
    if record_path.is_symlink():
        return "its completion record is a symbolic link"
    if "format" not in config and not record_path.exists():
        problem = _legacy_problem(d, config)
        return f"{problem} (written before completion records)" if problem else ""
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no completion record: the save did not finish"
    except (OSError, ValueError) as exc:
        return f"its completion record is unreadable ({exc.__class__.__name__})"
    files = record.get("files") if isinstance(record, dict) else None
    world = record.get("world_size") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files or not isinstance(world, int) or world < 1 or record.get("tag") != tag:
        return "its completion record is malformed (no files, world_size or tag)"
    missing = [n for n in _required(world) if n not in files]
    if missing:
        return f"its completion record does not list {', '.join(missing)}"
    due = []
    for name, entry in sorted(files.items()):
        parts = name.split("/")
        if not isinstance(entry, dict) or any(tag_name_problem(x) for x in parts):
            return f"its completion record names {name!r}, not a file of the tag"
        p = d.joinpath(*parts)
        if p.is_symlink() or not p.is_file():
            return f"{name} is missing"
        size = p.stat().st_size
        if size != entry.get("size"):
            return f"{name} has {size} bytes, its completion record says {entry.get('size')}"
        due.append((p, name, entry.get("md5")))
    if md5:
        from core.manifest import md5_files

        for (_, name, want), got in zip(due, md5_files([p for p, _, _ in due]), strict=True):
            if got != want:
                return f"{name} has md5 {got}, its completion record says {want}"
    return ""


def _ours(d: Path) -> bool:
    """Whether folder ``d`` is a checkpoint tag bertpipe wrote (it holds bertpipe's files)."""
    return any((d / n).exists() for n in (CONFIG_NAME, COMPLETE_NAME)) or any(d.glob("bertpipe_rank*.pt"))


def run_tags(output_dir: str | Path) -> list[tuple[int, str]]:
    """(step, tag) of the checkpoint tag folders this run made, oldest first: numeric folder names (not
    symlinks) inside ``checkpoints/`` holding bertpipe's files. Nothing else there is ever touched."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir() or root.is_symlink():
        return []
    out = []
    for d in root.iterdir():
        if d.name.isascii() and d.name.isdigit() and not d.is_symlink() and d.is_dir() and _ours(d):
            out.append((int(d.name), d.name))
    return sorted(out)


def newest_complete(output_dir: str | Path, *, md5: bool = False, skip: tuple[str, ...] = ()) -> tuple[str | None,
                                                                                                      list[str]]:
    """(the newest complete tag of the run or None, the newer tags found incomplete as "tag (why)")."""
    bad = []
    for _, tag in reversed(run_tags(output_dir)):
        if tag in skip:
            continue
        problem = tag_problem(output_dir, tag, md5=md5)
        if not problem:
            return tag, bad
        bad.append(f"{tag} ({problem})")
    return None, bad


@dataclass(frozen=True)
class ResumePoint:
    """Where a run resumes: ``tag``, and ``note`` (one line) when that is not what ``latest`` says."""

    tag: str
    note: str = ""


def resume_point(output_dir: str | Path, *, md5: bool = False) -> ResumePoint | None:
    """The checkpoint a ``--resume`` continues from; None when the run has no checkpoint yet.

    Raises:
        InputError: the run has checkpoint folders, but none is complete (naming them and why).
    """
    root = checkpoint_dir(output_dir)
    named, why = read_latest(output_dir)
    if named is not None:
        problem = tag_problem(output_dir, named, md5=md5)
        if not problem:
            return ResumePoint(named)
        why = f"names checkpoint {named}, which is incomplete ({problem})"
    tag, bad = newest_complete(output_dir, md5=md5, skip=(named,) if named else ())
    if tag is not None:
        skipped = f"; newer, incomplete: {'; '.join(bad)}" if bad else ""
        return ResumePoint(tag, f"{root / LATEST_NAME} {why}: resuming from checkpoint {tag}, the newest complete "
                                f"one{skipped}")
    if not bad and (named is None or not (root / named).exists()):
        return None  # no checkpoint of the run at all: a first start
    listed = "; ".join(([f"latest {why}"] if named is None else [why]) + bad)
    raise InputError(f"{root} holds no complete checkpoint to resume from ({listed}); remove the incomplete "
                     "folders, or write the tag of a complete checkpoint into checkpoints/latest; --overwrite "
                     "without --resume discards them and starts at step 1")


def run_checkpoints(output_dir: str | Path) -> str:
    """A short description of the checkpoints of a run in ``output_dir`` ("" when it has none)."""
    tags = [t for _, t in run_tags(output_dir)]
    latest = checkpoint_dir(output_dir) / LATEST_NAME
    if not tags and not (latest.exists() or latest.is_symlink()):
        return ""
    return f"checkpoints {', '.join(tags[-4:])}" if tags else "a checkpoints/latest file"


def start_point(output_dir: str | Path, *, resume: bool, overwrite: bool, md5: bool = False) -> ResumePoint | None:
    """Where a training in ``output_dir`` starts: a checkpoint (``--resume``), or None for step 1.

    Raises:
        InputError: ``--resume`` with ``--overwrite``; ``--resume`` over checkpoints none of which is complete;
            no ``--resume`` over a run's checkpoints without ``--overwrite`` (never step 1 over them).
    """
    if resume and overwrite:
        raise InputError("--resume and --overwrite contradict each other: --resume continues the run in "
                         f"--output-dir {output_dir}, --overwrite discards it and starts at step 1; give one")
    if resume:
        return resume_point(output_dir, md5=md5)
    held = run_checkpoints(output_dir)
    if held and not overwrite:
        raise InputError(f"--output-dir {output_dir} holds {held} of a training run; add --resume to continue it, "
                         "or --overwrite to discard them and start at step 1 (or choose another --output-dir)")
    return None


def discard_run(output_dir: str | Path) -> list[str]:
    """``--overwrite``: remove the run's checkpoint tags (only folders it made), ``latest``, DeepSpeed's recovery
    scripts and summary.json; returns what was removed (relative names)."""
    root = checkpoint_dir(output_dir)
    gone = []
    for _, tag in run_tags(output_dir):
        _remove_tag(root, tag)
        gone.append(f"checkpoints/{tag}")
    for name in (LATEST_NAME, *RECOVERY_SCRIPTS):
        p = root / name
        if p.is_symlink() or p.is_file():
            p.unlink()
            gone.append(f"checkpoints/{name}")
    summary = Path(output_dir) / "summary.json"
    if summary.is_file() and not summary.is_symlink():
        summary.unlink()
        gone.append("summary.json")
    return gone


def _remove_tag(root: Path, tag: str) -> None:
    """Delete ``root/tag`` after checking (again, right before) that it is a real folder directly inside ``root``."""
    d = root / tag
    if tag_name_problem(tag) or d.is_symlink() or not d.is_dir() or d.resolve().parent != root.resolve():
        raise InputError(f"refusing to delete {d}: not a checkpoint folder inside {root}")
    shutil.rmtree(d)


def remove_stale_tag(output_dir: str | Path, tag: str) -> bool:
    """Before saving ``tag``: remove an earlier folder of that name the run made (debris of a killed save, or a
    checkpoint of a rolled-back timeline), so the new tag holds only its own files. True if one was removed."""
    if any(t == tag for _, t in run_tags(output_dir)):
        _remove_tag(checkpoint_dir(output_dir), tag)
        return True
    return False


def prune_checkpoints(output_dir: str | Path, keep: int, protect: str | None = None) -> list[Path]:
    """Keep the ``keep`` newest complete checkpoints of the run; delete the older complete ones and the
    incomplete ones older than ``protect`` (debris of killed saves). Only folders the run made
    (:func:`run_tags`) are candidates; the newest complete one, ``protect`` (the tag just saved) and the one
    ``latest`` names are never deleted. ``keep <= 0`` keeps everything.

    Returns the deleted directories.
    """
    if keep <= 0:
        return []
    root = checkpoint_dir(output_dir)
    tags = run_tags(output_dir)
    complete = [(s, t) for s, t in tags if not tag_problem(output_dir, t)]
    kept = {t for _, t in complete[-keep:]} | {protect, latest_tag(output_dir)}
    floor = int(protect) if protect and protect.isdigit() else -1
    doomed = [t for s, t in complete if t not in kept]
    doomed += [t for s, t in tags if s < floor and t not in kept and (s, t) not in complete]
    deleted = []
    for t in sorted(set(doomed), key=int):
        _remove_tag(root, t)
        deleted.append(root / t)
    return deleted
