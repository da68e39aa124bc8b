"""Prefect artifacts of a data run: a table per stage, a progress bar while shards run, a dataset summary.

Artifacts are a view for the Prefect UI; nothing reads them back. Outside a flow run (plain tests) they
are skipped. Their keys end with the work dir's id (:func:`artifact_scope`): two work dirs never share a key.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
COUNTERS = ("documents", "instances", "records", "picked", "rows", "articles", "tokens", "parts")


#: the short id of the work dir whose run makes artifacts now (see :func:`artifact_scope`)
_SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("bertpipe_artifact_scope", default="")


def scope_id(path: str | os.PathLike) -> str:
    """A work dir's identity in artifact keys: the first 8 hex digits of the md5 of its resolved path."""
    return hashlib.md5(str(Path(path).resolve()).encode()).hexdigest()[:8]


@contextmanager
def artifact_scope(path: str | os.PathLike) -> Iterator[str]:
    """Artifact keys made within the block end with ``path``'s :func:`scope_id` (``stage-hdf5-1a2b3c4d``): the
    latest artifact of a key is that of the latest run on this work dir, not of whichever run finished last."""
    token = _SCOPE.set(scope_id(path))
    try:
        yield _SCOPE.get()
    finally:
        _SCOPE.reset(token)


def _key(*parts: str) -> str:
    """Artifact keys: lowercase letters, digits and dashes; the work dir's id last (:func:`artifact_scope`)."""
    scope = _SCOPE.get()
    return re.sub(r"[^a-z0-9]+", "-", "-".join((*parts, scope) if scope else parts).lower()).strip("-")


def _in_flow() -> bool:
    from prefect.context import FlowRunContext

    return FlowRunContext.get() is not None


def stage_rows(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per shard (or one for a whole stage): files, bytes, counters, seconds, cache hit."""
    rows = []
    for r in results:
        m = r["manifest"]
        row: dict[str, Any] = {"shard": r["shard"] or "-", "files": len(m["files"]),
                               "bytes": sum(f["bytes"] for f in m["files"])}
        for c in COUNTERS:
            if isinstance(m["counters"].get(c), int):
                row[c] = m["counters"][c]
        row["seconds"] = m["seconds"] if not r["cached"] else r["seconds"]
        row["cache"] = "hit" if r["cached"] else "miss"
        rows.append(row)
    return rows


def stage_table(stage: str, results: Sequence[dict[str, Any]]) -> None:
    """A table artifact ``stage-<stage>`` for one stage of this run."""
    if not _in_flow() or not results:
        return
    from prefect.artifacts import create_table_artifact

    rows = stage_rows(results)
    hits = sum(r["cache"] == "hit" for r in rows)
    create_table_artifact(rows, key=_key("stage", stage),
                          description=f"**{stage}** ({results[0]['dir'].rsplit('/', 1)[0] if results[0]['shard'] else results[0]['dir']}): "
                          f"{len(rows)} call(s), {hits} cached")


class ShardProgress:
    """A progress artifact updated as shards finish (at most every ``every_s`` seconds)."""

    def __init__(self, stage: str, total: int, every_s: float = 1.0) -> None:
        self.total, self.done, self.every_s, self._last = max(total, 1), 0, every_s, 0.0
        self.id = None
        if _in_flow():
            from prefect.artifacts import create_progress_artifact

            self.id = create_progress_artifact(0.0, key=_key("progress", stage),
                                               description=f"{stage}: shards finished")

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if self.id is not None and (self.done == self.total or now - self._last >= self.every_s):
            from prefect.artifacts import update_progress_artifact

            update_progress_artifact(self.id, 100.0 * self.done / self.total)
            self._last = now


def dataset_markdown(source: str, stages: dict[str, dict[str, Any]], results: dict[str, list[dict[str, Any]]],
                     max_files: int = 40) -> str:
    """Markdown: where the data came from, each stage's key/dir/sizes, and file md5s (first ``max_files``)."""
    lines = ["# bertpipe dataset", "", f"Source: `{source}`", "", "| stage | key | calls | cached | files | bytes |",
             "| --- | --- | --- | --- | --- | --- |"]
    for name, s in stages.items():
        lines.append(f"| {name} | `{s['key']}` | {s['calls']} | {s['cached']} | {s['files']} | {s['bytes']:,} |")
    lines += ["", "## Files (md5)", "", "| stage | file | bytes | md5 |", "| --- | --- | --- | --- |"]
    n = 0
    for name, rs in results.items():
        for r in rs:
            for f in r["manifest"]["files"]:
                if n < max_files:
                    shard = f"{r['shard']}/" if r["shard"] else ""
                    lines.append(f"| {name} | {shard}{f['name']} | {f['bytes']:,} | `{f['md5']}` |")
                n += 1
    if n > max_files:
        lines.append(f"| … | {n - max_files} more (see each stage's _manifest.json) | | |")
    return "\n".join(lines) + "\n"


def dataset_summary(source: str, stages: dict[str, dict[str, Any]], results: dict[str, list[dict[str, Any]]]) -> None:
    if not _in_flow():
        return
    from prefect.artifacts import create_markdown_artifact

    create_markdown_artifact(dataset_markdown(source, stages, results), key=_key("dataset-summary"),
                             description="bertpipe data set: source, stages, md5s, sizes")


def summarize(results: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Totals of one stage: key, dir, calls, cached, files, bytes, seconds (of them, CPU and waits for a core),
    counters summed."""
    rs = list(results)
    counters: dict[str, int] = {}
    for r in rs:
        for c in COUNTERS:
            v = r["manifest"]["counters"].get(c)
            if isinstance(v, int):
                counters[c] = counters.get(c, 0) + v
    first = rs[0]
    return {"key": first["key"], "dir": first["dir"].rsplit("/", 1)[0] if first["shard"] else first["dir"],
            "calls": len(rs), "cached": sum(bool(r["cached"]) for r in rs),
            "files": sum(len(r["manifest"]["files"]) for r in rs),
            "bytes": sum(f["bytes"] for r in rs for f in r["manifest"]["files"]),
            "seconds": round(sum(r["seconds"] for r in rs), 3),
            # of the seconds: CPU, and waits for a core (core.costs.spent); the rest was blocked (the disk, locks)
            "cpu_seconds": round(sum(r.get("cpu", 0.0) for r in rs if not r["cached"]), 3),
            "run_wait_seconds": round(sum(r.get("run_wait", 0.0) for r in rs if not r["cached"]), 3), **counters,
            "dropped": sum(bool(r.get("dropped")) for r in rs), "shards": [r["shard"] for r in rs if r["shard"]],
            "redone": [f"{r['shard'] or r['stage']}: {r['why']}" for r in rs
                       if not r["cached"] and r.get("why") and not r["why"].startswith("never done")][:20]}
