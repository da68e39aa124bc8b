"""NVIDIA's shuffled shards: every row of the variable-length shards moved to a random shard (``shuffle_samples``).

Reference: NVIDIA MLPerf BERT training_results v3.0/v3.1 ``input_preprocessing/``, two scripts with the same flags
(``--input_hdf5`` and ``--output_hdf5``, both folders; spec §10):

1. the index lists: ``sorted(glob(<input_hdf5>/part_0*.hdf5))``, rows counted from ``input_ids``; the list of
   ``(file, row)`` pairs in file and row order is shuffled with ``random.Random(24).shuffle`` ("the seed is fixed
   to 24"); output shard k takes the next ``rows(input k)`` pairs (every shard keeps its input's row count) and the
   pairs are written as JSON to ``<output_hdf5>/shard_indices_<k:05>.lst``;
2. ``shuffle_samples.py``: every input loaded into memory, then for each shard its rows copied one by one, in list
   order, into ``part_<k:05d>_of_<N:05d>.hdf`` (sic: ``.hdf``; NVIDIA's published ``4320_shards_varlength_shuffled
   .chk`` names ``.hdf5`` files): the four vlen datasets as ``convert_fixed2variable.py`` creates them and
   ``next_sentence_labels`` (i1).

v2.1 shuffled with an unseeded ``random.shuffle`` of the padded shards (not reproducible); v3.0 made it the
two steps above, on the variable-length shards.

Here the same permutation is computed without the Python list (:mod:`preprocessing.pyrandom`, equal to
``random.Random(seed).shuffle``), and the rows move through a bounded external shuffle instead of the whole data
set in memory:

1. count the inputs (and check them); compute the permutation and its inverse (two arrays of n indices, on disk
   as scratch, memory-mapped by the workers);
2. scatter (parallel over input files): each input read in chunks, each row sent to the bucket of its destination
   (a bucket: consecutive output shards, about :attr:`ShuffleConfig.bucket_rows` rows), into scratch files;
3. gather (parallel over buckets): a bucket's rows read back, put in destination order, and its shards written
   (each via a temporary name, closed for good, renamed), with the index lists when ``index_lists`` is set;
4. the manifest, last; the scratch folder is removed.

Output names end in ``.hdf5`` (what the published list and NVIDIA's trainer expect); the content of each shard
equals the script's (names, dtypes, shapes, values: tests/preprocessing/nvidia/test_nvidia_shuffle.py), and so do
NVIDIA's ``hdf5_md5`` digests. Memory: 8 bytes per row of the whole set for the permutation (its inverse lives on
disk), plus one bucket per worker. Scratch disk: about the size of the input.

    bertpipe shuffle-samples --input_hdf5 hdf5_4320_shards_varlength --output_hdf5 hdf5_4320_shards_varlength_shuffled
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError
from core.manifest import (
    MANIFEST_NAME,
    Manifest,
    StageOutput,
    load_manifest,
    md5_files,
    remove_debris,
    verify_manifest,
)
from core.pools import default_workers, run_all
from core.schema import H5_ERRORS
from core.stage import Stage
from preprocessing.hdf5_check import check_compact
from preprocessing.hdf5_io import chunks, h5_create, reading, tmp_path, verify_inputs, write_vlen

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
#: The reference's input pattern (inside --input_hdf5).
INPUT_GLOB = "part_0*.hdf5"
#: Where the scatter step keeps its buckets while the stage runs (inside the output folder; removed at the end).
SCRATCH = ".shuffle-scratch"
#: NVIDIA's variable-length shard: vlen datasets (name, element dtype) in creation order, then the labels.
VLEN = (("input_ids", "int16"), ("segment_ids", "int8"), ("masked_lm_positions", "int16"), ("masked_lm_ids", "int16"))
#: In-memory scatter buffer of a scatter call before it appends to the bucket files.
FLUSH_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True)
class ShuffleConfig:
    """Parameters of the shuffle (the reference has none but its fixed seed)."""

    seed: int = 24  # random.Random(24) in the reference ("if you want a different shuffling please change")
    index_lists: bool = False  # also write the reference's shard_indices_<k:05>.lst (JSON [[file, row], ...])
    bucket_rows: int = 262144  # rows gathered in memory at once per worker (whole output shards)
    chunk_rows: int = 8192  # rows read at once


def key_params(cfg: ShuffleConfig) -> dict[str, Any]:
    """What decides the bytes (not the bucket and chunk sizes)."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("bucket_rows", "chunk_rows")}


