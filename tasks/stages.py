"""The Prefect task of the data DAG: one batch of stage calls, named after its stages (from the registry).

Every task takes a :class:`~tasks.calls.Batch` and returns small JSON dicts, one per unit (stage, shard,
key, dir, manifest, cached, seconds, why); the work itself is the library functions the units name.

Caching (architecture.md, "Artifacts, manifests, caching"): the Prefect cache key is made of the units'
content keys (stage, stage code version, resolved parameters, upstream digests: the ``key`` that also
names ``work/<stage>/<key>``) and shard names, never the run id. The manifest on disk decides:
:class:`ManifestCachePolicy` only hands Prefect the key while every unit's manifest verifies; when one does
not (files deleted or changed) but Prefect holds a record under that key, the policy returns a one-off key
so the record is not trusted and the task runs. The task body checks the manifests again, so a run without
any Prefect record (new PREFECT_HOME, another machine) still skips finished work.

Library loggers (``preprocessing``, ``pretrain``) reach the run logger through Prefect's
``PREFECT_LOGGING_EXTRA_LOGGERS`` (set by ``bertpipe run`` and the deployments) in the flow's own process;
records logged in a local worker process or on a Dask worker are captured there, come back with the result
(or the error) and are re-logged here (tasks.calls.capture_records).

On a Dask cluster (``persist=False``) no Prefect result record is written: the workers would write it under the
launching machine's ``PREFECT_HOME`` path on their own disks (an ERROR per task where that path cannot be made),
and the manifests in the shared work dir decide what is done anyway. A call that fails because its worker does not
see the work dir, or because the run has ended, is not retried.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from functools import cache
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext

from tasks.calls import Batch, check_done, execute_batch


def cache_key(batch: Batch) -> str:
    """Prefect's key for a batch: its units' content keys and shards, never the run."""
    units = [f"{u.stage}/{u.key}/{u.shard}" for c in batch.calls for u in c.units]
    digest = hashlib.md5("\n".join(units).encode()).hexdigest()[:16]
    return f"bertpipe-{batch.calls[0].label.split('[')[0]}-{digest}"


@dataclass
class ManifestCachePolicy(CachePolicy):
    """Cache key = the units' content keys, but only while every unit's manifest verifies."""

    def compute_key(self, task_ctx: TaskRunContext, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        batch = inputs.get("batch")
        if not isinstance(batch, Batch) or any(u.stage in c.force for c in batch.calls for u in c.units):
            return None  # a forced stage: run, and leave the existing record alone (other stages' batches: Cached)
        if any(u.piece for c in batch.calls for u in c.units):
            return None  # pieces of a stage (counts, shard groups) are never taken from Prefect's records
        key = cache_key(batch)
        if all(check_done(u, c.check_md5, c.revive, c.root) is not None for c in batch.calls for u in c.units):
            return key
        try:
            known = task_ctx.result_store.exists(key)
        except Exception:  # noqa: BLE001 - no store configured: nothing to distrust
            known = False
        # A record whose files are gone or changed is not trusted: look up a key that has none.
        return f"{key}-redo-{uuid.uuid4().hex[:12]}" if known else key


def _run(batch: Batch, workers: int = 1) -> list[dict[str, Any]]:
    logger = get_run_logger()

    def relog(records: list[tuple[int, str, str]]) -> None:
        for level, name, message in records:
            logger.log(level, "%s: %s", name, message)

    out = execute_batch(batch, workers, on_records=relog)
    ran = [r for r in out.results if not r["cached"]]  # pieces (no manifest) always run
    logger.info("%s: %d of %d unit(s) ran, %.2f s", batch.label, len(ran), len(out.results),
                sum(r["seconds"] for r in out.results))
    return out.results


_stage_batch = task(_run, name="stage", cache_policy=ManifestCachePolicy(), persist_result=True,
                    result_serializer="json", task_run_name="{batch.label}")


def _worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: not when the worker does not see the work dir, nor once the run has ended."""
    from tasks.runtoken import RunEnded, WorkDirNotSeen

    try:
        state.result(raise_on_failure=True)
    except (WorkDirNotSeen, RunEnded):
        return False
    except BaseException:  # noqa: BLE001 - any other failure: retried as declared
        return True
    return True


@cache
def task_for(stages: str, retries: int = 0, persist: bool = True) -> Any:
    """The Prefect task of a group of stages ("tfrecord+hdf5"): the one task, named after them. ``persist=False``
    (a Dask cluster): no result record, no Prefect cache (the manifests decide, see the module docstring)."""
    from prefect.cache_policies import NO_CACHE

    opts: dict[str, Any] = {"name": stages}
    if retries:
        opts.update(retries=retries, retry_delay_seconds=[10, 60], retry_condition_fn=_worth_retrying)
    if not persist:
        opts.update(persist_result=False, cache_policy=NO_CACHE)
    return _stage_batch.with_options(**opts)
