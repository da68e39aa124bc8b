"""The training run's configuration: one frozen dataclass, its command-line flags and its argv.

Every field is a flag of ``pretrain/train.py`` and of ``bertpipe train`` (``--max-steps`` and
``--max_steps`` both work). :func:`to_argv` turns a config back into flags so that the launcher command
printed by ``bertpipe train`` is exactly what each rank parses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_DS_CONFIG = Path(__file__).resolve().parents[1] / "deployments" / "ds_config_zero1_bf16.json"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One pre-training run (defaults: a short CPU run of the tiny model)."""

    train_dir: str = ""
    """4-bin folder (``{128,256,384,512}/part_<k>_of_<N>.hdf5``), a folder of padded HDF5 files or one file, or
    packed data (Habana's or NVIDIA's packed HDF5 files, detected from their datasets: see --packed)."""
    packed: bool = False
    """Train on packed rows (several sequences a row; Habana's pack_pretraining_data_pytorch.py or NVIDIA's
    packed_data layout): refuse --train-dir unless it holds them. Packed data is detected without the flag too;
    --no-packed on packed data is refused (packs are never unpacked).
    Each token attends only within its sequence, positions restart per sequence, NSP per sequence;
    --micro-batch then counts packs, while the MLPerf log, the eval interval and metrics' samples count the
    sequences the packs hold."""
    batch_mix: str = ""
    """Length bins of a micro-batch's rows (pretrain/batch_mix.py): one-bin (each batch from one bin, bertpipe's,
    fastest), random (rows of any length at random: NVIDIA's, MLCommons' and Habana's trainers) or split (fixed
    rows per bin, --split-batch-cnt: Samsung's); not given: per --model (split when --split-batch-cnt is given)."""
    split_batch_cnt: str = ""
    """Rows of the bins 128, 256, 384, 512 in every micro-batch, e.g. 6 3 2 5 (Samsung's MLPerf trainer; the
    micro-batch is their sum); implies --batch-mix split."""
    eval_file: str = ""
    """Eval HDF5 (eval_10k.hdf5); empty: no evaluation."""
    output_dir: str = "results/pretrain"
    """Checkpoints, metrics.jsonl, summary.json, config.json, tensorboard/."""
    model: str = "tiny"
    """Model preset: tiny, base, large, 1.5b, 5b."""
    model_config: str = ""
    """Optional JSON (bert_config.json style) whose fields override the preset."""
    vocab_size: int = 0
    """Override the preset's vocab_size (0: keep it)."""
    deepspeed_config: str = str(DEFAULT_DS_CONFIG)
    """DeepSpeed JSON (ZeRO stage, bf16, clipping, batch sizes); the flags below override its batch fields."""
    micro_batch: int = 0
    """train_micro_batch_size_per_gpu (0: from the DeepSpeed JSON)."""
    global_batch: int = 0
    """train_batch_size over all ranks and accumulation steps (0: from the JSON, else micro x ranks)."""
    zero_stage: int = -1
    """ZeRO stage 0/1/2 (-1: from the JSON)."""
    max_steps: int = 100
    """Optimizer steps of the whole run (the schedule's length)."""
    steps_this_run: int = -1
    """Stop (with a checkpoint) after this many steps of this invocation (-1: run to max_steps)."""
    optimizer: str = ""
    """lans, lamb or adamw; not given: the --model preset's (MODEL_DEFAULTS)."""
    trust_ratio: str = "per-tensor"
    """LAMB/LANS trust ratios under ZeRO-1/2: per-tensor (each parameter's norms, summed over the ranks' flat
    partitions: the same update as unsharded LAMB/LANS) or per-group (the norms of each rank's partition of a
    param group, as Habana's ZeRO runs). Without ZeRO both are per-tensor."""
    lamb_trust_ratio_no_decay: bool = False
    """LAMB: apply the trust ratio to the weight-decay-0 group (biases, LayerNorm) too; off = NVLAMB's
    default, apex FusedLAMB and NVIDIA's BERT trainer (those parameters take plain lr-sized steps)."""
    learning_rate: float = 0.0
    """Peak learning rate; not given: the --model preset's (MODEL_DEFAULTS)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm)."""
    clip_grad_norm: float = -1.0
    """Clip the global gradient norm to this (0: no clipping); not given: the DeepSpeed config's
    gradient_clipping, else 1.0 as apex FusedLAMB and NVIDIA's MLPerf runs (pretrain/recipe.py)."""
    warmup_proportion: float = -1.0
    """PolyWarmUp warm-up fraction; not given: the --model preset's (MODEL_DEFAULTS)."""
    constant_proportion: float = -1.0
    """PolyWarmUp constant fraction after warm-up (habana convention only); not given: the --model preset's."""
    warmup_steps: int = -1
    """Warm-up in optimizer steps, an integer as MLPerf's configs set it (NVIDIA's WARMUP_STEPS); instead of
    --warmup-proportion (not both). Not given: --warmup-proportion x --max-steps (truncated, as NVIDIA's trainer)."""
    start_warmup_step: int = 0
    """MLPerf's start_warmup_step (<= 0; NVIDIA's configs use e.g. -25): the warm-up counts from that step, so step
    1 is already that far into it (--schedule-convention mlperf only; pretrain/recipe.py)."""
    schedule_convention: str = ""
    """Which lr step k runs at: mlperf (f(k-1): NVIDIA's MLPerf scheduler, MLCommons' TF reference; the first
    warm-up step at lr 0, the last step at base/N) or habana (f(k): Habana's DeepSpeed BERT; the last step at lr
    0); not given: per --model (pretrain/recipe.py)."""
    scheduler_degree: float = 1.0
    """PolyWarmUp decay degree."""
    seed: int = 12439
    """Base seed; rank r uses seed + r for dropout; the data order uses (seed, epoch)."""
    deterministic: bool = False
    """torch.use_deterministic_algorithms and friends (exact resume, golden loss curves)."""
    device: str = "auto"
    """auto (HPU > CUDA > CPU), hpu, cuda or cpu."""
    compile: bool = False
    """torch.compile the engine (HPU eager mode or CUDA)."""
    static_mlm: bool = False
    """MLM head over all prediction slots (static shapes for graph compilers); always on for HPU."""
    log_interval: int = 1
    """Write a metrics record every N optimizer steps."""
    checkpoint_interval: int = 200
    """Save a checkpoint every N optimizer steps (0: only at the end / on SIGTERM)."""
    keep_checkpoints: int = 3
    """Keep only the N newest checkpoints (0: keep all; a BERT-1.5B checkpoint with ZeRO states is ~18 GB)."""
    resume: bool = False
    """Continue from OUTPUT_DIR/checkpoints/latest, or from the newest complete checkpoint when `latest` is
    missing, empty, damaged or names an incomplete one (said in one line); no checkpoint yet: start at step 1."""
    overwrite: bool = False
    """Start at step 1 in an OUTPUT_DIR that holds checkpoints of a run, removing them (its checkpoint folders,
    latest, summary.json; metrics.jsonl restarts). Without it (and without --resume) such a dir is refused."""
    init_checkpoint: str = ""
    """Start from these weights (optimizer, step and schedule start fresh): a TF1 checkpoint prefix (MLPerf's
    model.ckpt-28252) or its directory, a .safetensors file (bertpipe import-tf) or a transformers directory
    (bertpipe export-hf). Shapes must match the model; ignored when --resume finds a checkpoint of this run."""
    eval_interval_steps: int = 0
    """Evaluate every N steps (0: at the MLPerf interval in samples, spec §12), and always at the end."""
    eval_interval_samples: int = 0
    """Evaluate after the step whose samples trained reach each multiple of N (0: MLPerf's interval for the global
    batch, spec §12; NVIDIA's --eval_iter_samples). Samples are sequences: on packed data, those the packs held
    (all ranks). --eval-interval-steps, when given, wins."""
    average_packing_rate: float = 0.0
    """Packed data only: the sequences a pack holds on average, for MLPerf's global batch size (packs x this, in
    sequences: the MLPerf log's global_batch_size and the MLPerf eval interval computed from it; NVIDIA's
    --average_packing_rate). 0: the figure the data records (Habana's <train_dir>_metadata.json avg_seq_per_sample,
    or pack-nvidia's manifest), else 2.0 (NVIDIA's and Habana's default at 512)."""
    eval_batch_size: int = 16
    """Eval micro-batch per rank."""
    max_eval_samples: int = 0
    """Use only the first N eval samples (0: all)."""
    tensorboard: bool = True
    """Write TensorBoard scalars to OUTPUT_DIR/tensorboard (rank 0)."""
    vocab: str = ""
    """The vocab.txt the data was made with: sets vocab_size (when --vocab-size is 0) and is recorded (path, md5)
    in config.json and summary.json, so `bertpipe export-hf` writes the matching tokenizer. `bertpipe train`
    with a data work dir as --train-dir uses the work dir's vocab when this is empty."""
    mlperf_division: str = "open"
    """MLPerf submission_division in OUTPUT_DIR/mllog.txt: closed or open."""
    mlperf_org: str = "bertpipe"
    """MLPerf submission_org in mllog.txt (the submitting organisation)."""
    mlperf_platform: str = ""
    """MLPerf submission_platform in mllog.txt (empty: <ranks>x<device>, e.g. 8xhpu)."""
    mlperf_status: str = "onprem"
    """MLPerf submission_status in mllog.txt: onprem, cloud, preview or research."""

    def __post_init__(self) -> None:
        # fields left at their "unset" default take the model's values (flags given explicitly win)
        if self.split_batch_cnt and not self.batch_mix:
            object.__setattr__(self, "batch_mix", "split")
        for name, value in MODEL_DEFAULTS.get(self.model, MODEL_DEFAULTS["tiny"]).items():
            if name == "warmup_proportion" and self.warmup_steps >= 0:
                continue  # an integer warm-up was given instead
            if getattr(self, name) == UNSET[name]:
                object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The "take the model's default" values of the fields in MODEL_DEFAULTS.
