"""The end-to-end flow on the built-in sample: data DAG, then a short tiny-model CPU training run (slow:
DeepSpeed's launcher start-up)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flowhelpers import run_cli


@pytest.mark.slow
def test_e2e_on_the_sample(prefect_harness, tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    w = tmp_path / "w"
    assert run_cli("e2e", "--work-dir", w, "--max-steps", "3", "--workers", "1", "--dupe-factor", "1") == 0
    summary = json.loads((w / "pretrain" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["model"] == "tiny"
    assert (w / "pretrain" / "metrics.jsonl").is_file()
