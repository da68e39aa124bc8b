"""The end-to-end flow: the data DAG, then a pre-training run on its 4 bins and eval_10k.

    bertpipe run e2e --work-dir work --max-steps 20          # built-in sample, tiny model, CPU
    prefect deployment run 'bertpipe-e2e/e2e' --param data='{"work_dir": "work/e2e"}'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from flows.data_flow import run_data
from flows.pretrain_flow import pretrain_flow
from preprocessing.params import DataParams


@flow(name="bertpipe-e2e", description="MLPerf BERT data DAG, then DeepSpeed pre-training on it")
def e2e_flow(data: DataParams | None = None, output_dir: str | None = None, model: str = "tiny",
             max_steps: int = 20, nproc: int = 1, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``data``: the data flow's parameters; training output defaults to <work_dir>/pretrain;
    ``options``: more TrainConfig fields for the training run (e.g. ``{"learning_rate": 0.01}``)."""
    p = data if isinstance(data, DataParams) else DataParams(**(data or {}))
    summary = run_data(p)
    out = summary["outputs"]
    result = pretrain_flow(train_dir=out["train_dir"], eval_file=out["eval_hdf5"],
                           output_dir=output_dir or str(Path(p.work_dir) / "pretrain"), model=model,
                           max_steps=max_steps, nproc=nproc, vocab=out["vocab"], options=options)
    return {"data": summary, "pretrain": result}
