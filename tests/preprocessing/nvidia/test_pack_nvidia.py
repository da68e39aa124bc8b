"""bertpipe pack-nvidia against NVIDIA's packed_data scripts (re-enacted: tests/preprocessing/nvidia_packed_reference.py)
and against the invariants of a packed set, read the way NVIDIA's trainer reads it (tests/loader_rules.py).

The NNLS at max_seq_length 512 takes a minute or more on a loaded 2-core machine, so the default tests pack at
smaller lengths (a flag of NVIDIA's scripts); the runs at 512 are marked slow.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest

from core.errors import InputError, RecordError
from preprocessing.nvidia.pack import (
    PACKED_DATASETS,
    PackNvidiaConfig,
    assign_packs,
    packing_recipe,
    packing_strategies,
    run_pack_nvidia,
)
from tests.loader_rules import NvidiaPackedDataset, nvidia_mlperf_training_files, nvidia_packed_batch
from tests.preprocessing import nvidia_packed_reference as ref

SIX = ref.SIX
DTYPES = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i4",
          "masked_lm_ids": "i4", "next_sentence_labels": "i1"}


# -- inputs ---------------------------------------------------------------------------------------------------------
def write_padded(path: Path, data: dict[str, np.ndarray]) -> Path:
    with h5py.File(path, "w") as f:
        for k in SIX:
            f.create_dataset(k, data=data[k], dtype=DTYPES[k])
    return path


def made_up_rows(lengths: list[int], rng: np.random.Generator, width: int = 512, preds: int = 76) -> dict:
    """Padded rows of the given lengths: random tokens, 0..min(preds, L-1) sorted masked positions in 1..L-1."""
    n = len(lengths)
    lens = np.asarray(lengths, dtype=np.int64)
    ids = rng.integers(1000, 30000, (n, width)) * (np.arange(width) < lens[:, None])
    seg = rng.integers(0, 2, (n, width)) * (np.arange(width) < lens[:, None])
    pos = np.zeros((n, preds), np.int64)
    mlm = np.zeros((n, preds), np.int64)
    for i, length in enumerate(lengths):
        k = int(rng.integers(0, min(preds, length - 1) + 1)) if length > 1 else 0
        p = np.sort(rng.choice(np.arange(1, length), size=k, replace=False)) if k else np.zeros(0, np.int64)
        pos[i, :k], mlm[i, :k] = p, rng.integers(1000, 30000, k)
    return {"input_ids": ids, "input_mask": (np.arange(width) < lens[:, None]).astype(np.int8), "segment_ids": seg,
            "masked_lm_positions": pos, "masked_lm_ids": mlm, "next_sentence_labels": rng.integers(0, 2, n)}


def to_varlength(src: Path, dst: Path) -> Path:
    from preprocessing.nvidia.varlength import pack_varlength

    pack_varlength(src, dst)
    return dst


@pytest.fixture(scope="module")
def golden_parts(golden: Path, tmp_path_factory) -> list[Path]:
    """Three padded parts of the golden sample's rows of length <= 128 (real MLPerf instances), in order (the
    ``golden`` fixture: ../shared, or in a clone the same sample.hdf5 rebuilt from tests/golden)."""
    d = tmp_path_factory.mktemp("golden_parts")
    with h5py.File(golden / "sample.hdf5", "r") as f:
        data = {k: f[k][:] for k in SIX}
    keep = np.flatnonzero(data["input_mask"].sum(axis=1) <= 128)
    return [write_padded(d / f"part-{i:05d}-of-00003.hdf5", {k: v[idx] for k, v in data.items()})
            for i, idx in enumerate(np.array_split(keep, [400, 1100]))]


# -- comparing with the reference -------------------------------------------------------------------------------------
def read_packed(path: Path) -> dict[str, tuple[np.dtype, tuple, list[np.ndarray]]]:
    with h5py.File(path, "r") as f:
        return {k: (h5py.check_vlen_dtype(f[k].dtype), f[k].shape, [np.asarray(r) for r in f[k][:]]) for k in f}


def assert_same_content(ours: Path, theirs: Path) -> None:
    a, b = read_packed(ours), read_packed(theirs)
    assert list(a) == list(b) == sorted(name for name, _ in PACKED_DATASETS), (ours, list(a))
    for name, dt in PACKED_DATASETS:
        (dta, sa, ra), (dtb, sb, rb) = a[name], b[name]
        assert dta == dtb == np.dtype(dt) and sa == sb, (ours, name, dta, dtb, sa, sb)
        for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
            assert x.dtype == y.dtype and np.array_equal(x, y), (ours, name, i, x, y)


def assert_equals_reference(out: Path, ref_dir: Path, texts: list[str], cfg: PackNvidiaConfig) -> None:
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    shards = [f"part_{i:05d}" if cfg.reference_names else f"part_{i:05d}.hdf5" for i in range(cfg.shards_num)]
    assert names == sorted(["_manifest.json", *shards, *(f"shard_list_{i:05d}.lst" for i in range(cfg.shards_num))])
    for i, text in enumerate(texts):
        assert (out / f"shard_list_{i:05d}.lst").read_text() == text, i
        assert_same_content(out / shards[i], ref_dir / f"part_{i:05d}")


def run_both(parts: list[Path], tmp_path: Path, cfg: PackNvidiaConfig, inputs: list[Path] | None = None,
             workers: int = 1, reference: tuple[Path, list[str]] | None = None) -> tuple[Path, list[str]]:
    """bertpipe on ``inputs`` (default: ``parts``) and the re-enacted scripts on ``parts`` (or their output
    ``reference``, made with the same config): the same files."""
    if reference is None:
        reference = tmp_path / "ref", ref.reference_pack(parts, tmp_path / "ref", cfg.max_seq_length,
                                                         cfg.max_seq_per_sample, cfg.shards_num, cfg.seed)
    ref_dir, texts = reference
    out = tmp_path / "ours"
    run_pack_nvidia(inputs or parts, out, cfg, workers=workers)
    assert_equals_reference(out, ref_dir, texts, cfg)
    return out, texts


# -- invariants, read as NVIDIA's trainer reads ---------------------------------------------------------------------------
def sequences_of_inputs(parts: list[Path]) -> Counter:
    out: Counter = Counter()
    for p in parts:
        with h5py.File(p, "r") as f:
            d = {k: f[k][:] for k in SIX}
        for i in range(len(d["input_ids"])):
            n, m = int(d["input_mask"][i].sum()), int((d["masked_lm_positions"][i] != 0).sum())
            out[(tuple(d["input_ids"][i, :n].tolist()), tuple(d["segment_ids"][i, :n].tolist()),
                 tuple(d["masked_lm_positions"][i, :m].tolist()), tuple(d["masked_lm_ids"][i, :m].tolist()),
                 int(d["next_sentence_labels"][i]))] += 1
    return out


def check_invariants(out: Path, parts: list[Path], cfg: PackNvidiaConfig) -> None:
    """<= max_seq_per_sample sequences and <= max_seq_length tokens a pack; every input sequence exactly once;
    every file read by NVIDIA's packed Dataset and preprocess_batch, which give back the sequences."""
    files = nvidia_mlperf_training_files(out)
    assert len(files) == cfg.shards_num and not any("shard_list" in f for f in files)
    seen: Counter = Counter()
    empty = 0
    for path in files:
        ds = NvidiaPackedDataset(path, cfg.max_seq_length)
        for i in range(len(ds)):
            ids, seg, mask, labels, nsp3, plen3 = ds[i]
            lens = plen3[plen3 > 0]
            # a pack whose slots were all padding holds no sequence (the reference writes such packs too)
            assert len(lens) <= cfg.max_seq_per_sample and lens.sum() == mask.sum() <= cfg.max_seq_length
            empty += not len(lens)
            batch = nvidia_packed_batch([ds[i]])
            assert np.array_equal(batch["cu_seqlens"], np.concatenate([[0], np.cumsum(lens)]))
            restart = np.concatenate([np.arange(n) for n in lens]) if len(lens) else np.zeros(0)
            assert np.array_equal(batch["position_ids"][0, :lens.sum()], restart)
            assert np.array_equal(batch["labels_nsp"], nsp3[:len(lens)])
            for j, n in enumerate(lens):
                a = int(batch["cu_seqlens"][j])
                mpos = np.flatnonzero(labels[a:a + n])  # masked ids are never 0 ([PAD])
                seen[(tuple(ids[a:a + n].tolist()), tuple(seg[a:a + n].tolist()), tuple(mpos.tolist()),
                      tuple(labels[a:a + n][mpos].tolist()), int(nsp3[j]))] += 1
    assert seen == sequences_of_inputs(parts)
    assert json.loads((out / "_manifest.json").read_text())["counters"]["empty_packs"] == empty


