"""Reading a work dir without Prefect: which stage outputs are done, corrupt, incomplete or missing.

Layout: ``<work>/<stage>/<key>/_manifest.json`` for whole-stage outputs and
``<work>/<stage>/<key>/<shard>/_manifest.json`` for per-shard stages; ``<work>/last_run.json`` (written
by the data flow) says which keys and shards the last run expected.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.errors import ChecksumError, ManifestError
from core.manifest import MANIFEST_NAME, dropped_info, load_manifest, verify_manifest
from preprocessing import registry

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


def check_dir(d: Path, check_md5: bool, trust_stat: bool = False) -> tuple[str, int, int, str]:
    """(state, files, bytes, detail) of one stage or shard directory (see verify_manifest for the modes)."""
    if not (d / MANIFEST_NAME).exists():
        return "incomplete", 0, 0, "no _manifest.json (an interrupted run; the next run redoes it)"
    if (info := dropped_info(d)) is not None:
        return "dropped", 0, 0, (f"{info.get('files')} files, {info.get('bytes', 0):,} bytes deleted at {info.get('when')} "
                                 f"({info.get('why')}); rebuilt by a run that needs them")
    try:
        m = verify_manifest(d, check_md5=check_md5, trust_stat=trust_stat)
    except (ManifestError, ChecksumError) as exc:
        m2 = None
        try:
            m2 = load_manifest(d)
        except ManifestError:
            pass
        n = len(m2.files) if m2 else 0
        return "corrupt", n, sum(f.bytes for f in m2.files) if m2 else 0, str(exc)
    return "done", len(m.files), sum(f.bytes for f in m.files), ""


def _units(stage: str, key_dir: Path) -> Iterator[tuple[str, Path]]:
    """(shard, dir) of a key dir: its shard sub-directories for per-shard stages, else itself."""
    if stage in registry.per_shard() and not (key_dir / MANIFEST_NAME).exists():
        for s in sorted(p for p in key_dir.iterdir() if p.is_dir()):
            yield s.name, s
    else:
        yield "", key_dir


def scan(work: Path, check_md5: bool = False, trust_stat: bool = False) -> list[Entry]:
    """Every stage/key/shard directory found under ``work``, plus what the last run expected but is gone."""
    work = Path(work)
    out: list[Entry] = []
    seen: set[str] = set()
    stage_dirs = [work / n for n in registry.names() if (work / n).is_dir()] if work.is_dir() else []
    for stage_dir in stage_dirs:  # only the registry's stages: work/pretrain (training output) is not one
        for key_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
            for shard, d in _units(stage_dir.name, key_dir):
                e = Entry(stage_dir.name, key_dir.name, shard, *check_dir(d, check_md5, trust_stat))
                out.append(e)
                seen.add(e.path)
    for stage, key, shard in expected(work):
        path = "/".join(x for x in (stage, key, shard) if x)
        if path not in seen:
            out.append(Entry(stage, key, shard, "missing", detail="expected by the last run (last_run.json)"))
    return out


def expected(work: Path) -> list[tuple[str, str, str]]:
    """(stage, key, shard) of every output the last data run produced or found."""
    summary = last_run(work)
    out = []
    for stage, s in summary.get("stages", {}).items():
        if isinstance(s, dict) and isinstance(s.get("key"), str):
            for shard in s.get("shards") or [""]:
                out.append((stage, s["key"], shard))
    return out


def last_run(work: Path) -> dict:
    """``work/last_run.json`` (what the last data run produced or found), {} when absent or not one."""
    path = Path(work) / "last_run.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(summary, dict) or not isinstance(summary.get("stages", {}), dict):
        log.warning("%s is not a bertpipe run summary; ignoring it (the next `bertpipe run` rewrites it)", path)
        return {}
    return summary


def current_keys(work: Path) -> dict[str, str]:
    """stage -> key of the last run (other keys in the work dir are older runs' outputs)."""
    return {stage: key for stage, key, _ in expected(work)}
