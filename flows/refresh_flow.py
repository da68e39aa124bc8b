"""The refresh flow: rebuild the data set when anything that decides its bytes changed.

    prefect deployment run 'bertpipe-refresh/refresh' --param datasets_dir=$PWD/datasets     # or on its schedule
    python -c "from flows.refresh_flow import refresh_flow; refresh_flow(datasets_dir='/data/datasets', \\
        source='https://mirror/enwiki-latest-pages-articles.xml.bz2', vocab='vocab.txt')"

Every run, before any task, checks its parameters (``data.<name>``: DataParams' fields; a misspelt one is refused
naming the valid ones), then, holding ``datasets_dir``'s lock (one refresh at a time, beside the deployment's
``concurrency_limit``):

1. reads the dump's published md5 (``<name>.md5``, ``md5sums``… next to it; ``sample`` carries its own);
2. the gate (flows/versions.py): ``latest`` is walked as the data DAG would walk it, without running anything;
   the refresh is "unchanged" only when every stage is done there with the key this refresh would give it (the
   dump's md5, every data parameter, the vocab, each stage's code version) and its files verify. ``force=true``
   rebuilds whatever the gate says;
3. otherwise it builds a version (``versions/<time>-<md5[:8]>``, or resumes a failed build that asked for the
   same), starting from hard links to the previous version's outputs (only changed stages run), and moves
   ``latest`` there (atomic symlink swap) after success: a failed build leaves ``latest`` alone;
4. keeps ``keep_versions`` complete versions (``latest`` included) and removes older ones and failed or
   half-built ones, never one a training reads (core/readlock.py);
5. reports it all in the markdown artifact ``refresh-<id of datasets_dir>``; a failed refresh logs one line and
   leaves an artifact ``refresh-failed-<id>`` (its ``on_failure`` hook).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from core.errors import InputError
from core.lock import WorkDirLock
from core.manifest import atomic_write_text
from flows.data_flow import run_data
from flows.guard import DataParameters, check_data, check_source, check_type, flow_start
from flows.versions import (
    REQUEST_FILE,
    SOURCE_FILE,
    gate,
    latest_version,
    link_reusable,
    move_latest,
    new_version,
    prune,
    request,
    resumable,
    unlink_unused,
)
from preprocessing.params import surface

#: a refresh that runs longer than this fails (its concurrency slot is freed well before the next weekly run)
REFRESH_TIMEOUT_S = 6 * 24 * 3600


def published_md5(source: str) -> str:
    """The md5 the source's publisher gives for it (InputError when there is none: nothing to compare).

    ``sample`` (the packaged dump) has its md5 in the package.
    """
    from preprocessing.params import SAMPLE
    from preprocessing.text.download import resolve

    if source == SAMPLE:
        from preprocessing.sample import SAMPLE_MD5

        return SAMPLE_MD5

    res = resolve(source)
    if not res.md5:
        raise InputError(f"no published checksum found for {source} (looked for <name>.md5 and md5sums next to "
                         "it); a refresh compares checksums, so publish one next to the dump")
    return res.md5


def current_version(datasets_dir: Path) -> dict[str, Any] | None:
    """SOURCE.json of the version ``latest`` points to, or None."""
    try:
        return json.loads((datasets_dir / "latest" / SOURCE_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def _failed(flow: Any, flow_run: Any, state: Any) -> None:
    """``on_failure`` / ``on_crashed``: one ERROR line in the run's logs and an artifact saying what is left."""
    from prefect.logging.loggers import flow_run_logger

    from tasks.artifacts import scope_id

    params = flow_run.parameters or {}
    root = Path(str(params.get("datasets_dir") or "."))
    latest = latest_version(root) if root.is_dir() else None
    where = f"latest still points at {latest.name}" if latest else "there is no latest version yet"
    message = (state.message or state.name).split("\n")[0][:500]
    flow_run_logger(flow_run, flow).error("refresh of %s failed: %s; %s (a failed build is resumed by the next "
                                          "refresh)", root, message, where)
    try:
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(
            key=f"refresh-failed-{scope_id(root)}", description=f"bertpipe refresh of {root} failed",
            markdown=f"# bertpipe refresh failed\n\n`{root}`: {message}\n\n{where}; the next refresh resumes the "
                     "build.\n")
    except Exception:  # noqa: BLE001 - the report of a failure must not fail
        pass


def _report(root: Path, out: dict[str, Any]) -> None:
    """The refresh's markdown artifact: the decision and why, what was reused and run, versions kept and removed."""
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return
    from prefect.artifacts import create_markdown_artifact

    from tasks.artifacts import _key

    lines = [f"# bertpipe refresh of `{root}`", "",
             f"**{'Rebuilt' if out['rebuilt'] else 'Unchanged'}**: version `{out['version']}` "
             f"({out['reason'] or 'every stage verified with the keys this refresh would give it'})", "",
             f"Source: `{out['source']}`, md5 `{out['md5']}`"]
    if out.get("reused"):
        lines += ["", f"Reused from `{out['previous']}` (hard links): " +
                  ", ".join(f"{k} ({v})" for k, v in out["reused"].items())]
    if out.get("stages"):
        lines += ["", "| stage | calls | ran | cached |", "| --- | --- | --- | --- |"]
        lines += [f"| {k} | {v['calls']} | {v['calls'] - v['cached']} | {v['cached']} |" for k, v in out["stages"].items()]
    lines += ["", "## Versions kept", "", "| version | why |", "| --- | --- |"]
    lines += [f"| `{k['version']}` | {k['why']} |" for k in out["kept"]]
    lines += ["", "## Versions removed", ""]
    if out["removed"]:
        lines += ["| version | why | bytes freed |", "| --- | --- | --- |"]
        lines += [f"| `{r['version']}` | {r['why']} | {r['bytes']:,} |" for r in out["removed"]]
    else:
        lines.append("none")
    create_markdown_artifact("\n".join(lines) + "\n", key=_key("refresh"),
                             description=f"bertpipe refresh of {root}: {'rebuilt' if out['rebuilt'] else 'unchanged'}")