# -- the pieces -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target,depth", [(16, 3), (40, 3), (12, 4), (30, 2), (7, 1), (64, 3)])
def test_strategies_are_the_references_in_its_order(target, depth):
    assert packing_strategies(target, depth) == [tuple(s) for s in ref.packing_strategies(0, 1, target, depth)]


def test_strategy_count_at_512():
    assert len(packing_strategies(512, 3)) == 1 + 256 + sum((512 - a) // 2 - a + 1 for a in range(1, 171))


def test_successive_shuffles_are_one_random_generators():
    """The 512 index lists and the pack list are shuffled by one generator: each permutation continues the
    stream where the last one left it (sizes past PY_TAIL take the vectorised path)."""
    from preprocessing.pyrandom import Shuffles

    sizes = [0, 3, 1, 70000, 2, 17, 0, 100000, 5]
    ours, theirs = Shuffles(7), random.Random(7)
    for n in sizes:
        items = list(range(n))
        theirs.shuffle(items)
        assert ours.permutation(n).tolist() == items, n


def _hist(t: int, pairs: dict[int, int]) -> np.ndarray:
    h = np.zeros(t, np.int64)
    for length, n in pairs.items():
        h[length - 1] = n
    return h


HISTOGRAMS = {
    "random-64": (64, 3, np.random.default_rng(3).integers(0, 60, 64)),
    "skewed-64": (64, 3, np.r_[np.random.default_rng(4).integers(0, 5, 56), [90, 0, 120, 0, 300, 0, 500, 2000]]),
    "tiny": (32, 3, _hist(32, {3: 1, 17: 2, 30: 1})),
    "one-short-sequence": (48, 3, _hist(48, {7: 1})),  # the NNLS rounds to nothing: the gradient's top-k branch
    "three-short": (16, 3, _hist(16, {1: 1, 2: 1, 11: 1})),  # likewise
    "few-lengths": (48, 3, _hist(48, {1: 5, 24: 7, 47: 3, 48: 4})),
    "depth-2": (40, 2, np.random.default_rng(5).integers(0, 30, 40)),
    "depth-4": (24, 4, np.random.default_rng(6).integers(0, 40, 24)),
}


@pytest.mark.parametrize("case", sorted(HISTOGRAMS))
def test_recipe_equals_the_references(case):
    t, d, hist = HISTOGRAMS[case]
    ours = packing_recipe(hist, t, d)
    strategies, mixture, padding = ref.get_packing_recipe([int(x) for x in hist], t, d)
    assert ours.strategies == [tuple(s) for s in strategies]
    assert ours.mixture.dtype == mixture.dtype and np.array_equal(ours.mixture, mixture)
    assert ours.padding.dtype == padding.dtype and np.array_equal(ours.padding, padding)
    a = np.zeros((t, len(strategies)), np.int64)
    for i, s in enumerate(strategies):
        for length in s:
            a[length - 1, i] += 1
    assert np.array_equal(a @ ours.mixture, hist + ours.padding)  # every sequence packed, the rest is padding
    assert ours.stats["packs"] == int(mixture.sum()) and ours.stats["sequences"] == int(hist.sum())


def test_assignment_takes_each_index_once():
    t, d, hist = HISTOGRAMS["skewed-64"]
    asg = assign_packs(hist, packing_recipe(hist, t, d), seed=1)
    for length in range(1, t + 1):
        idx = asg.seq_idx[asg.seq_len == length]
        assert sorted(idx.tolist()) == list(range(hist[length - 1]))
        assert np.array_equal(asg.dest[asg.len_off[length] + idx], np.flatnonzero(asg.seq_len == length))
    per_pack = np.diff(asg.pack_off)
    assert per_pack.max() <= d and asg.packs == packing_recipe(hist, t, d).stats["packs"]
    sums = np.add.reduceat(asg.seq_len.astype(np.int64), asg.pack_off[:-1]) * (per_pack > 0)
    assert sums.max() <= t


def test_assignment_written_to_files_in_small_pieces_is_the_same(tmp_path):
    """``out``: seq_len, seq_idx, pack_off and dest written to files as they are made (the full set's plan in
    ~10 bytes a sequence); any piece size: the same arrays as in memory."""
    t, d, hist = HISTOGRAMS["skewed-64"]
    recipe = packing_recipe(hist, t, d)
    mem = assign_packs(hist, recipe, seed=1)
    files = assign_packs(hist, recipe, seed=1, chunk_packs=7, out=tmp_path)
    for name in ("pack_off", "seq_len", "seq_idx", "dest", "len_off"):
        a, b = getattr(mem, name), getattr(files, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    for name in ("pack_off", "seq_len", "seq_idx", "dest"):
        assert np.array_equal(np.load(tmp_path / f"{name}.npy"), getattr(mem, name)), name
    assert files.empty_packs == mem.empty_packs == int(np.count_nonzero(np.diff(mem.pack_off) == 0))


# -- whole runs against the reference ---------------------------------------------------------------------------------------
GOLDEN_CFG = PackNvidiaConfig(max_seq_length=128, shards_num=7, seed=99)


@pytest.fixture(scope="module")
def golden_reference(golden_parts, tmp_path_factory) -> tuple[Path, list[str]]:
    """The re-enacted scripts on the golden parts (GOLDEN_CFG): their folder and the shard lists' texts."""
    d = tmp_path_factory.mktemp("golden_reference")
    c = GOLDEN_CFG
    return d, ref.reference_pack(golden_parts, d, c.max_seq_length, c.max_seq_per_sample, c.shards_num, c.seed)


def test_golden_rows_equal_the_reference(golden_parts, golden_reference, tmp_path):
    cfg = GOLDEN_CFG
    out, texts = run_both(golden_parts, tmp_path, cfg, reference=golden_reference)
    check_invariants(out, golden_parts, cfg)
    m = json.loads((out / "_manifest.json").read_text())
    assert m["stage"] == "pack_nvidia" and m["counters"]["sequences"] == 1535
    assert m["counters"]["packs"] == sum(len(json.loads(t)) for t in texts)
    assert sorted(f["name"] for f in m["files"]) == sorted(p.name for p in out.iterdir() if p.name != "_manifest.json")


def test_golden_varlength_shards_in_two_workers_equal_the_reference(golden_parts, golden_reference, tmp_path):
    """NVIDIA's variable-length rows (pack-varlength of the same parts) pack the same; two workers, same bytes."""
    var = [to_varlength(p, tmp_path / p.name.replace("part-", "part_")) for p in golden_parts]
    cfg = replace(GOLDEN_CFG, reference_names=True)
    out, _ = run_both(golden_parts, tmp_path, cfg, inputs=var, workers=2, reference=golden_reference)
    one = tmp_path / "one_worker"
    run_pack_nvidia(golden_parts, one, cfg, workers=1)
    md5 = {p.name: json.loads(p.joinpath("_manifest.json").read_text())["files"] for p in (out, one)}
    assert md5[out.name] == md5[one.name]


def test_made_up_every_length_several_inputs(tmp_path):
    t = 48
    rng = np.random.default_rng(11)
    lengths = [*range(1, t + 1), *range(1, t + 1), *rng.integers(1, t + 1, 300).tolist(), *([t] * 9)]
    rng.shuffle(lengths)
    cuts = [0, 37, 38, 200, len(lengths)]  # a 1-row input among them
    parts = [write_padded(tmp_path / f"part-{i:05d}.hdf5", made_up_rows(lengths[a:b], rng, width=64, preds=12))
             for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False))]
    cfg = PackNvidiaConfig(max_seq_length=t, shards_num=6, seed=3)
    out, _ = run_both(parts, tmp_path, cfg)
    check_invariants(out, parts, cfg)


