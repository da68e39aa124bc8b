"""The data flow: dump or MLPerf text -> parts -> (vocab) -> TFRecords -> HDF5 -> 4 bins, and
eval.txt -> TFRecord -> eval_10k -> HDF5.

    bertpipe run --work-dir work                                   # the built-in sample
    bertpipe run --text-dir results --vocab vocab.txt --work-dir work --n-output-shards 2048
    bertpipe run ... --only hdf5          # one stage (its inputs must be done)
    bertpipe run ... --force tfrecord     # redo one stage
    python -c "from flows.data_flow import run_sample; print(run_sample('work/demo'))"

Stages run in waves (tfrecord shards + eval_tfrecord, then hdf5 shards + eval_10k, then bins +
eval_hdf5); the shards of a wave run in parallel. Each stage's key is computed from its upstream
manifests, so a stage is found again (cached) exactly when its inputs and parameters are unchanged.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows.dag import DataDag
from flows.params import DataParams
from preprocessing.manifest import atomic_write_text
from tasks.lock import WorkDirLock

_D = DataParams()


def run_data(p: DataParams) -> dict[str, Any]:
    """The body of the data flow (call it inside a flow run): lock the work dir, run the DAG."""
    work = Path(p.work_dir).resolve()
    with WorkDirLock(work, wait_s=p.wait_lock_s):
        atomic_write_text(work / "run_config.json", json.dumps(p.model_dump(), indent=1, sort_keys=True) + "\n")
        dag = DataDag(p, get_run_logger())
        summary = dag.run()
        atomic_write_text(work / "last_run.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


@flow(name="bertpipe-data", description="MLPerf BERT data: text -> TFRecords -> HDF5 -> 4 bins, and eval_10k")
def data_flow(work_dir: str = _D.work_dir, source: str = _D.source, source_md5: str | None = None,
              text_dir: str | None = None, link_text: bool = False, vocab: str | None = None,
              vocab_size: int | None = None,
              num_test_articles: int | None = None, current_time: str | None = None,
              max_seq_length: int = _D.max_seq_length, max_predictions_per_seq: int = _D.max_predictions_per_seq,
              dupe_factor: int = _D.dupe_factor, masked_lm_prob: float = _D.masked_lm_prob,
              random_seed: int = _D.random_seed, short_seq_prob: float = _D.short_seq_prob,
              do_lower_case: bool = _D.do_lower_case, num_eval_examples: int = _D.num_eval_examples,
              n_output_shards: int | None = None, workers: int = _D.workers, runner: str = _D.runner,
              dask_address: str | None = None, stages: list[str] | None = None, force: list[str] | None = None,
              verify_md5: bool = True, wait_lock_s: float = 0.0) -> dict[str, Any]:
    """Run the data DAG; returns a summary: per stage key, dir, calls, cached, files, bytes, seconds."""
    params = {k: v for k, v in locals().items() if v is not None or k in ("stages",)}
    params["force"] = force or []
    return run_data(DataParams(**params))


def run_sample(work_dir: str | os.PathLike, **overrides: Any) -> dict[str, Any]:
    """The data DAG on the built-in sample (what `bertpipe demo` runs): returns the flow's summary."""
    return data_flow(work_dir=str(work_dir), source="sample", **overrides)