UNSET: dict[str, Any] = {"optimizer": "", "learning_rate": 0.0, "warmup_proportion": -1.0, "constant_proportion": -1.0,
                         "schedule_convention": "", "batch_mix": ""}

#: Optimizer settings per model preset, used for the fields not given (TrainConfig.__post_init__).
#: tiny: learns visibly in 60 steps on the golden sample (2 CPU ranks, micro-batch 8: loss 11.0 -> 8.1);
#: base: Google's BERT-Base recipe (Adam with decoupled weight decay, lr 1e-4, warm-up 10,000 of 1,000,000 steps);
#: large: the MLPerf BERT-Large reference (LAMB, lr 4e-4 at global batch 448, no warm-up, starting from
#: MLPerf's checkpoint); 1.5b/5b: Habana's DeepSpeed BERT runs (LANS, lr 0.0015, warm-up 5 %, constant 25 %).
#: The schedule convention follows the recipe copied (pretrain/recipe.py): MLPerf's (and Google's) f(k-1) for
#: large and base, Habana's f(k) for 1.5b/5b; tiny keeps f(k), on which its 60-step defaults were tuned. The
#: batches' bins (pretrain/batch_mix.py): rows of any length at random, as the references draw them, except tiny
#: (one bin a batch: the fastest, for tests and smoke runs).
MODEL_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": {"optimizer": "lans", "learning_rate": 0.05, "warmup_proportion": 0.05, "constant_proportion": 0.0,
             "schedule_convention": "habana", "batch_mix": "one-bin"},
    "base": {"optimizer": "adamw", "learning_rate": 1e-4, "warmup_proportion": 0.01, "constant_proportion": 0.0,
             "schedule_convention": "mlperf", "batch_mix": "random"},
    "large": {"optimizer": "lamb", "learning_rate": 4e-4, "warmup_proportion": 0.0, "constant_proportion": 0.0,
              "schedule_convention": "mlperf", "batch_mix": "random"},
    "1.5b": {"optimizer": "lans", "learning_rate": 0.0015, "warmup_proportion": 0.05, "constant_proportion": 0.25,
             "schedule_convention": "habana", "batch_mix": "random"},
    "5b": {"optimizer": "lans", "learning_rate": 0.0015, "warmup_proportion": 0.05, "constant_proportion": 0.25,
           "schedule_convention": "habana", "batch_mix": "random"},
}