@pytest.mark.parametrize("lengths,shards", [([5, 9, 2], 4), ([16] * 3 + [1], 2), ([7], 3), ([3, 3, 3, 3, 3, 3, 8], 1)])
def test_tiny_sets_with_absent_lengths_and_empty_shards(tmp_path, lengths, shards):
    parts = [write_padded(tmp_path / "part-00000.hdf5", made_up_rows(lengths, np.random.default_rng(2), 16, 4))]
    cfg = PackNvidiaConfig(max_seq_length=16, shards_num=shards)
    out, texts = run_both(parts, tmp_path, cfg)
    check_invariants(out, parts, cfg)
    empty = sum(t == "[]" for t in texts)
    assert json.loads((out / "_manifest.json").read_text())["counters"]["empty_shards"] == empty


def test_the_seed_decides_the_packs(golden_parts, tmp_path):
    cfg = PackNvidiaConfig(max_seq_length=128, shards_num=2)
    texts = []
    for seed in (1, 2):
        run_pack_nvidia(golden_parts, tmp_path / str(seed), PackNvidiaConfig(max_seq_length=128, shards_num=2,
                                                                             seed=seed))
        texts.append((tmp_path / str(seed) / "shard_list_00000.lst").read_text())
    assert texts[0] != texts[1]
    assert cfg.seed == 12345


