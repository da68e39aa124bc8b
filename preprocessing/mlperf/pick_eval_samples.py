"""Stage 8: the evenly spaced eval subset of a TFRecord (MLCommons ``pick_eval_samples.py``, spec §9).

The reference reads every record, then keeps record ``int(i * ratio)`` for ``i < num_to_pick`` with
``ratio = num_records / num_to_pick`` (a float: no RNG, order kept) and re-serialises it unchanged;
so the picked records are byte-identical to their source records and are copied here as they are
(after checking both CRCs and that each parses as an MLPerf example, as the reference's parser would).

Asked for more records than there are, the reference silently repeats records. Here
``allow_fewer=False`` (the CLI) refuses, and ``allow_fewer=True`` (the Prefect DAG, whose samples
can be small) keeps every record once, logs it and records ``kept_all_records: 1`` in the manifest.

    bertpipe pick-eval-samples --input_tfrecord=eval_intermediate --output_tfrecord=eval_10k \\
        --num_examples_to_pick=10000          # official eval set: 25,382,591 bytes
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from core.errors import InputError, RecordError
from core.manifest import Manifest, StageOutput
from core.stage import Stage
from preprocessing.hdf5_io import atomic_path, stage_params, verify_inputs
from preprocessing.mlperf.records import RecordShape, decode_batch
from preprocessing.mlperf.tfrecord import count_records, frame, iter_records

log = logging.getLogger(__name__)

STAGE_VERSION = "1"


@dataclass(frozen=True, kw_only=True)
class PickEvalConfig:
    """Parameters of the eval selection (reference flags of the same names)."""

    num_examples_to_pick: int = 10000  # size of the eval set (MLPerf: eval_10k)
    allow_fewer: bool = False  # more picks than records: False -> error; True -> keep every record once
    max_seq_length: int = 512  # expected record shape, checked while parsing (as the reference does)
    max_predictions_per_seq: int = 76
    validate_batch: int = 1024  # picked records parsed and checked at once


def pick_indices(num_records: int, num_to_pick: int) -> list[int]:
    """The reference's selection: ``int(i * (num_records / num_to_pick))`` for ``i < num_to_pick``."""
    if num_to_pick < 1:
        raise InputError(f"num_examples_to_pick must be at least 1, got {num_to_pick}")
    ratio = num_records / num_to_pick
    return [int(i * ratio) for i in range(num_to_pick)]


def _plan(num_records: int, cfg: PickEvalConfig, path: Path) -> tuple[list[int], bool]:
    if num_records == 0:
        raise InputError(f"{path} holds no records; nothing to pick the eval set from")
    if cfg.num_examples_to_pick <= num_records:
        return pick_indices(num_records, cfg.num_examples_to_pick), False
    if not cfg.allow_fewer:
        raise InputError(f"{path} holds {num_records} records, fewer than --num_examples_to_pick="
                         f"{cfg.num_examples_to_pick}; the reference would silently repeat records. Pick at most "
                         f"{num_records} or give a larger input")
    log.warning("%s holds only %d records (< %d requested): keeping every record once", path, num_records,
                cfg.num_examples_to_pick)
    return list(range(num_records)), True


def pick_eval_samples(input_tfrecord: Path, out: BinaryIO, cfg: PickEvalConfig) -> dict[str, int]:
    """Stream the picked records of ``input_tfrecord`` into ``out``; returns counters.

    Raises:
        InputError: no records, or more picks than records without ``allow_fewer``.
        RecordError: a record is corrupt or truncated, or a picked record is not a valid MLPerf
            example (names the file and record index).
    """
    input_tfrecord = Path(input_tfrecord)
    n = count_records(input_tfrecord)
    picks, kept_all = _plan(n, cfg, input_tfrecord)
    shape = RecordShape(max_seq_length=cfg.max_seq_length, max_predictions_per_seq=cfg.max_predictions_per_seq)
    pending: list[tuple[int, bytes]] = []

    def flush() -> None:
        try:
            decode_batch([p for _, p in pending], shape, path=input_tfrecord, first_index=pending[0][0])
        except RecordError:  # the batch is not consecutive: find the record to name its true index
            for index, payload in pending:
                decode_batch([payload], shape, path=input_tfrecord, first_index=index)
            raise
        for index, payload in pending:
            out.write(frame(payload) * picks_of[index])
        pending.clear()

    picks_of: dict[int, int] = {}
    for i in picks:  # ratio < 1 cannot happen here, but count repeats rather than assume
        picks_of[i] = picks_of.get(i, 0) + 1
    for index, payload in enumerate(iter_records(input_tfrecord)):  # every record's CRCs are checked
        if index in picks_of:
            pending.append((index, payload))
            if len(pending) == cfg.validate_batch:
                flush()
    if pending:
        flush()
    return {"records_in": n, "requested": cfg.num_examples_to_pick, "picked": len(picks),
            "kept_all_records": int(kept_all)}


def run_pick_eval_samples(input_tfrecord: Path, out_dir: Path, cfg: PickEvalConfig = PickEvalConfig(), *,
                          output_name: str = "eval_10k.tfrecord", upstream: Sequence[Manifest] = ()) -> Manifest:
    """Stage function: ``out_dir/output_name``; counters records_in, requested, picked, kept_all_records."""
    input_tfrecord = Path(input_tfrecord)
    verify_inputs([input_tfrecord], upstream)
    with StageOutput(out_dir, "pick_eval_samples", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION) as out:
        with out.open(output_name) as f:
            counters = pick_eval_samples(input_tfrecord, f, cfg)
        for k, v in counters.items():
            out.count(k, v)
    log.info("%s: picked %d of %d records -> %s", input_tfrecord, counters["picked"], counters["records_in"],
             out.path(output_name))
    return out.manifest


def pick_eval_samples_file(input_tfrecord: Path, output_tfrecord: Path, cfg: PickEvalConfig) -> dict[str, int]:
    """The CLI's form: write ``output_tfrecord`` atomically, without a manifest."""
    with atomic_path(Path(output_tfrecord)) as tmp, open(tmp, "wb") as f:
        return pick_eval_samples(Path(input_tfrecord), f, cfg)


# -- the DAG's declaration of this stage (core/stage.py) -----------------------------------------------
def _pick_config(p: Any) -> PickEvalConfig:
    """MLPerf's 10,000 picks; a small eval set keeps every record once (logged, counted as `picked`)."""
    return PickEvalConfig(num_examples_to_pick=p.num_eval_examples, allow_fewer=True, max_seq_length=p.max_seq_length,
                          max_predictions_per_seq=p.max_predictions_per_seq)


DAG_STAGES = (Stage(name="eval_10k", title="pick_eval_samples: evenly spaced eval records (MLPerf: 10,000)",
                    reads=("eval_tfrecord",), run=run_pick_eval_samples, version=STAGE_VERSION,
                    config=PickEvalConfig, configure=_pick_config, key_params=stage_params,
                    plan=lambda plan: [plan.unit(str(plan.result("eval_tfrecord").path("eval_intermediate")),
                                                 cfg=plan.cfg, output_name="eval_10k")],
                    droppable=True, aliases=("pick_eval_samples", "pick_eval")),)
