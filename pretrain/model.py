"""BERT for pre-training (masked LM + next-sentence prediction), written for speed where it counts.

* Attention is `torch.nn.functional.scaled_dot_product_attention` (flash / memory-efficient kernels on GPU,
  the fused CPU kernel here) with one fused QKV projection.
* The MLM head (dense + LayerNorm + the 30k-wide tied decoder) runs only on the valid masked positions:
  ~20 of 128 tokens (or ~76 of 512), not on every token; with hidden 1024 the full-sequence decoder would
  cost as much as ~3 encoder layers.
* Batches may be padded only to their length bin's bound (S = 128/256/384/512): positions are 0..S-1 and the
  key-padding mask makes the result independent of S.
* Everything is dtype-agnostic (bf16 weights work); the losses are computed in fp32.
* Packed rows (several sequences in one row, ``pretrain/packing.py``): ``forward(..., positions=...,
  next_sentence_positions=..., next_sentence_weights=...)`` with ``input_mask`` holding each token's sequence
  number (1, 2, 3 ...; 0 = padding). A token attends only to the tokens of its own sequence, position ids
  restart at each sequence, the pooler and NSP head run on each sequence's [CLS], and the losses are those
  of the same sequences unpadded, one per row (mean over all masked tokens of the batch, mean NSP loss over
  its sequences). Attention runs per sequence, never over the whole row: the rows' tokens go through the
  encoder flat ([B*S, H]) with ``cu_seqlens`` marking each sequence (and each row's padding, a run of its own
  that no real token sees), and a varlen kernel attends within each run. Kernels (``PACKED_KERNELS``; the
  default "auto" picks per device, dtype and dropout, ``BertForPreTraining.packed_attention`` says which ran):
  - ``torch_varlen``: PyTorch's own ``torch.nn.attention.varlen.varlen_attn`` (flash, CUDA fp16/bf16, no
    dropout): static shapes, no host sync (cu_seqlens by a scatter-min), torch.compile-friendly;
  - ``nested_varlen``: SDPA on a jagged nested tensor (PyTorch's flash kernel with dropout on CUDA; measured
    slower than the padded rows on an H200, so "auto" does not pick it);
  - ``aten_flash_varlen``: the same PyTorch flash kernels called directly, with dropout (not yet timed on a
    GPU, so by name only);
  - ``flash_varlen``: the optional ``flash_attn`` package (CUDA fp16/bf16, dropout), only where it imports;
  - ``flex_varlen``: FlexAttention with a document BlockMask (compile it for speed; no dropout);
  - ``split_varlen``: one SDPA per sequence on views of the flat tensor (the fastest exact path measured on
    CPU; any device, dropout);
  - None: SDPA over the whole row with a block-diagonal boolean mask ("auto" on CUDA with attention dropout
    and without flash_attn: exact, but it computes full-row attention).

Parameter names (see `hf_export.py` / `tf_import.py` for the mappings):
  embeddings.{word,position,token_type}_embeddings.weight, embeddings.LayerNorm.{weight,bias}
  encoder.layer.N.{attn_qkv, attn_out, attn_LayerNorm, ffn_in, ffn_out, ffn_LayerNorm}.{weight,bias}
  pooler.{weight,bias}, mlm_head.{dense, LayerNorm}.{weight,bias}, mlm_head.bias, nsp_head.{weight,bias}
The MLM decoder is tied to embeddings.word_embeddings.weight (no separate parameter).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pretrain.config import BertConfig

NO_DECAY_KEYS = ("bias", "LayerNorm", "gamma", "beta")  # Habana's rule for weight_decay 0.0


@dataclass
class PretrainingOutput:
    """What `BertForPreTraining.forward` returns (losses are None when labels are not given)."""

    loss: Tensor | None
    mlm_loss: Tensor | None
    nsp_loss: Tensor | None
    mlm_logits: Tensor  # [N_valid, vocab_size], the valid masked positions of all rows, row-major
    #                     ([B*P, vocab_size], all slots, when the model was built with static_mlm=True)
    nsp_logits: Tensor  # [B, 2]; packed rows: [N_sequences, 2] ([B*S, 2], all slots, with static_mlm=True)
    mlm_correct: Tensor  # scalar int64: valid masked tokens whose argmax equals the label (0 without labels)
    mlm_count: Tensor  # scalar int64: valid masked tokens


def _activation(name: str) -> nn.Module:
    if name == "gelu":
        return nn.GELU()
    if name in ("gelu_new", "gelu_tanh"):
        return nn.GELU(approximate="tanh")
    return nn.ReLU()


class BertEmbeddings(nn.Module):
    """Word + position + segment embeddings, LayerNorm, dropout."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        """``positions`` [B, S]: each token's position id (packed rows restart at 0 per sequence); None: 0..S-1."""
        if positions is None:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(
            segment_ids
        )
        return self.dropout(self.LayerNorm(x))


