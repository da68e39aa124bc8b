"""BERT model configurations: one frozen dataclass and the named presets.

Presets (parameter counts with the vocab padded to a multiple of 8):
  tiny   2 layers, hidden 64, 2 heads      ~2.1 M  (unit tests, CPU smoke runs)
  base   12 / 768 / 12                     ~110 M  (BERT-Base, Google's bert_config.json)
  large  24 / 1024 / 16                    ~335 M  (MLPerf BERT-Large)
  1.5b   48 / 1600 / 25, pre-LN variant    ~1.5 B  (Habana deepspeed-bert bert_1.5b_config.json)
  5b     63 / 2560 / 40, vocab 512035      ~6.3 B  (Habana bert_5b_config.json)
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "relu")


@dataclass(frozen=True)
class BertConfig:
    """Shape and regularisation of a BERT encoder with MLM + NSP heads (field names as Google's bert_config.json)."""

    vocab_size: int = 30522
    """Number of real WordPiece ids; the embedding table is padded (see pad_vocab_to_multiple_of)."""
    hidden_size: int = 1024
    """Width of the residual stream."""
    num_hidden_layers: int = 24
    """Number of transformer blocks."""
    num_attention_heads: int = 16
    """Attention heads per block; must divide hidden_size."""
    intermediate_size: int = 4096
    """Width of the feed-forward layer."""
    hidden_act: str = "gelu"
    """Feed-forward activation: "gelu" (exact erf, as BERT), "gelu_new"/"gelu_tanh" or "relu"."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings and on each sub-layer output."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities (passed to SDPA as dropout_p)."""
    max_position_embeddings: int = 512
    """Longest sequence the position table covers."""
    type_vocab_size: int = 2
    """Number of segment ids (sentence A / B)."""
    initializer_range: float = 0.02
    """Std of the normal initialisation of linear and embedding weights."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (BERT's TF value)."""
    layer_norm_large_model: bool = False
    """Habana's pre-LN-like variant for 1.5B/5B: a separate residual stream ("layer_norm_input") is carried
    through the blocks and each LayerNorm only feeds the next sub-layer (see model.BertLayer)."""
    pad_vocab_to_multiple_of: int = 8
    """Embedding/decoder rows are padded to this multiple (Habana: 30522 -> 30528) for aligned matmuls;
    logits are still returned over vocab_size ids only."""

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} is not one of {ACTIVATIONS}")
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "pad_vocab_to_multiple_of"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word-embedding table and of the tied MLM decoder."""
        m = self.pad_vocab_to_multiple_of
        return (self.vocab_size + m - 1) // m * m

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, strict: bool = True) -> BertConfig:
        """Build from a dict (ours, Google's bert_config.json or Habana's).

        Args:
            d: field values; missing fields take the defaults.
            strict: raise on keys that are not fields (else they are dropped).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown and strict:
            raise ValueError(f"unknown BertConfig keys {unknown}; known: {sorted(names)}")
        return cls(**{k: v for k, v in d.items() if k in names})

    @classmethod
    def from_json_file(cls, path: str | Path, *, strict: bool = False) -> BertConfig:
        """Read a bert_config.json; unknown keys (e.g. Habana's "bert_5b") are ignored unless strict."""
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: cannot read a BERT config JSON ({e})") from e
        if not isinstance(d, dict):
            raise ValueError(f"{path}: expected a JSON object of BertConfig fields")
        try:
            return cls.from_dict(d, strict=strict)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from e


MODEL_PRESETS: dict[str, BertConfig] = {
    "tiny": BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256),
    "base": BertConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
    "large": BertConfig(),
    "1.5b": BertConfig(hidden_size=1600, num_hidden_layers=48, num_attention_heads=25, intermediate_size=6400,
                       layer_norm_large_model=True),
    "5b": BertConfig(vocab_size=512035, hidden_size=2560, num_hidden_layers=63, num_attention_heads=40,
                     intermediate_size=10240, layer_norm_large_model=True),
}


def model_config(name: str, **overrides: Any) -> BertConfig:
    """A preset by name ("tiny", "base", "large", "1.5b", "5b") with single fields overridden."""
    try:
        base = MODEL_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {sorted(MODEL_PRESETS)}") from None
    return dataclasses.replace(base, **overrides) if overrides else base
