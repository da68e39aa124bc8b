"""The Prefect task that launches pre-training (``pretrain/launch.py``: the deepspeed launcher, as a process).

Training runs in its own processes (one per rank), never inside the Prefect worker, so a run started
here is the same program a person starts with ``bertpipe train``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task


@task(name="pretrain", persist_result=True, result_serializer="json", task_run_name="pretrain[{model}]")
def launch_pretraining(train_dir: str, eval_file: str, output_dir: str, *, model: str = "tiny", max_steps: int = 20,
                       nproc: int = 1, vocab_size: int = 0, resume: bool = False,
                       options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Launch ``pretrain/train.py`` through DeepSpeed's launcher; returns its summary.json (if written)."""
    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig

    logger = get_run_logger()
    cfg = TrainConfig(train_dir=train_dir, eval_file=eval_file, output_dir=output_dir, model=model,
                      max_steps=max_steps, vocab_size=vocab_size, resume=resume, **(options or {}))
    rc = launch(cfg, nproc=nproc)
    if rc != 0:
        raise RuntimeError(f"pre-training exited with status {rc}; see {output_dir} and the launcher output above")
    summary_file = Path(output_dir) / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else {}
    logger.info("pre-training done: %s", summary or output_dir)
    return {"output_dir": output_dir, "summary": summary}