@dataclass
class Varlen:
    """Attention over unpadded tokens [T, H]: sequence i is tokens cu_seqlens[i]:cu_seqlens[i+1]."""

    cu_seqlens: Tensor  # [N + 1] int32
    max_seqlen: int
    kernel: object  # (q, k, v [T, heads, head_dim], cu_seqlens, max_seqlen, dropout_p) -> [T, heads, head_dim]


class BertLayer(nn.Module):
    """One transformer block: SDPA self-attention and a feed-forward layer, each with residual + LayerNorm.

    Post-LN (BERT): h = LN(h + sublayer(h)). With `layer_norm_large_model` (Habana's 1.5B/5B variant) a
    separate residual stream r is carried: r = r + sublayer(h); h = LN(r), i.e. each LayerNorm is the pre-LN
    of the next sub-layer. As in Habana's modeling.py the stream starts at 0 before the first block (the
    embedding output enters only through the first attention).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_attention_heads
        self.attn_dropout_p = config.attention_probs_dropout_prob
        self.large = config.layer_norm_large_model
        self.attn_qkv = nn.Linear(h, 3 * h)  # rows: query, key, value
        self.attn_out = nn.Linear(h, h)
        self.attn_LayerNorm = nn.LayerNorm(h, eps=eps)
        self.ffn_in = nn.Linear(h, config.intermediate_size)
        self.act = _activation(config.hidden_act)
        self.ffn_out = nn.Linear(config.intermediate_size, h)
        self.ffn_LayerNorm = nn.LayerNorm(h, eps=eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def attention(self, x: Tensor, key_mask: Tensor | Varlen) -> Tensor:
        dropout_p = self.attn_dropout_p if self.training else 0.0
        if isinstance(key_mask, Varlen):  # x: [T, H], the unpadded tokens of packed rows
            t, h = x.shape
            q, k, v = self.attn_qkv(x).view(t, 3, self.num_heads, h // self.num_heads).unbind(1)
            ctx = key_mask.kernel(q, k, v, key_mask.cu_seqlens, key_mask.max_seqlen, dropout_p)
            return self.attn_out(ctx.reshape(t, h))
        b, s, h = x.shape
        q, k, v = self.attn_qkv(x).view(b, s, 3, self.num_heads, h // self.num_heads).unbind(2)
        ctx = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=key_mask,
            dropout_p=dropout_p,
        )
        return self.attn_out(ctx.transpose(1, 2).reshape(b, s, h))

    def forward(self, x: Tensor, residual: Tensor | None, key_mask: Tensor | Varlen) -> tuple[Tensor, Tensor | None]:
        a = self.dropout(self.attention(x, key_mask))
        if self.large:
            residual = a if residual is None else residual + a
            x = self.attn_LayerNorm(residual)
        else:
            x = self.attn_LayerNorm(x + a)
        f = self.dropout(self.ffn_out(self.act(self.ffn_in(x))))
        if self.large:
            residual = residual + f
            return self.ffn_LayerNorm(residual), residual
        return self.ffn_LayerNorm(x + f), None


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, x: Tensor, key_mask: Tensor | Varlen) -> Tensor:
        residual = None
        for layer in self.layer:
            x, residual = layer(x, residual, key_mask)
        return x


class BertMLMHead(nn.Module):
    """dense + activation + LayerNorm, then the decoder tied to the word embeddings, plus an output bias."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = _activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))
        self.vocab_size = config.vocab_size

    def forward(self, hidden: Tensor, decoder_weight: Tensor) -> Tensor:
        """Logits over the real vocabulary (the padding rows exist only to align the matmul)."""
        x = self.LayerNorm(self.act(self.dense(hidden)))
        return F.linear(x, decoder_weight, self.bias)[..., : self.vocab_size]


