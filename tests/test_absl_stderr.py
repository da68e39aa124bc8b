"""The test session's guard against absl (TensorFlow) closing pytest's capture file (tests/conftest.py).

tests/flows/test_demo.py died when run after tests/pretrain ("lost sys.stderr"): TensorFlow, imported inside a
test, imported absl, whose logging handler kept that test's captured stderr and closed it when Prefect's
``logging.config.dictConfig`` shut every handler down in the next flow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HAZARD = """
import io, logging.config, sys
sys.path.insert(0, {root!r})
captured, real = io.StringIO(), sys.stderr
if {guard}:
    from tests.conftest import absl_handler_on_the_real_stderr
    sys.stderr = captured
    absl_handler_on_the_real_stderr()  # (pytest_configure: capture already on)
sys.stderr = captured  # a test's capture while TensorFlow imports absl
import absl.logging
sys.stderr = real
logging.config.dictConfig({{"version": 1}})  # Prefect's logging set-up
print(captured.closed)
"""


@pytest.mark.parametrize(("guard", "closed"), [(False, "True"), (True, "False")])
def test_dictconfig_closes_a_captured_stream_unless_absl_came_in_on_the_real_stderr(guard, closed):
    pytest.importorskip("absl.logging")
    r = subprocess.run([sys.executable, "-c", HAZARD.format(root=str(ROOT), guard=guard)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == closed


def test_this_session_has_absl_on_the_real_stderr():
    absl_logging = pytest.importorskip("absl.logging")
    assert absl_logging.get_absl_handler().python_handler.stream is sys.__stderr__
