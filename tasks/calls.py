"""Running stage units, without Prefect: decide with the manifest on disk, run what is due, say why.

A :class:`Call` is what one task does for one shard (or one whole stage): its units in order (part i's
TFRecord, then part i's HDF5), the stages forced to run again, and, when the registry declares one, the
function that writes a chain of units in one pass. :func:`execute` looks at each unit's directory: a
``_manifest.json`` that verifies (files, sizes, md5s) and was built from the same upstream manifests means
done, and nothing runs; otherwise the unit runs, and the log says why ("md5 mismatch in FILE", "missing
FILE", "never done"). A :class:`Batch` of calls is one Prefect task: its calls run in this process, or
side by side in the local worker pool.

Prefect-free on purpose: ``bertpipe status`` / ``verify``, pool workers and Dask workers import this module.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from core.errors import ChecksumError, ManifestError
from core.manifest import (
    Manifest,
    check_inside,
    drop_files,
    dropped_info,
    load_manifest,
    outside,
    recording_stats,
    verify_manifest,
)
from core.pools import make_pool, terminate
from core.stage import Unit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Call:
    """One shard's (or one whole stage's) chain of units, run in order in one place."""

    units: tuple[Unit, ...]
    force: frozenset[str] = frozenset()  # stages to redo even when their manifests verify
    check_md5: bool = True  # "done" re-hashes outputs (False: sizes only)
    root: str = ""  # the work dir: every out_dir must resolve inside it (a symlink must not lead writes out)
    surface: str = "flow"  # how errors spell parameters (preprocessing.params.surface)
    fused: Callable[..., tuple[Manifest, ...]] | None = None  # writes the whole chain in one pass, when all due
    revive: bool = False  # dropped units (--keep training) are due: a later stage needs their files
    #: units whose files are deleted (``--keep training``, manifest kept) once every later unit of the call is
    #: done: part i's TFRecord, as soon as part i's HDF5 is written, so the TFRecords never all sit on disk
    drop: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        u = self.units[0]
        stages = "+".join(dict.fromkeys(x.stage for x in self.units))
        return f"{stages}[{u.shard}]" if u.shard else stages


@dataclass(frozen=True)
class Batch:
    """The calls of one task (a few dozen shards at most, so orchestration stays a small share)."""

    calls: tuple[Call, ...]
    inline: bool = True  # run here (serial runs, Dask or Prefect process workers) or in the local pool
    progress_id: str = ""  # a local run's progress counter (see :func:`progress_hook`)

    @property
    def label(self) -> str:
        first, last = self.calls[0].label, self.calls[-1].label
        return first if len(self.calls) == 1 else f"{first}..{last.rsplit('[', 1)[-1].rstrip(']')} ({len(self.calls)})"


def why_not_done(unit: Unit, check_md5: bool = True, revive: bool = False,
                 root: str = "") -> tuple[Manifest | None, str]:
    """(the verified manifest, "") when ``unit`` is done, else (None, why it is not).

    A unit whose files were dropped (``--keep training``; its drop record matching its manifest) counts as
    done, its manifest standing for it, unless ``revive``: then a later stage needs its files back. A damaged
    manifest is "manifest corrupt: ..." (the unit is redone); with ``root`` (the work dir), a unit directory
    resolving outside it is never done, and nothing in it is read.
    """
    if root and (real := outside(unit.out_dir, root)):
        return None, f"its folder resolves to {real}, outside the work dir"
    try:
        m = load_manifest(unit.out_dir)
    except ManifestError as exc:
        found = re.search(r" is corrupt \((.*)\); not trusted", str(exc), re.S)
        return None, f"manifest corrupt: {found.group(1) if found else exc}"
    if m is None:
        return None, "never done (or interrupted before its manifest)"
    if dropped_info(unit.out_dir, m) is not None:
        return (None, "dropped by --keep training, and a later stage needs its files") if revive else (m, "")
    try:
        m = verify_manifest(unit.out_dir, check_md5=check_md5, trust_stat=True)
    except (ManifestError, ChecksumError) as exc:
        return None, str(exc).split(";")[0]
    if unit.pass_upstream:
        try:
            expected = {f"{u.stage}:{u.key}": u.digest for u in unit.upstream_manifests()}
        except ManifestError as exc:
            return None, str(exc)
        if m.upstream != expected:
            return None, "built from other upstream outputs"
    for k, v in (unit.fresh or {}).items():
        if m.counters.get(k) != v:
            return None, f"its source changed since it was made ({k})"
    return m, ""


def check_done(unit: Unit, check_md5: bool = True, revive: bool = False, root: str = "") -> Manifest | None:
    return why_not_done(unit, check_md5, revive, root)[0]


def invoke(unit: Unit) -> Manifest:
    """Run ``unit``'s library function in this process."""
    return unit.call()


def result_dict(unit: Unit, m: Manifest, *, cached: bool, seconds: float, why: str = "") -> dict[str, Any]:
    """What a task returns per unit (JSON types only: Prefect stores it with the json serializer)."""
    return {"stage": unit.stage, "shard": unit.shard, "key": unit.key, "dir": unit.out_dir,
            "manifest": json.loads(m.to_json()), "cached": cached, "seconds": round(seconds, 3), "why": why,
            "dropped": cached and dropped_info(unit.out_dir, m) is not None}


