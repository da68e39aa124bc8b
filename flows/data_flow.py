"""The data flow: dump or MLPerf text -> parts -> (vocab) -> TFRecords -> HDF5 -> 4 bins, and
eval.txt -> TFRecord -> eval_10k -> HDF5.

    bertpipe run --work-dir work                                   # the built-in sample
    bertpipe run --text-dir results --vocab vocab.txt --work-dir work --n-output-shards 2048
    bertpipe run ... --only hdf5          # one stage (and whatever it needs that is not done)
    bertpipe run ... --force tfrecord     # redo one stage
    prefect deployment run 'bertpipe-data/data' --param work_dir=$PWD/work/data --param 'stages=["vocab"]'
    python -c "from flows.data_flow import run_sample; print(run_sample('work/demo'))"

The flow's parameters are :class:`preprocessing.params.DataParams`' fields, one for one (its signature is
generated from them, so the Prefect UI and the deployments show every field with its default and help).
"""

from __future__ import annotations

import inspect
import json
import os
import typing
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from core.lock import WorkDirLock
from core.manifest import atomic_write_text
from flows.dag import DataDag
from flows.guard import check_data, flow_start
from preprocessing.params import DataParams, spell
from preprocessing.targets import folders as target_folders
from tasks.artifacts import artifact_scope


def run_data(p: DataParams) -> dict[str, Any]:
    """The body of the data flow (call it inside a flow run): lock the work dir, run the DAG. Artifact keys name
    the work dir (tasks.artifacts.artifact_scope)."""
    work = Path(p.work_dir).resolve()
    advice = (f"wait for that run to finish (or pass {spell('wait_lock_s')} SECONDS), or use another "
              f"{spell('work_dir')}")
    with WorkDirLock(work, wait_s=p.wait_lock_s, advice=advice), artifact_scope(work):
        atomic_write_text(work / "run_config.json", json.dumps(p.to_dict(), indent=1, sort_keys=True) + "\n")
        dag = DataDag(p, get_run_logger())
        summary = dag.run()
        summary["targets"] = target_folders(p.targets, summary["outputs"])  # each target's folder and eval file
        atomic_write_text(work / "last_run.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


def _data_flow(**params: Any) -> dict[str, Any]:
    flow_start()  # the pools' forkserver dies with this run; bertpipe's errors without Prefect's tracebacks
    return run_data(check_data(params))  # every parameter checked before any task (as `bertpipe run`)


def _signature() -> inspect.Signature:
    """DataParams' fields as keyword parameters (name, annotation, default)."""
    hints = typing.get_type_hints(DataParams)
    out = []
    for f in fields(DataParams):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[f.name]))
    return inspect.Signature(out, return_annotation=dict[str, Any])


def _docstring() -> str:
    args = "\n".join(f"    {f.name}: {f.metadata['help']}" for f in fields(DataParams))
    return ("Run the data DAG; returns a summary: per stage key, dir, calls, cached, files, bytes, seconds.\n\n"
            f"Args:\n{args}\n")


_data_flow.__signature__ = _signature()  # type: ignore[attr-defined]
_data_flow.__doc__ = _docstring()
data_flow = flow(_data_flow, name="bertpipe-data", persist_result=True, result_serializer="json",
                 description="MLPerf BERT data: text -> TFRecords -> HDF5 -> 4 bins, and eval_10k")


def run_sample(work_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """The data DAG on the built-in sample (what `bertpipe demo` runs): returns the flow's summary."""
    return data_flow(work_dir=str(work_dir), source="sample", **overrides)
