"""Running stage units, without Prefect: decide with the manifest on disk, run what is due, say why.

A :class:`Call` is what one task does for one shard (or one whole stage): its units in order (part i's
TFRecord, then part i's HDF5), the stages forced to run again, and, when the registry declares one, the
function that writes a chain of units in one pass. :func:`execute` looks at each unit's directory: a
``_manifest.json`` that verifies (files, sizes, md5s) and was built from the same upstream manifests means
done, and nothing runs; otherwise the unit runs, and the log says why ("md5 mismatch in FILE", "missing
FILE", "never done"). A :class:`Batch` of calls is one Prefect task: its calls run in this process, or
side by side in the local worker pool.

A call of a DAG run carries the run's token (tasks/runtoken.py): it first checks that it sees the run's work dir
(else it fails in one line naming its host and the path, before writing anything), and commits no manifest once
the run has ended. The records our libraries log while a call runs are captured and returned with its results
(:func:`capture_records`), wherever it ran, unless they already reach Prefect (``PREFECT_LOGGING_EXTRA_LOGGERS``
in the flow's own process): the task re-logs them, so they show in the flow run's logs.

Prefect-free on purpose: ``bertpipe status`` / ``verify``, pool workers and Dask workers import this module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ChecksumError, ManifestError
from core.manifest import (
    Manifest,
    check_inside,
    clear_links,
    drop_files,
    dropped_info,
    load_manifest,
    outside,
    recording_stats,
    verify_manifest,
)
from core.pools import make_pool, terminate
from core.stage import Unit
from tasks.runtoken import RunToken, entered

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
    run: RunToken | None = None  # the DAG run's token: the work dir must be seen, commits stop when the run ends

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
    #: fused calls a group holds (:func:`groups`), as the DAG chose for the whole stage; 0: from this batch alone
    group: int = 0

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
    if _may_drop(unit.stage) and dropped_info(unit.out_dir, m) is not None:
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


def _may_drop(stage: str) -> bool:
    """Whether a drop record counts for ``stage``: only a stage ``--keep training`` drops (an intermediate); a
    ``_dropped.json`` anywhere else was planted or left by hand, and the files are checked as usual."""
    from preprocessing import registry

    return stage in registry.droppable() or stage not in registry.names()


def check_done(unit: Unit, check_md5: bool = True, revive: bool = False, root: str = "") -> Manifest | None:
    return why_not_done(unit, check_md5, revive, root)[0]


def invoke(unit: Unit) -> Manifest:
    """Run ``unit``'s library function in this process."""
    return unit.call()


def result_dict(unit: Unit, m: Manifest, *, cached: bool, seconds: float, why: str = "", cpu: float = 0.0,
                run_wait: float = 0.0) -> dict[str, Any]:
    """What a task returns per unit (JSON types only: Prefect stores it with the json serializer). ``seconds``:
    the unit's wall; ``cpu`` and ``run_wait``: of it, the process's CPU seconds and its wait for a core
    (core.costs.spent)."""
    return {"stage": unit.stage, "shard": unit.shard, "key": unit.key, "dir": unit.out_dir,
            "manifest": json.loads(m.to_json()), "cached": cached, "seconds": round(seconds, 3),
            "cpu": round(cpu, 3), "run_wait": round(run_wait, 3), "why": why,
            "dropped": cached and _may_drop(unit.stage) and dropped_info(unit.out_dir, m) is not None,
            "host": socket.gethostname()}


def accept(row: dict[str, Any]) -> None:
    """The flow's check of a call's result: the output it names is here, on the flow's side: the manifest in
    ``row["dir"]`` is the one the call returned (same digest: stage, key, every file's name, size and md5) and
    every file it lists is a plain file of the recorded size (a dropped unit: its drop record matches). The md5s
    are not re-hashed here (the digest match stands for them; ``bertpipe verify`` re-hashes).

    Raises WorkDirNotSeen (one line: the unit, the host it ran on, what is missing here, what to do)."""
    from tasks.runtoken import WorkDirNotSeen

    if row.get("manifest") is None:  # a piece of a stage: no manifest of its own (its stage's finish checks)
        return
    d = Path(row["dir"])
    label = f"{row['stage']}[{row['shard']}]" if row.get("shard") else row["stage"]

    def refuse(problem: str) -> None:
        ran = f" ran on host {row['host']}, but" if row.get("host") else ""
        raise WorkDirNotSeen(f"{label}{ran} this machine ({socket.gethostname()}) {problem}; does every Dask worker "
                             f"mount the work dir at the same path? Nothing is trusted that the flow cannot see: "
                             "run again once it can")

    try:
        m = load_manifest(d)
    except ManifestError as exc:
        refuse(f"finds its manifest damaged ({str(exc)[:120]})")
    if m is None:
        refuse(f"does not find its manifest {d / '_manifest.json'}")
    if m.digest != Manifest.from_dict(row["manifest"]).digest:
        refuse(f"finds another manifest in {d} than the call wrote (digest {m.digest[:12]})")
    if _may_drop(row["stage"]) and dropped_info(d, m) is not None:
        return
    try:
        verify_manifest(d, check_md5=False)
    except (ManifestError, ChecksumError) as exc:
        refuse(f"does not find its files as listed: {str(exc).split(';')[0]}")


