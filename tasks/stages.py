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
``PREFECT_LOGGING_EXTRA_LOGGERS`` (set by ``bertpipe run`` and the deployments); records logged in a local
worker process come back with the result and are re-logged here.
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
    out = execute_batch(batch, workers)
    for level, name, message in out.records:
        logger.log(level, "%s: %s", name, message)
    ran = [r for r in out.results if not r["cached"]]  # pieces (no manifest) always run
    logger.info("%s: %d of %d unit(s) ran, %.2f s", batch.label, len(ran), len(out.results),
                sum(r["seconds"] for r in out.results))
    return out.results


_stage_batch = task(_run, name="stage", cache_policy=ManifestCachePolicy(), persist_result=True,
                    result_serializer="json", task_run_name="{batch.label}")


@cache
def task_for(stages: str, retries: int = 0) -> Any:
    """The Prefect task of a group of stages ("tfrecord+hdf5"): the one task, named after them."""
    opts: dict[str, Any] = {"name": stages}
    if retries:
        opts.update(retries=retries, retry_delay_seconds=[10, 60])
    return _stage_batch.with_options(**opts)