def input_files(input_dir: str | Path) -> list[Path]:
    """The reference's inputs: ``sorted(glob(<dir>/part_0*.hdf5))``."""
    return sorted(Path(input_dir).glob(INPUT_GLOB))


def shard_name(k: int, n: int) -> str:
    return f"part_{k:05d}_of_{n:05d}.hdf5"


def list_name(k: int) -> str:
    return f"shard_indices_{k:05}.lst"


# -- step 1: count ------------------------------------------------------------------------------------------
def open_varlength(path: str | Path) -> Any:
    """Open one of NVIDIA's variable-length shards, checking its five datasets (InputError naming the file)."""
    import h5py

    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise InputError(f"HDF5 file {path} does not exist") from None
    except H5_ERRORS as exc:
        raise InputError(f"{path} is not a readable HDF5 file ({exc}); shuffle-samples reads NVIDIA's "
                         "variable-length shards (chop-hdf5 --varlength / pack-varlength)") from None
    try:
        n = None
        with reading(path, "its datasets"):
            for name, dt in (*VLEN, ("next_sentence_labels", "")):
                ds = f.get(name)
                base = h5py.check_vlen_dtype(ds.dtype) if isinstance(ds, h5py.Dataset) else None
                ok = isinstance(ds, h5py.Dataset) and len(ds.shape) == 1 and (
                    base is not None and base.kind in "iu" if dt else ds.dtype.kind in "iu")
                if not ok or (n is not None and ds.shape[0] != n):
                    raise InputError(f"{path}: no variable-length {name!r} dataset of one row per sample "
                                     "(NVIDIA's packed form: input_ids, segment_ids, masked_lm_positions, masked_lm_ids "
                                     "vlen, next_sentence_labels; make it with chop-hdf5 --varlength)")
                n = ds.shape[0]
    except BaseException:
        f.close()
        raise
    return f


def count_rows(path: str | Path) -> int:
    with open_varlength(path) as f:
        return int(f["input_ids"].shape[0])


# -- the plan: permutation, buckets -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShufflePlan:
    """Everything the scatter and gather calls need (small, picklable): inputs and counts, the scratch folder
    holding ``perm.npy`` / ``inv.npy``, and the buckets (first shard of each, and the end)."""

    files: tuple[tuple[str, int], ...]
    scratch: str
    bucket_shards: tuple[int, ...]  # bucket b holds shards bucket_shards[b] .. bucket_shards[b+1]-1
    cfg: ShuffleConfig

    @property
    def n_shards(self) -> int:
        return len(self.files)

    @property
    def starts(self) -> np.ndarray:
        """Global first destination row of every shard, and the total."""
        return np.concatenate([[0], np.cumsum([c for _, c in self.files], dtype=np.int64)])

    def bucket_rows(self) -> np.ndarray:
        """Global first destination row of every bucket, and the total."""
        return self.starts[list(self.bucket_shards)]


def make_plan(files: Sequence[tuple[str, int]], scratch: str | Path, cfg: ShuffleConfig) -> ShufflePlan:
    """Compute and store the permutation (``perm[t]``: the source row of destination row t) and its inverse."""
    from preprocessing.pyrandom import shuffle_permutation

    scratch = Path(scratch)
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    n = sum(c for _, c in files)
    perm = shuffle_permutation(n, cfg.seed)
    np.save(scratch / "perm.npy", perm)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(n, dtype=perm.dtype)
    del perm
    np.save(scratch / "inv.npy", inv)
    del inv
    return _rebuild(files, scratch, cfg)