try:  # PyTorch's own varlen flash attention (torch >= 2.9; CUDA)
    from torch.nn.attention.varlen import varlen_attn as _varlen_attn
except ImportError:  # older torch: nested_varlen / split_varlen instead
    _varlen_attn = None

_UNSET = object()
_FLASH_VARLEN = _UNSET


def _flash_attn_varlen():
    """``flash_attn.flash_attn_varlen_func``, or None where the package is absent or fails to import."""
    global _FLASH_VARLEN
    if _FLASH_VARLEN is _UNSET:
        try:
            from flash_attn import flash_attn_varlen_func
        except Exception:  # not installed, or built for another torch / CUDA: fall back to SDPA
            flash_attn_varlen_func = None
        _FLASH_VARLEN = flash_attn_varlen_func
    return _FLASH_VARLEN


def flash_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float) -> Tensor:
    """flash-attn's varlen kernel (CUDA, fp16/bf16): q, k, v [T, heads, head_dim] -> [T, heads, head_dim]."""
    return _flash_attn_varlen()(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=dropout_p)


flash_varlen.static_shapes = True


def _lengths(cu_seqlens: Tensor) -> list[int]:
    """Each sequence's length (host ints; a host sync on an accelerator)."""
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()


def split_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float) -> Tensor:
    """One SDPA call per sequence on ``split`` views of q, k, v [T, heads, head_dim] (no mask, no copy in; the
    backward is one concatenation, not a zero-filled gradient per slice): attention FLOPs sum(len^2) instead
    of rows x S^2. Any device (a host sync for the lengths), any dtype, dropout."""
    lengths = _lengths(cu_seqlens)
    out = []
    for a, b, c in zip(q.split(lengths), k.split(lengths), v.split(lengths), strict=True):
        if a.shape[0] == 0:
            out.append(a)
            continue
        out.append(F.scaled_dot_product_attention(a.transpose(0, 1), b.transpose(0, 1), c.transpose(0, 1),
                                                  dropout_p=dropout_p).transpose(0, 1))
    return torch.cat(out)


def torch_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float) -> Tensor:
    """PyTorch's ``varlen_attn`` (flash; CUDA, fp16/bf16). It has no dropout: dropout_p must be 0."""
    if dropout_p:
        raise ValueError("torch_varlen has no attention dropout (use nested_varlen, split_varlen or flash_varlen)")
    return _varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)


torch_varlen.static_shapes = True  # takes cu_seqlens padded with zero-length sequences and max_seqlen >= the longest


