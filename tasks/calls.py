"""One stage (or shard) call, and how it runs, without Prefect.

A :class:`StageCall` names a library stage function (``"module:function"``), its arguments, its stage
directory ``work/<stage>/<key>[/<shard>]`` and the upstream stage directories whose manifests it is
given. :func:`execute` decides with the manifest on disk: a directory whose ``_manifest.json``
verifies (files, sizes, md5s) and was built from the same upstream manifests is done, and nothing
runs; otherwise the function runs, inline or in a local worker process (spawned, no Prefect import),
and the records it logged come back with the result so the Prefect task can forward them.

Prefect-free on purpose: ``bertpipe status`` / ``verify`` and pool worker processes import this module.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preprocessing.manifest import Manifest, check_inside, is_done, load_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageCall:
    """Everything one stage (or shard) run needs; small and picklable (paths, configs, no data)."""

    stage: str  # DAG stage name (text, vocab, tfrecord, hdf5, bins, eval_tfrecord, ...)
    key: str  # the stage's content key: names work/<stage>/<key>
    out_dir: str  # work/<stage>/<key> or work/<stage>/<key>/<shard>
    func: str  # "module:function" of the library stage function
    args: tuple = ()  # positional arguments before out_dir (input paths)
    kwargs: dict[str, Any] = field(default_factory=dict)  # configs, output_name ...
    shard: str = ""  # shard name for per-shard stages, "" for whole-stage ones
    upstream_dirs: tuple[str, ...] = ()  # stage/shard dirs whose manifests are passed as upstream=
    pass_upstream: bool = True  # the function takes upstream= (download does not)
    force: bool = False  # redo even when the manifest verifies
    inline: bool = True  # run in this process (Dask / Prefect process workers) or in the local pool
    check_md5: bool = True  # "done" re-hashes every output (False: sizes only)
    source_stats: dict[str, list[int]] | None = None  # must equal the manifest's (text import freshness)
    root: str = ""  # the work dir: out_dir must resolve inside it (a symlink must not lead writes elsewhere)

    @property
    def label(self) -> str:
        return f"{self.stage}[{self.shard}]" if self.shard else self.stage


def upstream_manifests(call: StageCall) -> list[Manifest]:
    """The manifests of ``call``'s upstream directories (each must exist: upstream stages ran first)."""
    out = []
    for d in call.upstream_dirs:
        m = load_manifest(d)
        if m is None:
            from preprocessing.errors import ManifestError

            raise ManifestError(f"{d}/_manifest.json is missing: the upstream stage of {call.label} is not done")
        out.append(m)
    return out


def check_done(call: StageCall) -> Manifest | None:
    """The verified manifest of ``call.out_dir`` if it is complete and built from the same upstream."""
    m = is_done(call.out_dir, check_md5=call.check_md5)
    if m is None:
        return None
    try:
        expected = {f"{u.stage}:{u.key}": u.digest for u in upstream_manifests(call)} if call.pass_upstream else {}
    except Exception:  # noqa: BLE001 - an unreadable upstream means "not done here"
        return None
    if call.pass_upstream and m.upstream != expected:
        log.warning("%s: %s was built from other upstream outputs; redoing it", call.label, call.out_dir)
        return None
    if call.source_stats is not None and m.counters.get("source_stats") != call.source_stats:
        log.info("%s: the source files changed since %s was made; redoing it", call.label, call.out_dir)
        return None
    return m


def invoke(call: StageCall) -> Manifest:
    """Run the library stage function of ``call`` in this process."""
    module, name = call.func.split(":")
    fn = getattr(importlib.import_module(module), name)
    kwargs = dict(call.kwargs)
    if call.pass_upstream:
        kwargs["upstream"] = upstream_manifests(call)
    return fn(*call.args, Path(call.out_dir), **kwargs)


class _ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[tuple[int, str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.levelno, record.name, record.getMessage()))


def _invoke_captured(call: StageCall) -> tuple[str, list[tuple[int, str, str]]]:
    """Pool worker entry: run the call, return the manifest (JSON) and the records it logged."""
    handler = _ListHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.INFO, logging.INFO))
    try:
        return invoke(call).to_json(), handler.records
    finally:
        root.removeHandler(handler)


def _watch_parent(parent: int) -> None:
    """Pool worker initializer: exit when the flow process dies (kill -9), so no orphan keeps writing."""
    def loop() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.5)

    threading.Thread(target=loop, daemon=True, name="bertpipe-parent-watch").start()


_POOL: ProcessPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def get_pool(workers: int) -> ProcessPoolExecutor:
    """The local worker pool of this flow process (created on first use: a cached run spawns nothing)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_watch_parent, initargs=(os.getpid(),))
        return _POOL


def shutdown_pool() -> None:
    global _POOL
    with _POOL_LOCK:
        if _POOL is not None:
            _POOL.shutdown(wait=True, cancel_futures=True)
            _POOL = None


def result_dict(call: StageCall, m: Manifest, *, cached: bool, seconds: float) -> dict[str, Any]:
    """What a stage task returns (JSON types only: Prefect stores it with the json serializer)."""
    return {"stage": call.stage, "shard": call.shard, "key": call.key, "dir": call.out_dir,
            "manifest": json.loads(m.to_json()), "cached": cached, "seconds": round(seconds, 3)}


def execute(call: StageCall, workers: int = 1) -> tuple[dict[str, Any], list[tuple[int, str, str]]]:
    """Do ``call`` unless its manifest on disk says it is done; returns (result, forwarded log records)."""
    t0 = time.perf_counter()
    if call.root:
        check_inside(call.out_dir, call.root)
    if not call.force:
        m = check_done(call)
        if m is not None:
            return result_dict(call, m, cached=True, seconds=time.perf_counter() - t0), []
    if call.inline:
        m, records = invoke(call), []
    else:
        text, records = get_pool(workers).submit(_invoke_captured, call).result()
        m = Manifest.from_dict(json.loads(text))
    return result_dict(call, m, cached=False, seconds=time.perf_counter() - t0), records


def manifest_of(result: dict[str, Any]) -> Manifest:
    return Manifest.from_dict(result["manifest"])