# -- step 2: scatter ------------------------------------------------------------------------------------------------
def _flat(rows: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """A chunk of vlen rows (object array) as (lengths int32, values concatenated)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    if not len(rows) or not lengths.sum():
        return lengths, np.zeros(0, dtype=dtype)
    return lengths, np.concatenate(list(rows)).astype(dtype, copy=False)


class _Buckets:
    """Records per bucket, kept in memory and appended to ``<scratch>/b<bucket>.t<task>`` when large."""

    def __init__(self, scratch: Path, task: int) -> None:
        self.scratch, self.task = scratch, task
        self.pending: dict[int, list[bytes]] = {}
        self.size = 0

    def add(self, bucket: int, parts: Sequence[np.ndarray]) -> None:
        blob = [np.ascontiguousarray(p).tobytes() for p in parts]
        self.pending.setdefault(bucket, []).extend(blob)
        self.size += sum(map(len, blob))
        if self.size >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        for b, blobs in self.pending.items():
            with open(self.scratch / f"b{b:05d}.t{self.task:05d}", "ab") as f:
                f.write(b"".join(blobs))
        self.pending, self.size = {}, 0


def scatter(plan: ShufflePlan, task: int, file_ids: Sequence[int]) -> dict[str, Any]:
    """Send every row of inputs ``file_ids`` to the bucket of its destination (scratch files of task ``task``)."""
    scratch = Path(plan.scratch)
    inv = np.load(scratch / "inv.npy", mmap_mode="r")
    bstart = plan.bucket_rows()
    firsts = plan.starts
    out = _Buckets(scratch, task)
    rows_done = 0
    for fid in file_ids:
        path, n = plan.files[fid]
        with open_varlength(path) as f:
            if f["input_ids"].shape[0] != n:
                raise InputError(f"{path} changed while shuffle-samples ran (it had {n} rows); run again")
            for a, b in chunks(n, plan.cfg.chunk_rows):
                with reading(Path(path), f"rows {a}..{b - 1}"):
                    data = {name: f[name][a:b] for name, _ in VLEN}
                    nsl = f["next_sentence_labels"][a:b].astype(np.int8)
                dst = np.asarray(inv[firsts[fid] + a:firsts[fid] + b], dtype=np.int64)
                bucket = np.searchsorted(bstart, dst, side="right") - 1
                seq_len, ids = _flat(data["input_ids"], "int16")
                seg_len, seg = _flat(data["segment_ids"], "int8")
                pred_len, pos = _flat(data["masked_lm_positions"], "int16")
                mlm_len, mlm = _flat(data["masked_lm_ids"], "int16")
                if (seg_len != seq_len).any() or (mlm_len != pred_len).any():
                    row = int(np.flatnonzero((seg_len != seq_len) | (mlm_len != pred_len))[0])
                    raise InputError(f"{path}: row {a + row}: segment_ids / masked_lm_ids do not have the length of "
                                     "input_ids / masked_lm_positions; the file is corrupt, re-create it")
                check_compact(path, a, seq_len, pred_len, ids=ids, seg=seg, pos=pos, mlm=mlm, nsl=nsl)
                order = np.argsort(bucket, kind="stable")
                t_order = np.argsort(np.repeat(bucket, seq_len), kind="stable")
                p_order = np.argsort(np.repeat(bucket, pred_len), kind="stable")
                nb = len(bstart) - 1
                r_cut = np.concatenate([[0], np.cumsum(np.bincount(bucket, minlength=nb))])
                t_cut = np.concatenate([[0], np.cumsum(np.bincount(bucket, weights=seq_len, minlength=nb))]).astype(int)
                p_cut = np.concatenate([[0], np.cumsum(np.bincount(bucket, weights=pred_len, minlength=nb))]).astype(int)
                for bk in np.flatnonzero(np.diff(r_cut)).tolist():
                    rs = order[r_cut[bk]:r_cut[bk + 1]]
                    ts = t_order[t_cut[bk]:t_cut[bk + 1]]
                    ps = p_order[p_cut[bk]:p_cut[bk + 1]]
                    header = np.array([len(rs), len(ts), len(ps), 0], dtype=np.int64)
                    out.add(bk, [header, dst[rs], seq_len[rs], pred_len[rs], nsl[rs], ids[ts], seg[ts], pos[ps],
                                 mlm[ps]])
                rows_done += b - a
    out.flush()
    return {"kind": "scatter", "task": task, "rows": rows_done}


# -- step 3: gather and write ------------------------------------------------------------------------------------
_FIELDS = (("dst", np.int64, "r"), ("seq", np.int32, "r"), ("pred", np.int32, "r"), ("nsl", np.int8, "r"),
           ("ids", np.int16, "t"), ("seg", np.int8, "t"), ("pos", np.int16, "p"), ("mlm", np.int16, "p"))


def _read_bucket(scratch: Path, bucket: int) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {name: [] for name, _, _ in _FIELDS}
    for p in sorted(scratch.glob(f"b{bucket:05d}.t*")):
        buf = p.read_bytes()
        at = 0
        while at < len(buf):
            r, t, q, _ = np.frombuffer(buf, dtype=np.int64, count=4, offset=at).tolist()
            at += 32
            for name, dt, kind in _FIELDS:
                count = {"r": r, "t": t, "p": q}[kind]
                parts[name].append(np.frombuffer(buf, dtype=dt, count=count, offset=at))
                at += count * np.dtype(dt).itemsize
    return {name: (np.concatenate(v) if v else np.zeros(0, dtype=dt))
            for (name, dt, _), v in zip(_FIELDS, parts.values(), strict=True)}


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] .. starts[i] + lengths[i] - 1`` for every i, concatenated."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    # 4-byte indices where they fit (half the memory traffic of the repeat and the gathers); the same values
    dt = np.int32 if max(total, int(starts.max()) + int(lengths.max())) < 2**31 else np.int64
    shift = np.repeat((starts - (np.cumsum(lengths) - lengths)).astype(dt), lengths)
    shift += np.arange(total, dtype=dt)
    return shift


def _index_list(perm: np.ndarray, file_starts: np.ndarray) -> str:
    """NVIDIA's ``json.dumps`` of the (file, row) pairs of source rows ``perm``."""
    f = np.searchsorted(file_starts, perm, side="right") - 1
    r = perm - file_starts[f]
    return "[" + ", ".join(f"[{a}, {b}]" for a, b in zip(f.tolist(), r.tolist(), strict=True)) + "]"


def gather(plan: ShufflePlan, bucket: int, out_dir: str | Path) -> dict[str, Any]:
    """Write the shards of ``bucket`` into ``out_dir``; returns their entries ``[name, bytes, md5]``."""
    import h5py

    out_dir = Path(out_dir)
    data = _read_bucket(Path(plan.scratch), bucket)
    order = np.argsort(data["dst"], kind="stable")
    k0, k1 = plan.bucket_shards[bucket], plan.bucket_shards[bucket + 1]
    starts = plan.starts
    if not np.array_equal(data["dst"][order], np.arange(starts[k0], starts[k1])):
        raise InputError(f"shuffle-samples: the scratch of shards {k0}..{k1 - 1} is incomplete (in {plan.scratch}); "
                         "run again")
    seq, pred = data["seq"][order], data["pred"][order]
    t_start = np.concatenate([[0], np.cumsum(data["seq"])[:-1]]).astype(np.int64)[order]
    p_start = np.concatenate([[0], np.cumsum(data["pred"])[:-1]]).astype(np.int64)[order]
    ti, pi = _ranges(t_start, seq), _ranges(p_start, pred)
    cols = {"input_ids": data["ids"][ti], "segment_ids": data["seg"][ti], "masked_lm_positions": data["pos"][pi],
            "masked_lm_ids": data["mlm"][pi]}
    nsl = data["nsl"][order]
    del data
    t_cum = np.concatenate([[0], np.cumsum(seq, dtype=np.int64)])
    p_cum = np.concatenate([[0], np.cumsum(pred, dtype=np.int64)])
    perm = np.load(Path(plan.scratch) / "perm.npy", mmap_mode="r") if plan.cfg.index_lists else None
    finals: list[Path] = []
    for k in range(k0, k1):
        a, b = int(starts[k] - starts[k0]), int(starts[k + 1] - starts[k0])
        final = out_dir / shard_name(k, plan.n_shards)
        tmp = tmp_path(final)
        try:
            with h5_create(tmp, in_memory=(t_cum[b] - t_cum[a]) * 3 <= (8 << 20)) as f:
                dsets = {name: f.create_dataset(name, (b - a,), dtype=h5py.vlen_dtype(np.dtype(dt)))
                         for name, dt in VLEN}
                labels = f.create_dataset("next_sentence_labels", data=np.zeros(b - a, dtype="i1"), dtype="i1")
                for c0, c1 in chunks(b - a, plan.cfg.chunk_rows):
                    r0, r1 = a + c0, a + c1
                    for name, _ in VLEN:
                        lens, cum = (seq, t_cum) if name in ("input_ids", "segment_ids") else (pred, p_cum)
                        write_vlen(dsets[name], cols[name][cum[r0]:cum[r1]], lens[r0:r1], c0)  # one HDF5 write
                    labels[c0:c1] = nsl[r0:r1]
            os.replace(tmp, final)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)
            from core.manifest import raise_if_disk_full

            raise_if_disk_full(exc, final)
            raise
        finals.append(final)
        if perm is not None:
            lst = out_dir / list_name(k)
            ltmp = tmp_path(lst)
            ltmp.write_text(_index_list(np.asarray(perm[starts[k]:starts[k + 1]], dtype=np.int64), starts),
                            encoding="ascii")
            os.replace(ltmp, lst)
            finals.append(lst)
    return {"kind": "shards", "bucket": bucket,
            "entries": [[p.name, p.stat().st_size, md5] for p, md5 in zip(finals, md5_files(finals), strict=True)]}


