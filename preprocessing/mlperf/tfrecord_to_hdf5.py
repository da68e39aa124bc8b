"""Stage 9: TFRecord -> padded HDF5 in the Samsung MLPerf layout (spec §10).

Reference: Samsung MLPerf v1.1 ``trans_tfrecord_to_hdf5.py``: count the records, create the six
datasets (:data:`preprocessing.hdf5_io.HDF5_DATASETS`) empty and in order, then fill them row by
row (~630 records/s). Here records are CRC-checked, validated and decoded in batches with NumPy
(:mod:`preprocessing.mlperf.records`) and written in chunks of rows, so memory stays bounded by
``cfg.batch_size`` whatever the file size (12,606 records of golden/sample.tfrecord -> 46 MB).

Creating the datasets empty first and writing afterwards is what makes the bytes identical to the
reference's (h5py 3.14 / HDF5 1.14.6): the raw data of each dataset is then allocated at its first
write, in dataset order, after all the object headers.

    bertpipe tfrecord-to-hdf5 --input eval_10k.tfrecord --output eval_10k.hdf5
    bertpipe tfrecord-to-hdf5 --input 'tfrecords/part-*' --output hdf5/   # one <name>.hdf5 each

In the data DAG, when part i's TFRecord and its HDF5 are both due, :func:`run_fused` makes both in one
call: create_pretraining_data's C engine writes the TFRecord, then fills the padded rows of the HDF5
from the same instances (``Engine.fill_padded``), so the 500 MB TFRecord is not parsed again. Same
files, bytes, md5s and manifests as the two stages run one after the other.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ManifestError, RecordError
from core.manifest import Manifest, StageOutput
from core.progress import progress
from core.schema import HDF5_DATASETS, row_shape
from core.stage import Stage, Unit
from preprocessing.hdf5_io import (
    atomic_path,
    chunks,
    h5_create,
    stage_file,
    stage_params,
    verify_inputs,
)
from preprocessing.mlperf.records import RecordShape, count_records_fast, iter_batches

log = logging.getLogger(__name__)

STAGE_VERSION = "1"


@dataclass(frozen=True, kw_only=True)
class HDF5Config:
    """Parameters of the TFRecord -> HDF5 conversion."""

    max_seq_length: int = 512  # width of input_ids / input_mask / segment_ids (Samsung: hard-coded 512)
    max_predictions_per_seq: int = 76  # width of masked_lm_positions / masked_lm_ids (Samsung: 76)
    batch_size: int = 1024  # records decoded and written at once (~60 MB of transient arrays)


def _checked(values: np.ndarray, dtype: str, name: str, path: Path, first: int) -> np.ndarray:
    """Cast decoded values to the dataset dtype, refusing values that do not fit (HDF5 would clip them)."""
    target = np.dtype(dtype)
    if values.dtype == target or not values.size:
        return values.astype(target, copy=False)
    info = np.iinfo(target)
    if values.min() >= info.min and values.max() <= info.max:
        return values.view(target) if values.dtype.itemsize == target.itemsize else values.astype(target)
    bad = int(np.flatnonzero(((values < info.min) | (values > info.max)).reshape(len(values), -1).any(axis=1))[0])
    row = values[bad].ravel()
    v = row[(row < info.min) | (row > info.max)][0]
    raise RecordError(f"{path}: record {first + bad}: feature {name!r} value {v} does not fit "
                      f"the HDF5 dtype {target}; the record is not an MLPerf pre-training example")


def convert_tfrecord_to_hdf5(input_tfrecord: Path, output_hdf5: Path, cfg: HDF5Config = HDF5Config()) -> int:
    """Write ``output_hdf5`` (the path is written as is; see :func:`atomic_path`). Returns the record count.

    Raises:
        RecordError: a record is corrupt (CRC), truncated, misses a feature or has a wrong length;
            the message names the file and the record index.
    """
    input_tfrecord = Path(input_tfrecord)
    n = count_records_fast(input_tfrecord)  # pass 1, as the reference: the datasets get their final shape
    shape = RecordShape(max_seq_length=cfg.max_seq_length, max_predictions_per_seq=cfg.max_predictions_per_seq)
    done = 0
    with h5_create(output_hdf5) as f, progress(total=n, desc=input_tfrecord.name, unit="rec") as bar:
        datasets = [f.create_dataset(name, (n, *row_shape(kind, cfg.max_seq_length, cfg.max_predictions_per_seq)),
                                     dtype=dtype) for name, dtype, kind in HDF5_DATASETS]
        for first, arrays in iter_batches(input_tfrecord, shape, cfg.batch_size):
            stop = first + len(arrays["input_ids"])
            if stop > n:  # pragma: no cover - count_records and iter_records read the same framing
                raise RecordError(f"{input_tfrecord}: more records than counted; was the file modified meanwhile?")
            for ds, (name, dtype, kind) in zip(datasets, HDF5_DATASETS, strict=True):
                values = arrays[name][:, 0] if not kind else arrays[name]
                ds[first:stop] = _checked(values, dtype, name, input_tfrecord, first)
            done = stop
            bar.update(stop - first)
    if done != n:  # pragma: no cover - see above
        raise RecordError(f"{input_tfrecord}: read {done} records, counted {n}")
    return n


def _convert_into(out: StageOutput, pairs: Sequence[tuple[Path, str]], cfg: HDF5Config) -> None:
    for src, name in pairs:
        t0 = time.perf_counter()
        with stage_file(out, name) as tmp:
            n = convert_tfrecord_to_hdf5(src, tmp, cfg)
        dt = time.perf_counter() - t0
        out.count("records", n)
        out.count("files", 1)
        log.info("%s -> %s: %d records in %.2f s (%.0f records/s)", src, out.path(name), n, dt, n / max(dt, 1e-9))


def run_tfrecord_to_hdf5(input_tfrecord: Path, out_dir: Path, cfg: HDF5Config = HDF5Config(), *,
                         output_name: str, upstream: Sequence[Manifest] = ()) -> Manifest:
    """Stage function: one padded HDF5 ``out_dir/output_name`` from one TFRecord (counter ``records``)."""
    input_tfrecord = Path(input_tfrecord)
    verify_inputs([input_tfrecord], upstream)
    with StageOutput(out_dir, "tfrecord_to_hdf5", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION) as out:
        _convert_into(out, [(input_tfrecord, output_name)], cfg)
    return out.manifest


def run_tfrecord_to_hdf5_many(inputs: Sequence[Path], out_dir: Path, cfg: HDF5Config = HDF5Config(), *,
                              upstream: Sequence[Manifest] = ()) -> Manifest:
    """One ``<input name>.hdf5`` per TFRecord in ``out_dir`` (the Samsung wrapper's naming), one manifest."""
    inputs = [Path(p) for p in inputs]
    verify_inputs(inputs, upstream)
    with StageOutput(out_dir, "tfrecord_to_hdf5", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION) as out:
        _convert_into(out, [(p, p.name + ".hdf5") for p in inputs], cfg)
    return out.manifest


def tfrecord_to_hdf5_file(input_tfrecord: Path, output_hdf5: Path, cfg: HDF5Config = HDF5Config()) -> int:
    """Convert to an explicit output path, atomically, without a manifest (the CLI's file form)."""
    with atomic_path(Path(output_hdf5)) as tmp:
        return convert_tfrecord_to_hdf5(Path(input_tfrecord), tmp, cfg)


# -- tfrecord + hdf5 of one part in one pass (Stage.fused) ---------------------------------------------
#: The datasets in the order of Engine.fill_padded's buffers, with the dtypes it fills.
_ENGINE_ROWS = (("input_ids", "i4"), ("input_mask", "i1"), ("segment_ids", "i1"), ("masked_lm_positions", "i4"),
                ("masked_lm_ids", "i4"), ("next_sentence_labels", "i1"))


def write_padded_from_engine(engine: Any, n: int, output_hdf5: Path, cfg: HDF5Config, desc: str = "") -> int:
    """The padded HDF5 of the ``n`` instances the engine wrote, in the order written: the bytes
    :func:`convert_tfrecord_to_hdf5` makes from that TFRecord (same datasets, created the same way, filled
    in the same row chunks). Returns ``n``."""
    dtypes = dict(_ENGINE_ROWS)
    with h5_create(output_hdf5) as f, progress(total=n, desc=desc, unit="rec") as bar:
        datasets = {name: f.create_dataset(name, (n, *row_shape(kind, cfg.max_seq_length,
                                                                  cfg.max_predictions_per_seq)), dtype=dtype)
                    for name, dtype, kind in HDF5_DATASETS}
        rows = min(cfg.batch_size, max(n, 1))
        bufs = [np.empty((rows, *datasets[name].shape[1:]), dtype=dtypes[name]) for name, _ in _ENGINE_ROWS]
        for first, stop in chunks(n, cfg.batch_size):
            views = [b[:stop - first] for b in bufs]
            engine.fill_padded(first, stop, *views)
            for (name, _), v in zip(_ENGINE_ROWS, views, strict=True):
                datasets[name][first:stop] = v
            bar.update(stop - first)
    return n


def _engine_fits(engines: list[Any], tf_cfg: Any, h5_cfg: HDF5Config, n: int) -> bool:
    """Whether the one engine of the TFRecord just written can give this HDF5's rows directly."""
    return (len(engines) == 1 and hasattr(engines[0], "fill_padded") and n > 0
            and (tf_cfg.max_seq_length, tf_cfg.max_predictions_per_seq)
            == (h5_cfg.max_seq_length, h5_cfg.max_predictions_per_seq)
            and {name: dtype for name, dtype, _ in HDF5_DATASETS} == dict(_ENGINE_ROWS))


def run_fused(tf_unit: Unit, h5_unit: Unit) -> list[Manifest]:
    """Part i's TFRecord and its padded HDF5 in one pass (the hdf5 stage's ``fused``; the DAG calls it when
    both are due). The TFRecord stage runs as always; its C engine is kept, and the HDF5 is filled from the
    instances it holds rather than from the 500 MB it wrote. The two files' md5s are then taken side by side
    (core.manifest.deferred_md5; in tasks.calls.execute_group, with the other parts' of the group) and the two
    manifests written, TFRecord's first: both are what the two stages
    write one after the other (same files, md5s, keys, counters). Without the C engine (``BERTPIPE_NATIVE=0``),
    or for any other pair of units, the HDF5 stage runs as usual on the TFRecord just written."""
    from core.manifest import deferred_md5, flush_deferred
    from preprocessing.mlperf import cpd_fast

    with cpd_fast.keeping_engine() as engines:
        try:
            with deferred_md5():
                tf_manifest = tf_unit.call()
                cfg = h5_unit.kwargs.get("cfg")
                n = int(tf_manifest.counters.get("instances", -1))
                src = Path(h5_unit.args[0]) if h5_unit.args else None
                fused = (h5_unit.run is run_tfrecord_to_hdf5 and isinstance(cfg, HDF5Config)
                         and len(h5_unit.args) == 1 and src is not None and src.parent == Path(tf_unit.out_dir)
                         and [Path(d) for d in h5_unit.upstream_dirs] == [Path(tf_unit.out_dir)]
                         and "output_name" in h5_unit.kwargs and src.name == tf_unit.kwargs.get("output_name")
                         and _engine_fits(engines, tf_unit.kwargs.get("cfg"), cfg, n))
                if fused:
                    h5_manifest = _fused_hdf5(engines.pop(), n, src, Path(h5_unit.out_dir), cfg,
                                              h5_unit.kwargs["output_name"], [tf_manifest])
        finally:
            engines.clear()  # free the instances (before the separate path reads the TFRecord)
    if not fused:
        flush_deferred()  # inside an outer block (tasks.calls.execute_group): the TFRecord's manifest, now
        return [tf_manifest, h5_unit.call()]
    return [tf_manifest, h5_manifest]


def _fused_hdf5(engine: Any, n: int, src: Path, out_dir: Path, cfg: HDF5Config, output_name: str,
                upstream: list[Manifest]) -> Manifest:
    """run_tfrecord_to_hdf5's manifest and file, the rows taken from ``engine`` (which wrote ``src``). The
    input is checked as listed upstream with its size; its md5 is taken with the HDF5's (deferred_md5)."""
    from core.manifest import verify_file

    entry = next((f for m in upstream for f in m.files if f.name == src.name), None)
    if entry is None:
        stages = ", ".join(sorted({m.stage for m in upstream}))
        raise ManifestError(f"{src} is not listed in the upstream manifest(s) of {stages}; "
                            "pass the files that stage produced")
    verify_file(src, entry.md5, entry.bytes, check_md5=False, what="per the upstream manifest")
    with StageOutput(out_dir, "tfrecord_to_hdf5", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION) as out:
        t0 = time.perf_counter()
        with stage_file(out, output_name) as tmp:
            write_padded_from_engine(engine, n, tmp, cfg, desc=src.name)
        dt = time.perf_counter() - t0
        out.count("records", n)
        out.count("files", 1)
        log.info("%s -> %s: %d records in %.2f s (%.0f records/s, from the instances that wrote it)", src,
                 out.path(output_name), n, dt, n / max(dt, 1e-9))
    return out.manifest


# -- the DAG's declarations of this stage (core/stage.py) ----------------------------------------------
def _hdf5_config(p: Any) -> HDF5Config:
    return HDF5Config(max_seq_length=p.max_seq_length, max_predictions_per_seq=p.max_predictions_per_seq)


def _plan_shards(plan: Any) -> list[Any]:
    """Part i's HDF5 from part i's TFRecord, in the same call (the TFRecord stage's units)."""
    return [plan.unit(str(Path(u.out_dir) / u.shard), cfg=plan.cfg, output_name=u.shard + ".hdf5", shard=u.shard,
                      upstream=[u.out_dir]) for u in plan.units_of("tfrecord")]


def _plan_eval(plan: Any) -> list[Any]:
    return [plan.unit(str(plan.result("eval_10k").path("eval_10k")), cfg=plan.cfg, output_name="eval_10k.hdf5")]


DAG_STAGES = (
    Stage(name="hdf5", title="tfrecord_to_hdf5: one padded HDF5 per part file (Samsung's layout)",
          reads=("tfrecord",), run=run_tfrecord_to_hdf5, version=STAGE_VERSION, config=HDF5Config,
          configure=_hdf5_config, key_params=stage_params, plan=_plan_shards, per_shard=True, chain=True,
          fused=run_fused, droppable=True, aliases=("tfrecord_to_hdf5",)),
    Stage(name="eval_hdf5", title="tfrecord_to_hdf5 over eval_10k: the eval set trainers read",
          reads=("eval_10k",), run=run_tfrecord_to_hdf5, version=STAGE_VERSION, config=HDF5Config,
          configure=_hdf5_config, key_params=stage_params, plan=_plan_eval, outputs={"eval_hdf5": "eval_10k.hdf5"}),
)
