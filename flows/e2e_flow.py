"""The end-to-end flow: the data DAG, then a pre-training run on its 4 bins and eval_10k.

    bertpipe run e2e --work-dir work --max-steps 20          # built-in sample, tiny model, CPU
    prefect deployment run 'bertpipe-e2e/e2e' --param data='{"work_dir": "work/e2e"}'

Both halves' parameters are checked before any task (``data.<name>``, ``options.<name>``, flows/guard.py); the
training runs in this flow run (its logs are this run's), with the output dir locked as the training flow
locks it; a retry of a crashed run finds the data stages done and continues the training from its checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow

from core.paths import PathCheck
from flows.data_flow import run_data
from flows.guard import DataParameters, check_data, check_training, flow_start
from flows.pretrain_flow import run_training
from preprocessing.params import DataParams


@flow(name="bertpipe-e2e", description="MLPerf BERT data DAG, then DeepSpeed pre-training on it",
      persist_result=True, result_serializer="json")
def e2e_flow(data: DataParameters | None = None, output_dir: str | None = None,  # type: ignore[valid-type]
             model: str = "tiny", max_steps: int = 20, nproc: int = 1, options: dict[str, Any] | None = None,
             wait_lock_s: float = 0.0) -> dict[str, Any]:
    """``data``: the data flow's parameters (``{"work_dir": "work/e2e", "n_output_shards": 4}``); training output
    defaults to <work_dir>/pretrain; ``options``: more TrainConfig fields for the training run (e.g.
    ``{"learning_rate": 0.01}``, ``{"overwrite": true}`` to train again over an earlier run's checkpoints);
    ``wait_lock_s``: wait this long for an output dir another training holds. Returns ``{"dataset": the data
    run's summary, "pretrain": the training's}``."""
    flow_start()
    p = check_data(data.to_dict() if isinstance(data, DataParams) else data, "data.")
    if "samsung-4bins" not in p.targets:  # bertpipe's trainer reads the 4-bin set: refused before any task
        from core.errors import InputError
        from preprocessing.params import current_surface

        flag = "--target" if current_surface() == "cli" else "data.targets"
        raise InputError(f"{flag} {', '.join(p.targets)}: e2e trains bertpipe on the 4-bin set; add {flag} "
                         "samsung-4bins (or build the other targets with the data flow alone)")
    opts = check_training(model=model, max_steps=max_steps, nproc=nproc, options=options)  # before any task
    out_dir = output_dir or str(Path(p.work_dir) / "pretrain")
    PathCheck().output_dir("output_dir" if output_dir else "data.work_dir", out_dir)
    summary = run_data(p)
    out = summary["outputs"]
    result = run_training(train_dir=out["train_dir"], eval_file=out["eval_hdf5"], output_dir=out_dir, model=model,
                          max_steps=max_steps, nproc=nproc, vocab=out["vocab"], options=opts,
                          wait_lock_s=wait_lock_s)
    # ("dataset", not "data": Prefect 3.8 reads a persisted result whose top level has a "data" key as its own
    # old record format, and run_deployment(...).state.result() would return that value alone)
    return {"dataset": summary, "pretrain": result}