# -- step 4: the manifest ------------------------------------------------------------------------------------------
def finish_shuffle(out_dir: str | Path, plan: ShufflePlan, written: Sequence[dict[str, Any]],
                   upstream: Sequence[Manifest] = (), *, manifest_name: str = MANIFEST_NAME) -> Manifest:
    """The stage manifest (every shard, and list, in order); the scratch folder removed first."""
    shutil.rmtree(plan.scratch, ignore_errors=True)
    got = {e[0]: e[2] for w in written for e in w["entries"]}
    names = [shard_name(k, plan.n_shards) for k in range(plan.n_shards)]
    if plan.cfg.index_lists:
        names += [list_name(k) for k in range(plan.n_shards)]
    missing = [nm for nm in names if nm not in got]
    if missing:  # pragma: no cover - the buckets cover every shard by construction
        raise InputError(f"shuffle-samples: {len(missing)} file(s) were not written (e.g. {missing[0]}); run again")
    with StageOutput(out_dir, "nvidia_shuffle", params=key_params(plan.cfg), upstream=upstream,
                     code_version=STAGE_VERSION, manifest_name=manifest_name) as out:
        for nm in names:
            out.add_file(nm, got[nm])
        out.count("files", plan.n_shards)
        out.count("rows", int(plan.starts[-1]))
    return out.manifest