def execute(call: Call) -> list[dict[str, Any]]:
    """Do what ``call``'s units need, in order; one result per unit."""
    from preprocessing.params import surface

    with surface(call.surface), recording_stats():
        return _execute(call)


def _execute(call: Call) -> list[dict[str, Any]]:
    t0 = time.perf_counter()
    for u in call.units:
        if call.root:
            check_inside(u.out_dir, call.root)
    if any(u.piece for u in call.units):
        return [_run_piece(u) for u in call.units]
    state = [(None, "forced") if u.stage in call.force else why_not_done(u, call.check_md5, call.revive, call.root)
             for u in call.units]
    due = [i for i, (m, _) in enumerate(state) if m is None]
    if call.fused is not None and len(due) == len(call.units) > 1:
        for u, (_, why) in zip(call.units, state, strict=True):
            _log_redo(u, why)
        manifests = call.fused(*call.units)
        secs = (time.perf_counter() - t0) / len(call.units)
        return _drop_done(call, [result_dict(u, m, cached=False, seconds=secs, why=why)
                                 for u, m, (_, why) in zip(call.units, manifests, state, strict=True)])
    out, ran = [], False
    for u, (m, why) in zip(call.units, state, strict=True):
        t = time.perf_counter()
        if ran and u.stage not in call.force:  # its upstream was just made: look again
            m, why = why_not_done(u, call.check_md5, call.revive, call.root)
        if m is not None:
            out.append(result_dict(u, m, cached=True, seconds=time.perf_counter() - t))
            continue
        _log_redo(u, why)
        out.append(result_dict(u, invoke(u), cached=False, seconds=time.perf_counter() - t, why=why))
        ran = True
    return _drop_done(call, out)


def _drop_done(call: Call, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``call.drop``: delete those units' files (manifest kept, ``_dropped.json`` written), their readers done."""
    for i in call.drop:
        if not out[i]["dropped"]:
            out[i]["freed"] = drop_files(call.units[i].out_dir, "--keep training", call.root or None)
            out[i]["dropped"] = True
    return out


def _run_piece(unit: Unit) -> dict[str, Any]:
    """A piece of a stage (``Unit.piece``): it always runs (the DAG asked the whole stage "done?" first) and
    returns a JSON value, which the stage's ``finish`` reads; no manifest of its own."""
    t = time.perf_counter()
    value = unit.call()
    return {"stage": unit.stage, "shard": unit.shard, "key": unit.key, "dir": unit.out_dir, "manifest": None,
            "cached": False, "seconds": round(time.perf_counter() - t, 3), "why": "", "dropped": False,
            "value": value}


def _log_redo(unit: Unit, why: str) -> None:
    # a first run's "never done" is the normal case: only a redo of something that existed is news
    level = logging.DEBUG if why.startswith("never done") else logging.INFO
    log.log(level, "%s: running (%s)", unit.label, why)


# -- batches: here, or in the local worker pool ----------------------------------------------------------
class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.name, record.getMessage()))


def _execute_captured(call: Call) -> tuple[str, list[tuple[int, str, str]]]:
    """Pool worker entry: run the call, return its results (JSON) and the records it logged."""
    handler = _ListHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    try:
        return json.dumps(execute(call)), handler.records
    finally:
        root.removeHandler(handler)


_POOL: ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_PROGRESS: dict[str, Callable[[int], None]] = {}


def get_pool(workers: int) -> ProcessPoolExecutor:
    """The local worker pool of this flow process (created on first use: a cached run starts none)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = make_pool(workers)
        return _POOL


def shutdown_pool(*, failed: bool = False) -> None:
    """Close the local pool: wait for it after a good run, terminate it (no waiting) after an error."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        terminate(pool) if failed else pool.shutdown(wait=True, cancel_futures=True)


def progress_hook(progress_id: str, step: Callable[[int], None] | None) -> None:
    """Register (or with None drop) the per-call progress callback of a local run."""
    if step is None:
        _PROGRESS.pop(progress_id, None)
    else:
        _PROGRESS[progress_id] = step


@dataclass
class BatchResult:
    results: list[dict[str, Any]] = field(default_factory=list)
    records: list[tuple[int, str, str]] = field(default_factory=list)


def execute_batch(batch: Batch, workers: int = 1) -> BatchResult:
    """Run a batch's calls: in order here (``inline``), or all at once on the local pool."""
    out = BatchResult()
    step = _PROGRESS.get(batch.progress_id)
    if batch.inline:
        for call in batch.calls:
            out.results += execute(call)
            if step:
                step(1)
        return out
    pool = get_pool(workers)
    futures = [pool.submit(_execute_captured, call) for call in batch.calls]
    try:
        for fut in futures:
            text, records = fut.result()
            out.results += json.loads(text)
            out.records += records
            if step:
                step(1)
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    return out


def manifest_of(result: dict[str, Any]) -> Manifest:
    return Manifest.from_dict(result["manifest"])