# -- bad input: one line naming the file -------------------------------------------------------------------------------------
def test_bad_inputs_name_the_file(tmp_path):
    rng = np.random.default_rng(0)
    good = write_padded(tmp_path / "part-00000.hdf5", made_up_rows([4, 5], rng, 16, 4))
    cfg = PackNvidiaConfig(max_seq_length=16, shards_num=1)
    not_h5 = tmp_path / "part-00001.hdf5"
    not_h5.write_bytes(b"not hdf5")
    with pytest.raises(InputError, match="part-00001.hdf5 is not a readable HDF5"):
        run_pack_nvidia([good, not_h5], tmp_path / "o1", cfg)
    no_mask = tmp_path / "part-00002.hdf5"
    with h5py.File(no_mask, "w") as f:
        f.create_dataset("input_ids", data=np.ones((2, 16), np.int32))
    with pytest.raises(InputError, match="part-00002.hdf5 has no dataset 'segment_ids'"):
        run_pack_nvidia([no_mask], tmp_path / "o2", cfg)
    long = write_padded(tmp_path / "part-00003.hdf5", made_up_rows([3, 20], rng, 32, 4))
    with pytest.raises(RecordError, match=r"part-00003.hdf5: row 1 has sequence length 20; expected 1..16"):
        run_pack_nvidia([long], tmp_path / "o3", cfg)
    empty = write_padded(tmp_path / "part-00004.hdf5", made_up_rows([], rng, 16, 4))
    with pytest.raises(InputError, match="no rows"):
        run_pack_nvidia([empty], tmp_path / "o4", cfg)
    with pytest.raises(InputError, match="max_seq_per_sample must be at least 2"):
        run_pack_nvidia([good], tmp_path / "o5", PackNvidiaConfig(max_seq_length=16, max_seq_per_sample=1))
    assert not any(p.name.startswith(".") for p in (tmp_path / "o3").iterdir())  # scratch and temp files gone