class _AtenFlashVarlen(torch.autograd.Function):
    """PyTorch's own flash varlen kernels (``aten::_flash_attention_forward/_backward``, what ``varlen_attn``
    calls with dropout fixed at 0) with attention dropout: the backward replays the forward's RNG state."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, dropout_p):  # noqa: ANN001, ANN205
        out, lse, rng_a, rng_b, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, rng_a, rng_b)
        ctx.max_seqlen, ctx.dropout_p = max_seqlen, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        q, k, v, out, lse, cu, rng_a, rng_b = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu, cu, ctx.max_seqlen, ctx.max_seqlen, ctx.dropout_p, False,
            rng_a, rng_b)
        return dq, dk, dv, None, None, None


def aten_flash_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int,
                      dropout_p: float) -> Tensor:
    """PyTorch's flash varlen kernel called directly, with attention dropout (CUDA fp16/bf16; no extra package).
    Static shapes like torch_varlen; compiles. "auto" picks it on CUDA with attention dropout (training):
    on an H200, 1.04x the block-diagonal SDPA mask eager, 1.83x the padded rows compiled (docs/benchmarks.md)."""
    return _AtenFlashVarlen.apply(q, k, v, cu_seqlens, max_seqlen, dropout_p)


aten_flash_varlen.static_shapes = True


def nested_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float) -> Tensor:
    """SDPA on jagged nested tensors (flash with dropout on CUDA fp16/bf16; a slow fallback on CPU)."""
    offsets = cu_seqlens.long()
    nt = [torch.nested.nested_tensor_from_jagged(t.contiguous(), offsets, min_seqlen=1, max_seqlen=max_seqlen
                                                 ).transpose(1, 2)
          for t in (q, k, v)]
    return F.scaled_dot_product_attention(*nt, dropout_p=dropout_p).transpose(1, 2).values()


def flex_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float) -> Tensor:
    """FlexAttention over all T tokens as one sequence with a document mask (a token attends only within its
    cu_seqlens run; fully masked blocks are skipped). No dropout. Eager FlexAttention is a slow reference:
    compile the model (or use ``torch.compile(flex_attention)``) for speed."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if dropout_p:
        raise ValueError("flex_varlen has no attention dropout")
    t = q.shape[0]
    doc = torch.searchsorted(cu_seqlens[1:].long(), torch.arange(t, device=q.device), right=True)

    def same_doc(b, h, qi, ki):  # noqa: ANN001, ANN202 - FlexAttention's mask_mod signature
        return doc[qi] == doc[ki]

    mask = create_block_mask(same_doc, None, None, t, t, device=q.device)
    out = _flex(flex_attention, q.device)(*(x.transpose(0, 1)[None] for x in (q, k, v)), block_mask=mask)
    return out[0].transpose(0, 1)


_FLEX_FN = None
#: compile flex_attention (once) when called eagerly: None = on accelerators only (on CPU compiling needs a C++
#: toolchain and minutes on a small machine; eager FlexAttention is then the reference), True, False
FLEX_COMPILE: bool | None = None


def _flex(fn, device: torch.device):  # noqa: ANN001, ANN202
    global _FLEX_FN
    if torch.compiler.is_compiling() or not (FLEX_COMPILE if FLEX_COMPILE is not None else device.type != "cpu"):
        return fn
    if _FLEX_FN is None:
        _FLEX_FN = torch.compile(fn, dynamic=False)
    return _FLEX_FN


def reference_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, dropout_p: float) -> Tensor:
    """The varlen kernel's function with plain SDPA, one sequence at a time (any device; for tests)."""
    bounds = cu_seqlens.tolist()
    out = [F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)), dropout_p=dropout_p
                                          ).transpose(0, 1) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return torch.cat(out) if out else q.new_zeros(q.shape)


PACKED_KERNELS = {"split_varlen": split_varlen, "torch_varlen": torch_varlen, "nested_varlen": nested_varlen,
                  "aten_flash_varlen": aten_flash_varlen,
                  "flex_varlen": flex_varlen, "flash_varlen": flash_varlen, "reference_varlen": reference_varlen,
                  "sdpa_mask": None}


def torch_varlen_available() -> bool:
    return _varlen_attn is not None