# -- all steps in one call ------------------------------------------------------------------------------------------
def scatter_tasks(plan: ShufflePlan, workers: int) -> list[tuple[int, list[int]]]:
    """(task, input files) calls: about 4 per worker, contiguous runs of files of similar row counts."""
    n = plan.n_shards
    t = max(1, min(n, 4 * max(1, workers)))
    bounds = [n * i // t for i in range(t + 1)]
    return [(i, list(range(a, b))) for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)) if b > a]


def _begin(out_dir: Path, manifest_name: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / manifest_name).unlink(missing_ok=True)
    remove_debris(out_dir)


def run_nvidia_shuffle(inputs: Sequence[Path], out_dir: Path, cfg: ShuffleConfig = ShuffleConfig(), *,
                       upstream: Sequence[Manifest] = (), workers: int = 1,
                       manifest_name: str = MANIFEST_NAME) -> Manifest:
    """Stage function: ``out_dir/part_<k:05d>_of_<N:05d>.hdf5`` for each of the N inputs (given in the reference's
    order, sorted part_0*.hdf5), rows shuffled across shards as NVIDIA's scripts do; manifest last."""
    files = [Path(p) for p in inputs]
    if not files:
        raise InputError(f"shuffle-samples got no input files (the reference reads <input_hdf5>/{INPUT_GLOB})")
    verify_inputs(files, upstream, workers=workers)
    counts = run_all(count_rows, [(str(p),) for p in files], workers)
    out_dir = Path(out_dir)
    _begin(out_dir, manifest_name)
    plan = make_plan(list(zip(map(str, files), counts, strict=True)), out_dir / SCRATCH, cfg)
    try:
        log.info("%d rows of %d shards: permutation of random.Random(%d) ready; %d bucket(s)", sum(counts),
                 len(files), cfg.seed, len(plan.bucket_shards) - 1)
        run_all(scatter, [(plan, t, ids) for t, ids in scatter_tasks(plan, workers)], workers)
        written = run_all(gather, [(plan, b, str(out_dir)) for b in range(len(plan.bucket_shards) - 1)], workers)
        return finish_shuffle(out_dir, plan, written, upstream, manifest_name=manifest_name)
    finally:
        shutil.rmtree(plan.scratch, ignore_errors=True)