# -- at 512 (slow: the NNLS over 22,102 strategies) ---------------------------------------------------------------------------
@pytest.mark.slow
def test_golden_sample_at_512_equals_the_reference(golden, tmp_path):
    with h5py.File(golden / "sample.hdf5", "r") as f:
        data = {k: f[k][:] for k in SIX}
    parts = [write_padded(tmp_path / f"part-{i:05d}.hdf5", {k: v[idx] for k, v in data.items()})
             for i, idx in enumerate(np.array_split(np.arange(len(data["input_ids"])), 4))]
    cfg = PackNvidiaConfig(shards_num=16)
    out, _ = run_both(parts, tmp_path, cfg, workers=2)
    check_invariants(out, parts, cfg)


@pytest.mark.slow
def test_every_length_1_to_512_equals_the_reference(tmp_path):
    rng = np.random.default_rng(512)
    lengths = [*range(1, 513), *rng.integers(1, 513, 700).tolist(), *([512] * 40)]
    rng.shuffle(lengths)
    parts = [write_padded(tmp_path / f"part-{i:05d}.hdf5", made_up_rows(chunk, rng))
             for i, chunk in enumerate(np.array_split(np.asarray(lengths), 3))]
    cfg = PackNvidiaConfig(shards_num=10)
    out, _ = run_both(parts, tmp_path, cfg, workers=2)
    check_invariants(out, parts, cfg)


