"""Packed rows (pretrain/packing.py, the model's packed forward): a packed batch is the same sequences unpadded.

Fixtures: real rows of the golden ``sample.hdf5`` packed by ``best_fit_packs`` (at most 3 a pack) and written in
Habana's and NVIDIA's packed layouts; and the golden 128 bin packed by bertpipe's pack-habana / pack-nvidia
stages (the vendors' packers re-done), read back as exactly the golden sequences. The test that matters: loss and every parameter gradient of a packed
batch equal those of the same sequences as padded rows (fp32, <= 1e-5 relative), with either attention path.
"""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from core.errors import InputError
from pretrain.packing import (
    HABANA_DTYPES,
    NVIDIA_DTYPES,
    PACKED_FIELDS,
    best_fit_packs,
    discover_packed,
    pack_rows,
    read_habana,
    read_nvidia,
    real_counts,
    sequence_lengths,
    training_sampler,
    write_habana,
    write_nvidia,
)

torch = pytest.importorskip("torch")

from pretrain.config import model_config  # noqa: E402
from pretrain.model import BertForPreTraining, reference_varlen  # noqa: E402

TOL = 1e-5


@pytest.fixture(scope="module")
def rows(golden) -> dict[str, np.ndarray]:
    """The first 600 rows of the golden sample (real data: 512 columns, 76 prediction slots)."""
    with h5py.File(golden / "sample.hdf5") as f:
        return {k: f[k][:600] for k in f}


def take(rows: dict, idx) -> dict[str, np.ndarray]:
    return {k: np.asarray(v)[list(idx)] for k, v in rows.items()}


@pytest.fixture(scope="module")
def case(rows):
    """(padded rows in pack order, packed rows): 10 real rows of all lengths -> packs of 3, 2 and 1 sequences."""
    lengths = sequence_lengths(rows)
    pick = []
    for lo, hi, n in ((1, 128, 5), (129, 256, 3), (257, 384, 1), (385, 512, 1)):
        pick += list(np.flatnonzero((lengths >= lo) & (lengths <= hi))[:n])
    sel = take(rows, pick)
    packs = best_fit_packs(sequence_lengths(sel), 512, 3)
    assert sorted(len(p) for p in packs)[0] < 3 and max(len(p) for p in packs) == 3  # mixed pack sizes
    order = [r for p in packs for r in p]  # sequences in the order the packs hold them
    return take(sel, order), pack_rows(sel, packs, 512)


def tensors(arrays: dict) -> dict:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}


def model(large: bool = False, static: bool = False) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(model_config("tiny", layer_norm_large_model=large), static_mlm=static).eval()


