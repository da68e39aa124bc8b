"""Model unit tests: shapes, masked-only MLM head, bin-bound padding invariance, losses, param groups, configs."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from pretrain.config import MODEL_PRESETS, BertConfig, model_config  # noqa: E402
from pretrain.model import BertForPreTraining, valid_mask  # noqa: E402

TINY = model_config("tiny")


def make_batch(lengths: list[int], seq: int, n_pred: int = 20, seed: int = 0) -> dict:
    """A batch shaped like the HDF5 rows: ids/mask/segments padded with 0 to `seq`, positions padded with 0."""
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ids = torch.zeros(b, seq, dtype=torch.int32)
    mask = torch.zeros(b, seq, dtype=torch.int8)
    seg = torch.zeros(b, seq, dtype=torch.int8)
    pos = torch.zeros(b, n_pred, dtype=torch.int32)
    lab = torch.zeros(b, n_pred, dtype=torch.int32)
    for r, n in enumerate(lengths):
        ids[r, :n] = torch.randint(1000, 30522, (n,), generator=g)
        ids[r, 0], ids[r, n - 1] = 101, 102
        mask[r, :n] = 1
        seg[r, n // 2: n] = 1
        k = max(1, min(n_pred, n * 15 // 100)) if r % 4 != 3 else 0  # every 4th row: no masked token
        chosen = torch.randperm(n - 2, generator=g)[:k].sort().values + 1
        pos[r, :k] = chosen.to(torch.int32)
        lab[r, :k] = torch.randint(0, 30522, (k,), generator=g, dtype=torch.int32)
    nsp = torch.tensor([r % 2 for r in range(b)], dtype=torch.int8)
    return dict(input_ids=ids, segment_ids=seg, input_mask=mask, masked_lm_positions=pos,
                masked_lm_ids=lab, next_sentence_labels=nsp)


def tiny_model(**overrides) -> BertForPreTraining:
    torch.manual_seed(0)
    return BertForPreTraining(model_config("tiny", **overrides)).eval()


def test_output_shapes_and_counts():
    batch = make_batch([128, 40, 77, 100, 9], 128)
    out = tiny_model()(**batch)
    n_valid = int((batch["masked_lm_positions"] != 0).sum())
    assert out.mlm_logits.shape == (n_valid, 30522)
    assert out.nsp_logits.shape == (5, 2)
    assert int(out.mlm_count) == n_valid
    assert 0 <= int(out.mlm_correct) <= n_valid


def test_valid_slots_end_at_first_zero():
    pos = torch.tensor([[5, 9, 0, 7, 0], [3, 4, 6, 8, 10], [0, 2, 3, 0, 0]])
    assert valid_mask(pos).tolist() == [[True, True, False, False, False], [True] * 5, [False] * 5]


@pytest.mark.parametrize("large", [False, True])
def test_masked_only_mlm_equals_full_head_gathered(large: bool):
    model = tiny_model(layer_norm_large_model=large)
    batch = make_batch([128, 60, 33, 120], 128)
    with torch.no_grad():
        out = model(**batch)
        seq, pooled = model.encode(batch["input_ids"], batch["segment_ids"], batch["input_mask"])
        full = model.mlm_scores(seq)  # [B, S, V] over every position
    valid = batch["masked_lm_positions"] != 0
    rows = torch.arange(4)[:, None].expand_as(valid)[valid]
    gathered = full[rows, batch["masked_lm_positions"].long()[valid]]
    torch.testing.assert_close(out.mlm_logits, gathered, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.nsp_logits, model.nsp_head(pooled), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("large", [False, True])
def test_padding_to_bin_bound_or_512_gives_same_logits(large: bool):
    model = tiny_model(layer_norm_large_model=large)
    lengths = [128, 17, 90, 64]
    short = make_batch(lengths, 128, seed=3)
    long = make_batch(lengths, 512, seed=3)
    assert torch.equal(long["input_ids"][:, :128], short["input_ids"])
    with torch.no_grad():
        a, b = model(**short), model(**long)
    torch.testing.assert_close(a.mlm_logits, b.mlm_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.nsp_logits, b.nsp_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-6)


def test_loss_is_mean_ce_over_valid_tokens_plus_nsp():
    model = tiny_model()
    batch = make_batch([128, 50, 100, 30, 80], 128)
    out = model(**batch)
    valid = batch["masked_lm_positions"] != 0
    labels = batch["masked_lm_ids"].long()[valid]
    mlm = F.cross_entropy(out.mlm_logits, labels)
    nsp = F.cross_entropy(out.nsp_logits, batch["next_sentence_labels"].long())
    torch.testing.assert_close(out.mlm_loss, mlm)
    torch.testing.assert_close(out.nsp_loss, nsp)
    torch.testing.assert_close(out.loss, mlm + nsp)
    assert int(out.mlm_correct) == int((out.mlm_logits.argmax(-1) == labels).sum())
    # an untrained model is close to uniform over the vocabulary
    assert abs(mlm.detach().item() - math.log(30522)) < 1.0
    out.loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_batch_without_masked_tokens_has_finite_zero_mlm_loss():
    batch = make_batch([40, 50, 60, 64], 64)
    batch["masked_lm_positions"].zero_()
    out = tiny_model()(**batch)
    assert out.mlm_logits.shape == (0, 30522) and int(out.mlm_count) == 0
    assert out.mlm_loss.item() == 0.0 and torch.isfinite(out.loss)


def test_without_labels_no_loss():
    batch = make_batch([40, 50], 64)
    out = tiny_model()(batch["input_ids"], batch["segment_ids"], batch["input_mask"], batch["masked_lm_positions"])
    assert out.loss is None and out.mlm_loss is None and out.nsp_loss is None


def test_bf16_forward_backward_is_finite():
    model = tiny_model().to(torch.bfloat16).train()
    out = model(**make_batch([128, 70, 20], 128))
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_dropout_only_in_train_mode():
    model = tiny_model()
    batch = make_batch([128, 70], 128)
    with torch.no_grad():
        assert torch.equal(model(**batch).mlm_logits, model(**batch).mlm_logits)
        model.train()
        assert not torch.equal(model(**batch).mlm_logits, model(**batch).mlm_logits)


def test_large_model_variant_changes_the_function_not_the_parameters():
    post, pre = tiny_model(), tiny_model(layer_norm_large_model=True)
    assert [n for n, _ in post.named_parameters()] == [n for n, _ in pre.named_parameters()]
    pre.load_state_dict(post.state_dict())
    batch = make_batch([100, 60], 128)
    with torch.no_grad():
        assert not torch.allclose(post(**batch).mlm_logits, pre(**batch).mlm_logits)


def test_decoder_is_tied_and_vocab_padded():
    model = tiny_model()
    assert model.embeddings.word_embeddings.weight.shape[0] == 30528
    assert model.embeddings.word_embeddings.weight[30522:].abs().sum().item() == 0.0
    names = [n for n, _ in model.named_parameters()]
    assert not any("decoder" in n for n in names)


def test_param_groups_split_decay_and_no_decay():
    model = tiny_model()
    groups = model.param_groups(0.01)
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    named = dict(model.named_parameters())
    no_decay = {n for n, p in named.items() if any(p is q for q in groups[1]["params"])}
    assert no_decay == {n for n in named if n.endswith("bias") or "LayerNorm" in n}
    assert "embeddings.word_embeddings.weight" not in no_decay and "mlm_head.bias" in no_decay


def test_presets_and_parameter_counts():
    assert MODEL_PRESETS["tiny"].num_hidden_layers == 2 and MODEL_PRESETS["tiny"].hidden_size == 64
    assert MODEL_PRESETS["1.5b"].layer_norm_large_model and MODEL_PRESETS["5b"].padded_vocab_size == 512040
    expected = {"large": 335.2e6, "1.5b": 1.53e9, "5b": 6.27e9}
    for name, approx in expected.items():
        with torch.device("meta"):
            n = BertForPreTraining(MODEL_PRESETS[name]).num_parameters()
        assert abs(n - approx) / approx < 0.01, (name, n)


def test_base_preset_has_transformers_parameter_count():
    """--model base is BERT-Base: transformers' BertForPreTraining of Google's bert_config.json counts the same
    parameters (110,106,428); ours pads the vocab rows 30522 -> 30528 (embedding rows and MLM bias)."""
    transformers = pytest.importorskip("transformers")
    base = MODEL_PRESETS["base"]
    assert (base.num_hidden_layers, base.hidden_size, base.num_attention_heads, base.intermediate_size,
            base.vocab_size, base.max_position_embeddings, base.type_vocab_size) == (12, 768, 12, 3072, 30522, 512, 2)
    hf_config = transformers.BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2)
    with torch.device("meta"):
        hf = sum(p.numel() for p in transformers.BertForPreTraining(hf_config).parameters())
        ours = BertForPreTraining(base).num_parameters()
        unpadded = BertForPreTraining(dataclasses.replace(base, pad_vocab_to_multiple_of=1)).num_parameters()
    assert hf == 110_106_428
    assert unpadded == hf
    assert ours == hf + (30528 - 30522) * (768 + 1)


def test_config_round_trip_and_errors(tmp_path):
    cfg = model_config("large", hidden_dropout_prob=0.0)
    assert BertConfig.from_dict(cfg.to_dict()) == cfg
    assert dataclasses.replace(cfg, hidden_dropout_prob=0.1) == MODEL_PRESETS["large"]
    habana = {"hidden_size": 1600, "num_hidden_layers": 48, "num_attention_heads": 25, "intermediate_size": 6400,
              "vocab_size": 30522, "layer_norm_large_model": True, "bert_5b": False}
    path = tmp_path / "bert_1.5b_config.json"
    path.write_text(json.dumps(habana))
    assert BertConfig.from_json_file(path) == MODEL_PRESETS["1.5b"]
    with pytest.raises(ValueError, match="bert_5b"):
        BertConfig.from_json_file(path, strict=True)
    with pytest.raises(ValueError, match="not a multiple"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="unknown model"):
        model_config("huge")


def test_static_mlm_shapes_give_the_same_losses_and_valid_logits():
    dynamic = tiny_model()
    static = BertForPreTraining(TINY, static_mlm=True).eval()
    static.load_state_dict(dynamic.state_dict())
    batch = make_batch([128, 60, 33, 120, 90], 128)
    with torch.no_grad():
        a, b = dynamic(**batch), static(**batch)
    assert b.mlm_logits.shape == (5 * 20, 30522)
    keep = valid_mask(batch["masked_lm_positions"]).flatten()
    torch.testing.assert_close(b.mlm_logits[keep], a.mlm_logits, rtol=1e-5, atol=1e-5)
    for field in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(b, field), getattr(a, field))
    assert int(b.mlm_count) == int(a.mlm_count) and int(b.mlm_correct) == int(a.mlm_correct)


def test_gpu_bench_flops_formula_matches_torch_flop_counter():
    """bench/gpu_bench.py's MFU numerator counts exactly the matmul FLOPs that torch's FlopCounter sees."""
    import importlib.util
    from pathlib import Path

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_bench.py"
    spec = importlib.util.spec_from_file_location("gpu_bench", path)
    gpu_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_bench)
    cfg = model_config("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForPreTraining(cfg, static_mlm=True)
    for seq in (128, 384):
        batch = gpu_bench.make_batches(cfg, 2, seq, 1, "cpu")[0]
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:  # math: countable bmm
            model(**batch).loss.backward()
        slots = batch["masked_lm_positions"].shape[1]
        assert counter.get_total_flops() == 2 * gpu_bench.flops_per_sequence(cfg, seq, slots)


def test_sequence_longer_than_position_table_is_refused():
    model = BertForPreTraining(model_config("tiny", max_position_embeddings=128))
    with pytest.raises(ValueError, match="max_position_embeddings=128"):
        model(**make_batch([100, 129], 129))


def reference_encode(model: BertForPreTraining, ids, seg, mask):
    """Habana's modeling.py written out op by op (matmul/softmax attention with a -10000 additive mask;
    with layer_norm_large_model the residual stream starts at 0 and each LayerNorm reads it)."""
    cfg = model.config
    x = model.embeddings(ids.long(), seg.long())
    additive = (1.0 - mask[:, None, None, :].float()) * -10000.0
    residual = 0
    for layer in model.encoder.layer:
        b, s, h = x.shape
        q, k, v = (t.view(b, s, cfg.num_attention_heads, -1).permute(0, 2, 1, 3)
                   for t in layer.attn_qkv(x).split(h, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.head_dim) + additive
        a = layer.attn_out((scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, s, h))
        if cfg.layer_norm_large_model:
            attention_ln_input = a + residual
            x = layer.attn_LayerNorm(attention_ln_input)
            residual = layer.ffn_out(F.gelu(layer.ffn_in(x))) + attention_ln_input
            x = layer.ffn_LayerNorm(residual)
        else:
            x = layer.attn_LayerNorm(a + x)
            x = layer.ffn_LayerNorm(layer.ffn_out(F.gelu(layer.ffn_in(x))) + x)
    return x


@pytest.mark.parametrize("large", [False, True])
def test_encoder_matches_op_by_op_reference(large: bool):
    model = tiny_model(layer_norm_large_model=large, num_hidden_layers=3)
    with torch.no_grad():
        for p in model.parameters():  # move LayerNorms/biases off 1/0 so every term matters
            p.add_(torch.randn_like(p) * 0.05)
    batch = make_batch([128, 50, 99], 128)
    with torch.no_grad():
        seq, _ = model.encode(batch["input_ids"], batch["segment_ids"], batch["input_mask"])
        ref = reference_encode(model, batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    torch.testing.assert_close(seq, ref, rtol=1e-4, atol=1e-4)
