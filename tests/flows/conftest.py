"""Prefect for flow tests: one temporary server for the session, PREFECT_HOME in a temp dir, no analytics."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from flowhelpers import split_docs

# Before anything imports prefect: its home (database, result records) goes to a temp dir.
_HOME = tempfile.mkdtemp(prefix="bertpipe-prefect-home-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)  # the session's database and results: not left in /tmp
os.environ["PREFECT_HOME"] = _HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "preprocessing,pretrain,tasks,flows")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# Temporary servers of the subprocesses the tests start (bertpipe sets 120 s itself; a bare Prefect flow, 20 s):
# on a busy 2-core machine their start-up (database migrations) took 42-46 s and failed the tests
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# The session's one test server (SQLite) serves every flow test: on a loaded 2-core CI machine it went silent for
# 20-30 s (its database locked past the 30 s busy timeout) and a run was stopped as if the server were gone. The
# tests of a server that is really gone (test_prefect_server_lost.py) set their own environment: the default there.
os.environ.setdefault("BERTPIPE_PREFECT_PATIENCE_S", "180")


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[Path]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield Path(_HOME)


@pytest.fixture(scope="session")
def three_part_text(golden: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLPerf-style text dir with 3 part files (golden part-00000 cut at documents) and a short eval.txt."""
    d = tmp_path_factory.mktemp("text3")
    src = (golden / "text_chain" / "part-00000-of-00500").read_text(encoding="utf-8")
    for i, part in enumerate(split_docs(src, 3)):
        (d / f"part-{i:05d}-of-00500").write_text(part, encoding="utf-8")
    ev = split_docs((golden / "text_chain" / "eval.txt").read_text(encoding="utf-8"), 4)[0]
    (d / "eval.txt").write_text(ev, encoding="utf-8")
    return d


@pytest.fixture(scope="session")
def serial_run(prefect_harness, three_part_text: Path, shared_data: Path, tmp_path_factory) -> tuple[Path, dict]:
    """The three-part text through the whole data DAG, serially: (work dir, md5 of every output)."""
    from flowhelpers import FAST, output_md5s, run_cli

    w = tmp_path_factory.mktemp("serial") / "w"
    assert run_cli("--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", "--work-dir", w, *FAST) == 0
    return w, output_md5s(w)
