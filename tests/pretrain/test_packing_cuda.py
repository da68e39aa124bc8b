"""Packed attention on CUDA (marked ``gpu``; skipped where torch sees no CUDA device): each CUDA kernel's packed
batch against the same sequences as padded rows. No DeepSpeed, no golden files: synthetic rows of all lengths.

* fp32 (TF32 off): split_varlen and nested_varlen equal the padded rows to <= 1e-5 relative (loss and every
  gradient), as on CPU.
* bf16: PyTorch's flash kernels (torch_varlen, nested_varlen), FlexAttention (flex_varlen, compiled) and
  split_varlen, each against the fp32 padded result of the same weights: the loss within 2e-2 relative and
  each gradient within max(3 x the bf16 padded rows' own error, 3e-2) of its largest entry (the README's bf16
  tolerance). The bf16 padded rows' error is printed beside each.
* torch.compile of the whole model with torch_varlen: static shapes (no host sync, no recompilation across
  batches of other sequence lengths) and the eager result.
* aten_flash_varlen (PyTorch's flash kernels called directly, with dropout): equal to the others without dropout;
  with it, reproducible under a seed and never across sequences.
* attention dropout on CUDA: "auto" picks aten_flash_varlen (varlen_attn has no dropout; nested_varlen, PyTorch's
  flash kernel with dropout through nested tensors, trains too but measured slower than padded rows on an H200).

    python -m pytest tests/pretrain/test_packing_cuda.py -m gpu -q -s
"""

from __future__ import annotations

import copy

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

from pretrain import model as M  # noqa: E402
from pretrain.config import model_config  # noqa: E402
from tests.pretrain.test_packing_attention import synthetic, tensors  # noqa: E402

LENGTHS = [500, 30, 12, 260, 250, 100, 128, 7, 400, 64, 311, 3, 200, 180, 90, 512, 45, 333]
DEV = torch.device("cuda")


def cfg(dropout: float = 0.0):
    # 4 heads of 64 (flash's head dims), no dropout unless asked (exact comparisons)
    return model_config("tiny", hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)


def on(batch: dict) -> dict:
    return {k: v.to(DEV) for k, v in tensors(batch).items()}


def loss_and_grads(m, batch):
    m.zero_grad(set_to_none=True)
    out = m(**batch)
    out.loss.backward()
    return out, {n: p.grad.detach().float().clone() for n, p in m.named_parameters() if p.grad is not None}


def rel(a, b) -> float:
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.fixture(scope="module")
def case():
    return synthetic(LENGTHS)


@pytest.fixture(scope="module")
def fp32_model():
    torch.manual_seed(0)
    return M.BertForPreTraining(cfg()).to(DEV).eval()


@pytest.fixture(scope="module")
def fp32_reference(case, fp32_model):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return loss_and_grads(fp32_model, on(case[0]))


@pytest.mark.parametrize("kernel", ["split_varlen", "nested_varlen"])
def test_fp32_packed_equals_padded(case, fp32_model, fp32_reference, kernel):
    ref, ref_g = fp32_reference
    m = copy.deepcopy(fp32_model)
    m.varlen_kernel = kernel
    out, g = loss_and_grads(m, on(case[1]))
    assert m.packed_attention == f"varlen:{kernel}"
    diffs = {"loss": rel(out.loss, ref.loss), **{n: rel(g[n], ref_g[n]) for n in ref_g}}
    worst = max(diffs, key=diffs.get)
    print(f"\nfp32 {kernel}: max relative difference {diffs[worst]:.2e} ({worst})")
    assert diffs[worst] <= 1e-5, (worst, diffs[worst])


@pytest.fixture(scope="module")
def bf16_padded_error(case, fp32_model, fp32_reference):
    ref, ref_g = fp32_reference
    m = copy.deepcopy(fp32_model).to(torch.bfloat16)
    out, g = loss_and_grads(m, on(case[0]))
    return {"loss": rel(out.loss, ref.loss), **{n: rel(g[n], ref_g[n]) for n in ref_g}}


@pytest.mark.parametrize("kernel", ["torch_varlen", "aten_flash_varlen", "nested_varlen", "flex_varlen",
                                    "split_varlen"])