def execute(call: Call) -> list[dict[str, Any]]:
    """Do what ``call``'s units need, in order; one result per unit."""
    from preprocessing.params import surface

    with entered(call.run), surface(call.surface), recording_stats():
        return _execute(call)()


def _execute(call: Call, grouped: bool = False) -> Callable[[], list[dict[str, Any]]]:
    """Run what ``call`` needs; returns the function that gives its result rows. ``grouped``: inside
    :func:`execute_group`'s deferred md5 block, the rows are taken (and ``--keep training`` drops done) only
    after the block has hashed the files and written the manifests."""
    from core import costs
    from core.manifest import flush_deferred

    c0 = costs.clock()
    for u in call.units:
        if call.root:
            check_inside(u.out_dir, call.root)
    if any(u.piece for u in call.units):
        rows = [_run_piece(u) for u in call.units]
        return lambda: rows
    state = [(None, "forced") if u.stage in call.force else why_not_done(u, call.check_md5, call.revive, call.root)
             for u in call.units]
    due = [i for i, (m, _) in enumerate(state) if m is None]
    if call.fused is not None and len(due) == len(call.units) > 1:
        for u, (_, why) in zip(call.units, state, strict=True):
            _log_redo(u, why)
            clear_links(u.out_dir)
        manifests = call.fused(*call.units)
        each = {k: v / len(call.units) for k, v in costs.spent(c0).items()}
        return lambda: _drop_done(call, [result_dict(u, m, cached=False, why=why, **each)
                                         for u, m, (_, why) in zip(call.units, manifests, state, strict=True)])
    out: list[tuple[Unit, Manifest, bool, dict[str, float], str]] = []
    ran = False
    for u, (m, why) in zip(call.units, state, strict=True):
        t = costs.clock()
        if ran and u.stage not in call.force:  # its upstream was just made: look again
            m, why = why_not_done(u, call.check_md5, call.revive, call.root)
        if m is not None:
            out.append((u, m, True, costs.spent(t), ""))
            continue
        _log_redo(u, why)
        clear_links(u.out_dir)  # before its first byte: nothing it writes, lists or removes goes through a link
        m = invoke(u)
        if grouped:
            flush_deferred()  # the next unit reads this one's files against its manifest: written now
        out.append((u, m, False, costs.spent(t), why))
        ran = True
    return lambda: _drop_done(call, [result_dict(u, m, cached=cached, why=why, **cost)
                                     for u, m, cached, cost, why in out])


#: Parts whose fused calls one process runs before it hashes their files together (execute_group): 4 parts are
#: 8 files (a TFRecord and an HDF5 each), the 8 md5 lanes of AVX-512VL or AVX2; about 5 GB of a real part's files
#: wait in the page cache meanwhile.
GROUP_PARTS = int(os.environ.get("BERTPIPE_MD5_GROUP", "4"))


