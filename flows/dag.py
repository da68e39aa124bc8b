"""The data DAG as a generic walk over the stage registry (``preprocessing/registry.py``).

No stage is named here. A stage starts as soon as every stage it reads is complete: it is planned into
calls (one per part file for per-shard stages; a chained stage such as the HDF5 conversion rides in its
upstream's calls, shard by shard), the calls are grouped into batches (a few dozen shards per Prefect task,
so a 500-part run is not 1,000 task runs), and the batches are submitted to the task runner: threads plus
the local worker pool, Prefect's process pool, or a Dask cluster. Each stage's key is computed from its
parameters and its upstream outputs' digests, so a stage is found again (cached) exactly when its inputs and
parameters are unchanged; the manifests on disk, not Prefect's records, decide what is done.

``--only``/``stages`` names the stages wanted: what they read is run too when it is not done (and the log
says so). Stages outside the selection that are already done are reported as well, so ``last_run.json``
always names the whole data set (train_dir, eval_hdf5, vocab).

The flow trusts only what it sees (issue 21): the run writes a token into the work dir that every call checks
first (tasks/runtoken.py; a worker without the work dir fails in one line), a call's result is accepted only when
its manifest and files are found here (tasks.calls.accept), and when the run stops, however it stops, the token
goes first (no call commits a manifest after that), then outstanding futures are cancelled. On Dask the workers
are checked before any work, and a lost scheduler ends the run in one line (flows/cluster.py).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from core.errors import InputError, ManifestError
from core.manifest import check_inside, clear_links, load_manifest, stage_key
from core.pools import default_workers
from core.stage import Plan, Result, Stage, Unit
from preprocessing import registry
from preprocessing.params import DataParams, current_surface, spell
from tasks.artifacts import ShardProgress, dataset_summary, stage_table, summarize
from tasks.calls import (
    Batch,
    Call,
    accept,
    check_done,
    group_size,
    manifest_of,
    progress_hook,
    result_dict,
    shutdown_pool,
    why_not_done,
)
from tasks.runtoken import RunToken, WorkDirNotSeen, end_run, start_run

#: A batch (one Prefect task) holds at most this many calls; fewer when that leaves workers idle.
MAX_BATCH = 64
#: ...and at least this many (``BERTPIPE_BATCH_MIN``, default 1: a small run's shards are a Prefect task each).
#: bench/bench_scale.py sets 4, so that its 4 parts hash their files as one group, as batches do at full size.
BATCH_MIN = max(1, int(os.environ.get("BERTPIPE_BATCH_MIN", "1") or 1))


@dataclass
class _Group:
    """The calls of one stage and the stages chained into it, while they run."""

    stages: list[str]
    expected: int
    rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    done: int = 0
    bar: Any = None
    artifact: Any = None
    pieces: list[Unit] | None = None  # a stage written as pieces: this phase's units, in order
    values: list[Any] = field(default_factory=list)  # what the pieces of earlier phases returned
    seconds: float = 0.0  # the pieces' seconds so far
    cpu: float = 0.0  # of them, CPU seconds (core.costs.spent)
    run_wait: float = 0.0  # and waits for a core
    why: str = "never done"  # why a stage written as pieces runs (its whole was not done)


def identity(result: Result) -> str:
    """What downstream keys depend on: the digest of a stage's outputs (all shards' for a per-shard stage)."""
    if list(result.manifests) == [""]:
        return result.manifest.digest
    joined = "\n".join(f"{s}:{m.digest}" for s, m in sorted(result.manifests.items()))
    return hashlib.md5(joined.encode()).hexdigest()


def _signal_behind(exc: BaseException) -> BaseException | None:
    """SIGTERM or Ctrl-C that arrived inside a library and came out as another error (pydantic wraps what a
    serializer raised into PydanticSerializationError, naming it only in its text): the signal's own exception,
    so the command stops with its one line and exit code. None when ``exc`` is one already, or no signal."""
    if not isinstance(exc, Exception):
        return None
    seen, e = [], exc
    while e is not None and len(seen) < 10:
        seen.append(e)
        e = e.__cause__ or e.__context__
    for e in seen:
        if not isinstance(e, Exception):
            return e
    text = " ".join(str(e) for e in seen)
    if re.search(r"\bTerminationSignal\b", text):
        import signal

        from prefect.exceptions import TerminationSignal

        return TerminationSignal(signal.SIGTERM)
    if re.search(r"\bKeyboardInterrupt\b", text):
        return KeyboardInterrupt()
    return None


class DataDag:
    """One run of the data DAG for :class:`DataParams` (used inside a flow run)."""

    def __init__(self, p: DataParams, logger: logging.Logger | logging.LoggerAdapter) -> None:
        self.p, self.log = p, logger
        self.work = Path(p.work_dir).resolve()
        self.workers = p.workers or default_workers()
        self.kind = p.resolved_runner()
        self.inline = self.kind != "local" or self.workers == 1  # calls run here, or in the local pool
        self.stages = registry.active(p)
        self.by_name = {s.name: s for s in self.stages}
        self._check_selection()
        self.selected = set(p.stages) if p.stages else set(self.by_name)
        self.targets = self._with_ancestors(self.selected)
        self.cfgs = {s.name: s.configure(p) for s in self.stages}
        self.keys: dict[str, str] = {}
        self.results: dict[str, Result] = {}
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.planned: dict[str, list[Unit]] = {}
        self.task_runs: dict[str, int] = {}  # "tfrecord+hdf5" -> task runs (batches) submitted
        self.runner: Any = None
        self.plans: dict[str, Plan] = {}
        self._pending: dict[Any, tuple[_Group, Batch]] = {}
        self.token: RunToken | None = None
        self._done: queue.Queue = queue.Queue()  # futures of _pending, as they finish

    # -- selection ---------------------------------------------------------------------------------
    def _check_selection(self) -> None:
        for s in sorted(set(self.p.stages or ()) | set(self.p.force)):
            if s not in self.by_name:
                why = {"text": f"{spell('text_dir')} was given", "mlcommons": f"{spell('source')} is mlcommons",
                       "dump": "the source is a dump"}[self.p.source_kind]
                raise InputError(f"stage '{s}' is not part of this run ({why}); its stages are: "
                                 f"{', '.join(self.by_name)}")

    def _with_ancestors(self, names: set[str]) -> set[str]:
        out, todo = set(), list(names)
        while todo:
            n = todo.pop()
            if n not in out:
                out.add(n)
                todo.extend(self.by_name[n].reads)
        return out

    # -- keys and plans ------------------------------------------------------------------------------
    def _key(self, s: Stage) -> str:
        up = [self.keys[r] if s.chain else identity(self.results[r]) for r in s.reads]
        params = {**s.key_params(self.cfgs[s.name]), **(s.key_extra(self.p) if s.key_extra else {})}
        return stage_key(s.name, s.version, params, up)

    def _plan(self, s: Stage) -> list[Unit]:
        self.keys[s.name] = key = self._key(s)
        self.plans[s.name] = plan = Plan(s, self.p, self.cfgs[s.name], key, self.work, self.results, self.planned)
        units = s.plan(plan)
        self.planned[s.name] = units
        return units

    def _whole(self, s: Stage, pieces: list[Unit]) -> Unit:
        """The unit a stage written as pieces stands for when asking "done?": its dir, reading every
        directory its pieces read."""
        plan = self.plans[s.name]
        up = dict.fromkeys(d for u in pieces for d in u.upstream_dirs)
        return plan.unit(upstream=list(up)) if up else plan.unit()

    def _done_units(self, s: Stage) -> list[Unit]:
        """The units whose manifests say whether ``s`` is done (for a stage written as pieces: the whole)."""
        units = self._plan(s)
        return [self._whole(s, units)] if s.finish else units

    def _calls(self, s: Stage) -> tuple[list[str], list[Call]]:
        """``s`` planned, with the stages chained to it: (stage names, one call per shard)."""
        chained = [c for c in self.stages if c.chain and c.reads == (s.name,) and c.name in self.targets]
        units = self._plan(s)
        extra = [{u.shard: u for u in self._plan(c)} for c in chained]
        fused = chained[0].fused if len(chained) == 1 else None
        force = frozenset(self.p.force)
        # --keep training: a droppable stage read only by the stages chained into its calls goes shard by shard,
        # as soon as its readers have written that shard (part i's TFRecord once part i's HDF5 is done)
        readers = {t.name for t in self.stages if s.name in t.reads}
        drop = (0,) if (self.p.keep == "training" and s.droppable and chained
                        and readers <= {c.name for c in chained}) else ()
        calls = [Call(units=(u, *(e[u.shard] for e in extra)), force=force, check_md5=self.p.verify_md5,
                      root=str(self.work), surface=current_surface(), fused=fused, drop=drop, run=self.token)
                 for u in units]
        return [s.name, *(c.name for c in chained)], calls

    def _batches(self, calls: list[Call], progress_id: str) -> list[Batch]:
        """About 4 batches a slot (at most MAX_BATCH calls each, at least :data:`BATCH_MIN`): a small run's
        shards are a task each. Where a fused chain's batches hold a group or more (tasks.calls.group_size of the
        stage: 4 parts whose 8 files hash together), they hold whole groups: the batches run side by side, so
        none is cut into smaller groups to keep the workers busy (500 parts on 16 workers: batches of 8, two
        groups of 4 each, not 8 lone parts)."""
        slots = self._slots()
        size = max(1, min(MAX_BATCH, max(BATCH_MIN, math.ceil(len(calls) / (4 * slots)))))
        group = group_size(len(calls), slots) if any(c.fused is not None for c in calls) else 0
        if group and size >= group:
            size = math.ceil(size / group) * group
        else:
            group = 0  # batches of fewer calls than a group: each decides its own (tasks.calls.groups)
        return [Batch(calls=tuple(calls[i:i + size]), inline=self.inline, progress_id=progress_id, group=group)
                for i in range(0, len(calls), size)]

    def _slots(self) -> int:
        """How many calls can run at once: local workers, or the Dask cluster's worker threads."""
        client = getattr(self.runner, "_client", None)
        if self.kind == "dask" and client is not None:
            try:
                return max(1, sum(client.nthreads().values()))
            except Exception:  # noqa: BLE001 - the scheduler did not answer: guess from --workers
                pass
        return self.workers

    # -- the walk ----------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Run every target stage (and report every stage found done); the run's summary."""
        import time

        self.t0 = time.perf_counter()
        self.token = start_run(self.work)
        try:
            with self._make_runner() as runner:
                self.runner = runner
                try:
                    self._check_cluster()
                    self._walk()
                except BaseException as exc:
                    end_run(self.token)  # first: a call still running anywhere commits nothing from now on
                    self._cancel_pending()
                    shutdown_pool(failed=True)
                    self._remove_unfinished()
                    if (stop := _signal_behind(exc)) is not None:
                        raise stop from None
                    raise
                shutdown_pool()
        finally:
            end_run(self.token)
        self._find_done_rest()
        self._sweep_trainer_folders()
        self._say_what_ran_too()
        if self.p.keep == "training":
            self._drop_intermediates()
        return self._finish()

    def _remove_unfinished(self) -> None:
        """After a failed or stopped run: the temporary files and scratch folders (hidden ``*_scratch``) of every
        stage that was planned and not finished are removed, and the files of its units that have no manifest
        (never done: partial output), as the command then says (a stage's own clean-up does not run in a pool
        worker that was stopped). A download's ``.part`` stays (it resumes). Links are never followed."""
        import shutil
        import stat

        from core.manifest import MANIFEST_NAME, outside, remove_debris

        for name, units in self.planned.items():
            if name in self.results:
                continue
            for d in dict.fromkeys(Path(u.out_dir) for u in units):
                try:
                    if not stat.S_ISDIR(os.lstat(d).st_mode) or outside(d, self.work):
                        continue
                    remove_debris(d)
                    for e in os.scandir(d):
                        if e.name.startswith(".") and e.name.endswith("_scratch") and e.is_dir(follow_symlinks=False):
                            shutil.rmtree(e.path, ignore_errors=True)
                    if not os.path.lexists(d / MANIFEST_NAME):  # its outputs so far: never done, so removed
                        for dirpath, _dirs, files in os.walk(d):  # never into a linked folder
                            for n in files:
                                f = Path(dirpath) / n
                                if stat.S_ISREG(os.lstat(f).st_mode) and n != ".bertpipe.lock" \
                                        and not n.endswith(".part"):  # a download resumes from its .part
                                    f.unlink(missing_ok=True)
                except OSError as exc:  # a clean-up must not hide the run's own error
                    self.log.warning("could not remove the unfinished files of %s in %s: %s", name, d, exc)

    # -- the cluster (flows/cluster.py) ------------------------------------------------------------------
    def _client(self) -> Any:
        return getattr(self.runner, "_client", None) if self.kind == "dask" else None

    def _check_cluster(self) -> None:
        """On Dask, before any work: every worker reaches this run's Prefect API and sees the work dir."""
        if self.kind != "dask":
            return
        from prefect.settings import PREFECT_API_URL

        from flows.cluster import ClusterGone, check_workers, gone_line

        try:
            client = self.runner.client  # connects
        except OSError as exc:
            raise ClusterGone(gone_line(self.p.dask_address, exc)) from None
        inputs = tuple(str(Path(x).resolve()) for x in (self.p.text_dir, self.p.vocab, self.p.source)
                       if x and "://" not in x and Path(x).exists())  # (source: a dump file; not a preset)
        n = check_workers(client, self.p.dask_address, PREFECT_API_URL.value() or "", self.token, inputs)
        self.log.info("Dask: %d worker(s) at %s reach this run's Prefect API and see the work dir", n,
                      self.p.dask_address)

    def _cancel_pending(self) -> None:
        from flows.cluster import cancel

        cancel(list(self._pending), self._client())
        self._pending.clear()

    def _next_done(self) -> Any:
        """The next finished future of ``_pending`` (each reports itself once, see ``_submit``); on Dask, a
        scheduler lost for GONE_AFTER_S raises ClusterGone."""
        from flows.cluster import GONE_AFTER_S, disconnected, scheduler_gone

        lost_since = None
        while True:
            try:
                fut = self._done.get(timeout=1.0)
            except queue.Empty:
                client = self._client()
                if client is None or not disconnected(client):
                    lost_since = None
                    continue
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since >= GONE_AFTER_S:
                    raise scheduler_gone(None, client, self.p.dask_address) or RuntimeError("scheduler gone") from None
                continue
            if fut in self._pending:
                return fut

    def _ready(self) -> list[Stage]:
        return [s for s in self.stages if s.name in self.targets and not s.chain and s.name not in self.keys
                and all(r in self.results for r in s.reads)]

    def _walk(self) -> None:
        pending = self._pending
        failed: list[BaseException] = []
        while True:
            ready = self._ready() if not failed else []
            for s in ready:
                self._start(s)
            if ready:  # a stage found done without a task (or with no calls) may unblock others at once
                continue
            if not pending:
                break
            fut = self._next_done()
            group, batch = pending.pop(fut)
            try:
                rows = fut.result()
                if fut.state.name == "Cached":  # Prefect's record (every manifest verified): nothing ran
                    rows = self._cached_rows(batch)
                self._collect(group, batch, rows)
            except Exception as exc:  # noqa: BLE001 - let the other batches finish, then re-raise
                from flows.cluster import scheduler_gone

                if gone := scheduler_gone(exc, self._client(), self.p.dask_address):
                    raise gone from None
                self.log.error("%s failed: %s: %s", batch.label, type(exc).__name__, exc)
                failed.append(exc)
                continue
        if failed:  # a worker without the work dir says so first: the other failures follow from it
            raise next((e for e in failed if isinstance(e, WorkDirNotSeen)), failed[0])

    def _start(self, s: Stage) -> None:
        if any(self.results[r].dropped for r in s.reads) and self._done_without_running(s):
            return
        if s.finish is not None:
            self._start_pieces(s)
            return
        names, calls = self._calls(s)
        group = _Group(stages=names, expected=len(calls), rows={n: [] for n in names})
        if not calls:
            self._complete(group)
            return
        self._submit(group, calls)

    def _submit(self, group: _Group, calls: list[Call]) -> None:
        from core.progress import progress
        from tasks.stages import task_for

        label = "+".join(group.stages)
        pid = f"{label}-{uuid.uuid4().hex[:8]}"
        group.bar = progress(total=len(calls), desc=label, unit="call")
        group.artifact = ShardProgress(label, len(calls))
        if not self.inline:
            progress_hook(pid, group.bar.update)
        retries = max(self.by_name[n].retries for n in group.stages)
        batches = self._batches(calls, pid)
        self.task_runs[label] = self.task_runs.get(label, 0) + len(batches)
        task = task_for(label, retries, persist=self.kind != "dask")
        for b in batches:
            fut = self.runner.submit(task, {"batch": b, "workers": self.workers})
            self._pending[fut] = (group, b)
            fut.add_done_callback(self._done.put)

    # -- a stage written as pieces (core/stage.py: Unit.piece, Stage.finish) --------------------------------
    def _start_pieces(self, s: Stage) -> None:
        """Done already (its manifest verifies), or run its first pieces; ``finish`` decides what follows."""
        units = self._plan(s)
        whole = self._whole(s, units)
        m, why = (None, "forced") if s.name in self.p.force else why_not_done(whole, self.p.verify_md5,
                                                                                 root=str(self.work))
        if m is not None:
            self._record(s.name, [result_dict(whole, m, cached=True, seconds=0.0)])
            return
        group = _Group(stages=[s.name], expected=0, rows={s.name: []}, why=why)
        check_inside(whole.out_dir, self.work)
        clear_links(whole.out_dir)  # its pieces write there: never through a link
        self._pieces(group, units)

    def _pieces(self, group: _Group, units: list[Unit]) -> None:
        group.pieces, group.expected, group.done, group.rows = units, len(units), 0, {group.stages[0]: []}
        if not units:
            self._complete(group)
            return
        calls = [Call(units=(u,), force=frozenset(self.p.force), check_md5=self.p.verify_md5, root=str(self.work),
                      surface=current_surface(), run=self.token) for u in units]
        self._submit(group, calls)

    def _finish_pieces(self, group: _Group) -> None:
        """Every piece of this phase returned: ask the stage's ``finish`` for the next phase or its manifest."""
        from core.manifest import Manifest, recording_stats

        name = group.stages[0]
        s = self.by_name[name]
        order = {u.shard: i for i, u in enumerate(group.pieces or [])}
        rows = sorted(group.rows[name], key=lambda r: order[r["shard"]])
        group.values += [r["value"] for r in rows]
        group.seconds += sum(r["seconds"] for r in rows)
        group.cpu += sum(r.get("cpu", 0.0) for r in rows)
        group.run_wait += sum(r.get("run_wait", 0.0) for r in rows)
        with recording_stats():
            out = s.finish(self.plans[name], list(group.values))
        if not isinstance(out, Manifest):
            self._pieces(group, list(out))
            return
        whole = self._whole(s, self.planned[name])
        self._record(name, [result_dict(whole, out, cached=False, seconds=group.seconds, why=group.why,
                                        cpu=group.cpu, run_wait=group.run_wait)])

    # -- the disk budget (--keep training) ------------------------------------------------------------------
    def _done_without_running(self, s: Stage) -> bool:
        """``s`` reads a stage whose files were dropped: done already (recorded), or revive what it needs."""
        units = self._done_units(s)
        found = [check_done(u, self.p.verify_md5, root=str(self.work)) for u in units]
        if units and all(found) and s.name not in self.p.force:
            self._record(s.name, [result_dict(u, m, cached=True, seconds=0.0) for u, m in zip(units, found,
                                                                                                strict=True)])
            return True
        self._revive(s)
        return False

    def _revive(self, s: Stage) -> None:
        """Rebuild the dropped files ``s`` reads (and, first, the dropped files those need), same keys."""
        from prefect.futures import wait

        from tasks.stages import task_for

        heads: list[str] = []
        todo = [r for r in s.reads if self.results[r].dropped]
        while todo:
            r = todo.pop()
            stage = self.by_name[r]
            head = stage.reads[0] if stage.chain else r
            if head not in heads:
                heads.append(head)
                todo += [u for u in self.by_name[head].reads if self.results[u].dropped]
        for head in sorted(heads, key=[x.name for x in self.stages].index):
            names, calls = self._calls(self.by_name[head])
            calls = [replace(c, revive=True) for c in calls if any(u.shard in self.results[u.stage].dropped
                                                                   for u in c.units)]
            self.log.info("rebuilding the dropped %s files of %d call(s): %s needs them", "+".join(names), len(calls),
                          s.name)
            batches = self._batches(calls, "")
            self.task_runs["+".join(names)] = self.task_runs.get("+".join(names), 0) + len(batches)
            futures = [self.runner.submit(task_for("+".join(names), persist=self.kind != "dask"),
                                          {"batch": b, "workers": self.workers}) for b in batches]
            for f in futures:
                self._pending[f] = (None, None)  # cancelled if the run stops meanwhile
            wait(futures)
            for f in futures:
                self._pending.pop(f, None)
            rows = [r for f in futures for r in f.result()]
            for r in rows:
                accept(r)
            for name in names:
                kept = [r for r in self.rows.get(name, []) if r["shard"] not in {x["shard"] for x in rows}]
                self._record(name, sorted(kept + [r for r in rows if r["stage"] == name], key=lambda r: r["shard"]))

    def _drop_intermediates(self) -> None:
        """--keep training: delete the files of droppable stages whose readers are all done (verified in this run)."""
        from core.manifest import drop_files

        freed = sum(r.get("freed", 0) for rows in self.rows.values() for r in rows)  # dropped shard by shard
        for s in self.stages:
            readers = [t.name for t in self.stages if s.name in t.reads]
            if not s.droppable or s.name not in self.results or not all(t in self.results for t in readers):
                continue
            for shard in self.results[s.name].manifests:
                freed += drop_files(self.results[s.name].unit_dir(shard), "--keep training", self.work)
            self.results[s.name].dropped = set(self.results[s.name].manifests)
            for r in self.rows[s.name]:
                r["dropped"] = True
        if freed:
            self.log.info("--keep training: deleted %.2f GB of intermediate files (manifests kept)", freed / 1e9)

    def _collect(self, group: _Group, batch: Batch, rows: list[dict[str, Any]]) -> None:
        for r in rows:  # the flow trusts only what it sees: each output is here, as the call says
            accept(r)
        if group.pieces is not None:
            rows = [r for r in rows if "value" in r]
        for r in rows:
            group.rows[r["stage"]].append(r)
        group.done += len(batch.calls)
        if self.inline:
            group.bar.update(len(batch.calls))
        for _ in batch.calls:
            group.artifact.step()
        if group.done == group.expected:
            group.bar.close()
            progress_hook(batch.progress_id, None)
            self._complete(group)

    def _complete(self, group: _Group) -> None:
        if group.pieces is not None:
            self._finish_pieces(group)
            return
        for name in group.stages:
            rows = sorted(group.rows[name], key=lambda r: r["shard"])
            self._record(name, rows)

    def _record(self, name: str, rows: list[dict[str, Any]]) -> None:
        d = self.work / name / self.keys[name]
        self.results[name] = Result(stage=name, key=self.keys[name], dir=d,
                                    manifests={r["shard"]: manifest_of(r) for r in rows},
                                    ran={r["shard"]: not r["cached"] for r in rows},
                                    dropped={r["shard"] for r in rows if r.get("dropped")})
        self.rows[name] = rows
        stage_table(name, rows)

    def _cached_rows(self, batch: Batch) -> list[dict[str, Any]]:
        """Rows for a batch Prefect found cached, describing *this* work dir's directories.

        Prefect's record is keyed by content, so it may come from another work dir (same PREFECT_HOME,
        same inputs) and name that dir. The cache policy only hit because these manifests verified.
        """
        rows = []
        for u in (u for c in batch.calls for u in c.units):
            m = load_manifest(u.out_dir)
            if m is None:
                raise ManifestError(f"{u.out_dir}/_manifest.json disappeared during the run; run again to redo "
                                    f"{u.label}")
            rows.append(result_dict(u, m, cached=True, seconds=0.0))
        return rows  # (checked by _collect, as every call's rows)

    # -- after the walk ----------------------------------------------------------------------------------
    def _find_done_rest(self) -> None:
        """Stages outside the selection whose outputs are done (sizes checked): the rest of the data set."""
        for s in self.stages:
            if s.name in self.results or not all(r in self.results for r in s.reads):
                continue
            if s.chain and s.reads[0] not in self.planned:
                continue
            try:
                units = self._done_units(s)
            except (InputError, KeyError, OSError):
                continue
            found = [check_done(u, check_md5=False, root=str(self.work)) for u in units]
            if units and all(found):
                self._record(s.name, [result_dict(u, m, cached=True, seconds=0.0) for u, m in zip(units, found,
                                                                                                    strict=True)])

    def _sweep_trainer_folders(self) -> None:
        """The folders trainers read (``train_dir``, the eval HDF5's) hold only what their manifests list: an
        unlisted plain file there is removed (a trainer globbing the folder would read it); a link or anything
        else is refused in one line (InputError)."""
        from tasks.workdir import sweep_unlisted

        for name, result in self.results.items():
            if list(result.manifests) == [""] and not result.dropped:
                for rel in sweep_unlisted(name, result.dir, result.manifest, self.work):
                    self.log.warning("removed %s/%s: a file bertpipe did not write, in a folder trainers read "
                                     "whole", result.dir, rel)

    def _say_what_ran_too(self) -> None:
        extra = sorted(n for n in self.targets - self.selected if n in self.results
                       and any(self.results[n].ran.values()))
        if extra and self.p.stages:
            self.log.info("also ran %s: the selected stage(s) %s need them and they were not done",
                          ", ".join(extra), ", ".join(sorted(self.selected)))

    def _finish(self) -> dict[str, Any]:
        summary = {s.name: summarize(self.rows[s.name]) for s in self.stages if self.rows.get(s.name)}
        outputs = {}
        for s in self.stages:
            if s.name in self.results:
                for out_name, rel in s.outputs.items():
                    outputs[out_name] = str(self.results[s.name].dir / rel) if rel else str(self.results[s.name].dir)
        source = self.p.text_dir or self.p.source
        dataset_summary(source, summary, self.rows)
        return {"work_dir": str(self.work), "source": source, "stages": summary, "outputs": outputs,
                "task_runs": self.task_runs, "wall_seconds": round(time.perf_counter() - self.t0, 3)}

    def _make_runner(self) -> Any:
        if self.kind == "dask":
            if not self.p.dask_address:
                raise InputError(f"runner 'dask' needs a scheduler address: pass {spell('dask_address')} "
                                 "tcp://HOST:8786")
            from prefect_dask import DaskTaskRunner

            return DaskTaskRunner(address=self.p.dask_address)
        if self.kind == "prefect-process":
            from prefect.task_runners import ProcessPoolTaskRunner

            return ProcessPoolTaskRunner(max_workers=self.workers)
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=self.workers)