def test_bf16_packed_within_tolerance_of_fp32(case, fp32_model, fp32_reference, bf16_padded_error, kernel):
    ref, ref_g = fp32_reference
    m = copy.deepcopy(fp32_model).to(torch.bfloat16)
    m.varlen_kernel = kernel
    out, g = loss_and_grads(m, on(case[1]))
    assert m.packed_attention == f"varlen:{kernel}"
    diffs = {"loss": rel(out.loss, ref.loss), **{n: rel(g[n], ref_g[n]) for n in ref_g}}
    worst = max(diffs, key=lambda n: diffs[n] / max(3 * bf16_padded_error[n], 3e-2))
    print(f"\nbf16 {kernel}: loss {diffs['loss']:.2e} (padded bf16 {bf16_padded_error['loss']:.2e}); worst gradient "
          f"{worst} {diffs[worst]:.2e} (padded bf16 {bf16_padded_error[worst]:.2e}); max over gradients "
          f"{max(diffs.values()):.2e} (padded bf16 {max(bf16_padded_error.values()):.2e})")
    assert diffs["loss"] <= 2e-2
    assert diffs[worst] <= max(3 * bf16_padded_error[worst], 3e-2), (worst, diffs[worst])


def test_aten_flash_varlen_dropout_drops_within_sequences_only(case, fp32_model):
    """With attention dropout the gradients differ from run to run, but a sequence's outputs never depend on
    another sequence of its pack (the same check as without dropout, under one RNG seed)."""
    m = copy.deepcopy(fp32_model).to(torch.bfloat16).train()
    m.varlen_kernel = "aten_flash_varlen"
    for layer in m.encoder.layer:
        layer.attn_dropout_p = 0.1
    batch = on(case[1])
    other = {k: v.clone() for k, v in batch.items()}
    seq = batch["input_mask"]
    p = int((seq.amax(1) >= 2).nonzero()[0])
    second = seq[p] == 2
    other["input_ids"][p, second] = 1000 + (other["input_ids"][p, second] * 7) % 20000
    outs = []
    for b in (batch, other):
        torch.manual_seed(5)
        outs.append(m.sequence_output(b["input_ids"], b["segment_ids"], b["input_mask"], b["positions"],
                                      b["next_sentence_positions"].shape[1]).detach())
    assert not torch.equal(outs[0][p][second], outs[1][p][second])
    first = seq[p] == 1
    assert torch.isfinite(outs[0]).all()
    torch.manual_seed(5)
    again = m.sequence_output(batch["input_ids"], batch["segment_ids"], batch["input_mask"], batch["positions"],
                              batch["next_sentence_positions"].shape[1]).detach()
    assert torch.equal(again, outs[0])  # the same seed, the same dropout masks
    # flash's dropout RNG is indexed by (sequence, head, position), not by data: the 1st sequence is untouched
    assert torch.equal(outs[0][p][first], outs[1][p][first])


def test_compiled_model_with_torch_varlen_has_static_shapes(case, fp32_model):
    import torch._dynamo

    m = copy.deepcopy(fp32_model).to(torch.bfloat16)
    m.varlen_kernel, m.static_mlm = "torch_varlen", True  # static MLM/NSP shapes too: no host sync anywhere
    eager, _ = loss_and_grads(m, on(case[1]))
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)  # fullgraph: no host sync, no graph break
    other = synthetic([300, 200, 12, 500, 99, 400, 256, 256, 31, 77, 150, 3, 480, 250, 64, 128, 17, 333], seed=1)[1]
    other = {k: v[: len(case[1]["input_ids"])] for k, v in other.items()}  # the same number of packs
    for batch in (case[1], other, case[1]):
        out = compiled(**on(batch))
        out.loss.backward()
    out = compiled(**on(case[1]))
    assert rel(out.loss, eager.loss) <= 2e-2
    assert m.packed_attention == "varlen:torch_varlen"


@pytest.mark.parametrize("kernel", ["auto", "nested_varlen", "aten_flash_varlen"])
def test_attention_dropout_on_cuda(kernel):
    torch.manual_seed(0)
    m = M.BertForPreTraining(cfg(dropout=0.1)).to(DEV).to(torch.bfloat16).train()
    M._FLASH_VARLEN = None  # as a plain install: no flash_attn
    m.varlen_kernel = kernel
    out, g = loss_and_grads(m, on(synthetic(LENGTHS)[1]))
    assert m.packed_attention == ("varlen:aten_flash_varlen" if kernel == "auto" else f"varlen:{kernel}")
    assert torch.isfinite(out.loss) and all(torch.isfinite(v).all() for v in g.values())
    m.eval()
    m.varlen_kernel = "auto"
    with torch.no_grad():
        m(**on(synthetic(LENGTHS)[1]))
    assert m.packed_attention == "varlen:torch_varlen"  # eval: no dropout, PyTorch's varlen_attn
