"""A run's recipe beyond the optimizer: which lr each step runs at, and the gradient clipping (no torch here).

Learning-rate schedule, two conventions (``--schedule-convention``; k = 1, 2, ... N the optimizer steps):

* ``mlperf``: NVIDIA's MLPerf BERT scheduler (``LinearWarmupPolyDecayScheduler`` in its training_results
  submissions, stepped before the optimizer with ``last_epoch`` = k): with ``offset = 1 if start == 0 else 0``
  and ``m = k - offset - start``, the lr is ``base * m / W`` while ``m < W``, else
  ``base * (1 - min((k - offset) / N, 1)) ** degree``. With ``--start-warmup-step 0`` (the default) that is
  f(k-1), MLCommons' TF reference exactly (``optimization.py``: warm-up ``(global_step - start) / W``,
  ``polynomial_decay(global_step)``, global_step = k - 1): the first warm-up step runs at lr 0, the last step at
  base/N (no warm-up: every step is base/N lower than f(k)). With a negative start (NVIDIA's configs: -25;
  Samsung's: -16) NVIDIA's scheduler drops the offset, so warm-up and decay run one step later than the TF
  formula would; bertpipe follows NVIDIA's, the code MLPerf's submissions ran. (NVIDIA divides by W + 1e-6;
  bertpipe by W: 1e-6/W relative.) W and start are integers (``--warmup-steps``, ``--start-warmup-step``);
  without ``--warmup-steps``, W = int(warmup_proportion x N), as NVIDIA's and Samsung's trainers compute it.
* ``habana``: Habana's DeepSpeed BERT (``PolyWarmUpScheduler`` in Model-References' deepspeed-bert): progress
  p = k / N, lr ``base * p / w`` while p < w, then base while p < w + c, then
  ``base * ((1 - p) / (1 - w - c)) ** degree``; step k runs at f(k) (its scheduler reads the optimizer's step
  count after DeepSpeed has stepped the optimizer, and DeepSpeed's zero-gradient state-initialisation step
  counts one: Habana's ZeRO runs pass ``adjust_step`` to keep bias correction at t, the schedule stays at
  f(k)). The first step's lr is not 0; the last step runs at lr 0. w = --warmup-proportion (or
  --warmup-steps / N), c = --constant-proportion.

Per model (MODEL_DEFAULTS in train_config.py): ``large`` and ``base`` run ``mlperf`` (MLPerf's BERT-Large
recipe; Google's BERT-Base recipe uses the same TF optimization.py), ``1.5b``/``5b`` ``habana``, ``tiny``
``habana`` (bertpipe's earlier behaviour, on which its 60-step defaults were tuned).

Gradient clipping (``--clip-grad-norm``): the global gradient norm is clipped to 1.0, as apex FusedLAMB
(``max_grad_norm=1.0``), NVIDIA's MLPerf runs and MLCommons' TF reference (``clip_by_global_norm(1.0)``) do,
unless the DeepSpeed config's ``gradient_clipping`` or the flag says otherwise (0: no clipping). DeepSpeed
applies it (its ``gradient_clipping``) before the optimizer sees the gradients.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import InputError

CONVENTIONS = ("mlperf", "habana")
DEFAULT_CLIP = 1.0


def habana_factor(step: int, total_steps: int, warmup: float, constant: float = 0.0, degree: float = 1.0) -> float:
    """Habana's PolyWarmUp multiplier at ``step`` (progress = step / total; see the module docstring)."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    progress = step / total_steps
    if progress < warmup:
        return progress / warmup
    if progress < warmup + constant:
        return 1.0
    remaining = max(1.0 - progress, 0.0)
    return (remaining / (1.0 - warmup - constant)) ** degree


def mlperf_factor(step: int, total_steps: int, warmup_steps: int, start_warmup_step: int = 0,
                  degree: float = 1.0) -> float:
    """NVIDIA's MLPerf LinearWarmupPolyDecay multiplier of optimizer step ``step`` (1-based; module docstring)."""
    if total_steps <= 0:
        raise ValueError(f"total_steps must be positive, got {total_steps}")
    offset = 1 if start_warmup_step == 0 else 0
    m = step - offset - start_warmup_step
    if warmup_steps and m < warmup_steps:
        return m / warmup_steps
    progress = min((step - offset) / total_steps, 1.0)
    return (1.0 - progress) ** degree


@dataclass(frozen=True)
class ScheduleSpec:
    """The resolved lr schedule of a run."""

    convention: str
    total_steps: int
    warmup_steps: int | float
    """mlperf: the integer W; habana: warm-up fraction x total steps (the step where the lr reaches its base)."""
    start_warmup_step: int = 0
    constant: float = 0.0
    degree: float = 1.0

    @property
    def warmup_fraction(self) -> float:
        return self.warmup_steps / self.total_steps

    def factor(self, step: int) -> float:
        """The lr multiplier of optimizer step ``step`` (1-based)."""
        if self.convention == "mlperf":
            return mlperf_factor(step, self.total_steps, int(self.warmup_steps), self.start_warmup_step, self.degree)
        return habana_factor(step, self.total_steps, self.warmup_fraction, self.constant, self.degree)

    def describe(self) -> str:
        if self.convention == "mlperf":
            warm = f"warm-up {int(self.warmup_steps)} steps" + (
                f" from step {self.start_warmup_step}" if self.start_warmup_step else "")
            return (f"schedule mlperf (NVIDIA's MLPerf scheduler: step k at f(k-1){' shifted' if self.start_warmup_step else ''}"
                    f"), {warm}, poly {self.degree:g} decay to 0 over {self.total_steps} steps")
        w = self.warmup_steps
        return (f"schedule habana (Habana's PolyWarmUp: step k at f(k)), warm-up {w:g} steps"
                + (f", constant to step {(self.warmup_fraction + self.constant) * self.total_steps:g}" if self.constant
                   else "") + f", poly {self.degree:g} decay to 0 at step {self.total_steps}")


