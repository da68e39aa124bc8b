"""NVIDIA's eval set: evenly spaced rows of a padded HDF5, in the packed form (``pick_eval_samples_varlength.py``).

Reference: NVIDIA MLPerf BERT ``input_preprocessing/pick_eval_samples_varlength.py`` (training_results v1.1 ..
v3.1; spec §10). Flags ``--input_hdf5_file``, ``--output_hdf5_file`` (``.hdf5`` is appended to it),
``--num_examples_to_pick`` (10000), ``--max_seq_length`` (512), ``--max_predictions_per_seq`` (76). Row ``i`` of
the output is row ``int(i * (num_examples / num_examples_to_pick))`` of the input (a float ratio: no RNG, order
kept), cut as ``convert_fixed2variable.py`` cuts it (``input_ids``/``segment_ids`` to ``sum(input_mask)``,
``masked_lm_positions``/``masked_lm_ids`` to ``sum(positions != 0)``; vlen int16/int8/int16/int16, then
``next_sentence_labels`` i1). NVIDIA's published checksum of the result (``eval_varlength.chk``):
``part_eval_10k.hdf5 611d8bae26646145e1c33338a27ba124``.

Differences: the output name gets ``.hdf5`` appended only when it does not end in ``.hdf5`` already (the script
would write ``x.hdf5.hdf5``); more picks than rows is refused (the script silently repeats rows); lengths are
summed in int64 (the script's ``sum()`` of an int8 row wraps under NumPy 2: its NumPy 1 behaviour is kept);
rows are read and written in chunks (the script goes row by row): from a contiguous input only the picked rows
are read (memory maps), checked and cut as preprocessing/nvidia/varlength.compact_padded does.

The pick over the eval TFRecord (MLCommons ``pick_eval_samples.py``, ``bertpipe pick-eval-samples``) uses the
same formula, so in the data DAG NVIDIA's eval file is bertpipe's ``eval_10k.hdf5`` in the packed form
(``nvidia_eval`` stage below).

    bertpipe pick-eval-samples-varlength --input_hdf5_file eval_all.hdf5 --output_hdf5_file eval_varlength/part_eval_10k
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError
from core.manifest import Manifest, StageOutput
from core.schema import HDF5_FIELDS
from core.stage import Stage
from preprocessing.hdf5_io import (
    atomic_path,
    chunks,
    h5_create,
    open_padded,
    reading,
    stage_file,
    stage_params,
    verify_inputs,
)

STAGE_VERSION = "2"  # 2: the DAG's file in <stage>/eval_varlength/ (the manifest one level up)
#: The trainer's eval folder inside the DAG's stage directory: it holds the HDF5 file alone, because NVIDIA's
#: ``create_eval_dataset`` takes every file of --eval_dir whose full path contains ``part`` (a manifest beside it
#: would be read as HDF5 under a path like /data/part1/...); the manifest stays one level up, as train_dir's does.
DAG_DATA_DIR = "eval_varlength"
DAG_FILE = f"{DAG_DATA_DIR}/part_eval_10k.hdf5"


@dataclass(frozen=True, kw_only=True)
class PickVarlenConfig:
    """Parameters of the pick (the reference's flags)."""

    num_examples_to_pick: int = 10000  # 0: every row, in order (the data DAG: eval_10k.hdf5 is picked already)
    max_seq_length: int = 512
    max_predictions_per_seq: int = 76
    chunk_rows: int = 4096  # input rows read at once


def output_path(output_hdf5_file: str | Path) -> Path:
    """The reference's output name: ``.hdf5`` appended (unless it is there already)."""
    s = str(output_hdf5_file)
    return Path(s if s.endswith(".hdf5") else s + ".hdf5")


def pick_rows(num_examples: int, num_to_pick: int, path: Path | str = "the input") -> np.ndarray:
    """The reference's picks: ``int(i * (num_examples / num_to_pick))`` for ``i < num_to_pick`` (0: every row)."""
    if num_to_pick == 0:
        return np.arange(num_examples, dtype=np.int64)
    if num_to_pick < 1:
        raise InputError(f"num_examples_to_pick must be at least 1, got {num_to_pick}")
    if num_examples < num_to_pick:
        raise InputError(f"{path} holds {num_examples} rows, fewer than --num_examples_to_pick={num_to_pick}; the "
                         f"reference would silently repeat rows. Pick at most {num_examples} or give a larger input")
    ratio = num_examples / num_to_pick
    return np.array([int(i * ratio) for i in range(num_to_pick)], dtype=np.int64)


def pick_eval_varlength(input_hdf5: str | Path, output_hdf5: str | Path, cfg: PickVarlenConfig = PickVarlenConfig(),
                        ) -> dict[str, int]:
    """Write the picked rows of ``input_hdf5`` in the packed form to ``output_hdf5`` (the path as given)."""
    import h5py

    from preprocessing.hdf5_io import write_vlen
    from preprocessing.nvidia.varlength import VARLEN_DATASETS, compact_padded, mapped_padded

    path = Path(input_hdf5)
    with open_padded(path, max_seq_length=cfg.max_seq_length,
                     max_predictions_per_seq=cfg.max_predictions_per_seq) as src:
        n = int(src["next_sentence_labels"].shape[0])
        picks = pick_rows(n, cfg.num_examples_to_pick, path)
        k = len(picks)
        with reading(path, "its datasets"):
            maps = mapped_padded(src, path)  # contiguous input: only the picked rows are read
        with h5_create(output_hdf5, in_memory=k * 2400 <= (8 << 20)) as dst:
            out = {name: dst.create_dataset(name, (k,), dtype=h5py.vlen_dtype(np.dtype(dt)))
                   for name, dt, _ in VARLEN_DATASETS}
            nsl = dst.create_dataset("next_sentence_labels", data=np.zeros(k, dtype="i1"), dtype="i1")
            o = 0
            for a, b in chunks(n, cfg.chunk_rows):  # these writes, chunk by chunk, make the file's bytes: kept
                lo, hi = np.searchsorted(picks, [a, b], side="left")
                if hi == lo:
                    continue
                sel = picks[lo:hi] - a
                span = slice(a + int(sel[0]), a + int(sel[-1]) + 1)
                with reading(path, f"rows {span.start}..{span.stop - 1}"):
                    if maps is not None:
                        got = maps.rows(span.start, span.stop)
                        rows = {name: got[name][sel - sel[0]] for name in HDF5_FIELDS}
                    else:
                        rows = {name: src[name][span][sel - sel[0]] for name in HDF5_FIELDS}
                    cut = compact_padded(rows, path, span.start, cfg.max_seq_length, row_ids=span.start + sel - sel[0])
                m = hi - lo
                for name, _, kind in VARLEN_DATASETS:  # one HDF5 write per dataset and chunk
                    write_vlen(out[name], cut.flat[name], cut.lengths(kind), o)
                nsl[o:o + m] = cut.nsl
                o += m
    return {"rows_in": n, "picked": k}


def pick_eval_varlength_file(input_hdf5: str | Path, output_hdf5: str | Path,
                             cfg: PickVarlenConfig = PickVarlenConfig()) -> dict[str, int]:
    """The CLI's form: ``output_hdf5`` written atomically, without a manifest."""
    with atomic_path(Path(output_hdf5)) as tmp:
        return pick_eval_varlength(input_hdf5, tmp, cfg)


def run_pick_eval_varlength(input_hdf5: Path, out_dir: Path, cfg: PickVarlenConfig = PickVarlenConfig(), *,
                            output_name: str = "part_eval_10k.hdf5", upstream: Sequence[Manifest] = ()) -> Manifest:
    """Stage function: ``out_dir/output_name``; counters rows_in, picked."""
    verify_inputs([Path(input_hdf5)], upstream)
    with StageOutput(out_dir, "nvidia_eval", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION) as out:
        with stage_file(out, output_name) as tmp:
            counters = pick_eval_varlength(input_hdf5, tmp, cfg)
        for k, v in counters.items():
            out.count(k, v)
    return out.manifest


# -- the DAG's declaration (core/stage.py); the lead wires it into preprocessing/registry.py -----------------------
def _plan_eval(plan: Any) -> list[Any]:
    return [plan.unit(str(plan.result("eval_hdf5").path("eval_10k.hdf5")), cfg=plan.cfg, output_name=DAG_FILE)]


def _configure(p: Any) -> PickVarlenConfig:
    """eval_10k.hdf5 is the pick already: every one of its rows, in order (the same rows as NVIDIA's pick)."""
    return PickVarlenConfig(num_examples_to_pick=0, max_seq_length=p.max_seq_length,
                            max_predictions_per_seq=p.max_predictions_per_seq)


#: NVIDIA's eval file: bertpipe's eval_10k.hdf5 in the packed form, ``eval_varlength/part_eval_10k.hdf5`` (that
#: folder is the trainer's --eval_dir), for every NVIDIA target
#: (preprocessing/targets.py: their names start with ``nvidia-``).
DAG_STAGES = (Stage(name="nvidia_eval", title="pick_eval_samples_varlength: the eval set in NVIDIA's packed form",
                    reads=("eval_hdf5",), run=run_pick_eval_varlength, version=STAGE_VERSION,
                    config=PickVarlenConfig, configure=_configure, key_params=stage_params, plan=_plan_eval,
                    outputs={"nvidia_eval_varlength": DAG_FILE},
                    when=lambda p: any(t.startswith("nvidia-") for t in tuple(getattr(p, "targets", ()) or ()))),)