@flow(name="bertpipe-refresh", description="Rebuild the data set into a new version when anything that decides its "
      "bytes changed; keep_versions bounds the versions kept", persist_result=True, result_serializer="json",
      on_failure=[_failed], on_crashed=[_failed], timeout_seconds=REFRESH_TIMEOUT_S)
def refresh_flow(datasets_dir: str, source: str = "enwiki-latest", vocab: str | None = None,
                 data: DataParameters | None = None, keep_versions: int = 2,  # type: ignore[valid-type]
                 force: bool = False, wait_lock_s: float = 0.0) -> dict[str, Any]:
    """``datasets_dir``: where versions and ``latest`` live (required; put it outside the checkout, e.g. on the
    data disk); ``data``: further data-flow parameters (shards, workers, keep, ...; its work_dir, source and vocab
    are set here); ``keep_versions``: complete versions kept, latest included (>= 1); ``force``: rebuild even when
    nothing changed; ``wait_lock_s``: wait this long for a refresh already running on ``datasets_dir``.

    Errors about ``data`` name its fields as ``data.<name>``.
    """
    flow_start()
    from core.paths import PathCheck

    check_type("datasets_dir", datasets_dir, str)
    if not datasets_dir.strip():
        raise InputError("datasets_dir is empty; give the folder that holds the versions and latest")
    root = Path(datasets_dir).resolve()
    PathCheck().output_dir("datasets_dir", root)
    check_type("keep_versions", keep_versions, int)
    if keep_versions < 1:
        raise InputError(f"keep_versions must be >= 1 (latest is always kept), got {keep_versions}")
    check_type("force", force, bool)
    check_type("wait_lock_s", wait_lock_s, float)
    if not 0 <= wait_lock_s <= 1e7:
        raise InputError(f"wait_lock_s must be between 0 and 1e7 seconds, got {wait_lock_s}")
    check_source("source", source)
    if vocab is not None:
        check_type("vocab", vocab, str)
        PathCheck().input_file("vocab", vocab, "vocab.txt")
    fixed = {"work_dir": str(root / "versions" / "new"), "source": source, "source_md5": None, "vocab": vocab,
             "text_dir": None}
    p = check_data(data, "data.", fixed)
    with surface("data."):
        return _refresh(root, p, keep_versions, force, wait_lock_s)


def _refresh(root: Path, p: Any, keep_versions: int, force: bool, wait_lock_s: float) -> dict[str, Any]:
    from preprocessing import registry
    from tasks.artifacts import artifact_scope

    logger = get_run_logger()
    root.mkdir(parents=True, exist_ok=True)
    lock = WorkDirLock(root, wait_lock_s, what="datasets dir",
                       advice="another refresh is running there: wait for it to finish (or set wait_lock_s SECONDS), "
                              "or use another datasets_dir")
    with lock, artifact_scope(root):
        md5 = published_md5(p.source)
        p = replace(p, source_md5=md5)
        previous = latest_version(root)
        ok, why = (False, "force=true") if force else gate(p, previous)
        out: dict[str, Any] = {"source": p.source, "md5": md5, "previous": previous.name if previous else None}
        if ok:
            logger.info("unchanged: %s holds what this refresh would build (every stage's key and files verified); "
                        "keeping it", previous.name)
            kept, removed = prune(root, keep_versions)
            out.update(rebuilt=False, version=previous.name, reason="", kept=kept, removed=removed)
            _say_pruned(logger, removed)
            _report(root, out)
            return out
        req = request(p, md5)
        vdir = resumable(root, req["fingerprint"]) or new_version(root, md5)
        logger.info("building %s%s: %s", vdir.name, " (resuming a failed build)" if vdir.exists() else "", why)
        vdir.mkdir(parents=True, exist_ok=True)
        if not (vdir / REQUEST_FILE).is_file():
            atomic_write_text(vdir / REQUEST_FILE, json.dumps({**req, "started": time.strftime("%Y-%m-%dT%H:%M:%S")},
                                                              indent=1, sort_keys=True) + "\n")
        every = [s.name for s in registry.active(p)]
        reused = {} if force else link_reusable(previous, vdir, skip=set(p.force))
        if reused:
            logger.info("reusing %s's outputs (hard links): %s", previous.name,
                        ", ".join(f"{k} ({v})" for k, v in reused.items()))
        summary = run_data(replace(p, work_dir=str(vdir), force=every if force else p.force))
        unlink_unused(vdir)
        info = {"version": vdir.name, "source": p.source, "md5": md5, "built": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "outputs": summary["outputs"], "request": req["fingerprint"], "reason": why,
                "reused_from": previous.name if reused else None}
        atomic_write_text(vdir / SOURCE_FILE, json.dumps(info, indent=1, sort_keys=True) + "\n")
        move_latest(root, vdir)
        logger.info("latest -> %s", vdir)
        kept, removed = prune(root, keep_versions, building=vdir)
        _say_pruned(logger, removed)
        stages = {k: {"calls": v["calls"], "cached": v["cached"]} for k, v in summary["stages"].items()}
        out.update(rebuilt=True, version=vdir.name, reason=why, reused=reused, stages=stages, kept=kept,
                   removed=removed, outputs=summary["outputs"])
        _report(root, out)
        return out


def _say_pruned(logger: Any, removed: list[dict[str, Any]]) -> None:
    for r in removed:
        logger.info("removed version %s (%s): %.2f GB freed", r["version"], r["why"], r["bytes"] / 1e9)
