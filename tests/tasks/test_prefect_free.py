"""CLI start-up stays fast: the run/status/verify/vocab commands and the Prefect-free task helpers do not
import Prefect (it is imported inside `bertpipe run` only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["bertpipe.commands.run", "bertpipe.commands.status", "bertpipe.commands.verify", "bertpipe.commands.vocab",
           "tasks.calls", "core.lock", "tasks.workdir", "preprocessing.params", "preprocessing.text.vocab",
           "preprocessing.text.text_import"]


def test_no_prefect_on_import() -> None:
    code = f"import sys\nfor m in {MODULES!r}: __import__(m)\nprint(sorted(k for k in sys.modules if k.split('.')[0] in ('prefect', 'torch', 'tensorflow')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_help_lists_the_flags() -> None:
    r = subprocess.run([str(Path(sys.executable).parent / "bertpipe"), "run", "--help"], cwd=ROOT,
                       capture_output=True, text=True, check=True)
    assert "--only STAGE" in r.stdout and "--dask-address" in r.stdout and "--max-seq-length" in r.stdout
