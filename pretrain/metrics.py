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


def _kind(record: dict[str, Any]) -> str:
    return "eval" if "eval_mlm_accuracy" in record else "train"


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Make ``metrics.jsonl`` the history of a run that (re)starts after step ``last_step``: drop the records
    past it (a resumed run writes them again), lines cut off by a kill, and all but the last record of a
    step and kind (train or eval), in step order. Rewritten atomically (temp name + rename), only when
    something changes; returns how many lines went."""
    from core.manifest import atomic_write_text

    path = Path(path)
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    last: dict[tuple[int, str], int] = {}
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= last_step:
            last[(record["step"], _kind(record))] = i
    keep = [i for (_, i) in sorted((step, i) for (step, _), i in last.items())]  # by step, then as written
    if keep != list(range(len(lines))):
        atomic_write_text(path, "".join(lines[i] + "\n" for i in keep))
    return len(lines) - len(keep)


def has_eval_record(path: str | Path, step: int) -> bool:
    """Whether ``metrics.jsonl`` holds the eval record of ``step``."""
    path = Path(path)
    if not path.is_file():
        return False
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("step") == step and _kind(record) == "eval":
            return True
    return False


class MetricsWriter:
    """Appends one JSON object per record to ``OUTPUT_DIR/metrics.jsonl``.

    ``start_step``: the step the run starts from (0, or the resumed checkpoint's): records past it are
    removed first (:func:`truncate_metrics`), so after any number of resumes each step is listed once; the
    TensorBoard writer purges its events past it too. Only rank 0 writes; other ranks get a writer whose
    methods do nothing.
    """

    def __init__(self, output_dir: str | Path, enabled: bool = True, tensorboard: bool = True,
                 start_step: int = 0) -> None:
        self.enabled = enabled
        self.path = Path(output_dir) / "metrics.jsonl"
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dropped = truncate_metrics(self.path, start_step)
        if dropped:
            log.info("metrics.jsonl: %d records past step %d removed (this run writes them again)", dropped,
                     start_step)
        self._f = self.path.open("a", encoding="utf-8")
        if tensorboard:
            try:
                _without_tensorflow()
                from torch.utils.tensorboard import SummaryWriter

                tb_dir = Path(output_dir) / "tensorboard"
                earlier = tb_dir.is_dir() and any(tb_dir.glob("events.out.tfevents.*"))
                self._tb = SummaryWriter(str(tb_dir), purge_step=start_step + 1 if earlier else None)
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