def execute_group(calls: Sequence[Call]) -> list[dict[str, Any]]:
    """Several calls of one fused chain (parts i..j's TFRecord+HDF5) run in order, in one :func:`deferred_md5`
    block: each writes its files, and their md5s are taken together when the last is written (up to 8 or 16
    files side by side, where one call's two files hash at a third of that speed); then the manifests, in the
    order written. The calls share the run token; at an error in call k, the outputs the calls before it
    finished get their manifests, and the error is raised."""
    from core import costs
    from core.manifest import deferred_md5
    from preprocessing.params import surface

    if len(calls) == 1:
        return execute(calls[0])
    c0 = costs.clock()
    results: list[Callable[[], list[dict[str, Any]]]] = []
    error: Exception | None = None
    with entered(calls[0].run), surface(calls[0].surface), recording_stats():
        with deferred_md5():
            for call in calls:
                try:
                    results.append(_execute(call, grouped=True))
                except Exception as exc:  # noqa: BLE001 - raised below, once the calls before it are finished
                    error = exc
                    break
        if error is not None:
            raise error
        rows = [row for r in results for row in r()]
    # each row's seconds (and CPU, and wait for a core): its own work plus its share of the files' hashing
    made = [r for r in rows if not r["cached"]]
    total = costs.spent(c0)
    for k in ("seconds", "cpu", "run_wait"):
        shared = max(0.0, total[k] - sum(r[k] for r in rows)) / max(1, len(made))
        for r in made:
            r[k] = round(r[k] + shared, 3)
    return rows


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
    from core import costs

    t = costs.clock()
    value = unit.call()
    cost = {k: round(v, 3) for k, v in costs.spent(t).items()}
    return {"stage": unit.stage, "shard": unit.shard, "key": unit.key, "dir": unit.out_dir, "manifest": None,
            "cached": False, **cost, "why": "", "dropped": False, "value": value}


def _log_redo(unit: Unit, why: str) -> None:
    # a first run's "never done" is the normal case: only a redo of something that existed is news
    level = logging.DEBUG if why.startswith("never done") else logging.INFO
    log.log(level, "%s: running (%s)", unit.label, why)


# -- the records a call logs -------------------------------------------------------------------------------
Record = tuple[int, str, str]  # (level, logger name, message)
#: loggers whose records are the infrastructure's, not the call's (they stay where they are)
_NOT_CAPTURED = ("distributed", "prefect", "httpx", "httpcore", "asyncio", "tornado", "urllib3", "fsspec", "bokeh")
_LIBRARIES = ("preprocessing", "pretrain", "tasks", "flows", "core")


