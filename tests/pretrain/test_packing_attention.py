"""The packed attention kernels (pretrain/model.py): which one "auto" picks, the static-shape cu_seqlens path,
and that the step line's attention name is the kernel that ran. Exactness against the padded rows is in
test_packing.py (CPU kernels) and test_cuda_train.py (CUDA kernels, marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pretrain import model as M  # noqa: E402
from pretrain.config import model_config  # noqa: E402
from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths  # noqa: E402


def synthetic(lengths, seed=0):
    """Padded rows (512 columns, 76 slots) of the given lengths and the same rows packed (<= 3 a pack)."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    rows = {"input_ids": np.zeros((n, 512), np.int32), "input_mask": np.zeros((n, 512), np.int8),
            "segment_ids": np.zeros((n, 512), np.int8), "masked_lm_positions": np.zeros((n, 76), np.int32),
            "masked_lm_ids": np.zeros((n, 76), np.int32), "next_sentence_labels": rng.integers(0, 2, n, np.int8)}
    for r, length in enumerate(lengths):
        rows["input_ids"][r, :length] = rng.integers(1000, 30000, length)
        rows["input_ids"][r, 0] = 101
        rows["input_mask"][r, :length] = 1
        rows["segment_ids"][r, length // 2:length] = 1
        k = min(76, max(1, round(length * 0.15)))
        rows["masked_lm_positions"][r, :k] = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
        rows["masked_lm_ids"][r, :k] = rng.integers(1000, 30000, k)
    packs = best_fit_packs(sequence_lengths(rows), 512, 3)
    order = [r for p in packs for r in p]
    return {k: v[order] for k, v in rows.items()}, pack_rows(rows, packs, 512)


def tensors(a):
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in a.items()}


def test_auto_picks_per_device_dtype_and_dropout(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert M.auto_varlen_kernel(cpu, torch.float32, 0.1) is M.split_varlen
    assert M.auto_varlen_kernel(cpu, torch.bfloat16, 0.0) is M.split_varlen
    assert M.auto_varlen_kernel(torch.device("hpu"), torch.bfloat16, 0.0) is M.split_varlen
    assert M.auto_varlen_kernel(cuda, torch.float32, 0.0) is M.split_varlen
    monkeypatch.setattr(M, "_FLASH_VARLEN", None)  # flash_attn absent
    assert M.torch_varlen_available()  # PyTorch's own kernel ships with torch (>= 2.10)
    assert M.auto_varlen_kernel(cuda, torch.bfloat16, 0.0) is M.torch_varlen
    # with attention dropout (which varlen_attn lacks): the same flash kernels called with it
    assert M.auto_varlen_kernel(cuda, torch.bfloat16, 0.1) is M.aten_flash_varlen
    monkeypatch.setattr(M, "_varlen_attn", None)  # a torch without varlen_attn: the block-diagonal SDPA mask
    assert M.auto_varlen_kernel(cuda, torch.bfloat16, 0.1) is None
    assert M.auto_varlen_kernel(cuda, torch.bfloat16, 0.0) is None
    monkeypatch.setattr(M, "_FLASH_VARLEN", lambda *a, **k: None)  # flash_attn installed: optional, preferred
    assert M.auto_varlen_kernel(cuda, torch.float16, 0.1) is M.flash_varlen


def test_static_shape_kernels_get_fixed_cu_seqlens_and_equal_the_padded_rows():
    lengths = [500, 30, 12, 260, 250, 100, 128, 7, 400, 64, 311, 2 + 1]
    padded, packed = synthetic(lengths)
    seen = []

    def static_split(q, k, v, cu, max_seqlen, dropout_p):
        seen.append((cu.shape[0], max_seqlen, int(cu[-1])))
        return M.split_varlen(q, k, v, cu, max_seqlen, dropout_p)

    static_split.static_shapes = True
    torch.manual_seed(0)
    m = M.BertForPreTraining(model_config("tiny")).eval()
    ref = m(**tensors(padded))
    m.varlen_kernel = static_split
    out = m(**tensors(packed))
    b, n = packed["next_sentence_positions"].shape
    assert set(seen) == {(b * (n + 1) + 1, 512, b * 512)}  # fixed length, padded with zero-length sequences
    assert m.packed_attention == "varlen:static_split"
    for f in ("loss", "mlm_loss", "nsp_loss"):
        a, r = float(getattr(out, f).detach()), float(getattr(ref, f).detach())
        assert abs(a - r) <= 1e-5 * abs(r)
    seen.clear()
    m.varlen_kernel = M.split_varlen  # (no static_shapes: exact cu_seqlens, one run per sequence and padding)
    m(**tensors(packed))
    assert m.packed_attention == "varlen:split_varlen"


def test_kernels_by_name_and_padding_outputs_are_zero():
    padded, packed = synthetic([100, 200, 300, 50])
    torch.manual_seed(0)
    m = M.BertForPreTraining(model_config("tiny")).eval()
    t = tensors(packed)
    for name in ("split_varlen", "reference_varlen", "nested_varlen"):
        m.varlen_kernel = name
        with torch.no_grad():
            seq = m.sequence_output(t["input_ids"], t["segment_ids"], t["input_mask"], t["positions"])
        assert m.packed_attention == f"varlen:{name}"
        assert torch.count_nonzero(seq[t["input_mask"] == 0]) == 0
    m.varlen_kernel = "sdpa_mask"
    with torch.no_grad():
        m.sequence_output(t["input_ids"], t["segment_ids"], t["input_mask"], t["positions"])
    assert m.packed_attention == "sdpa-block-diagonal-mask"


def test_split_varlen_with_dropout_trains_and_drops_within_sequences():
    _, packed = synthetic([100, 200, 300, 50, 480, 20])
    torch.manual_seed(0)
    m = M.BertForPreTraining(model_config("tiny")).train()
    m.varlen_kernel = "auto"
    out = m(**tensors(packed))
    out.loss.backward()
    assert m.packed_attention == "varlen:split_varlen" and torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