def auto_varlen_kernel(device: torch.device, dtype: torch.dtype, dropout_p: float):  # noqa: ANN201
    """The packed attention kernel "auto" picks. On CUDA in fp16/bf16: flash_attn's varlen kernel where that
    package imports; else PyTorch's own flash varlen kernels, ``varlen_attn`` (torch_varlen) without attention
    dropout and ``aten_flash_varlen`` (the same kernels with dropout) with it; on a torch without
    ``varlen_attn``, the full-row SDPA with the block-diagonal mask (None). Everywhere else (CPU, HPU, CUDA
    fp32) ``split_varlen``. Measured on an H200 (docs/benchmarks.md): with dropout, aten_flash_varlen 1.04x the
    SDPA mask's real tokens/s eager, 1.83x the padded rows compiled; nested_varlen 0.87x the padded rows."""
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        if _flash_attn_varlen() is not None:
            return flash_varlen
        if not torch_varlen_available():
            return None
        return torch_varlen if not dropout_p else aten_flash_varlen
    return split_varlen


def valid_mask(masked_lm_positions: Tensor) -> Tensor:
    """[B, P] bool: slots before the first 0 of each row (position 0 is [CLS], never masked)."""
    return (masked_lm_positions != 0).to(torch.int32).cumprod(dim=1).bool()