class _Capture(logging.Handler):
    """Installed once per process on the root logger: each record goes to the capture of the thread that logged
    it (a thread of its own, such as a reader thread, to the only capture running, if there is just one)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.by_thread: dict[int, list[Record]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(_NOT_CAPTURED):
            return
        sinks = self.by_thread
        sink = sinks.get(record.thread)
        if sink is None and len(sinks) == 1:
            sink = next(iter(sinks.values()), None)
        if sink is not None:
            try:
                sink.append((record.levelno, record.name, record.getMessage()))
            except Exception:  # noqa: BLE001 - a record that cannot be formatted is dropped, as logging would
                self.handleError(record)


_CAPTURE: _Capture | None = None
_CAPTURE_LOCK = threading.Lock()


def forwarded() -> bool:
    """Whether our libraries' records reach Prefect's API by themselves in this process: Prefect put its API
    handler on them (``PREFECT_LOGGING_EXTRA_LOGGERS``, set by ``bertpipe run`` before Prefect set up its logging:
    the flow's own process). Not in local pool workers, nor on Dask workers (their Prefect logging is their own)."""
    lg: logging.Logger | None = logging.getLogger("preprocessing")
    while lg is not None:
        if any(type(h).__name__ == "APILogHandler" for h in lg.handlers):
            return True
        lg = lg.parent if lg.propagate else None
    return False


def _capture_handler() -> _Capture:
    global _CAPTURE
    with _CAPTURE_LOCK:
        if _CAPTURE is None:
            _CAPTURE = _Capture()
        root = logging.getLogger()
        if _CAPTURE not in root.handlers:  # first use, or a logging set-up since (dictConfig) dropped it
            root.addHandler(_CAPTURE)
        if getattr(warnings.showwarning, "__module__", "") != "logging":  # first use, or replaced since
            logging.captureWarnings(False)
            logging.captureWarnings(True)  # warnings.warn(...) as records of "py.warnings", captured too
        for name in _LIBRARIES:  # INFO lines of ours are made even where the root logger says WARNING
            lg = logging.getLogger(name)
            if lg.getEffectiveLevel() > logging.INFO:
                lg.setLevel(logging.INFO)
        return _CAPTURE


@contextmanager
def capture_records(sink: list[Record]) -> Iterator[None]:
    """Append to ``sink`` the records (INFO and above) this thread logs while the block runs, except the
    infrastructure's (Dask, Prefect, HTTP). Nothing is captured where the records reach Prefect by themselves
    (:func:`forwarded`): the flow's own process."""
    if forwarded():
        yield
        return
    handler = _capture_handler()
    tid = threading.get_ident()
    before = handler.by_thread.get(tid)
    handler.by_thread[tid] = sink
    try:
        yield
    finally:
        if before is None:
            handler.by_thread.pop(tid, None)
        else:
            handler.by_thread[tid] = before


#: The stages of the calls this pool worker ran last.
_LAST_STAGES: frozenset[str] = frozenset()


def release_if_new_stages(stages: frozenset[str]) -> bool:
    """Before a pool worker runs calls of ``stages``: if they are not the stages it ran last, the big arrays the
    last ones kept for their next call (``preprocessing.pack_fast.process_space``) are freed, so a worker never
    holds one stage's buffers through another's calls. True when it freed (or had nothing to free)."""
    global _LAST_STAGES
    if stages == _LAST_STAGES:
        return False
    _LAST_STAGES = stages
    mod = sys.modules.get("preprocessing.pack_fast")  # not imported: nothing kept
    if mod is not None:
        mod.release_spaces()
    return True


def _execute_captured(calls: Sequence[Call]) -> tuple[str, list[Record]]:
    """Pool worker entry: run the calls (one, or a group: :func:`execute_group`), return their results (JSON) and
    the records they logged. When a call fails, its records go with the exception (``bertpipe_records``), to be
    logged all the same."""
    release_if_new_stages(frozenset(u.stage for c in calls for u in c.units))
    records: list[Record] = []
    try:
        with capture_records(records):
            return json.dumps(execute_group(calls)), records
    except BaseException as exc:
        with contextlib.suppress(AttributeError, TypeError):
            exc.bertpipe_records = records  # type: ignore[attr-defined]
        raise


def group_size(n_calls: int, workers: int) -> int:
    """Fused calls a group holds: :data:`GROUP_PARTS`, fewer where ``n_calls`` would leave a worker idle."""
    return max(1, min(GROUP_PARTS, -(-n_calls // max(1, workers))))


def groups(calls: Sequence[Call], workers: int, size: int = 0) -> list[tuple[Call, ...]]:
    """The batch's calls as they run: a fused chain's calls (part i's TFRecord+HDF5) by ``size`` (default:
    :func:`group_size` of this batch alone), to hash their files together; every other call alone. The DAG
    gives the size it chose for the whole stage (``Batch.group``): its batches run side by side on the
    workers, so a batch need not be split further to keep them busy."""
    size = size or group_size(len(calls), workers)
    out: list[tuple[Call, ...]] = []
    for call in calls:
        last = out[-1] if out else ()
        if (call.fused is not None and last and len(last) < size and last[-1].fused is call.fused
                and last[-1].run == call.run):
            out[-1] = (*last, call)
        else:
            out.append((call,))
    return out


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
    records: list[Record] = field(default_factory=list)


def execute_batch(batch: Batch, workers: int = 1, on_records: Callable[[list[Record]], None] | None = None
                  ) -> BatchResult:
    """Run a batch's calls: in order here (``inline``), or all at once on the local pool.

    The records each call logs (see :func:`capture_records`) are in the result's ``records``; ``on_records``
    gets them as each call ends, a failed call's included, before its error is raised."""
    out = BatchResult()
    step = _PROGRESS.get(batch.progress_id)

    def deliver(records: list[Record]) -> None:
        out.records.extend(records)
        if on_records is not None and records:
            on_records(records)

    if batch.inline:
        for group in groups(batch.calls, 1, batch.group):
            records: list[Record] = []
            try:
                with capture_records(records):
                    out.results += execute_group(group)
            finally:
                deliver(records)
            if step:
                step(len(group))
        return out
    pool = get_pool(workers)
    futures = [(pool.submit(_execute_captured, group), len(group)) for group in groups(batch.calls, workers, batch.group)]
    try:
        for fut, n in futures:
            try:
                text, records = fut.result()
            except BaseException as exc:
                deliver(list(getattr(exc, "bertpipe_records", None) or ()))
                raise
            out.results += json.loads(text)
            deliver(records)
            if step:
                step(n)
    except BaseException:
        for fut, _ in futures:
            fut.cancel()
        raise
    return out


def manifest_of(result: dict[str, Any]) -> Manifest:
    return Manifest.from_dict(result["manifest"])
