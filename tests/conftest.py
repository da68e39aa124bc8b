"""Shared fixtures. Tests that read ../shared/data skip cleanly when it is absent (a user's clone)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("BERTPIPE_SHARED", ROOT.parent / "shared")).resolve()
SHARED_DATA = SHARED / "data"
GOLDEN = SHARED_DATA / "golden"

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("BERTPIPE_PROGRESS", "0")
# library loggers called in-process after another test loaded Prefect: not a flow, nothing to send
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip the test when it is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (golden/real data only exists beside the project checkout)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def golden(shared_data: Path) -> Path:
    return shared_data / "golden"