def loss_and_grads(m: BertForPreTraining, batch: dict):
    m.zero_grad(set_to_none=True)
    out = m(**tensors(batch))
    out.loss.backward()
    return out, {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def rel(a, b) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.fixture(scope="module")
def padded_reference(case):
    """Loss and gradients of the padded rows, per model variant (computed once)."""
    cache = {}

    def get(large: bool):
        if large not in cache:
            cache[large] = loss_and_grads(model(large), case[0])
        return cache[large]
    return get


@pytest.mark.parametrize("kernel", ["sdpa-mask", "varlen", "split_varlen", "nested_varlen"])  # (flex: no CPU backward)
@pytest.mark.parametrize("large", [False, True])
def test_packed_batch_has_the_loss_and_gradients_of_the_same_sequences_padded(case, padded_reference, kernel, large):
    _, packed = case
    m = model(large)
    m.varlen_kernel = {"sdpa-mask": None, "varlen": reference_varlen}.get(kernel, kernel)
    ref, ref_grads = padded_reference(large)
    out, grads = loss_and_grads(m, packed)
    assert m.packed_attention == {"sdpa-mask": "sdpa-block-diagonal-mask", "varlen": "varlen:reference_varlen"
                                  }.get(kernel, f"varlen:{kernel}")
    assert int(out.mlm_count) == int(ref.mlm_count) > 0 and int(out.mlm_correct) == int(ref.mlm_correct)
    diffs = {f: rel(getattr(out, f), getattr(ref, f)) for f in ("loss", "mlm_loss", "nsp_loss")}
    assert set(grads) == set(ref_grads) and all(g.abs().max() > 0 for g in ref_grads.values())
    diffs.update({n: rel(grads[n], ref_grads[n]) for n in grads})
    worst = max(diffs, key=diffs.get)
    print(f"\n{kernel} large={large}: max relative difference {diffs[worst]:.2e} ({worst}); "
          f"loss {diffs['loss']:.1e}")
    assert diffs[worst] <= TOL, (worst, diffs[worst])


def test_static_shapes_packed_equal_dynamic(case):
    padded, packed = case
    dynamic, static = model(), model(static=True)
    a, b = dynamic(**tensors(padded)), static(**tensors(packed))
    assert b.nsp_logits.shape == (len(packed["input_ids"]) * 3, 2)  # every sequence slot
    for f in ("loss", "mlm_loss", "nsp_loss"):
        assert rel(getattr(b, f), getattr(a, f)) <= TOL
    keep = torch.from_numpy(packed["next_sentence_weights"].flatten() != 0)
    torch.testing.assert_close(b.nsp_logits[keep], a.nsp_logits, rtol=TOL, atol=1e-6)


@pytest.mark.parametrize("kernel", [None, reference_varlen, "split_varlen", "nested_varlen", "flex_varlen"])
def test_attention_never_crosses_sequences(case, kernel):
    """Changing one sequence of a pack leaves every other sequence's outputs bit for bit the same."""
    _, packed = case
    m = model()
    m.varlen_kernel = kernel
    p = int(np.flatnonzero(packed["next_sentence_weights"].sum(1) == 3)[0])  # a pack of 3 sequences
    other = {k: v.copy() for k, v in packed.items()}
    second = other["input_mask"][p] == 2
    rng = np.random.default_rng(0)
    other["input_ids"][p, second] = rng.integers(1000, 30000, int(second.sum()))
    other["segment_ids"][p, second] = 1 - other["segment_ids"][p, second]
    with torch.no_grad():
        a = m.sequence_output(*(torch.from_numpy(packed[k]) for k in ("input_ids", "segment_ids", "input_mask",
                                                                       "positions")))
        b = m.sequence_output(*(torch.from_numpy(other[k]) for k in ("input_ids", "segment_ids", "input_mask",
                                                                      "positions")))
    seq = torch.from_numpy(packed["input_mask"])
    assert not torch.equal(a[p][seq[p] == 2], b[p][seq[p] == 2])
    assert torch.equal(a[p][(seq[p] == 1) | (seq[p] == 3)], b[p][(seq[p] == 1) | (seq[p] == 3)])
    rows_unchanged = torch.arange(len(seq)) != p
    assert torch.equal(a[rows_unchanged], b[rows_unchanged])


def test_positions_restart_and_embeddings_are_the_unpacked_ones(case):
    padded, packed = case
    m = model()
    with torch.no_grad():
        emb_packed = m.embeddings(*(torch.from_numpy(packed[k]).long() for k in ("input_ids", "segment_ids",
                                                                                   "positions")))
        emb_padded = m.embeddings(*(torch.from_numpy(padded[k]).long() for k in ("input_ids", "segment_ids")))
    lengths = sequence_lengths(padded)
    r = 0
    for p in range(len(packed["input_ids"])):
        for s in range(int(packed["next_sentence_weights"][p].sum())):
            start, n = int(packed["next_sentence_positions"][p, s]), int(lengths[r])
            assert packed["positions"][p, start:start + n].tolist() == list(range(n))
            assert (packed["input_mask"][p, start:start + n] == s + 1).all()
            assert packed["input_ids"][p, start] == 101  # the sequence's [CLS] is where NSP reads it
            assert torch.equal(emb_packed[p, start:start + n], emb_padded[r, :n])
            r += 1
    assert r == len(padded["input_ids"])


def test_next_sentence_prediction_is_per_sequence(case):
    padded, packed = case
    m = model()
    with torch.no_grad():
        a, b = m(**tensors(padded)), m(**tensors(packed))
        torch.testing.assert_close(b.nsp_logits, a.nsp_logits, rtol=TOL, atol=1e-6)  # one row per sequence
        flipped = {k: v.copy() for k, v in packed.items()}
        p, s = 0, int(packed["next_sentence_weights"][0].sum()) - 1  # the last sequence of pack 0
        flipped["next_sentence_labels"][p, s] = 1 - flipped["next_sentence_labels"][p, s]
        c = m(**tensors(flipped))
    r = s  # pack 0's sequences come first in the padded order
    ce = torch.nn.functional.cross_entropy
    old = ce(a.nsp_logits[r:r + 1], torch.tensor([int(padded["next_sentence_labels"][r])]))
    new = ce(a.nsp_logits[r:r + 1], torch.tensor([1 - int(padded["next_sentence_labels"][r])]))
    n_seq = len(padded["input_ids"])
    torch.testing.assert_close(c.nsp_loss - b.nsp_loss, (new - old) / n_seq, rtol=1e-4, atol=1e-6)
    assert real_counts(packed) == (n_seq, int(sequence_lengths(padded).sum()))


@pytest.fixture(scope="module")
def packed_dirs(rows, tmp_path_factory):
    """The 600 rows packed into Habana files (2 parts) and NVIDIA files (2 shards without suffix)."""
    packs = best_fit_packs(sequence_lengths(rows), 512, 3)
    packed = pack_rows(rows, packs, 512)
    root = tmp_path_factory.mktemp("packed")
    habana, nvidia = root / "habana", root / "nvidia"
    habana.mkdir()
    nvidia.mkdir()
    half = len(packs) // 2
    for k, sl in enumerate((slice(0, half), slice(half, None))):
        part = {f: v[sl] for f, v in packed.items()}
        write_habana(habana / f"mixed_strategies_part_{k}.hdf5", part)
        write_nvidia(nvidia / f"output_{k:05}", part)
    (habana.parent / "habana_metadata.json").write_text("{}")  # (the packer writes it beside the folder)
    return rows, packs, packed, habana, nvidia


def test_the_two_layouts_on_disk(packed_dirs):
    *_, habana, nvidia = packed_dirs
    with h5py.File(habana / "mixed_strategies_part_0.hdf5") as f:
        assert {k: f[k].dtype.str[1:] for k in f} == HABANA_DTYPES
        assert f["input_ids"].shape[1] == 512 and f["masked_lm_positions"].shape[1] == 79
        assert f["next_sentence_positions"].shape[1] == 3
    with h5py.File(nvidia / "output_00000") as f:
        assert {k: h5py.check_vlen_dtype(f[k].dtype).name for k in f} == NVIDIA_DTYPES
        lens = f["packed_input_len"][0]
        assert len(f["input_ids"][0]) == lens.sum() and len(f["next_sentence_labels"][0]) == len(lens)
        assert sum(f["packed_masked_lm_len"][0]) == len(f["masked_lm_positions"][0])


def test_both_layouts_read_back_the_packs(packed_dirs):
    rows, packs, packed, habana, nvidia = packed_dirs
    for folder, layout in ((habana, "habana"), (nvidia, "nvidia")):
        found_layout, bins = discover_packed(folder)
        assert found_layout == layout and list(bins) == [512]
        shards = bins[512]
        assert sum(s.rows for s in shards) == len(packs)
        reader = read_habana if layout == "habana" else read_nvidia
        files = np.concatenate([np.full(s.rows, i) for i, s in enumerate(shards)])
        within = np.concatenate([np.arange(s.rows) for s in shards])
        order = np.random.default_rng(1).permutation(len(files))  # any order, across files
        handles = {}
        got = reader(shards, files[order], within[order], 512, handles)
        for h in handles.values():
            h.close()
        assert set(got) == set(PACKED_FIELDS)
        for k in PACKED_FIELDS:
            np.testing.assert_array_equal(got[k], packed[k][order], err_msg=f"{layout} {k}")
    # and each pack's sequences are the original rows
    lengths = sequence_lengths(rows)
    for p, members in enumerate(packs):
        for s, r in enumerate(members):
            start, n = int(packed["next_sentence_positions"][p, s]), int(lengths[r])
            np.testing.assert_array_equal(packed["input_ids"][p, start:start + n], rows["input_ids"][r, :n])
            np.testing.assert_array_equal(packed["segment_ids"][p, start:start + n], rows["segment_ids"][r, :n])
            mine = (packed["input_mask"][p][packed["masked_lm_positions"][p]] == s + 1) & (
                packed["masked_lm_positions"][p] != 0)
            k = int((rows["masked_lm_positions"][r] != 0).sum())
            np.testing.assert_array_equal(packed["masked_lm_positions"][p][mine] - start,
                                          rows["masked_lm_positions"][r, :k])
            np.testing.assert_array_equal(packed["masked_lm_ids"][p][mine], rows["masked_lm_ids"][r, :k])
            assert packed["next_sentence_labels"][p, s] == rows["next_sentence_labels"][r]


@pytest.mark.parametrize("which", ["habana", "nvidia"])
def test_sampler_splits_packs_per_rank_and_resumes_exactly(packed_dirs, which):
    *_, habana, nvidia = packed_dirs
    folder = habana if which == "habana" else nvidia
    r0, layout = training_sampler(str(folder), True, 4, rank=0, world=2, seed=3, vocab_size=30522)
    r1, _ = training_sampler(str(folder), False, 4, rank=1, world=2, seed=3, vocab_size=30522)  # detected
    assert layout == which and r0.layout == f"packed-{which}" and r0.steps_per_epoch == r1.steps_per_epoch
    seen0, seen1 = set(), set()
    for _ in range(r0.steps_per_epoch):
        a, b = r0.next_batch(), r1.next_batch()
        assert a.arrays["input_ids"].shape == (4, 512) and set(a.arrays) == set(PACKED_FIELDS)
        seen0.update(map(bytes, a.arrays["input_ids"].astype(np.int32)))
        seen1.update(map(bytes, b.arrays["input_ids"].astype(np.int32)))
    assert seen0.isdisjoint(seen1) and len(seen0) == len(seen1) == 4 * r0.steps_per_epoch
    for _ in range(3):
        r0.next_batch()  # into epoch 1
    state = r0.state_dict()
    expected = [r0.next_batch().arrays for _ in range(4)]
    again, _ = training_sampler(str(folder), True, 4, rank=0, world=2, seed=3, vocab_size=30522)
    again.load_state_dict(state)
    for want in expected:
        got = again.next_batch().arrays
        assert all(np.array_equal(got[k], want[k]) for k in PACKED_FIELDS)
    padded, _ = training_sampler(str(folder), True, 4, rank=0, world=2, seed=3)
    assert padded.digest() == r0.digest()
    for s in (r0, r1, again, padded):
        s.close()


def test_packed_flag_on_padded_rows_and_bad_packed_files_are_refused(golden, packed_dirs, tmp_path):
    *_, habana, nvidia = packed_dirs
    with pytest.raises(InputError, match="--packed: .* holds no packed rows.*pack-habana"):
        training_sampler(str(golden / "4bins"), True, 4)
    plain, layout = training_sampler(str(golden / "4bins" / "128"), False, 4)  # padded rows as before
    assert layout is None and plain.layout == ""
    mixed = tmp_path / "mixed"
    shutil.copytree(habana, mixed)
    shutil.copy(nvidia / "output_00001", mixed / "z_output_00001")
    with pytest.raises(InputError, match="z_output_00001 is not in the habana layout"):
        discover_packed(mixed)
    broken = tmp_path / "broken"
    shutil.copytree(habana, broken)
    with h5py.File(broken / "mixed_strategies_part_1.hdf5", "a") as f:
        del f["next_sentence_weights"]
    with pytest.raises(InputError, match="mixed_strategies_part_1.hdf5 lacks dataset.*next_sentence_weights"):
        discover_packed(broken)
    wide = tmp_path / "wide"
    shutil.copytree(habana, wide)
    with h5py.File(wide / "mixed_strategies_part_0.hdf5", "a") as f:
        ids = f["input_ids"][:]
        del f["input_ids"]
        f["input_ids"] = np.pad(ids, ((0, 0), (0, 4)))
    with pytest.raises(InputError, match="wrong shapes"):
        discover_packed(wide)


def test_cli_refuses_packed_flag_on_padded_rows(golden, packed_dirs, tmp_path, capsys):
    from bertpipe.cli import main

    rc = main(["train", "--packed", "--train-dir", str(golden / "4bins"), "--output-dir", str(tmp_path / "o"),
               "--nproc", "2", "--dry-run"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "holds no packed rows" in err[0] and "Traceback" not in err[0]
    rc = main(["train", "--packed", "--train-dir", str(packed_dirs[3]), "--output-dir", str(tmp_path / "o"),
               "--model", "tiny", "--nproc", "2", "--device", "cpu", "--dry-run"])
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and "--packed" in out and str(packed_dirs[3]) in out


def test_best_fit_packs_respects_the_limits():
    lengths = np.random.default_rng(0).integers(1, 513, 2000)
    packs = best_fit_packs(lengths, 512, 3)
    assert sorted(i for p in packs for i in p) == list(range(2000))
    assert all(len(p) <= 3 and lengths[p].sum() <= 512 for p in packs)
    assert lengths.sum() / (512 * len(packs)) > 0.9
    with pytest.raises(InputError, match="do not fit"):
        best_fit_packs(np.array([10, 513]), 512)


@pytest.fixture(scope="module")
def vendor_packs(golden, tmp_path_factory):
    """bertpipe's pack-habana and pack-nvidia stages (the vendors' packers re-done exactly) on the golden
    128 bin, packed to 128 tokens (so that their NNLS recipes take seconds)."""
    from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana
    from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia

    files = sorted((golden / "4bins" / "128").glob("part_*.hdf5"))
    root = tmp_path_factory.mktemp("vendor")
    run_pack_habana(files, root / "habana", HabanaPackConfig(max_sequence_length=128))
    run_pack_nvidia(files, root / "nvidia", PackNvidiaConfig(max_seq_length=128, shards_num=4))
    rows = {}
    for f in files:
        with h5py.File(f) as h:
            for k in h:
                rows.setdefault(k, []).append(h[k][:])
    return {k: np.concatenate(v) for k, v in rows.items()}, root / "habana", root / "nvidia"


@pytest.mark.parametrize("which", ["habana", "nvidia"])
def test_vendor_packed_files_are_the_golden_sequences_and_train_like_them(vendor_packs, which):
    rows, habana, nvidia = vendor_packs
    layout, bins = discover_packed(habana if which == "habana" else nvidia)  # (folders hold a manifest, lists)
    assert layout == which and list(bins) == ([128] if which == "habana" else [512])
    (width, shards), = bins.items()
    files = np.concatenate([np.full(s.rows, i) for i, s in enumerate(shards)])
    within = np.concatenate([np.arange(s.rows) for s in shards])
    handles = {}
    got = (read_habana if which == "habana" else read_nvidia)(shards, files, within, width, handles)
    for h in handles.values():
        h.close()
    lengths = sequence_lengths(rows)
    index = {rows["input_ids"][r, :lengths[r]].tobytes(): r for r in range(len(lengths))}
    seen = []
    for p in range(len(got["input_ids"])):
        for s in range(int(got["next_sentence_weights"][p].sum())):
            mine = got["input_mask"][p] == s + 1
            start, n = int(got["next_sentence_positions"][p, s]), int(mine.sum())
            assert mine[start:start + n].all() and got["positions"][p, start:start + n].tolist() == list(range(n))
            r = index[got["input_ids"][p, start:start + n].astype(rows["input_ids"].dtype).tobytes()]
            np.testing.assert_array_equal(got["segment_ids"][p, start:start + n], rows["segment_ids"][r, :n])
            slots = (got["masked_lm_positions"][p] != 0) & mine[got["masked_lm_positions"][p]]
            k = int((rows["masked_lm_positions"][r] != 0).sum())
            np.testing.assert_array_equal(got["masked_lm_positions"][p][slots] - start, rows["masked_lm_positions"][r, :k])
            np.testing.assert_array_equal(got["masked_lm_ids"][p][slots], rows["masked_lm_ids"][r, :k])
            assert got["next_sentence_labels"][p, s] == rows["next_sentence_labels"][r]
            seen.append(r)
    assert sorted(seen) == list(range(len(lengths)))  # every golden sequence once
    # the first 6 packs: loss and NSP logits of the same sequences as padded rows
    first = slice(0, 6)
    members = seen[:int(got["next_sentence_weights"][first].sum())]
    m = model()
    with torch.no_grad():
        a = m(**tensors(take(rows, members)))
        b = m(**tensors({k: v[first] for k, v in got.items()}))
    assert rel(b.loss, a.loss) <= TOL and int(a.mlm_count) == int(b.mlm_count)
    torch.testing.assert_close(b.nsp_logits, a.nsp_logits, rtol=TOL, atol=1e-6)


def test_bench_gpu_batches_hold_the_rows_they_count(rows):
    """bench/bench_train_packed.py --gpu counts real tokens and FLOPs from the rows each batch holds."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_train_packed.py"
    spec = importlib.util.spec_from_file_location("bench_train_packed", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lengths = sequence_lengths(rows)
    for mode in ("padded", "binned", "packed"):
        for arrays, idx in bench.gpu_batches(rows, mode, 4 * 512, 6):
            assert real_counts(arrays) == (len(idx), int(lengths[idx].sum())), mode
            width = arrays["input_ids"].shape[1]
            if mode == "binned":
                assert width in (128, 256, 384, 512) and (lengths[idx] > width - 128).all()
                assert (lengths[idx] <= width).all() and len(idx) == 4 * 512 // width
            else:
                assert width == 512 and len(arrays["input_ids"]) == 4
            if mode == "packed":  # the packs hold exactly those rows, in order
                got = [arrays["input_ids"][p, s:s + lengths[r]] for p in range(4)
                       for s, r in zip(arrays["next_sentence_positions"][p][arrays["next_sentence_weights"][p] != 0],
                                       idx[sum(int(w.sum()) for w in arrays["next_sentence_weights"][:p]):], strict=False)]
                assert all(np.array_equal(g, rows["input_ids"][r, :lengths[r]]) for g, r in zip(got, idx, strict=True))