CHOICES = {"model": ("tiny", "base", "large", "1.5b", "5b"), "optimizer": ("lans", "lamb", "adamw"),
           "trust_ratio": ("per-tensor", "per-group"), "schedule_convention": ("mlperf", "habana"),
           "batch_mix": ("one-bin", "random", "split"),
           "device": ("auto", "hpu", "cuda", "cpu"), "mlperf_division": ("closed", "open"),
           "mlperf_status": ("onprem", "cloud", "preview", "research")}


_I = 2**31 - 1
#: Numeric flags' valid ranges (inclusive), checked at parse time: 0, negative, nan, inf and huge values are
#: refused naming the flag before anything starts.
BOUNDS: dict[str, tuple[float, float]] = {
    "vocab_size": (0, 1 << 24), "micro_batch": (0, 1 << 20), "global_batch": (0, 1 << 30), "zero_stage": (-1, 3),
    "max_steps": (1, _I), "steps_this_run": (-1, _I), "learning_rate": (1e-12, 10.0), "weight_decay": (0.0, 100.0),
    "warmup_proportion": (0.0, 1.0), "constant_proportion": (0.0, 1.0), "scheduler_degree": (1e-6, 100.0),
    "warmup_steps": (0, _I), "start_warmup_step": (-_I, 0), "clip_grad_norm": (0.0, 1e6),
    "seed": (0, _I), "log_interval": (1, _I), "checkpoint_interval": (0, _I), "keep_checkpoints": (0, 1 << 20),
    "eval_interval_steps": (0, _I), "eval_interval_samples": (0, 1 << 62), "average_packing_rate": (0.0, 64.0), "eval_batch_size": (1, 1 << 20),
    "max_eval_samples": (0, _I),
}


