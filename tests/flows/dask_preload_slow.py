"""A Dask worker preload for tests/flows/test_dask_integrity.py (``dask worker --preload <this file>``): every
manifest commit of a stage output waits ``BERTPIPE_TEST_COMMIT_DELAY`` seconds first, so calls are still running
when the test stops the command, and would commit after it without the run token's gate. (Dask imports a preload
file twice: the original is kept on the class, so the wait is added once.)"""

from __future__ import annotations

import os
import time

from core import manifest

_ORIGINAL = manifest.StageOutput.__dict__.get("_bertpipe_unslowed", manifest.StageOutput._write_manifest)


def _slow_write_manifest(self: manifest.StageOutput) -> None:
    time.sleep(float(os.environ.get("BERTPIPE_TEST_COMMIT_DELAY", "0")))
    _ORIGINAL(self)


manifest.StageOutput._bertpipe_unslowed = _ORIGINAL  # type: ignore[attr-defined]
manifest.StageOutput._write_manifest = _slow_write_manifest  # type: ignore[method-assign]
