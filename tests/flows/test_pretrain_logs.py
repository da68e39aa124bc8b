"""The training launcher's output reaches the pretrain flow run's logs in Prefect (read back from its API).

One real 1-rank DeepSpeed launch of the tiny model (3 steps, no eval) must put its step lines there; a
launch whose ranks fail (a DeepSpeed JSON whose train_batch_size the ranks refuse for their world size) must put
the rank's error line there and into the flow's error message, with the last lines of the output. An unreadable
DeepSpeed JSON is refused before any launch (the recipe line reads it), naming the file.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))


@contextmanager
def info_logs_to_the_api():
    """tests/flows/conftest.py sets Prefect's level to WARNING; the run loggers' INFO lines (the default level
    outside the tests) must be sent here."""
    loggers = [logging.getLogger(n) for n in ("prefect.flow_runs", "prefect.task_runs")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def flow_run_logs(flow_run_id):
    """(level, message) of every log of the flow run and its task runs, and the flow run, from the API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=60)  # what the run's loggers queued is in the API
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])),
                                limit=200)
        flow_run = client.read_flow_run(flow_run_id)
    return [(r.level, r.message) for r in logs], flow_run


def run_pretrain_flow(golden: Path, out: Path, **options):
    from flows.pretrain_flow import pretrain_flow

    with info_logs_to_the_api():
        state = pretrain_flow(train_dir=str(golden / "4bins"), output_dir=str(out), model="tiny", max_steps=3,
                              nproc=1, evaluate=False, return_state=True,
                              options={"device": "cpu", "micro_batch": 4, "learning_rate": 0.05,
                                       "checkpoint_interval": 0, "tensorboard": False, **options})
    return state


def test_step_lines_reach_the_flow_run_logs(prefect_harness, golden: Path, tmp_path: Path) -> None:
    state = run_pretrain_flow(golden, tmp_path / "run")
    assert state.is_completed(), state.message
    logs, _ = flow_run_logs(state.state_details.flow_run_id)
    messages = [m for _, m in logs]
    steps = [m for m in messages if "pretrain.train: step " in m and "/3: loss " in m]
    assert [s.split("pretrain.train: step ")[1].split(":")[0] for s in steps] == ["1/3", "2/3", "3/3"], messages
    assert any("deepspeed" in m and "pretrain/train.py" in m for m in messages)  # the launcher command
    assert any(m.startswith("SUMMARY ") for m in messages)  # rank 0's summary line
    assert all(level < logging.ERROR for level, _ in logs), [m for lv, m in logs if lv >= logging.ERROR]


def test_a_failing_launch_puts_its_error_in_the_logs_and_the_message(prefect_harness, golden: Path,
                                                                      tmp_path: Path) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text('{"train_batch_size": 6}')  # micro-batch 4 x 1 rank: only the ranks check the product
    state = run_pretrain_flow(golden, tmp_path / "run", deepspeed_config=str(bad))
    assert state.is_failed()
    logs, flow_run = flow_run_logs(state.state_details.flow_run_id)
    wanted = "pretrain/train.py [rank 0]: error: global batch 6 is not a multiple of micro-batch 4 x 1 ranks"
    errors = [m for level, m in logs if level >= logging.ERROR]
    assert any(wanted in m for m in errors), errors
    # the flow run's message (the UI's) carries the error line itself, not a pointer to output it never shows
    for message in (state.message, flow_run.state.message):
        assert "pre-training exited with status" in message and wanted in message, message
        assert "last lines of the launcher output" in message and "output above" not in message


def test_an_unreadable_deepspeed_config_is_refused_before_any_launch(prefect_harness, golden: Path,
                                                                      tmp_path: Path) -> None:
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    state = run_pretrain_flow(golden, tmp_path / "run", deepspeed_config=str(bad))
    assert state.is_failed()
    logs, _ = flow_run_logs(state.state_details.flow_run_id)
    wanted = f"cannot read DeepSpeed config {bad}: Expecting property name"
    assert wanted in state.message, state.message
    assert any(wanted in m for level, m in logs if level >= logging.ERROR), logs
    assert not (tmp_path / "run" / "launcher.log").exists()  # nothing was launched