#: --help's "(default: ...)" of the fields whose default is a "not given" marker.
DEFAULT_TEXT = {"clip_grad_norm": "the DeepSpeed config's gradient_clipping, else 1.0",
                "average_packing_rate": "the data's recorded figure, else 2.0",
                "warmup_steps": "from --warmup-proportion"}


def _type_of(f: dataclasses.Field) -> type:
    return {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)]


def add_train_arguments(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """Add one ``--dashed``/``--under_scored`` flag per TrainConfig field."""
    docs = _field_docs()
    for f in fields(TrainConfig):
        if f.name in skip:
            continue
        names = sorted({"--" + f.name.replace("_", "-"), "--" + f.name})
        typ = _type_of(f)
        if typ is bool:
            p.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                           help=docs.get(f.name, ""))
        elif f.name == "split_batch_cnt":  # four integers, kept as one string ("6 3 2 5")
            from core.numbers import number

            p.add_argument(*names, dest=f.name, type=number(int, 0, 1 << 20), nargs=4, default=None,
                           metavar=("C128", "C256", "C384", "C512"), help=docs.get(f.name, ""))
        else:
            if f.name in BOUNDS:
                from core.numbers import number

                typ = number(typ, *BOUNDS[f.name])  # type: ignore[assignment]
            default = DEFAULT_TEXT.get(f.name) or (f"{f.default!r}" if f.name not in UNSET else "per --model: " + ", ".join(
                f"{m} {d[f.name]}" for m, d in MODEL_DEFAULTS.items()))
            p.add_argument(*names, dest=f.name, type=typ, default=f.default, choices=CHOICES.get(f.name),
                           help=f"{docs.get(f.name, '')} (default: {default})")


def from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig of parsed flags (unknown attributes ignored)."""
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    if "split_batch_cnt" in values:  # (argparse: None or the 4 integers)
        values["split_batch_cnt"] = " ".join(map(str, values["split_batch_cnt"] or []))
    return TrainConfig(**values)


def to_argv(cfg: TrainConfig) -> list[str]:
    """Flags that reproduce ``cfg`` (only the fields that differ from the defaults)."""
    argv: list[str] = []
    for f in fields(TrainConfig):
        value = getattr(cfg, f.name)
        if value == f.default and f.name not in ("train_dir", "output_dir"):
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif f.name == "split_batch_cnt":
            argv += [flag, *value.replace(",", " ").split()]
        else:
            argv += [flag, str(value)]
    return argv


def load_ds_config(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed JSON with the flag overrides applied, consistent batch fields and the gradient clipping
    (pretrain/recipe.py: --clip-grad-norm, else the JSON's gradient_clipping, else 1.0).

    DeepSpeed requires train_batch_size = micro x gradient_accumulation_steps x world_size; the
    accumulation steps are derived (Habana: 12288 / (32 x 8 cards) = 48).
    """
    path = Path(cfg.deepspeed_config)
    try:
        ds = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        from core.errors import InputError

        raise InputError(f"cannot read DeepSpeed config {path}: {exc}") from exc
    from pretrain.batch_mix import split_counts

    counts = split_counts(cfg)  # --split-batch-cnt: the micro-batch is their sum
    micro = sum(counts) if counts else cfg.micro_batch or int(ds.get("train_micro_batch_size_per_gpu", 8))
    gas = int(ds.get("gradient_accumulation_steps", 1))
    total = cfg.global_batch or int(ds.get("train_batch_size", micro * gas * world_size))
    if total % (micro * world_size):
        from core.errors import InputError

        raise InputError(f"global batch {total} is not a multiple of micro-batch {micro} x {world_size} ranks")
    ds.update(train_batch_size=total, train_micro_batch_size_per_gpu=micro,
              gradient_accumulation_steps=total // (micro * world_size))
    ds.setdefault("zero_allow_untested_optimizer", True)
    from pretrain.recipe import gradient_clipping

    ds["gradient_clipping"] = gradient_clipping(cfg, ds)[0]  # 1.0 unless the flag or the JSON says otherwise
    if cfg.zero_stage >= 0:
        ds.setdefault("zero_optimization", {})["stage"] = cfg.zero_stage
    ds.pop("optimizer", None)  # built in the script (our LAMB/LANS/AdamW) and passed to initialize
    ds.pop("scheduler", None)
    return ds


def _field_docs() -> dict[str, str]:
    """Field docstrings (the string literal under each field), for --help."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TrainConfig))
    body = tree.body[0].body
    docs = {}
    for a, b in zip(body, body[1:], strict=False):
        if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant):
            docs[a.target.id] = str(b.value.value).strip()
    return docs
