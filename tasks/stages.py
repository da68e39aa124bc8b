"""Prefect tasks: one thin task per stage (called once per shard for per-file stages).

Every task takes a :class:`~tasks.calls.StageCall` and returns a small JSON dict (stage, shard, key,
dir, manifest, cached, seconds); the work itself is the library function named in the call.

Caching (architecture.md, "Artifacts, manifests, caching"): the Prefect cache key is the stage's
content key (stage, stage code version, resolved parameters, upstream manifest digests: the ``key``
of the call, which also names ``work/<stage>/<key>``) plus the shard name — never the run id. The
manifest on disk decides: :class:`ManifestCachePolicy` only hands Prefect the key when the stage
directory's manifest verifies; when it does not (files deleted or changed) but Prefect holds a record
under that key, the policy returns a one-off key so the record is not trusted and the task runs. The
task body checks the manifest again, so a run without any Prefect record (new PREFECT_HOME, another
machine) still skips finished work.

Library loggers (``preprocessing``, ``pretrain``) reach the run logger through Prefect's
``PREFECT_LOGGING_EXTRA_LOGGERS`` (set by ``bertpipe run`` and the deployments); records logged in a
local worker process come back with the result and are re-logged here.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import CachePolicy
from prefect.context import TaskRunContext

from tasks.calls import StageCall, check_done, execute


def cache_key(call: StageCall) -> str:
    """Prefect's key for a stage (or shard) call: its content key, never the run."""
    return f"bertpipe-{call.stage}-{call.key}-{call.shard or 'all'}"


@dataclass
class ManifestCachePolicy(CachePolicy):
    """Cache key = the stage content key, but only while the stage directory's manifest verifies."""

    def compute_key(self, task_ctx: TaskRunContext, inputs: dict[str, Any], flow_parameters: dict[str, Any],
                    **kwargs: Any) -> str | None:
        call = inputs.get("call")
        if not isinstance(call, StageCall) or call.force:
            return None  # forced: run, and leave the existing record alone
        key = cache_key(call)
        if check_done(call) is not None:
            return key
        try:
            known = task_ctx.result_store.exists(key)
        except Exception:  # noqa: BLE001 - no store configured: nothing to distrust
            known = False
        # A record whose files are gone or changed is not trusted: look up a key that has none.
        return f"{key}-redo-{uuid.uuid4().hex[:12]}" if known else key


def _run(call: StageCall, workers: int) -> dict[str, Any]:
    logger = get_run_logger()
    result, records = execute(call, workers)
    for level, name, message in records:
        logger.log(level, "%s: %s", name, message)
    how = "cached (manifest verifies)" if result["cached"] else "done"
    logger.info("%s %s in %.2f s -> %s", call.label, how, result["seconds"], call.out_dir)
    return result


_OPTS: dict[str, Any] = {"cache_policy": ManifestCachePolicy(), "persist_result": True, "result_serializer": "json",
                         "task_run_name": "{call.label}"}


@task(name="download", retries=2, retry_delay_seconds=[10, 60], **_OPTS)
def download(call: StageCall, workers: int = 1) -> dict[str, Any]:
    """Fetch the dump (resumable, md5-checked); retried as a whole on top of the library's HTTP retries."""
    return _run(call, workers)


@task(name="extract", **_OPTS)
def extract(call: StageCall, workers: int = 1) -> dict[str, Any]:
    return _run(call, workers)


@task(name="text", **_OPTS)
def text(call: StageCall, workers: int = 1) -> dict[str, Any]:
    """Text stages (clean, segment, split_eval, gather) of a dump, or the import of MLCommons' text."""
    return _run(call, workers)


@task(name="vocab", **_OPTS)
def vocab(call: StageCall, workers: int = 1) -> dict[str, Any]:
    return _run(call, workers)


@task(name="create_pretraining_data", **_OPTS)
def create_pretraining_data(call: StageCall, workers: int = 1) -> dict[str, Any]:
    """One part file (or eval.txt) -> one TFRecord."""
    return _run(call, workers)


@task(name="pick_eval_samples", **_OPTS)
def pick_eval_samples(call: StageCall, workers: int = 1) -> dict[str, Any]:
    return _run(call, workers)


@task(name="tfrecord_to_hdf5", **_OPTS)
def tfrecord_to_hdf5(call: StageCall, workers: int = 1) -> dict[str, Any]:
    """One TFRecord -> one padded HDF5."""
    return _run(call, workers)


@task(name="split_4bins", **_OPTS)
def split_4bins(call: StageCall, workers: int = 1) -> dict[str, Any]:
    return _run(call, workers)


#: DAG stage name -> its task.
TASKS = {"download": download, "extract": extract, "text": text, "vocab": vocab,
         "tfrecord": create_pretraining_data, "eval_tfrecord": create_pretraining_data,
         "eval_10k": pick_eval_samples, "hdf5": tfrecord_to_hdf5, "eval_hdf5": tfrecord_to_hdf5,
         "bins": split_4bins}
