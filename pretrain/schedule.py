"""The learning-rate schedules (spec §13; pretrain/recipe.py: the mlperf and habana conventions) and the MLPerf
eval interval (spec §12)."""

from __future__ import annotations

import math

import torch

from pretrain.recipe import ScheduleSpec, habana_factor


def poly_warmup_factor(step: int, total_steps: int, warmup: float, constant: float = 0.0,
                       degree: float = 1.0) -> float:
    """The lr multiplier f(step) of optimizer step ``step`` (1-based; Habana's ``PolyWarmUpScheduler``).

    progress = step / total_steps; linear warm-up ``progress / warmup`` while progress < warmup, then 1
    while progress < warmup + constant, then ``((1 - progress) / (1 - warmup - constant)) ** degree``
    (clamped at 0 past the end). :class:`PolyWarmUpScheduler` gives step k the lr f(k), as Habana's DeepSpeed
    runs do (the ``habana`` convention of pretrain/recipe.py), so the first step's lr is not 0.
    """
    return habana_factor(step, total_steps, warmup, constant, degree)


class PolyWarmUpScheduler(torch.optim.lr_scheduler.LRScheduler):
    """Linear warm-up, optional constant phase, polynomial decay to 0 at ``total_steps``.

    Stepped after each optimizer step (torch's convention); the lr the optimizer holds for its k-th step
    (1-based) is ``base * poly_warmup_factor(k, ...)``: after ``last_epoch`` scheduler steps it is f(last_epoch + 1).

    Args:
        optimizer: the optimizer whose groups' ``lr`` it sets (their initial lr is the base lr).
        warmup: warm-up fraction of ``total_steps`` (reference: 0.05 for BERT-1.5B).
        total_steps: optimizer steps of the whole run (``--max-steps``).
        degree: polynomial degree of the decay (reference: 1.0, linear).
        constant: fraction of ``total_steps`` at the base lr after warm-up (reference: 0.25).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, total_steps: int, degree: float = 1.0,
                 constant: float = 0.0, last_epoch: int = -1) -> None:
        if not 0.0 <= warmup and 0.0 <= constant and warmup + constant < 1.0:
            raise ValueError(f"need 0 <= warmup, constant and warmup + constant < 1 (got {warmup}, {constant})")
        self.warmup, self.total_steps, self.degree, self.constant = warmup, total_steps, degree, constant
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        f = poly_warmup_factor(self.last_epoch + 1, self.total_steps, self.warmup, self.constant, self.degree)
        return [base * f for base in self.base_lrs]


class RecipeScheduler(torch.optim.lr_scheduler.LRScheduler):
    """The lr of a :class:`pretrain.recipe.ScheduleSpec` (mlperf or habana convention): the optimizer holds
    ``base * spec.factor(k)`` for its k-th step (1-based), the scheduler being stepped after each optimizer step.

    The spec is kept as plain attributes (checkpoints are read with ``weights_only``); a checkpoint of the
    earlier :class:`PolyWarmUpScheduler` (warmup fraction, no convention) resumes as the habana convention.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, spec: ScheduleSpec, last_epoch: int = -1) -> None:
        self.convention, self.total_steps, self.warmup_steps = spec.convention, spec.total_steps, spec.warmup_steps
        self.start_warmup_step, self.constant, self.degree = spec.start_warmup_step, spec.constant, spec.degree
        super().__init__(optimizer, last_epoch)

    @property
    def spec(self) -> ScheduleSpec:
        return ScheduleSpec(self.convention, self.total_steps, self.warmup_steps, self.start_warmup_step,
                            self.constant, self.degree)

    def get_lr(self) -> list[float]:
        f = self.spec.factor(self.last_epoch + 1)
        return [base * f for base in self.base_lrs]

    def load_state_dict(self, state_dict: dict) -> None:
        if "convention" not in state_dict and "warmup" in state_dict:  # a PolyWarmUpScheduler's state
            legacy = dict(state_dict)
            warmup = legacy.pop("warmup")
            legacy.update(convention="habana", warmup_steps=warmup * legacy["total_steps"], start_warmup_step=0)
            state_dict = legacy
        super().load_state_dict(state_dict)


def mlperf_eval_interval_samples(global_batch_size: int) -> int:
    """MLPerf BERT's eval frequency in training samples (spec §12).

    ``floor(0.05 * (230.23 * batch + 3,000,000) / 25,000) * 25,000``: 256..2048 -> 150,000;
    3072, 4096 -> 175,000; 8192 -> 225,000.
    """
    if global_batch_size <= 0:
        raise ValueError(f"global batch size must be positive, got {global_batch_size}")
    return math.floor(0.05 * (230.23 * global_batch_size + 3_000_000) / 25_000) * 25_000


def is_eval_step(step: int, global_batch_size: int, interval_samples: int) -> bool:
    """True when optimizer step ``step`` (1-based) crosses a multiple of ``interval_samples`` samples.

    Evaluations happen at samples 0 (optional, not here), F, 2F, ...; with a global batch that does not
    divide F the eval runs after the first step whose cumulative sample count reaches the next multiple.
    """
    if step <= 0:
        return False
    return crosses_multiple((step - 1) * global_batch_size, step * global_batch_size, interval_samples)


def crosses_multiple(before: int, after: int, interval_samples: int) -> bool:
    """True when a step that took the samples count from ``before`` to ``after`` reached the next multiple of
    ``interval_samples``: the eval rule in samples, whatever a step holds (packed steps train a varying number
    of sequences: ``pretrain/train.py`` counts them)."""
    return after // interval_samples > before // interval_samples


def eval_interval_steps(global_batch_size: int, interval_samples: int | None = None) -> float:
    """Average optimizer steps between evals (for logs): ``interval_samples / global_batch_size``."""
    samples = mlperf_eval_interval_samples(global_batch_size) if interval_samples is None else interval_samples
    return samples / global_batch_size
