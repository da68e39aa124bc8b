"""Progress bars for long work (tqdm on stderr).

Disabled when stderr is not a terminal or BERTPIPE_PROGRESS=0, forced with BERTPIPE_PROGRESS=1.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def progress_enabled() -> bool:
    flag = os.environ.get("BERTPIPE_PROGRESS")
    if flag is not None:
        return flag not in ("0", "false", "no", "")
    return sys.stderr.isatty()


def progress(iterable: Any = None, *, total: float | None = None, desc: str = "", unit: str = "it", **kw: Any):
    """A tqdm bar (or a no-op wrapper with the same API when progress is off)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not progress_enabled(),
                dynamic_ncols=True, leave=False, **kw)
