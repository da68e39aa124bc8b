"""Reading a work dir without Prefect: which stage outputs are done, corrupt, incomplete or missing.

Layout: ``<work>/<stage>/<key>/_manifest.json`` for whole-stage outputs and
``<work>/<stage>/<key>/<shard>/_manifest.json`` for per-shard stages; ``<work>/last_run.json`` (written
by the data flow) says which keys and shards the last run expected.

Nothing outside the work dir is read because of what is inside it: a stage, key or shard folder that
resolves outside (a symbolic link) is reported as such and not looked into; a manifest is checked against
its schema before use (core.manifest.schema_problem), and an output reached through a link is not read.
The folders trainers read whole (``train_dir``, the eval HDF5's folder) must hold only what their manifests
list (:func:`unlisted`).
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from core.errors import ChecksumError, InputError, ManifestError
from core.manifest import (
    _TMP_NAME,
    MANIFEST_NAME,
    RESERVED_NAMES,
    Manifest,
    dropped_info,
    load_manifest,
    name_problem,
    outside,
    read_plain,
    verify_manifest,
)
from preprocessing import registry
from preprocessing.targets import TARGETS

log = logging.getLogger(__name__)



@dataclass
class Entry:
    stage: str
    key: str
    shard: str  # "" for a whole-stage output
    state: str  # done | corrupt | incomplete | missing
    files: int = 0
    bytes: int = 0
    detail: str = ""

    @property
    def path(self) -> str:
        return "/".join(x for x in (self.stage, self.key, self.shard) if x)


def check_dir(d: Path, check_md5: bool, trust_stat: bool = False, stage: str = "") -> tuple[str, int, int, str]:
    """(state, files, bytes, detail) of one stage or shard directory (see verify_manifest for the modes).

    ``stage``: the DAG stage name; a stage whose folder trainers read whole is "corrupt" when that folder
    holds a file its manifest does not list."""
    if not os.path.lexists(d / MANIFEST_NAME):
        return "incomplete", 0, 0, "no _manifest.json (an interrupted run; the next run redoes it)"
    try:
        m = load_manifest(d)
    except ManifestError as exc:
        return "corrupt", 0, 0, str(exc)
    if m is None:  # pragma: no cover - removed since the look above
        return "incomplete", 0, 0, "no _manifest.json (an interrupted run; the next run redoes it)"
    files, nbytes = len(m.files), sum(f.bytes for f in m.files)
    if (not stage or stage in registry.droppable()) and (info := dropped_info(d, m)) is not None:
        return "dropped", 0, 0, (f"{files} files, {nbytes:,} bytes deleted at {str(info.get('when'))[:19]} "
                                 f"({str(info.get('why'))[:40]}); rebuilt by a run that needs them")
    try:
        verify_manifest(d, check_md5=check_md5, trust_stat=trust_stat)
    except (ManifestError, ChecksumError) as exc:
        return "corrupt", files, nbytes, str(exc)
    extra = unlisted(stage, d, m) if stage else []
    if extra:
        shown = ", ".join(f"{rel} ({kind})" for rel, kind in extra[:3]) + (f" and {len(extra) - 3} more"
                                                                           if len(extra) > 3 else "")
        return "corrupt", files, nbytes, (f"{len(extra)} entr{'y' if len(extra) == 1 else 'ies'} bertpipe did not "
                                          f"write in a folder trainers read whole: {shown}; the next `bertpipe run` "
                                          "removes plain files there (remove links and folders yourself)")
    return "done", files, nbytes, ""


#: last_run.json outputs that trainers read as whole folders: each target's input dir (a trainer globs train_dir,
#: nvidia_packed_dir, ...) and its eval file's folder (preprocessing/targets.py)
TRAINER_OUTPUTS = tuple(dict.fromkeys(n for t in TARGETS for n in (t.train, t.eval)))


def trainer_folders(stage: str, m: Manifest) -> list[str]:
    """The folders of stage ``stage`` that trainers read whole, relative to its directory ("" for itself)."""
    out = []
    for s in registry.STAGES:
        if s.name != stage:
            continue
        for name, rel in s.outputs.items():
            if name in TRAINER_OUTPUTS:
                is_dir = not rel or any(f.name.startswith(rel + "/") for f in m.files)
                folder = rel if is_dir else str(PurePosixPath(rel).parent)
                out.append("" if folder == "." else folder)
    return list(dict.fromkeys(out))


def unlisted(stage: str, d: Path, m: Manifest) -> list[tuple[str, str]]:
    """(path relative to ``d``, what it is: file, link, folder, other) of every entry in the folders of ``d``
    that trainers read whole which its manifest ``m`` does not list. Links are reported, never followed;
    bertpipe's own bookkeeping (manifest, markers) and the debris of killed writers (``.<name>.tmp-<pid>``,
    swept by the next run) are not counted."""
    listed = {f.name for f in m.files}
    parents = {str(PurePosixPath(n).parent) for n in listed}
    parents |= {str(p) for n in listed for p in PurePosixPath(n).parents}
    out: list[tuple[str, str]] = []
    for folder in trainer_folders(stage, m):
        top = d / folder if folder else d
        if os.path.islink(top):
            out.append((folder, "link"))
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            base = Path(dirpath)
            for n in sorted(dirnames):
                rel = (base / n).relative_to(d).as_posix()
                if os.path.islink(base / n):
                    out.append((rel, "link"))
                elif rel not in parents:
                    out.append((rel, "folder"))
            for n in sorted(filenames):
                rel = (base / n).relative_to(d).as_posix()
                if rel in listed or _TMP_NAME.match(n) or (base == d and n in RESERVED_NAMES):
                    continue
                mode = os.lstat(base / n).st_mode
                out.append((rel, "file" if stat.S_ISREG(mode) else "link" if stat.S_ISLNK(mode) else "other"))
    return out


def sweep_unlisted(stage: str, d: Path, m: Manifest, root: Path) -> list[str]:
    """Make the folders of ``d`` that trainers read whole hold only what ``m`` lists: unlisted plain files are
    removed (and unlisted folders left empty by that); returns what was removed.

    Raises:
        InputError: ``d`` resolves outside ``root``, or an unlisted entry is a link or no plain file (one line;
            nothing is removed then).
    """
    if real := outside(d, root):
        raise InputError(f"{d} resolves to {real}, outside the work dir {root} (a symbolic link?); remove the link")
    extra = unlisted(stage, d, m)
    odd = [(rel, kind) for rel, kind in extra if kind not in ("file", "folder")]
    if odd:
        rel, kind = odd[0]
        more = f" (and {len(odd) - 1} more)" if len(odd) > 1 else ""
        raise InputError(f"{d / rel} is a {kind} that bertpipe did not write{more}, in a folder trainers read whole; "
                         "remove it yourself and run again (bertpipe removes only plain files there)")
    removed = []
    for rel, kind in extra:
        if kind == "file":
            (d / rel).unlink(missing_ok=True)
            removed.append(rel)
    for rel, kind in sorted(extra, key=lambda e: -e[0].count("/")):  # the deepest first
        if kind == "folder":
            try:
                (d / rel).rmdir()  # only when empty now
                removed.append(rel + "/")
            except OSError:
                pass
    return removed


def _units(stage: str, key_dir: Path) -> Iterator[tuple[str, Path]]:
    """(shard, dir) of a key dir: its shard sub-directories for per-shard stages, else itself."""
    if stage in registry.per_shard() and not (key_dir / MANIFEST_NAME).exists():
        for s in sorted(p for p in key_dir.iterdir() if p.is_dir()):
            yield s.name, s
    else:
        yield "", key_dir


def scan(work: Path, check_md5: bool = False, trust_stat: bool = False, summary: dict | None = None) -> list[Entry]:
    """Every stage/key/shard directory found under ``work``, plus what the last run expected but is gone
    (``summary``: :func:`last_run` of ``work`` when the caller has read it already: it warns once)."""
    work = Path(work)
    out: list[Entry] = []
    seen: set[str] = set()
    stage_dirs = [work / n for n in registry.names() if (work / n).is_dir()] if work.is_dir() else []
    for stage_dir in stage_dirs:  # only the registry's stages: work/pretrain (training output) is not one
        if e := _outside_entry(work, stage_dir, stage_dir.name, ""):
            out.append(e)
            seen.add(e.path)
            continue
        for key_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
            if e := _outside_entry(work, key_dir, stage_dir.name, key_dir.name):
                out.append(e)
                seen.add(e.path)
                continue
            for shard, d in _units(stage_dir.name, key_dir):
                e = _outside_entry(work, d, stage_dir.name, key_dir.name, shard) or \
                    Entry(stage_dir.name, key_dir.name, shard, *check_dir(d, check_md5, trust_stat, stage_dir.name))
                out.append(e)
                seen.add(e.path)
    for stage, key, shard in expected(work, summary):
        path = "/".join(x for x in (stage, key, shard) if x)
        if not any(path == p or path.startswith(p + "/") for p in seen):
            out.append(Entry(stage, key, shard, "missing", detail="expected by the last run (last_run.json)"))
    return out


def _outside_entry(work: Path, d: Path, stage: str, key: str, shard: str = "") -> Entry | None:
    """A "corrupt" entry for a folder resolving outside the work dir (nothing in it is read), else None."""
    real = outside(d, work)
    if not real:
        return None
    return Entry(stage, key, shard, "corrupt", detail=f"{d} resolves to {real}, outside the work dir (a symbolic "
                 "link?): not read, and a run refuses to write or delete there; remove the link")


def expected(work: Path, summary: dict | None = None) -> list[tuple[str, str, str]]:
    """(stage, key, shard) of every output the last data run produced or found (``summary``: its
    :func:`last_run`, when read already)."""
    summary = last_run(work) if summary is None else summary
    out = []
    for stage, s in summary.get("stages", {}).items():
        for shard in s.get("shards") or [""]:
            out.append((stage, s["key"], shard))
    return out


def last_run(work: Path) -> dict:
    """``work/last_run.json`` (what the last data run produced or found), {} when absent or not one.

    It is checked before use: each stage's key and shards are plain folder names, and each output path
    resolves inside the work dir. Outputs recorded under the work dir's former path (a work dir moved or
    copied since) are read under its present one, never at the old place. A summary that fails a check is
    ignored with one warning naming it (the next `bertpipe run` rewrites it).
    """
    path = Path(work) / "last_run.json"
    try:
        summary = json.loads(read_plain(path) or "null")
    except (ManifestError, ValueError, RecursionError):
        summary = []
    if summary is None:
        return {}
    why = _summary_problem(summary)
    if not why:
        outputs, why = _rebased_outputs(Path(work), summary)
    if why:
        log.warning("%s is not a bertpipe run summary (%s); ignoring it (the next `bertpipe run` rewrites it)",
                    path, why)
        return {}
    from preprocessing.targets import folders

    built = summary.get("targets")
    built = [t for t in built if isinstance(t, str)] if isinstance(built, (dict, list)) else []
    return {**summary, "outputs": outputs, "targets": folders(built, outputs)}  # paths: the checked outputs


def _folder_name(x: object) -> bool:
    return isinstance(x, str) and "/" not in x and not name_problem(x)


def _summary_problem(summary: object) -> str:
    if not isinstance(summary, dict):
        return "not a JSON object"
    stages = summary.get("stages", {})
    if not isinstance(stages, dict):
        return "'stages' is not an object"
    for stage, s in stages.items():
        if not _folder_name(stage) or not isinstance(s, dict) or not _folder_name(s.get("key")):
            return f"stage {str(stage)[:40]!r} has no valid key"
        shards = s.get("shards") or []
        if not isinstance(shards, list) or not all(_folder_name(x) for x in shards):
            return f"stage {stage!r} lists a shard that is not a folder name"
    if not isinstance(summary.get("outputs", {}), dict):
        return "'outputs' is not an object"
    return ""


def _rebased_outputs(work: Path, summary: dict) -> tuple[dict[str, str], str]:
    """The summary's outputs, each under ``work`` (rebased from the recorded work dir), or why not."""
    recorded = summary.get("work_dir")
    out = {}
    for name, value in summary.get("outputs", {}).items():
        if not isinstance(value, str) or not value:
            return {}, f"output {str(name)[:40]!r} is not a path"
        p = Path(value) if Path(value).is_absolute() else work.absolute() / value
        if outside(p, work) and isinstance(recorded, str) and recorded and p.is_relative_to(recorded):
            p = work.absolute() / p.relative_to(recorded)  # the work dir was moved or copied since
        if real := outside(p, work):
            return {}, f"output {name!r} {value} resolves to {real}, outside the work dir"
        out[name] = str(p)
    return out, ""


def current_keys(work: Path, summary: dict | None = None) -> dict[str, str]:
    """stage -> key of the last run (other keys in the work dir are older runs' outputs)."""
    return {stage: key for stage, key, _ in expected(work, summary)}
