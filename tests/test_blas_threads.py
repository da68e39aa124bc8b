"""bertpipe's processes keep OpenBLAS to one thread (core/__init__.py): numpy's import otherwise starts a thread per
core that spins ~0.1 CPU-s, in every worker process."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import os
import core  # what every bertpipe process imports first (bertpipe -> core)
import numpy
print(os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task")))
"""


def _probe(env_extra: dict[str, str], probe: str = PROBE) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env_extra
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0], int(out[1])


def test_numpy_after_core_runs_without_blas_threads():
    value, threads = _probe({})
    assert value == "1"
    assert threads == 1  # no OpenBLAS worker thread beside the main one


def test_a_users_setting_is_kept():
    value, threads = _probe({"OPENBLAS_NUM_THREADS": "2"})
    assert value == "2"
    assert threads == 2  # OpenBLAS's own second thread: the probe sees threads (so the test above can fail)


def test_a_stage_module_imported_first_keeps_one_thread():
    """A library user who imports a stage module first (its own ``import numpy`` comes before its core imports):
    preprocessing's package imports core before any of its modules."""
    value, threads = _probe({}, PROBE.replace("import core  # what every bertpipe process imports first "
                                              "(bertpipe -> core)", "import preprocessing.nvidia.chop"))
    assert value == "1"
    assert threads == 1
