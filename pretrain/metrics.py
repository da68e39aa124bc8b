"""Rank-0 metrics: JSON lines, TensorBoard scalars (lazy import), and the run summary."""

from __future__ import annotations

import json
import logging
import math
import sys
import types
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _without_tensorflow() -> None:
    """Make TensorBoard's writer use its TF-free stub (tensorboard checks for ``tensorboard.compat.notf``).

    Otherwise writing events imports all of TensorFlow when it is installed: ~4 s and ~0.5 GB on rank 0.
    """
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


class MetricsWriter:
    """Appends one JSON object per record to ``OUTPUT_DIR/metrics.jsonl`` (a resumed run appends).

    Only rank 0 writes; other ranks get a writer whose methods do nothing.
    """

    def __init__(self, output_dir: str | Path, enabled: bool = True, tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a", encoding="utf-8")
        if tensorboard:
            try:
                _without_tensorflow()
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(Path(output_dir) / "tensorboard"))
            except ImportError as exc:  # tensorboard is in the [train] extra
                log.warning("TensorBoard disabled (%s); pip install .[train]", exc)

    def write(self, record: dict[str, Any]) -> None:
        """One record; floats that are not finite are written as strings (JSON has no NaN)."""
        if not self.enabled:
            return
        clean = {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in record.items()}
        self._f.write(json.dumps(clean) + "\n")
        self._f.flush()
        if self._tb is not None and "step" in record:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        if not self.enabled:
            return
        self._f.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_summary(output_dir: str | Path, summary: dict[str, Any]) -> Path:
    """``OUTPUT_DIR/summary.json`` (written atomically) and one line on stdout."""
    path = Path(output_dir) / "summary.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    print("SUMMARY " + json.dumps(summary, sort_keys=True), flush=True)
    return path