# -- the DAG's declaration (core/stage.py); the lead wires it into preprocessing/registry.py -------------------------
def count_piece(paths: Sequence[str], up_dir: str, out_dir: Path, cfg: ShuffleConfig) -> dict[str, Any]:
    """DAG piece: check the upstream shards against their manifest, count every input's rows."""
    verify_manifest(up_dir, trust_stat=True)
    return {"kind": "count-list", "counts": [[p, count_rows(p)] for p in paths]}


def scatter_piece(plan: ShufflePlan, task: int, file_ids: list[int], out_dir: Path) -> dict[str, Any]:
    return scatter(plan, task, file_ids)


def gather_piece(plan: ShufflePlan, bucket: int, out_dir: Path) -> dict[str, Any]:
    return gather(plan, bucket, out_dir)


def _plan_stage(upstream_stage: str):
    def plan_fn(plan: Any) -> list[Any]:
        up = plan.result(upstream_stage)
        files = [str(p) for p in input_files(up.dir)]
        if not files:
            raise InputError(f"{up.dir} holds no {INPUT_GLOB} shards to shuffle")
        return [replace(plan.unit(files, str(up.dir), cfg=plan.cfg, shard="count", upstream=[up.dir]),
                        run=count_piece, piece=True, pass_upstream=False, out_dir=str(plan.dir))]

    return plan_fn


def _finish_stage(upstream_stage: str):
    def finish_fn(plan: Any, values: list[dict[str, Any]]) -> Manifest | list[Any]:
        workers = plan.params.workers or default_workers()
        counts = [c for v in values if v["kind"] == "count-list" for c in v["counts"]]
        scattered = [v for v in values if v["kind"] == "scatter"]
        written = [v for v in values if v["kind"] == "shards"]
        out_dir = Path(plan.dir)
        if not scattered:  # after the count: the permutation, then the scatter pieces
            _begin(out_dir, MANIFEST_NAME)
            sp = make_plan(counts, out_dir / SCRATCH, plan.cfg)
            return [replace(plan.unit(sp, t, ids, shard=f"scatter/{t:05d}", upstream=[]),
                            run=scatter_piece, piece=True, pass_upstream=False, out_dir=str(out_dir))
                    for t, ids in scatter_tasks(sp, workers)]
        sp = _rebuild(counts, out_dir / SCRATCH, plan.cfg)
        if not written:
            return [replace(plan.unit(sp, b, shard=f"gather/{b:05d}", upstream=[]),
                            run=gather_piece, piece=True, pass_upstream=False, out_dir=str(out_dir))
                    for b in range(len(sp.bucket_shards) - 1)]
        up = load_manifest(plan.result(upstream_stage).dir)
        return finish_shuffle(out_dir, sp, written, [up] if up is not None else [])

    return finish_fn


def _rebuild(files: Sequence[tuple[str, int]], scratch: Path, cfg: ShuffleConfig) -> ShufflePlan:
    """The plan of :func:`make_plan` again, without recomputing the permutation (already in ``scratch``)."""
    bounds, acc = [0], 0
    for k, (_, c) in enumerate(files):
        acc += c
        if acc >= cfg.bucket_rows and k + 1 < len(files):
            bounds.append(k + 1)
            acc = 0
    bounds.append(len(files))
    return ShufflePlan(files=tuple((str(p), int(c)) for p, c in files), scratch=str(scratch),
                       bucket_shards=tuple(bounds), cfg=cfg)


def _stage(name: str, reads: str, targets: tuple[str, ...], output: str) -> Stage:
    return Stage(name=name, title=f"shuffle_samples: {reads}'s rows shuffled across its shards (random.Random(24))",
                 reads=(reads,), run=run_nvidia_shuffle, version=STAGE_VERSION, config=ShuffleConfig,
                 configure=lambda p: ShuffleConfig(), key_params=key_params, plan=_plan_stage(reads),
                 finish=_finish_stage(reads), outputs={output: ""},
                 when=lambda p: any(t in tuple(getattr(p, "targets", ()) or ()) for t in targets))


#: NVIDIA's v3.x training sets (hdf5_<N>_shards_varlength_shuffled: the shards at the top of the stage folder).
DAG_STAGES = (_stage("nvidia_4320_shuffled", "nvidia_4320", ("nvidia-4320",), "nvidia_4320_shuffled_dir"),
              _stage("nvidia_2048_shuffled", "nvidia_2048", ("nvidia-2048",), "nvidia_2048_shuffled_dir"))