class BertForPreTraining(nn.Module):
    """BERT encoder + MLM head (masked positions only) + NSP head; see the module docstring."""

    def __init__(self, config: BertConfig, *, static_mlm: bool = False) -> None:
        """Build and initialise the model.

        Args:
            config: shapes and dropout.
            static_mlm: run the MLM head on all B x P prediction slots instead of only the valid ones, so that
                no shape depends on the data (no host sync; HPU lazy mode and torch.compile(dynamic=False)).
                Losses, mlm_correct and mlm_count are unchanged; mlm_logits then has B*P rows, the invalid
                ones being padding (select them with valid_mask(masked_lm_positions).flatten()).
        """
        super().__init__()
        self.config = config
        self.static_mlm = static_mlm
        #: packed rows' attention kernel: "auto" (:func:`auto_varlen_kernel`), None (SDPA over the whole row with
        #: a block-diagonal mask), a name of PACKED_KERNELS or a varlen kernel function
        self.varlen_kernel: object = os.environ.get("BERTPIPE_PACKED_ATTENTION", "auto")  # (benches compare)
        self.packed_attention = ""  # what the last packed batch used: "sdpa-block-diagonal-mask" or "varlen:<kernel>"
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.mlm_head = BertMLMHead(config)
        self.nsp_head = nn.Linear(config.hidden_size, 2)
        self.apply(self._init_weights)
        with torch.no_grad():  # rows past vocab_size are never looked up nor scored
            self.embeddings.word_embeddings.weight[config.vocab_size:].zero_()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def encode(self, input_ids: Tensor, segment_ids: Tensor, input_mask: Tensor,
               positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Sequence output [B, S, H] and pooled output [B, H] (tanh(dense(h[:, 0])), the first sequence's)."""
        x = self.sequence_output(input_ids, segment_ids, input_mask, positions)
        return x, torch.tanh(self.pooler(x[:, 0]))

    def sequence_output(self, input_ids: Tensor, segment_ids: Tensor, input_mask: Tensor,
                        positions: Tensor | None = None, max_sequences: int | None = None) -> Tensor:
        """The encoder's output [B, S, H]. With ``positions`` the rows are packed: ``input_mask`` holds each
        token's sequence number (0 = padding) and a token attends only within its sequence; ``max_sequences``
        (sequences a row holds at most, e.g. next_sentence_positions' width) lets static-shape kernels skip
        the host sync."""
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"batch is padded to {input_ids.shape[1]} tokens, longer than the model's "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        x = self.embeddings(input_ids.long(), segment_ids.long(), None if positions is None else positions.long())
        if positions is None:
            key_mask = (input_mask != 0)[:, None, None, :]  # [B, 1, 1, S]: True = attend to this key
            return self.encoder(x, key_mask)
        kernel = self.varlen_kernel
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        if kernel == "auto":
            kernel = auto_varlen_kernel(x.device, x.dtype, dropout)
        elif isinstance(kernel, str):
            kernel = PACKED_KERNELS[kernel]
        if kernel is None:
            self.packed_attention = "sdpa-block-diagonal-mask"
            # [B, 1, S, S]: query i attends key j iff they carry the same sequence number (padding attends
            # padding only, so no row is all-masked; real tokens never see padding or another sequence)
            return self.encoder(x, (input_mask[:, :, None] == input_mask[:, None, :])[:, None])
        self.packed_attention = f"varlen:{getattr(kernel, '__name__', type(kernel).__name__)}"
        return self._encode_flat(x, input_mask, kernel, max_sequences)

    def _encode_flat(self, x: Tensor, seq_ids: Tensor, kernel, max_sequences: int | None) -> Tensor:  # noqa: ANN001
        """The encoder on the rows' B*S tokens flat ([B*S, H]), each run of one sequence number within a row
        (a sequence, or the row's padding) a varlen sequence of its own; padding positions of the result are 0.
        Sequences must be contiguous runs of one number within a row (as every packer writes). Kernels marked
        ``static_shapes`` get cu_seqlens of a fixed length B*(max_sequences+1)+1, padded with zero-length
        sequences, and max_seqlen = S: no host sync and no data-dependent shape (torch.compile, CUDA graphs)."""
        b, s, h = x.shape
        ids = seq_ids.reshape(-1)
        start = torch.ones_like(ids, dtype=torch.bool)
        start[1:] = ids[1:] != ids[:-1]
        start[::s] = True  # every row starts a run
        if getattr(kernel, "static_shapes", False) and max_sequences is not None:
            # run r starts at the smallest token index of run r: a scatter-min into B*(N+1) slots (elementwise
            # ops only: any device, no host sync); unused slots keep B*S, i.e. zero-length sequences at the end
            slots = b * (max_sequences + 1)
            run = torch.cumsum(start, 0) - 1
            where = torch.where(start & (run < slots), run, slots)  # (a row never holds more runs than slots)
            cu = torch.full((slots + 1,), b * s, dtype=torch.long, device=x.device).scatter_reduce(
                0, where, torch.arange(b * s, device=x.device), "amin")
            cu[slots] = b * s
            cu, max_len = cu.to(torch.int32), s
        else:
            starts = torch.nonzero(start).squeeze(1)  # (a host sync)
            cu, max_len = torch.cat([starts, starts.new_full((1,), b * s)]).to(torch.int32), None
        if max_len is None:
            max_len = int((cu[1:] - cu[:-1]).max())
        flat = self.encoder(x.reshape(b * s, h), Varlen(cu, max_len, kernel)).view(b, s, h)
        return flat * (seq_ids != 0).unsqueeze(-1).to(flat.dtype)

    def mlm_scores(self, hidden: Tensor) -> Tensor:
        """MLM logits [..., vocab_size] for any hidden states (e.g. all positions, for tests/eval)."""
        return self.mlm_head(hidden, self.embeddings.word_embeddings.weight)

    def forward(
        self,
        input_ids: Tensor,
        segment_ids: Tensor,
        input_mask: Tensor,
        masked_lm_positions: Tensor,
        masked_lm_ids: Tensor | None = None,
        next_sentence_labels: Tensor | None = None,
        positions: Tensor | None = None,
        next_sentence_positions: Tensor | None = None,
        next_sentence_weights: Tensor | None = None,
    ) -> PretrainingOutput:
        """Run the model on one batch padded to any S <= max_position_embeddings.

        Args:
            input_ids, segment_ids, input_mask: [B, S] integer tensors (the HDF5 fields); packed rows:
                input_mask holds each token's sequence number 1, 2, ... (0 = padding).
            masked_lm_positions: [B, P]; the valid slots are those before the first 0 (packed rows:
                positions within the row).
            masked_lm_ids: [B, P] labels of those slots, or None.
            next_sentence_labels: [B] (0 = is next, 1 = random), or None; packed rows: [B, N], one per sequence.
            positions: packed rows only, [B, S]: each token's position within its sequence.
            next_sentence_positions: packed rows only, [B, N]: where each sequence's [CLS] is in the row.
            next_sentence_weights: packed rows only, [B, N]: 1 for a sequence, 0 for an empty slot.
        """
        seq = self.sequence_output(input_ids, segment_ids, input_mask, positions,
                                   None if next_sentence_positions is None else next_sentence_positions.shape[1])
        b, s, h = seq.shape
        valid = valid_mask(masked_lm_positions)
        flat_index = torch.arange(b, device=seq.device)[:, None] * s + masked_lm_positions.long()
        if self.static_mlm:  # all slots; invalid ones gather [CLS] and are ignored below
            valid, flat_index = valid.flatten(), flat_index.flatten()
        else:  # boolean indexing: N_valid is data-dependent (one host sync)
            flat_index = flat_index[valid]
        mlm_logits = self.mlm_scores(seq.reshape(b * s, h).index_select(0, flat_index))
        nsp_valid = None
        if next_sentence_positions is None:  # one sequence per row: its [CLS] is at 0
            cls = seq[:, 0]
        else:  # each sequence's [CLS]
            nsp_valid = (next_sentence_weights != 0 if next_sentence_weights is not None
                         else torch.ones_like(next_sentence_positions, dtype=torch.bool))
            nsp_index = torch.arange(b, device=seq.device)[:, None] * s + next_sentence_positions.long()
            if self.static_mlm:  # all slots (static shapes); empty ones read row's position 0 and are ignored
                nsp_valid, nsp_index = nsp_valid.flatten(), nsp_index.flatten()
            else:
                nsp_index = nsp_index[nsp_valid]
            cls = seq.reshape(b * s, h).index_select(0, nsp_index)
        nsp_logits = self.nsp_head(torch.tanh(self.pooler(cls)))
        mlm_count = valid.sum()

        mlm_loss = nsp_loss = loss = None
        mlm_correct = torch.zeros((), dtype=torch.int64, device=seq.device)
        if masked_lm_ids is not None:
            if self.static_mlm:
                labels = torch.where(valid, masked_lm_ids.long().flatten(), -100)
            else:
                labels = masked_lm_ids.long()[valid]
            # sum / max(count, 1): the mean over valid tokens, and 0 (not NaN) for a batch without any
            mlm_loss = F.cross_entropy(mlm_logits.float(), labels, reduction="sum", ignore_index=-100
                                       ) / mlm_count.clamp(min=1)
            with torch.no_grad():
                mlm_correct = (mlm_logits.argmax(dim=-1) == labels).sum()
            loss = mlm_loss
        if next_sentence_labels is not None and nsp_valid is None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_labels.long().view(-1))
        elif next_sentence_labels is not None:  # the mean over the batch's sequences
            nsp_labels = next_sentence_labels.long()
            nsp_labels = (torch.where(nsp_valid, nsp_labels.flatten(), -100) if self.static_mlm
                          else nsp_labels[nsp_valid])
            nsp_loss = F.cross_entropy(nsp_logits.float(), nsp_labels, reduction="sum", ignore_index=-100
                                       ) / nsp_valid.sum().clamp(min=1)
        if next_sentence_labels is not None:
            loss = nsp_loss if loss is None else loss + nsp_loss
        return PretrainingOutput(loss, mlm_loss, nsp_loss, mlm_logits, nsp_logits, mlm_correct, mlm_count)

    def param_groups(self, weight_decay: float) -> list[dict]:
        """Two optimizer groups: weight decay on weights, none on biases and LayerNorm parameters."""
        decay, no_decay = [], []
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            (no_decay if any(k in name for k in NO_DECAY_KEYS) else decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
