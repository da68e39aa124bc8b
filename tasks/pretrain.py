"""The Prefect task that launches pre-training (``pretrain/launch.py``: the deepspeed launcher, as a process).

Training runs in its own processes (one per rank), never inside the Prefect worker, so a run started
here is the same program a person starts with ``bertpipe train``.
"""

from __future__ import annotations

import json
import re
from collections import deque
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task


class LauncherOutput:
    """Callback for :func:`pretrain.launch.launch`: each line into the run logger (error lines at ERROR),
    keeping the last lines and the error lines for the failure message."""

    ERROR = re.compile(r": error: |Traceback \(most recent call last\)|^(\[rank\d+\]: )?\w*(Error|Exception)\b")

    def __init__(self, logger, keep: int = 15) -> None:
        self.logger, self.last, self.errors = logger, deque(maxlen=keep), deque(maxlen=5)

    def __call__(self, line: str) -> None:
        if not line.strip():
            return
        self.last.append(line)
        if self.ERROR.search(line):
            self.errors.append(line)
            self.logger.error("%s", line)
        else:
            self.logger.info("%s", line)

    def failure(self) -> str:
        """The error lines, then the last lines of the output."""
        head = ("error: " + " | ".join(self.errors) + "; ") if self.errors else ""
        return head + "last lines of the launcher output:\n" + "\n".join(self.last)


@task(name="pretrain", persist_result=True, result_serializer="json", task_run_name="pretrain[{model}]")
def launch_pretraining(train_dir: str, eval_file: str, output_dir: str, *, model: str = "tiny", max_steps: int = 20,
                       nproc: int = 1, vocab_size: int = 0, resume: bool = False,
                       options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Launch ``pretrain/train.py`` through DeepSpeed's launcher; returns its summary.json (if written).

    The launcher's output (its ranks' too) goes line by line into this run's logs; a failed launch raises
    with its error lines and last lines in the message.
    """
    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig

    logger = get_run_logger()
    # options (more TrainConfig fields) may set vocab_size; the named parameters are the flow's (checked there)
    cfg = TrainConfig(**{"vocab_size": vocab_size, **(options or {}), "train_dir": train_dir, "eval_file": eval_file,
                         "output_dir": output_dir, "model": model, "max_steps": max_steps, "resume": resume})
    output = LauncherOutput(logger)
    rc = launch(cfg, nproc=nproc, on_output=output)
    if rc != 0:
        raise RuntimeError(f"pre-training exited with status {rc} (output in {output_dir}); {output.failure()}")
    summary_file = Path(output_dir) / "summary.json"
    summary = json.loads(summary_file.read_text(encoding="utf-8")) if summary_file.is_file() else {}
    logger.info("pre-training done: %s", summary or output_dir)
    return {"output_dir": output_dir, "summary": summary}
