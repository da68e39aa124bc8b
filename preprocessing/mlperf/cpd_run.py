"""Running create_pretraining_data on real paths: atomic outputs, many part files in parallel.

* :func:`write_pretraining_data` — one reference invocation (every input, one RNG, records
  round-robin over the outputs) written to temporary names and renamed into place on success;
* :func:`run_jobs` — many invocations (one per part file, as MLPerf runs them) on a process pool.
  Each job creates its own ``random.Random(seed)``, so the bytes never depend on the number of
  workers; the pool maps whole jobs, never CPU-sized groups.
* :func:`expand_inputs` — the reference's comma-separated globs, in order.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError
from core.manifest import raise_if_disk_full
from preprocessing.mlperf.create_pretraining_data import (
    LOG_EXAMPLES,
    CreatePretrainingDataConfig,
    Stats,
    create_pretraining_data,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One reference invocation: its inputs (read in order, one RNG) and its outputs (round-robin)."""

    inputs: tuple[Path, ...]
    outputs: tuple[Path, ...]


def expand_inputs(spec: str) -> list[Path]:
    """``a.txt,dir/part-*``: each comma-separated pattern expanded (sorted) in the given order."""
    files: list[Path] = []
    for pattern in (p.strip() for p in spec.split(",")):
        if not pattern:
            continue
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern] * os.path.exists(pattern)
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise InputError(f"input pattern {pattern!r} matches no file; check the path (globs like part-* are "
                             "expanded by bertpipe, comma-separated patterns are read in order)")
        files.extend(Path(m) for m in matches)
    if not files:
        raise InputError("no input files given (--input_file)")
    return files


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_pretraining_data(inputs: Sequence[Path], outputs: Sequence[Path], cfg: CreatePretrainingDataConfig,
                           log_examples: int = LOG_EXAMPLES) -> Stats:
    """One invocation to arbitrary paths; each output appears only complete (temp name + rename).

    Like the reference, no fsync: a killed run leaves no partial output under a final name, but
    durability across a power cut is the DAG's job (StageOutput fsyncs).
    """
    outputs = [Path(o) for o in outputs]
    if not outputs:
        raise InputError("no output file given (--output_file)")
    if len(set(outputs)) != len(outputs):
        raise InputError(f"the same output file is listed twice in {', '.join(map(str, outputs))}")
    for o in outputs:
        o.parent.mkdir(parents=True, exist_ok=True)
    tmps = [_tmp(o) for o in outputs]
    files = []
    try:
        files = [open(t, "wb", buffering=1 << 20) for t in tmps]  # noqa: SIM115 - closed below
        stats = create_pretraining_data(list(inputs), files, cfg, log_examples)
        for f in files:
            f.close()
        for t, o in zip(tmps, outputs, strict=True):
            os.replace(t, o)
        return stats
    except OSError as exc:  # a full disk (or ulimit -f) -> one clear error naming the output(s)
        raise_if_disk_full(exc, ", ".join(map(str, outputs)))
        raise
    finally:
        for f in files:
            try:
                f.close()
            except OSError:
                pass  # its buffer cannot be flushed (disk full): the temporary file is removed anyway
        for t in tmps:
            t.unlink(missing_ok=True)


def _run_job(job: Job, cfg: CreatePretrainingDataConfig, log_examples: int) -> Stats:
    return write_pretraining_data(job.inputs, job.outputs, cfg, log_examples)


def run_jobs(jobs: Sequence[Job], cfg: CreatePretrainingDataConfig, workers: int = 1,
             log_examples: int = LOG_EXAMPLES) -> list[Stats]:
    """Run independent invocations, ``workers`` at a time; results in job order.

    Only the first job logs its first examples (the others would interleave on a pool).
    """
    cfg.validate()
    if workers <= 0:
        workers = os.cpu_count() or 1
    workers = min(workers, len(jobs))
    examples = [log_examples if i == 0 else 0 for i in range(len(jobs))]
    if workers <= 1:
        return [_run_job(job, cfg, n) for job, n in zip(jobs, examples, strict=True)]
    if cfg.impl != "plain":
        from preprocessing.mlperf import cpd_fast

        cpd_fast.load()  # build/load the extension once, before the workers fork
    from core.pools import run_all

    try:
        return run_all(_run_job, [(job, cfg, n) for job, n in zip(jobs, examples, strict=True)], workers)
    except BaseException:  # Ctrl-C, SIGTERM, an error: the terminated workers could not remove their temp files
        for job in jobs:
            for o in job.outputs:
                for t in Path(o).parent.glob(f".{Path(o).name}.tmp-*"):
                    t.unlink(missing_ok=True)
        raise


def summary(stats: Sequence[Stats], seconds: float) -> str:
    """The one-line summary: documents, instances, seconds, MB/s and instances/s."""
    docs = sum(s.documents for s in stats)
    inst = sum(s.instances for s in stats)
    mb = sum(s.input_bytes for s in stats) / 1e6
    skipped = sum(s.skipped_lines for s in stats)
    impls = "+".join(sorted({s.impl for s in stats}))
    secs = max(seconds, 1e-9)
    text = (f"{len(stats)} invocation(s), {docs} documents, {inst} instances in {seconds:.2f} s: "
            f"{mb / secs:.2f} MB/s of text, {inst / secs:.0f} instances/s ({impls})")
    if skipped:
        text += f"; {skipped} lines skipped as invalid UTF-8"
    return text


def timed_jobs(jobs: Sequence[Job], cfg: CreatePretrainingDataConfig, workers: int = 1,
               log_examples: int = LOG_EXAMPLES) -> tuple[list[Stats], float]:
    """run_jobs plus its wall time."""
    t0 = time.perf_counter()
    stats = run_jobs(jobs, cfg, workers, log_examples)
    return stats, time.perf_counter() - t0
