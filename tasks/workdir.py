"""Reading a work dir without Prefect: which stage outputs are done, corrupt, incomplete or missing.

Layout: ``<work>/<stage>/<key>/_manifest.json`` for whole-stage outputs and
``<work>/<stage>/<key>/<shard>/_manifest.json`` for per-shard stages; ``<work>/last_run.json`` (written
by the data flow) says which keys and shards the last run expected.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from preprocessing.errors import ChecksumError, ManifestError
from preprocessing.manifest import MANIFEST_NAME, load_manifest, verify_manifest

SKIP = {".prefect", "pretrain"}  # pretrain/: the e2e flow's training output (checkpoints, not a stage)
SHARDED = {"tfrecord", "hdf5"}  # stages with one directory (and manifest) per part file


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


def check_dir(d: Path, check_md5: bool) -> tuple[str, int, int, str]:
    """(state, files, bytes, detail) of one stage or shard directory."""
    if not (d / MANIFEST_NAME).exists():
        return "incomplete", 0, 0, "no _manifest.json (an interrupted run; the next run redoes it)"
    try:
        m = verify_manifest(d, check_md5=check_md5)
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
    if stage in SHARDED and not (key_dir / MANIFEST_NAME).exists():
        for s in sorted(p for p in key_dir.iterdir() if p.is_dir()):
            yield s.name, s
    else:
        yield "", key_dir


def scan(work: Path, check_md5: bool = False) -> list[Entry]:
    """Every stage/key/shard directory found under ``work``, plus what the last run expected but is gone."""
    work = Path(work)
    out: list[Entry] = []
    seen: set[str] = set()
    for stage_dir in sorted(p for p in work.iterdir() if p.is_dir() and p.name not in SKIP) if work.is_dir() else []:
        for key_dir in sorted(p for p in stage_dir.iterdir() if p.is_dir()):
            for shard, d in _units(stage_dir.name, key_dir):
                e = Entry(stage_dir.name, key_dir.name, shard, *check_dir(d, check_md5))
                out.append(e)
                seen.add(e.path)
    for stage, key, shard in expected(work):
        path = "/".join(x for x in (stage, key, shard) if x)
        if path not in seen:
            out.append(Entry(stage, key, shard, "missing", detail="expected by the last run (last_run.json)"))
    return out


def expected(work: Path) -> list[tuple[str, str, str]]:
    """(stage, key, shard) of every output the last data run produced or found."""
    try:
        summary = json.loads((Path(work) / "last_run.json").read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return []
    out = []
    for stage, s in summary.get("stages", {}).items():
        for shard in s.get("shards") or [""]:
            out.append((stage, s["key"], shard))
    return out


def current_keys(work: Path) -> dict[str, str]:
    """stage -> key of the last run (other keys in the work dir are older runs' outputs)."""
    return {stage: key for stage, key, _ in expected(work)}
