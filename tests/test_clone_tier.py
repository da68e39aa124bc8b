"""A clone without ../shared skips at most one test of tests/preprocessing for want of it (docs/development.md).

Collected (not run) as a clone would: BERTPIPE_SHARED at an empty folder. What would add a skip there shows up at
collection: a test that needs what only ../shared holds without the ``needs_shared`` mark (a ``skipif`` of its own, or
the ``mlperf_sample`` fixture, which skips where ../shared/data is absent). The tests that are marked leave the run
behind one item, ``tests/conftest.py::needs_shared``, whose skip names them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = '''
import json, os
import pytest

SEEN = {}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):  # before tests/conftest.py takes the marked tests out
    SEEN["before"] = [{"id": i.nodeid, "fixtures": list(getattr(i, "fixturenames", ())),
                       "needs_shared": [list(m.args) for m in i.iter_markers("needs_shared")],
                       "skipif": [str(m.kwargs.get("reason", "")) for m in i.iter_markers("skipif")]} for i in items]


def pytest_collection_finish(session):
    SEEN["after"] = [i.nodeid for i in session.items]
    SEEN["reasons"] = [i.reason for i in session.items if i.nodeid == "tests/conftest.py::needs_shared"]
    with open(os.environ["CLONE_PROBE_OUT"], "w") as f:
        json.dump(SEEN, f)
'''


def test_a_clone_skips_one_test_of_tests_preprocessing_for_want_of_shared(tmp_path):
    (tmp_path / "clone_probe.py").write_text(PROBE)
    (tmp_path / "shared").mkdir()  # ../shared as a clone has it: nothing there
    env = {k: v for k, v in os.environ.items() if k not in ("BERTPIPE_REQUIRE_SHARED", "BERTPIPE_TEST_ORDER")}
    env.update(BERTPIPE_SHARED=str(tmp_path / "shared"), CLONE_PROBE_OUT=str(tmp_path / "seen.json"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "", "-p", "clone_probe", "-p",
                        "no:cacheprovider", "tests/preprocessing"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)  # (-m "": the slow tests too)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    seen = json.loads((tmp_path / "seen.json").read_text())
    before = {t["id"]: t for t in seen["before"]}
    marked = {i for i, t in before.items() if t["needs_shared"]}
    # the marked tests (the vendors' scripts, lists and the pinned WikiExtractor) are out, behind one item
    assert len(marked) > 20
    assert seen["after"] == [i for i in before if i not in marked] + ["tests/conftest.py::needs_shared"]
    (reason,) = seen["reasons"]
    assert "\n" not in reason and f"{len(marked)} tests that need it not run" in reason
    assert "test_nvidia_scripts.py" in reason and "test_extract_mlperf.py" in reason
    # nothing else would skip for want of ../shared
    unmarked = [t for i, t in before.items() if i not in marked]
    assert not [t["id"] for t in unmarked if "mlperf_sample" in t["fixtures"]]
    assert not [(t["id"], t["skipif"]) for t in unmarked
                if any("shared" in s or "reference" in s for s in t["skipif"])]