def schedule_spec(cfg) -> ScheduleSpec:  # noqa: ANN001 - a pretrain.train_config.TrainConfig
    """The schedule of ``cfg`` (its flags, after the --model defaults).

    Raises:
        InputError: flags that contradict each other or the convention, naming them.
    """
    conv, n = cfg.schedule_convention, cfg.max_steps
    if conv not in CONVENTIONS:
        raise InputError(f"--schedule-convention {conv!r}: choose one of {', '.join(CONVENTIONS)}")
    if cfg.warmup_steps >= 0 and cfg.warmup_proportion >= 0:
        raise InputError(f"--warmup-steps {cfg.warmup_steps} and --warmup-proportion {cfg.warmup_proportion} both "
                         "given: give one of them")
    if cfg.warmup_steps > n:
        raise InputError(f"--warmup-steps {cfg.warmup_steps} is more than --max-steps {n}")
    if conv == "mlperf":
        if cfg.constant_proportion > 0:
            raise InputError(f"--constant-proportion {cfg.constant_proportion}: MLPerf's scheduler has no constant "
                             "phase; pass --constant-proportion 0 or --schedule-convention habana")
        warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else int(max(cfg.warmup_proportion, 0.0) * n)
        return ScheduleSpec("mlperf", n, warmup, cfg.start_warmup_step, 0.0, cfg.scheduler_degree)
    if cfg.start_warmup_step:
        raise InputError(f"--start-warmup-step {cfg.start_warmup_step} is a setting of MLPerf's scheduler: pass "
                         "--schedule-convention mlperf, or drop it")
    warmup = cfg.warmup_steps if cfg.warmup_steps >= 0 else max(cfg.warmup_proportion, 0.0) * n
    constant = max(cfg.constant_proportion, 0.0)
    if warmup / n + constant >= 1.0:
        raise InputError(f"warm-up ({warmup:g} of {n} steps) plus --constant-proportion {constant} leave no decay: "
                         "their sum must stay below 1")
    return ScheduleSpec("habana", n, warmup, 0, constant, cfg.scheduler_degree)


def gradient_clipping(cfg, ds_config: dict[str, Any] | None = None) -> tuple[float, str]:  # noqa: ANN001
    """(max gradient norm, where it comes from): --clip-grad-norm, else the DeepSpeed JSON's gradient_clipping,
    else 1.0. 0 means no clipping. ``ds_config``: the JSON already read (else it is read from the flag's path)."""
    if cfg.clip_grad_norm >= 0:
        return float(cfg.clip_grad_norm), "--clip-grad-norm"
    if ds_config is None:
        try:
            ds_config = json.loads(Path(cfg.deepspeed_config).read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read DeepSpeed config {cfg.deepspeed_config}: {exc}") from exc
    if "gradient_clipping" in ds_config:
        value = ds_config["gradient_clipping"]
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise InputError(f"DeepSpeed config {cfg.deepspeed_config}: gradient_clipping {value!r} is not a number "
                             ">= 0 (0: no clipping)")
        return float(value), f"{Path(cfg.deepspeed_config).name} gradient_clipping"
    return DEFAULT_CLIP, "default, as apex FusedLAMB and NVIDIA's MLPerf runs"


def describe_clipping(value: float, source: str) -> str:
    return f"gradient clipping {'off' if value == 0 else f'at global norm {value:g}'} ({source})"


def recipe_line(cfg, spec: ScheduleSpec | None = None, clip: tuple[float, str] | None = None,  # noqa: ANN001
                packed: bool = False) -> str:
    """One line saying what the run uses: optimizer and lr, the schedule, the clipping and the batches' bins
    (``packed``: the data is packed rows, whose batches are one-bin).

    Raises:
        InputError: contradicting schedule, clipping or batch flags (from :func:`schedule_spec`,
            :func:`gradient_clipping`, :func:`pretrain.batch_mix.split_counts`).
    """
    from pretrain.batch_mix import describe_mix

    spec = spec or schedule_spec(cfg)
    clip = clip or gradient_clipping(cfg)
    if packed and cfg.batch_mix == "split":
        raise InputError(f"--split-batch-cnt: {cfg.train_dir} holds packed rows, all of one width; split batches "
                         "need the padded 4-bin folder")
    mix = "batches: packed rows" if packed else describe_mix(cfg)
    return "recipe: " + "; ".join([f"{cfg.optimizer} lr {cfg.learning_rate:g}", spec.describe(),
                                   describe_clipping(*clip), mix])