# -- the command -------------------------------------------------------------------------------------------------------------
def test_command_writes_what_the_library_writes(golden_parts, tmp_path):
    from bertpipe.cli import main

    out = tmp_path / "packed"
    argv = ["pack-nvidia", "--input_hdf5", str(golden_parts[0].parent), "--output-hdf5", str(out),
            "--max_seq_length", "128", "--shards-num", "3", "--seed", "5", "--workers", "1"]
    assert main(argv) == 0
    lib = tmp_path / "lib"
    run_pack_nvidia(golden_parts, lib, PackNvidiaConfig(max_seq_length=128, shards_num=3, seed=5))
    files = {p.name: json.loads((p / "_manifest.json").read_text())["files"] for p in (out, lib)}
    assert files["packed"] == files["lib"] and len(files["lib"]) == 6
    # again, into its own folder, with fewer shards: the earlier run's extra shards go (a trainer would read them)
    assert main([*argv[:-5], "2", "--seed", "5", "--workers", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.json", "part_00000.hdf5", "part_00001.hdf5",
                                                     "shard_list_00000.lst", "shard_list_00001.lst"]
    (out / "notes.txt").write_text("mine")
    assert main(argv) == 2  # a folder holding another file is refused, nothing written
    assert sorted(p.name for p in out.iterdir())[-1] == "shard_list_00001.lst"


# -- the DAG declaration (not registered yet: the lead wires the nvidia-packed target) ----------------------------------
def test_dag_pieces_write_what_the_stage_function_writes(golden_parts, tmp_path):
    """The declaration's phases (count per part, plan, scatter per part, shard groups, manifest), run as the DAG
    runs pieces (Unit.call in turn, finish after each phase), over hdf5-stage part folders with manifests."""
    from types import SimpleNamespace

    from core.manifest import Manifest, StageOutput
    from core.stage import Plan, Result
    from preprocessing.nvidia.pack import DAG_STAGES

    stage = DAG_STAGES[0]
    hdf5 = tmp_path / "work" / "hdf5" / "k0"
    manifests = {}
    for p in golden_parts:
        shard = p.name.removesuffix(".hdf5")
        with StageOutput(hdf5 / shard, "tfrecord_to_hdf5") as out:
            (hdf5 / shard).mkdir(parents=True, exist_ok=True)
            (hdf5 / shard / p.name).write_bytes(p.read_bytes())
            out.add_file(p.name)
        manifests[shard] = out.manifest
    params = SimpleNamespace(workers=2, max_seq_length=128, targets=("nvidia-packed",), nvidia_packed_shards=5,
                             pack_seed=99)
    assert stage.when(params) and not stage.when(SimpleNamespace(targets=("samsung-4bins",)))
    cfg = stage.configure(params)
    assert cfg == PackNvidiaConfig(max_seq_length=128, shards_num=5, seed=99)
    plan = Plan(stage, params, cfg, "k1", tmp_path / "work",
                {"hdf5": Result("hdf5", "k0", hdf5, manifests)}, {})
    units, values, phases = stage.plan(plan), [], 0
    while True:
        phases += 1
        values += [u.call() for u in units]
        out = stage.finish(plan, list(values))
        if isinstance(out, Manifest):
            break
        units = out
    assert phases == 4 and out.stage == "pack_nvidia" and set(out.upstream) == {f"tfrecord_to_hdf5:{m.key}"
                                                                               for m in manifests.values()}
    ref_dir = tmp_path / "direct"
    direct = run_pack_nvidia(golden_parts, ref_dir, cfg)
    assert [(f.name, f.md5) for f in out.files] == [(f.name, f.md5) for f in direct.files]
    assert not (plan.dir / ".pack_nvidia_scratch").exists()


def test_an_input_rewritten_between_the_count_and_the_scatter_is_refused(tmp_path):
    """The scatter takes the count step's lengths without reading the masks again: the input must be the file that
    was counted (its size and modification time), else one line says to run again."""
    import os

    from preprocessing.nvidia.pack import count_lengths, plan_packing, scatter_input

    rng = np.random.default_rng(31)
    part = write_padded(tmp_path / "part-00000.hdf5", made_up_rows(rng.integers(1, 17, 60).tolist(), rng,
                                                                    width=16, preds=4))
    sd = tmp_path / "scratch"
    sd.mkdir()
    cfg = PackNvidiaConfig(max_seq_length=16, shards_num=2)
    plan_packing([count_lengths(0, str(part), str(sd), cfg)], str(sd), cfg)
    assert scatter_input(0, str(part), str(sd), cfg)["rows"] == 60  # unchanged: taken
    st = part.stat()
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # rewritten in place, same size
    with pytest.raises(InputError, match=r"part-00000.hdf5 changed while pack-nvidia ran .*run again"):
        scatter_input(0, str(part), str(sd), cfg)
