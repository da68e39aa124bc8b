"""NVIDIA's shards: the 500 padded part files resharded into N files (``chop_hdf5_files.py``), padded or packed.

Reference: NVIDIA MLPerf BERT ``input_preprocessing/chop_hdf5_files.py`` (training_results v1.1 and v3.1, the
script ``prepare_data.sh`` runs; spec §10), and its one-pass variant ``chop_hdf5_files_to_varlength.py`` (chop,
then the rows in NVIDIA's packed form, as ``convert_fixed2variable.py`` writes them: ``--varlength`` here).

What the reference does (read from its source; both rounds in ``../shared/reference/``, run by the tests):

* inputs ``sorted(glob(<input_hdf5_dir>/part-00???-of-00500.hdf5))``, rows counted from
  ``next_sentence_labels``; output ``<output_hdf5_dir>/hdf5_<N>_shards_uncompressed/part_<k:05d>_of_<N:05d>.hdf5``;
  rows go to shards in input order (no RNG); ``nominal = ceil(total / N)``, ``excess = N * nominal - total``.
  The comment says the first ``excess`` shards get one row fewer; the two rounds' code differ in how:
* **rule v3.1** (v3.1's ``input_preprocessing/chop_hdf5_files.py``, and ``chop_hdf5_files_to_varlength.py`` in both
  rounds): tests ``ofile_idx < n_excess``: the first ``excess`` shards hold ``nominal - 1`` rows, the others
  ``nominal``; every row is kept. The script crashes when ``excess`` is 0 (shard 0 still gets ``nominal - 1``, the
  last row asks for shard N: IndexError) and when ``nominal`` is 1 with ``excess >= 2`` (a second empty shard:
  IndexError). bertpipe, on purpose: ``excess`` 0 gives every shard ``nominal`` rows (the rule as its comment
  states it; ``chop_hdf5_files_to_varlength.py`` would write one more shard, ``part_<N>``, holding the last row);
  the empty-shard crash is refused in one line. With ``nominal`` 1 and ``excess`` 1, shard 0 comes out empty, as
  in the script. This is the rule of v3.1's published ``4320_shards_varlength.chk`` (and its shuffled list).
* **rule v1.1** (v1.1's ``chop_hdf5_files.py``, left in v3.1's ``cleanup_scripts/``): resets its row counter
  *before* testing ``ofile_entry_idx < n_excess``, so shard 0 holds ``nominal - 1`` rows, every other shard
  ``nominal - 1`` when ``excess > 0`` and ``nominal`` when ``excess == 0``. A shard is written when the row after
  it arrives, so the rows beyond the N shards are **dropped**: ``N - excess`` rows when ``excess > 0``, the last
  row when ``excess == 0``. When they reach a whole shard (``N - excess >= nominal``, e.g. fewer rows than shards)
  the script crashes (IndexError: shard N does not exist). This is the rule of v1.1's ``4320_shards_varlength.chk``
  and of ``2048_shards_varlength.chk`` (byte-identical in both rounds). With no rows both rules fail at once.
* each shard: the six datasets from float64 buffers, ``create_dataset(name, data=buffer, dtype=...)`` in order
  ``input_ids i2, input_mask i1, segment_ids i1, masked_lm_positions i2, masked_lm_ids i2,
  next_sentence_labels i1`` (v1.1 and later; NVIDIA's 2019 script wrote ``i4`` ids), contiguous, uncompressed.

At NVIDIA's count (156,726,829 sequences) the rules agree on shards 0..2,770 of 4,320 and on shards 0..466 of 2,048.

Here (``--rule v3.1`` by default, ``--rule v1.1``): the same shard sizes and, under v1.1, the same dropped rows (so
NVIDIA's published checksums can match), counted in the manifest (``rows_dropped``) and logged; the crash cases
are refused in one line naming the largest shard count that works. Values that do not fit ``i2`` (a vocabulary
over 32,767 entries) are refused (the reference's cast would wrap them). Each dataset is created empty and filled
chunk by chunk, one after the other in the order above, which gives the reference's bytes for the padded shards
(same h5py/HDF5) with memory bounded by ``chunk_rows``; ``--varlength`` shards hold NVIDIA's vlen datasets
(``preprocessing/nvidia/varlength.py``; equal content, HDF5 bytes of their own): the padded rows are read through
memory maps where the parts are contiguous (as tfrecord-to-hdf5 writes them; h5py otherwise), checked with a few
reductions a chunk (the checks one by one where one fails: the same refusals) and cut with one C gather a
dataset. Shards are written in groups of up to 16, in parallel (:mod:`core.pools`); each shard is built in memory
by HDF5's core driver and written in one call, past the page cache where the stage's files would not stay in it
(the full set's), and a group's shards are hashed side by side from memory (:class:`preprocessing.packing.
ImageOutputs`: the bytes HDF5's file driver writes; a shard of more than :data:`IMAGE_MAX_BYTES` is written by
that driver chunk by chunk instead); any number of workers gives the same bytes.

    bertpipe chop-hdf5 --input_hdf5_dir hdf5/training --output_hdf5_dir hdf5/training-4320 --num_shards 4320
    bertpipe chop-hdf5 --rule v1.1 ... --num_shards 2048     # the rule of NVIDIA's 2,048-shard list
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError
from core.manifest import (
    MANIFEST_NAME,
    Manifest,
    StageOutput,
    late_fsyncs,
    load_manifest,
    md5_then_fsync,
    remove_debris,
    verify_manifest,
)
from core.pools import default_workers, even_calls, run_all
from core.schema import HDF5_FIELDS, row_shape
from core.stage import Stage
from preprocessing.hdf5_check import check_padded
from preprocessing.hdf5_io import (
    chunks,
    h5_create,
    open_padded,
    reading,
    stage_params,
    tmp_path,
    verify_inputs,
)
from preprocessing.nvidia.varlength import PaddedMap, mapped_padded

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
#: The chop rules, named by the MLCommons training round whose ``chop_hdf5_files.py`` has them (the first: default).
RULES = ("v3.1", "v1.1")
#: The reference's input pattern (inside --input_hdf5_dir).
INPUT_GLOB = "part-00???-of-00500.hdf5"
#: NVIDIA's padded shard: (name, dtype, width kind), in creation order (v1.1 and later).
NV_DATASETS: tuple[tuple[str, str, str], ...] = (
    ("input_ids", "i2", "seq"), ("input_mask", "i1", "seq"), ("segment_ids", "i1", "seq"),
    ("masked_lm_positions", "i2", "pred"), ("masked_lm_ids", "i2", "pred"), ("next_sentence_labels", "i1", ""))
#: Shards one shard-group call writes at most (hashed side by side: md5_files' 16 lanes).
GROUP_SHARDS = 16
#: Inputs from which the stage function counts rows on its workers (fewer: here; a pool takes longer to start).
COUNT_POOL_FILES = 64
#: Input files a group call keeps open at once.
OPEN_INPUTS = 8
#: The owner of a worker's kept buffers (pack_fast.process_space): the cut's arrays and the shards' images.
SPACE_OWNER = "chop"


@dataclass(frozen=True, kw_only=True)
class ChopConfig:
    """Parameters of the resharding (the reference's flags)."""

    num_shards: int = 2048  # reference default (prepare_data.sh passes 4320 or 2048)
    rule: str = RULES[0]  # which round's chop_hdf5_files.py: "v3.1" (keeps every row) or "v1.1" (drops the tail)
    max_seq_length: int = 512
    max_predictions_per_seq: int = 76
    varlength: bool = False  # chop_hdf5_files_to_varlength.py: shards in NVIDIA's packed (vlen) form
    chunk_rows: int = 4096  # rows read and written at once

    def __post_init__(self) -> None:
        check_rule(self.rule)


def shard_name(k: int, n: int) -> str:
    return f"part_{k:05d}_of_{n:05d}.hdf5"


def shards_folder(cfg: ChopConfig) -> str:
    """``hdf5_<N>_shards_uncompressed`` (the reference's) or ``hdf5_<N>_shards_varlength`` (prepare_data.sh's)."""
    return f"hdf5_{cfg.num_shards}_shards_{'varlength' if cfg.varlength else 'uncompressed'}"


def input_files(input_dir: str | Path) -> list[Path]:
    """The reference's inputs: ``sorted(glob(<dir>/part-00???-of-00500.hdf5))``."""
    return sorted(Path(input_dir).glob(INPUT_GLOB))


# -- the reference's shard sizes ------------------------------------------------------------------------
def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise InputError(f"unknown chop rule {rule!r}; choose from {', '.join(RULES)} (the MLCommons round whose "
                         "chop_hdf5_files.py it is)")
    return rule


@dataclass(frozen=True)
class ChopLayout:
    """How ``chop_hdf5_files.py`` of round ``rule`` cuts ``rows`` rows into ``n_shards`` shards."""

    rows: int
    n_shards: int
    nominal: int
    excess: int
    rule: str = RULES[0]

    @property
    def first_size(self) -> int:
        return self.size(0)

    @property
    def other_size(self) -> int:
        """Size of shard N-1 (v1.1: of every shard but 0)."""
        return self.size(self.n_shards - 1) if self.n_shards > 1 else self.size(0)

    def size(self, k: int) -> int:
        if self.rule == "v1.1":
            return self.nominal - 1 if k == 0 or self.excess > 0 else self.nominal
        return self.nominal - 1 if k < self.excess else self.nominal

    def start(self, k: int) -> int:
        """Global index of shard k's first row."""
        if self.rule == "v1.1":
            return 0 if k == 0 else self.size(0) + (k - 1) * self.size(1)
        return k * self.nominal - min(k, self.excess)

    def sizes(self) -> list[int]:
        return [self.size(k) for k in range(self.n_shards)]

    @property
    def kept(self) -> int:
        return self.start(self.n_shards)

    @property
    def dropped(self) -> int:
        return self.rows - self.kept


def layout_of(rows: int, n_shards: int, rule: str = RULES[0]) -> ChopLayout:
    """The rule's arithmetic alone (no crash check; ``rows`` >= 1, ``n_shards`` >= 1)."""
    nominal = -(-rows // n_shards)
    return ChopLayout(rows=rows, n_shards=n_shards, nominal=nominal, excess=n_shards * nominal - rows,
                      rule=check_rule(rule))


def reference_crash(rows: int, n_shards: int, rule: str = RULES[0]) -> str:
    """Why ``chop_hdf5_files.py`` of round ``rule`` fails on ``rows`` rows and ``n_shards`` shards ("" when it does
    not, or where bertpipe extends the rule on purpose: v3.1 with ``excess`` 0)."""
    check_rule(rule)
    if rows <= 0:
        return "no rows (the script fails: a shard of -1 rows)"
    nominal = -(-rows // n_shards)
    excess = n_shards * nominal - rows
    if rule == "v1.1":
        if excess > 0 and n_shards - excess >= nominal:
            return (f"{rows} rows for {n_shards} shards: {nominal - 1} rows per shard leave {n_shards - excess} rows "
                    "for a shard that does not exist (the v1.1 script crashes with IndexError)")
    elif nominal == 1 and excess >= 2:
        return (f"{rows} rows for {n_shards} shards: the first {excess} shards would be empty (the v3.1 script "
                "crashes with IndexError at the second empty shard)")
    return ""


def largest_working_shards(rows: int, n_shards: int, rule: str = RULES[0]) -> int:
    """The largest shard count <= ``n_shards`` that ``chop_hdf5_files.py`` handles for ``rows`` rows (0: none)."""
    for n in range(min(n_shards, max(rows + 1, 1)), 0, -1):
        if not reference_crash(rows, n, rule):
            return n
    return 0


def chop_layout(rows: int, n_shards: int, rule: str = RULES[0]) -> ChopLayout:
    """The reference's layout, or InputError where the reference crashes (naming what works)."""
    if n_shards < 1:
        raise InputError(f"num_shards must be at least 1, got {n_shards}")
    why = reference_crash(rows, n_shards, rule)
    if why:
        best = largest_working_shards(rows, n_shards, rule)
        hint = f"; at most {best} shards work for these rows" if best else ""
        raise InputError(f"chop_hdf5_files.py (rule {rule}) cannot cut these inputs into {n_shards} shards: {why}"
                         f"{hint} (--num_shards)")
    return layout_of(rows, n_shards, rule)


# -- step 1: count ----------------------------------------------------------------------------------------
def count_rows(path: str | Path, cfg: ChopConfig = ChopConfig()) -> int:
    """Rows of one padded input (its six datasets checked: names, widths, integer dtypes, one length)."""
    with open_padded(Path(path), max_seq_length=cfg.max_seq_length,
                     max_predictions_per_seq=cfg.max_predictions_per_seq) as f:
        return int(f["next_sentence_labels"].shape[0])


# -- step 2: groups of shards ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChopGroup:
    """Shards ``k0..k1-1`` and every input file with its row count (in input order; small, picklable)."""

    n_shards: int
    k0: int
    k1: int
    starts: tuple[int, ...]  # global first row of shards k0..k1 (k1: the end)
    files: tuple[tuple[str, int], ...]

    def spans(self, j: int) -> list[tuple[str, int, int]]:
        """(file, first row, stop row) of shard ``k0 + j``, in order."""
        s, e = self.starts[j], self.starts[j + 1]
        out, base = [], 0
        for path, n in self.files:
            a, b = max(s, base), min(e, base + n)
            if b > a:
                out.append((path, a - base, b - base))
            base += n
            if base >= e:
                break
        return out


def groups(layout: ChopLayout, files: Sequence[tuple[str, int]], n_groups: int) -> list[ChopGroup]:
    """The N shard indices cut into ``n_groups`` contiguous groups; each lists only the files its rows are in."""
    n = layout.n_shards
    n_groups = max(1, min(n_groups, n))
    bounds = [n * g // n_groups for g in range(n_groups + 1)]
    cum = np.concatenate([[0], np.cumsum([c for _, c in files], dtype=np.int64)])
    out = []
    for k0, k1 in zip(bounds, bounds[1:], strict=False):
        if k1 <= k0:
            continue
        s, e = layout.start(k0), layout.start(k1)
        hit = np.flatnonzero((cum[:-1] < e) & (cum[1:] > s))  # the files holding rows s..e-1
        lo, hi = (int(hit[0]), int(hit[-1])) if hit.size else (0, -1)
        base = int(cum[lo]) if hit.size else s
        out.append(ChopGroup(n_shards=n, k0=k0, k1=k1, starts=tuple(layout.start(k) - base for k in range(k0, k1 + 1)),
                             files=tuple((str(p), int(c)) for p, c in files[lo:hi + 1])))
    return out


def group_count(rows: int, n_shards: int, workers: int) -> int:
    """How many shard-group calls: groups of up to :data:`GROUP_SHARDS` shards (a group's shards are hashed side by
    side in one md5_files call: 16 lanes of AVX-512, 8 of AVX-512VL or AVX2), as many for each worker
    (core.pools.even_calls: 41 shards on 2 workers are 4 groups of 10-11, not 16, 16 and 9). The rows only bound
    it by the shards: a group reads and writes chunk by chunk."""
    del rows  # a group's memory does not grow with its rows
    return even_calls(n_shards, GROUP_SHARDS, workers)


# -- step 3: write a group ------------------------------------------------------------------------------------
class PaddedInputs:
    """The input files of a group call, opened once each (a few at a time); contiguous inputs also mapped."""

    def __init__(self, cfg: ChopConfig) -> None:
        self.cfg = cfg
        self.files: OrderedDict[str, Any] = OrderedDict()
        self.maps: dict[str, PaddedMap | None] = {}

    def open(self, path: str) -> Any:
        f = self.files.pop(path, None)
        if f is None:
            if len(self.files) >= OPEN_INPUTS:
                old, of = self.files.popitem(last=False)
                self.maps.pop(old, None)
                of.close()
            f = open_padded(Path(path), max_seq_length=self.cfg.max_seq_length,
                            max_predictions_per_seq=self.cfg.max_predictions_per_seq)
        self.files[path] = f
        return f

    def read(self, path: str, name: str, a: int, b: int) -> np.ndarray:
        f = self.open(path)
        with reading(Path(path), f"{name} rows {a}..{b - 1}"):
            return f[name][a:b]

    def rows(self, path: str, a: int, b: int) -> dict[str, np.ndarray]:
        """The six datasets' rows a..b-1: views of the file's memory maps (contiguous inputs: read when touched,
        with no copy) or arrays read through h5py."""
        f = self.open(path)
        if path not in self.maps:
            with reading(Path(path), "its datasets"):
                self.maps[path] = mapped_padded(f, Path(path))
        maps = self.maps[path]
        if maps is not None:
            return maps.rows(a, b)
        with reading(Path(path), f"rows {a}..{b - 1}"):
            return {name: f[name][a:b] for name in HDF5_FIELDS}

    def close(self) -> None:
        self.maps.clear()
        while self.files:
            self.files.popitem()[1].close()


def _cast(rows: np.ndarray, dtype: str, name: str, path: str, first: int) -> np.ndarray:
    """``rows`` as ``dtype``, refusing values that do not fit (the reference's float64 -> int cast would wrap)."""
    if rows.dtype == np.dtype(dtype):
        return rows
    info = np.iinfo(dtype)
    if rows.size and (rows.min() < info.min or rows.max() > info.max):
        bad = (rows < info.min) | (rows > info.max)
        row = int(np.flatnonzero(bad.reshape(len(rows), -1).any(axis=1))[0])
        raise InputError(f"{path}: row {first + row}: {name} holds a value outside {np.dtype(dtype).name}, which "
                         "NVIDIA's shards store (a vocabulary over 32,767 entries does not fit)")
    return rows.astype(dtype)


def _write_padded(f: Any, spans: list[tuple[str, int, int]], size: int, cfg: ChopConfig, inputs: PaddedInputs) -> None:
    for name, dtype, kind in NV_DATASETS:  # dataset by dataset: each complete before the next exists
        ds = f.create_dataset(name, (size, *row_shape(kind, cfg.max_seq_length, cfg.max_predictions_per_seq)),
                              dtype=dtype)
        o = 0
        for path, a, b in spans:
            for c0, c1 in chunks(b - a, cfg.chunk_rows):
                raw = inputs.read(path, name, a + c0, a + c1)  # the shared rules (preprocessing/hdf5_check.py):
                check_padded(path, a + c0, {name: raw} if name != "masked_lm_positions" else  # positions need
                             {name: raw, "input_mask": inputs.read(path, "input_mask", a + c0, a + c1)})  # the mask
                rows = _cast(raw, dtype, name, path, a + c0)
                ds[o:o + len(rows)] = rows
                o += len(rows)


def _write_varlength(f: Any, spans: list[tuple[str, int, int]], size: int, cfg: ChopConfig,
                     inputs: PaddedInputs) -> None:
    import h5py

    from preprocessing import pack_fast
    from preprocessing.hdf5_io import write_vlen
    from preprocessing.nvidia.varlength import VARLEN_DATASETS, compact_padded

    # the cut's arrays, used again chunk after chunk (each chunk written before the next), shard after shard
    space = pack_fast.process_space(SPACE_OWNER)
    out = {name: f.create_dataset(name, (size,), dtype=h5py.vlen_dtype(np.dtype(dt))) for name, dt, _ in VARLEN_DATASETS}
    nsl = f.create_dataset("next_sentence_labels", data=np.zeros(size, dtype="i1"), dtype="i1")
    o = 0
    for path, a, b in spans:
        for c0, c1 in chunks(b - a, cfg.chunk_rows):  # these writes, chunk by chunk, make the file's bytes: kept
            first = a + c0
            with reading(Path(path), f"rows {first}..{a + c1 - 1}"):  # the checks and cuts (varlength.py)
                rows = compact_padded(inputs.rows(path, first, a + c1), Path(path), first, cfg.max_seq_length,
                                      space=space)
            m = c1 - c0
            for name, _, kind in VARLEN_DATASETS:  # one HDF5 write per dataset and chunk, no object per row
                write_vlen(out[name], rows.flat[name], rows.lengths(kind), o)
            nsl[o:o + m] = rows.nsl
            o += m


#: Bytes a shard's row takes at most in its file (padded: 512 x 4 + 76 x 4 + 1 = 2,353; variable-length: its
#: values, 16 bytes an element in each vlen dataset and ~24 in the global heap), the metadata aside.
ROW_BYTES = 2400
#: A shard whose bound (ROW_BYTES a row) is larger is written by HDF5's file driver chunk by chunk, as before the
#: images, not built in memory: a few shards of many rows (``--num_shards 1`` over the full set: ~375 GB) keep
#: the call's memory bounded by ``chunk_rows``. The full set's 4,320 or 2,048 shards (~36,000-77,000 rows: 87-184
#: MB bounds) are built in memory.
IMAGE_MAX_BYTES = 256 << 20


def stage_output_bytes(group: ChopGroup) -> int:
    """About what the whole stage writes, from ``group``'s rows and share of the shards (a bound: ROW_BYTES a
    row): whether its files stay in the page cache (:func:`preprocessing.scratch.use_direct`)."""
    rows = group.starts[-1] - group.starts[0]
    return ROW_BYTES * rows * group.n_shards // max(1, group.k1 - group.k0)


def write_chop_group(group: ChopGroup, out_dir: str | Path, cfg: ChopConfig = ChopConfig()) -> dict[str, Any]:
    """Write shards ``group.k0..k1-1`` into ``out_dir`` (each via a temporary name, complete, renamed); returns
    their entries ``[name, bytes, md5]``, once every shard is on the disk (their writeback started as each is
    written, their fsyncs side by side after their md5s: core.manifest.late_fsyncs).

    Each shard is built in memory by HDF5's core driver, written in one call, past the page cache where the
    stage's files would not stay in it (the full set's ~150 GB: :func:`stage_output_bytes`), and hashed from
    memory (:class:`preprocessing.packing.ImageOutputs`: the bytes HDF5's file driver writes), written behind
    while the next shard is built."""
    from preprocessing import pack_fast
    from preprocessing.packing import ImageOutputs
    from preprocessing.scratch import use_direct

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = PaddedInputs(cfg)
    finals: list[Path] = []
    outputs = ImageOutputs(pack_fast.process_space(SPACE_OWNER), direct=use_direct(out_dir, stage_output_bytes(group)))
    try:
        with outputs, late_fsyncs():
            _write_chop_shards(group, out_dir, cfg, inputs, finals, outputs)
            known = outputs.md5s()
    finally:
        inputs.close()
    return {"kind": "shards", "k0": group.k0, "k1": group.k1,
            "entries": [[p.name, p.stat().st_size, md5]
                        for p, md5 in zip(finals, md5_then_fsync(finals, known), strict=True)]}


def _write_chop_shards(group: ChopGroup, out_dir: Path, cfg: ChopConfig, inputs: PaddedInputs, finals: list[Path],
                       outputs: Any) -> None:
    """The shards of ``group``, each complete and renamed (``outputs``: an ImageOutputs, the renames behind its
    writes); their final paths appended to ``finals``."""
    for j in range(group.k1 - group.k0):
        final = out_dir / shard_name(group.k0 + j, group.n_shards)
        tmp = tmp_path(final)
        size = group.starts[j + 1] - group.starts[j]
        bound = ROW_BYTES * size + (1 << 20)
        write = _write_varlength if cfg.varlength else _write_padded
        try:
            if bound <= IMAGE_MAX_BYTES:
                with outputs.create(tmp, bound) as f:
                    write(f, group.spans(j), size, cfg, inputs)
                outputs.rename(tmp, final)
            else:  # HDF5's file driver, chunk by chunk; hashed from the page cache (md5_then_fsync)
                with h5_create(tmp) as f:
                    write(f, group.spans(j), size, cfg, inputs)
                os.replace(tmp, final)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            from core.manifest import raise_if_disk_full

            raise_if_disk_full(exc, final)
            raise
        finals.append(final)


# -- step 4: the manifest ----------------------------------------------------------------------------------
def finish_chop(out_dir: str | Path, layout: ChopLayout, written: Sequence[dict[str, Any]], cfg: ChopConfig,
                upstream: Sequence[Manifest] = (), *, data_dir: str = "", manifest_name: str = MANIFEST_NAME,
                ) -> Manifest:
    """The stage manifest from the groups' entries; counters rows (kept), rows_in, rows_dropped, files."""
    prefix = f"{data_dir}/" if data_dir else ""
    got = {e[0]: e for w in written for e in w["entries"]}
    missing = [shard_name(k, layout.n_shards) for k in range(layout.n_shards)
               if shard_name(k, layout.n_shards) not in got]
    if missing:  # pragma: no cover - the groups cover 0..N-1 by construction
        raise InputError(f"chop-hdf5: {len(missing)} shard(s) were not written (e.g. {missing[0]}); run again")
    with StageOutput(out_dir, "nvidia_chop", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION, manifest_name=manifest_name) as out:
        for k in range(layout.n_shards):
            name = shard_name(k, layout.n_shards)
            out.add_file(prefix + name, got[name][2])
        out.count("files", layout.n_shards)
        out.count("rows", layout.kept)
        out.count("rows_in", layout.rows)
        out.count("rows_dropped", layout.dropped)
    return out.manifest


# -- all steps in one call --------------------------------------------------------------------------------
def _log_layout(layout: ChopLayout) -> None:
    if layout.rule == "v1.1":
        log.info("%d rows -> %d shards (rule v1.1): shard 0 holds %d rows, the others %d", layout.rows,
                 layout.n_shards, layout.first_size, layout.other_size)
    else:
        log.info("%d rows -> %d shards (rule v3.1): %d shards hold %d rows, %d hold %d", layout.rows, layout.n_shards,
                 layout.excess, layout.nominal - 1, layout.n_shards - layout.excess, layout.nominal)
    if layout.dropped:
        log.warning("as v1.1's chop_hdf5_files.py does, the last %d of %d rows are left out (the %d shards hold %d)",
                    layout.dropped, layout.rows, layout.n_shards, layout.kept)


def _begin(out_dir: Path, data_dir: str, manifest_name: str) -> None:
    d = out_dir / data_dir if data_dir else out_dir
    d.mkdir(parents=True, exist_ok=True)
    (out_dir / manifest_name).unlink(missing_ok=True)
    remove_debris(d)


def run_nvidia_chop(inputs: Sequence[Path], out_dir: Path, cfg: ChopConfig = ChopConfig(), *,
                    upstream: Sequence[Manifest] = (), workers: int = 1, data_dir: str = "",
                    manifest_name: str = MANIFEST_NAME) -> Manifest:
    """Stage function: ``out_dir/[data_dir/]part_<k:05d>_of_<N:05d>.hdf5`` for k < N, manifest at
    ``out_dir/manifest_name``. ``inputs`` in the reference's order (sorted part-00???-of-00500.hdf5)."""
    files = [Path(p) for p in inputs]
    if not files:
        raise InputError(f"chop-hdf5 got no input files (the reference reads <input_hdf5_dir>/{INPUT_GLOB})")
    verify_inputs(files, upstream, workers=workers)
    # counting opens each file (milliseconds): a pool of its own only for many files
    counts = run_all(count_rows, [(str(p), cfg) for p in files], workers if len(files) > COUNT_POOL_FILES else 1)
    layout = chop_layout(sum(counts), cfg.num_shards, cfg.rule)
    _log_layout(layout)
    out_dir = Path(out_dir)
    _begin(out_dir, data_dir, manifest_name)
    gs = groups(layout, list(zip(map(str, files), counts, strict=True)), group_count(layout.rows, cfg.num_shards,
                                                                                     workers))
    target = out_dir / data_dir if data_dir else out_dir
    try:
        written = run_all(write_chop_group, [(g, str(target), cfg) for g in gs], workers)
    except BaseException:  # no manifest: the shards this run wrote go too (a trainer would read them)
        for k in range(layout.n_shards):
            f = target / shard_name(k, layout.n_shards)
            if os.path.isfile(f) and not os.path.islink(f):
                f.unlink(missing_ok=True)
        raise
    return finish_chop(out_dir, layout, written, cfg, upstream, data_dir=data_dir, manifest_name=manifest_name)


# -- the DAG's declaration (core/stage.py); the lead wires it into preprocessing/registry.py -------------------
def count_piece(paths: Sequence[str], hdf5_dirs: Sequence[str], out_dir: Path, cfg: ChopConfig) -> dict[str, Any]:
    """DAG piece: check a few parts' HDF5 against their manifests, count their rows."""
    for d in hdf5_dirs:
        verify_manifest(d, trust_stat=True)
    return {"kind": "count-list", "counts": [[p, count_rows(p, cfg)] for p in paths]}


def group_piece(group: ChopGroup, out_dir: Path, cfg: ChopConfig) -> dict[str, Any]:
    """DAG piece: one group of shards, at the stage directory's top (NVIDIA's trainer takes files named part*)."""
    return write_chop_group(group, out_dir, cfg)


def _targets(p: Any) -> tuple[str, ...]:
    return tuple(getattr(p, "targets", ()) or ())


def dag_shards(p: Any, n: int) -> int:
    """Shards for a DAG run: ``--nvidia-shards`` if given, else ``n`` (4320 / 2048), or the sample's shard count on
    the built-in sample (NVIDIA's 4320 would crash the reference there)."""
    resolved = getattr(p, "resolved_nvidia_shards", None)
    if resolved is not None:
        return resolved(n)
    return (getattr(p, "n_output_shards", None) or 8) if getattr(p, "is_sample", False) else n


def _plan_chop(plan: Any) -> list[Any]:
    """Pieces: count every part's rows, in part order (as the bins stage does)."""
    from preprocessing.mlperf.split_4bins import count_pieces

    return count_pieces(plan, count_piece)


def _finish_chop(plan: Any, values: list[dict[str, Any]]) -> Manifest | list[Any]:
    counts = [c for v in values if v["kind"] == "count-list" for c in v["counts"]]
    written = [v for v in values if v["kind"] == "shards"]
    layout = chop_layout(sum(n for _, n in counts), plan.cfg.num_shards, plan.cfg.rule)
    if not written:
        _log_layout(layout)
        _begin(Path(plan.dir), "", MANIFEST_NAME)
        gs = groups(layout, counts, group_count(layout.rows, layout.n_shards, plan.params.workers or default_workers()))
        return [replace(plan.unit(g, cfg=plan.cfg, shard=f"shards/{g.k0:05d}", upstream=[]), run=group_piece,
                        piece=True, pass_upstream=False, out_dir=str(plan.dir)) for g in gs]
    h5 = plan.result("hdf5")
    upstream = [load_manifest(h5.unit_dir(s)) for s in h5.shards]
    return finish_chop(plan.dir, layout, written, plan.cfg, [m for m in upstream if m is not None])


def _stage(name: str, n: int, rule: str, targets: tuple[str, ...], output: str) -> Stage:
    return Stage(name=name, title=f"chop_hdf5_files(_to_varlength), rule {rule}: {n} of NVIDIA's variable-length "
                 "shards", reads=("hdf5",), run=run_nvidia_chop, version=STAGE_VERSION, config=ChopConfig,
                 configure=lambda p: ChopConfig(num_shards=dag_shards(p, n), varlength=True, rule=rule,
                                                max_seq_length=p.max_seq_length,
                                                max_predictions_per_seq=p.max_predictions_per_seq),
                 key_params=stage_params, plan=_plan_chop, finish=_finish_chop, outputs={output: ""},
                 when=lambda p: any(t in _targets(p) for t in targets))


#: Each stage pairs a rule with the published list it matches (the rule is in the stage key: ChopConfig.rule):
#: the 4320-shard set by v3.1's rule (NVIDIA's hdf5_4320_shards_varlength as v3.1's 4320_shards_varlength.chk lists
#: it: what ``nvidia-varlength`` hands to the trainer and ``nvidia-4320`` shuffles), the 2048-shard one by v1.1's
#: rule (2048_shards_varlength.chk, the same in both rounds: ``nvidia-2048-varlength``; ``nvidia-2048`` shuffles
#: the same rows from the padded parts) and the 4320-shard set by v1.1's rule
#: (v1.1's 4320_shards_varlength.chk: ``nvidia-4320-v1.1``). ``nvidia-packed`` does not need them: it packs the
#: padded parts (preprocessing/nvidia/pack.py). The shards lie at the top of the stage folder (NVIDIA's trainer takes
#: the files whose name holds ``part_``; the manifest's name does not).
DAG_STAGES = (_stage("nvidia_4320", 4320, "v3.1", ("nvidia-varlength",), "nvidia_4320_varlength_dir"),
              _stage("nvidia_2048", 2048, "v1.1", ("nvidia-2048-varlength",), "nvidia_2048_varlength_dir"),
              _stage("nvidia_4320_v11", 4320, "v1.1", ("nvidia-4320-v1.1",), "nvidia_4320_v11_varlength_dir"))
