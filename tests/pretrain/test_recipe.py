"""The lr of every step against the references' schedulers written out, the flags that set them, the MLPerf
log's record of them, and the gradient clipping default (pretrain/recipe.py)."""

from __future__ import annotations

import argparse
import json
import types
from pathlib import Path

import pytest
import torch

from core.errors import InputError
from pretrain.recipe import ScheduleSpec, gradient_clipping, recipe_line, schedule_spec
from pretrain.schedule import PolyWarmUpScheduler, RecipeScheduler
from pretrain.train_config import TrainConfig, add_train_arguments, from_args, load_ds_config, to_argv


def _parse(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return from_args(p.parse_args(argv))


def ours(spec: ScheduleSpec, base: float) -> list[float]:
    """The lr the optimizer holds at each of its steps, driven as DeepSpeed drives it (scheduler after step)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = RecipeScheduler(opt, spec)
    seen = []
    for _ in range(spec.total_steps):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return seen


# --- NVIDIA's MLPerf scheduler (training_results_v1.0 NVIDIA/benchmarks/bert/implementations/pytorch/schedulers.py,
# LinearWarmupPolyDecayScheduler), written out. Its step() runs before each optimizer step with
# last_epoch = optimizer._step + 1 (steps done + 1), so the k-th step (1-based) runs at get_lr(last_epoch=k).
def nvidia_lr(last_epoch: int, base: float, start_warmup_steps: int, warmup_steps: int, total_steps: int,
              end_learning_rate: float = 0.0, degree: float = 1.0) -> float:
    offset_step = int(start_warmup_steps == 0)
    mod_step = last_epoch - offset_step - start_warmup_steps
    cond = float(mod_step < warmup_steps)
    progress = cond * (mod_step / (warmup_steps + 1e-6)) + (1.0 - cond) * min(
        (last_epoch - offset_step) / total_steps, 1.0)
    return cond * (base * progress) + (1.0 - cond) * (
        (base - end_learning_rate) * (1 - progress) ** degree + end_learning_rate)


# --- MLCommons' TF reference (training language_model/tensorflow/bert/optimization.py create_optimizer): the
# k-th step runs with global_step = k - 1.
def tf_lr(global_step: int, base: float, num_train_steps: int, num_warmup_steps: int, start_warmup_step: int = 0,
          poly_power: float = 1.0) -> float:
    lr = base * (1.0 - min(global_step, num_train_steps) / num_train_steps) ** poly_power  # polynomial_decay
    if num_warmup_steps:
        steps = global_step - start_warmup_step
        if steps < num_warmup_steps:
            lr = base * steps / num_warmup_steps
    return lr


# --- Habana's DeepSpeed BERT (Model-References PyTorch/nlp/DeepSpeedExamples/deepspeed-bert/schedulers.py
# PolyWarmUpScheduler and lans.py), re-enacted: the scheduler is built before deepspeed.initialize, its step()
# sets last_epoch = param_group['step'] (1 while absent) and is called by DeepSpeed after each optimizer step;
# LANS counts group['step'] on every call, DeepSpeed ZeRO's zero-gradient state-initialisation call included.
def habana_get_lr(last_epoch: int, base: float, warmup: float, total_steps: int, degree: float, constant: float):
    progress = last_epoch / total_steps
    if progress < warmup:
        return base * progress / warmup
    if progress < warmup + constant:
        return base
    return base * ((1.0 - progress) / (1.0 - warmup - constant)) ** degree


def habana_lrs(base: float, warmup: float, total_steps: int, degree: float = 1.0, constant: float = 0.0):
    group: dict = {}
    lr = habana_get_lr(1, base, warmup, total_steps, degree, constant)  # the constructor's step(): no 'step' yet
    group["step"] = 1  # deepspeed.initialize: ZeRO's state-initialisation optimizer step (LANS counts it)
    seen = []
    for _ in range(total_steps):
        seen.append(lr)
        group["step"] += 1  # the optimizer step
        lr = habana_get_lr(group["step"], base, warmup, total_steps, degree, constant)  # engine: scheduler.step()
    return seen


NVIDIA_CASES = [  # (total, warmup steps, start_warmup_step): no warm-up; a warm-up; NVIDIA's v1.0 8x8x48 config
    (60, 0, 0), (40, 10, 0), (1271, 100, -25), (179, 82, -16)]  # ... and Samsung's v1.1 (lr_max_steps 179)


@pytest.mark.parametrize(("total", "warmup", "start"), NVIDIA_CASES)
def test_mlperf_convention_is_nvidias_mlperf_scheduler_at_every_step(total, warmup, start):
    base = 4e-4
    got = ours(ScheduleSpec("mlperf", total, warmup, start), base)
    want = [nvidia_lr(k, base, start, warmup, total) for k in range(1, total + 1)]
    for k, (a, b) in enumerate(zip(got, want, strict=True), 1):
        assert a == pytest.approx(b, rel=2e-6, abs=1e-15), (k, a, b)  # (NVIDIA divides by W + 1e-6)
    if start == 0:  # f(k-1): MLCommons' TF reference too, to the last bit
        assert got == pytest.approx([tf_lr(k - 1, base, total, warmup) for k in range(1, total + 1)], rel=1e-12)
        assert got[-1] == pytest.approx(base / total)  # the last step is not at lr 0
        assert got[0] == (0.0 if warmup else base)  # the first warm-up step runs at lr 0
    else:  # NVIDIA's scheduler drops its offset for a nonzero start: one step ahead of the TF formula
        assert got[:-1] == pytest.approx([tf_lr(k, base, total, warmup, start) for k in range(1, total)], rel=1e-12)


@pytest.mark.parametrize(("total", "warmup", "constant", "degree"), [(100, 0.05, 0.25, 1.0), (60, 0.05, 0.0, 1.0),
                                                                    (40, 0.1, 0.0, 2.0), (7, 0.0, 0.0, 1.0)])
def test_habana_convention_is_habanas_deepspeed_run_at_every_step(total, warmup, constant, degree):
    base = 0.0015
    got = ours(ScheduleSpec("habana", total, warmup * total, 0, constant, degree), base)
    want = habana_lrs(base, warmup, total, degree, constant)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-18)
    assert got[-1] == 0.0 and got[0] > 0.0  # f(k): the last step at lr 0, the first not
    old = PolyWarmUpScheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base), warmup, total,
                              degree, constant)  # bertpipe's earlier scheduler: the same lrs
    assert old.get_last_lr()[0] == pytest.approx(want[0])


def test_the_two_conventions():
    """Without warm-up one step apart; with one, MLPerf's decay also runs over the whole run (the warm-up
    overriding its start) while Habana's decays from the end of the warm-up."""
    mlperf, habana = ours(ScheduleSpec("mlperf", 20, 0), 1.0), ours(ScheduleSpec("habana", 20, 0), 1.0)
    assert mlperf[1:] == pytest.approx(habana[:-1]) and mlperf[0] == 1.0 and habana[-1] == 0.0
    mlperf, habana = ours(ScheduleSpec("mlperf", 20, 4), 1.0), ours(ScheduleSpec("habana", 20, 4), 1.0)
    assert mlperf[:5] == pytest.approx([0.0, 0.25, 0.5, 0.75, 0.8])  # 1 - 4/20 right after the warm-up
    assert habana[:5] == pytest.approx([0.25, 0.5, 0.75, 1.0, 0.9375])  # (1 - 5/20) / (1 - 0.2)


def test_defaults_per_model_and_the_integer_flags():
    assert schedule_spec(TrainConfig(model="large", max_steps=8000)) == ScheduleSpec("mlperf", 8000, 0, 0)
    assert schedule_spec(TrainConfig(model="base", max_steps=1000)).warmup_steps == 10  # int(0.01 x 1000)
    assert schedule_spec(TrainConfig(model="1.5b", max_steps=1000)) == ScheduleSpec("habana", 1000, 50.0, 0, 0.25)
    assert schedule_spec(TrainConfig(model="tiny", max_steps=60)).convention == "habana"
    # NVIDIA's truncation of the proportion: int(0.0333 x 1000) = 33
    assert schedule_spec(TrainConfig(model="large", max_steps=1000, warmup_proportion=0.0333)).warmup_steps == 33
    cfg = _parse(["--model", "large", "--max-steps", "1271", "--warmup-steps", "100", "--start-warmup-step", "-25"])
    assert (cfg.warmup_steps, cfg.start_warmup_step, cfg.warmup_proportion) == (100, -25, -1.0)
    assert schedule_spec(cfg) == ScheduleSpec("mlperf", 1271, 100, -25)
    assert _parse(to_argv(cfg)) == cfg
    habana = _parse(["--model", "1.5b", "--max-steps", "1000", "--warmup-steps", "40"])
    assert schedule_spec(habana) == ScheduleSpec("habana", 1000, 40, 0, 0.25)
    assert _parse(["--schedule-convention", "mlperf"]).schedule_convention == "mlperf"


@pytest.mark.parametrize(("argv", "match"), [
    (["--warmup-steps", "10", "--warmup-proportion", "0.1"], "give one of them"),
    (["--warmup-steps", "500", "--max-steps", "100"], "more than --max-steps 100"),
    (["--model", "tiny", "--start-warmup-step", "-3"], "--start-warmup-step -3 is a setting of MLPerf"),
    (["--model", "1.5b", "--schedule-convention", "mlperf"], "--constant-proportion 0.25: MLPerf's scheduler"),
    (["--model", "1.5b", "--warmup-proportion", "0.5", "--constant-proportion", "0.5"], "leave no decay"),
])
def test_contradicting_schedule_flags_are_refused_in_one_line(argv, match):
    with pytest.raises(InputError, match=match) as e:
        schedule_spec(_parse(argv))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("argv", [["--start-warmup-step", "3"], ["--warmup-steps", "-2"],
                                  ["--schedule-convention", "nvidia"], ["--clip-grad-norm", "-1"],
                                  ["--clip-grad-norm", "nan"]])
def test_bad_values_are_refused_when_parsed(argv, capsys):
    with pytest.raises(SystemExit):
        _parse(argv)
    assert argv[0] in capsys.readouterr().err


def test_scheduler_state_resumes_and_an_older_checkpoint_resumes_as_habana():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = RecipeScheduler(opt, ScheduleSpec("mlperf", 10, 3, -1))
    for _ in range(4):
        opt.step()
        sched.step()
    state = sched.state_dict()
    assert all(isinstance(v, int | float | str | list) for v in state.values())  # weights_only-safe
    again = RecipeScheduler(torch.optim.SGD([p], lr=1.0), ScheduleSpec("habana", 99, 0))
    again.load_state_dict(state)
    assert again.spec == ScheduleSpec("mlperf", 10, 3, -1) and again.get_last_lr() == sched.get_last_lr()
    old_opt = torch.optim.SGD([p], lr=1.0)
    old = PolyWarmUpScheduler(old_opt, 0.2, 10, 1.0, 0.1)
    for _ in range(3):
        old_opt.step()
        old.step()
    resumed = RecipeScheduler(torch.optim.SGD([p], lr=1.0), ScheduleSpec("mlperf", 10, 0))
    resumed.load_state_dict(old.state_dict())
    assert resumed.spec == ScheduleSpec("habana", 10, 2.0, 0, 0.1) and resumed.last_epoch == 3
    assert resumed.get_lr() == pytest.approx(old.get_lr())


def test_the_mlperf_log_records_the_schedule_the_run_runs(tmp_path):
    pytest.importorskip("mlperf_logging")
    from pretrain.mlperf_log import MLPerfLog

    def logged(cfg: TrainConfig, d: Path) -> dict:
        log = MLPerfLog(d, enabled=True)
        opt = types.SimpleNamespace(param_groups=[{"weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-6}])
        log.run_start(cfg, types.SimpleNamespace(max_position_embeddings=512), 8, "cpu", 448, 1, opt, 10000, 0, 0)
        log.run_stop(0, None)
        recs = [json.loads(line[len(":::MLLOG "):]) for line in (d / "mllog.txt").read_text().splitlines()]
        return {r["key"]: r["value"] for r in recs}

    samsung = logged(_parse(["--model", "large", "--max-steps", "179", "--warmup-steps", "82",
                             "--start-warmup-step", "-16"]), tmp_path / "a")
    assert (samsung["opt_learning_rate_warmup_steps"], samsung["num_warmup_steps"], samsung["start_warmup_step"],
            samsung["opt_learning_rate_training_steps"]) == (82, 82, -16, 179)
    habana = logged(TrainConfig(model="1.5b", max_steps=1000), tmp_path / "b")
    assert (habana["opt_learning_rate_warmup_steps"], habana["start_warmup_step"]) == (50, 0)


def test_clipping_defaults_to_1_unless_the_deepspeed_config_or_the_flag_says(tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}}))
    half = tmp_path / "half.json"
    half.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.5}))
    assert load_ds_config(TrainConfig(deepspeed_config=str(bare)), 1)["gradient_clipping"] == 1.0
    assert gradient_clipping(TrainConfig(deepspeed_config=str(bare)))[1].startswith("default, as apex FusedLAMB")
    assert load_ds_config(TrainConfig(deepspeed_config=str(half)), 1)["gradient_clipping"] == 0.5
    assert load_ds_config(_parse(["--deepspeed-config", str(half), "--clip-grad-norm", "2"]), 1)[
        "gradient_clipping"] == 2.0
    assert load_ds_config(_parse(["--deepspeed-config", str(half), "--clip-grad-norm", "0"]), 1)[
        "gradient_clipping"] == 0.0
    assert _parse(to_argv(_parse(["--clip-grad-norm", "0"]))).clip_grad_norm == 0.0
    assert "gradient clipping off (--clip-grad-norm)" in recipe_line(_parse(["--clip-grad-norm", "0"]))
    line = recipe_line(TrainConfig(deepspeed_config=str(bare), model="large", max_steps=100))
    assert "gradient clipping at global norm 1 (default, as apex FusedLAMB" in line
    assert "schedule mlperf" in line and "rows of any length at random" in line
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"gradient_clipping": "yes"}))
    with pytest.raises(InputError, match="gradient_clipping 'yes' is not a number"):
        load_ds_config(TrainConfig(deepspeed_config=str(bad)), 1)


def test_the_cli_says_the_recipe_first(golden, tmp_path, capsys):
    from bertpipe.cli import main

    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 1}}))
    rc = main(["train", "--train-dir", str(golden / "4bins"), "--model", "large", "--vocab-size", "30522",
               "--max-steps", "50", "--warmup-steps", "5", "--nproc", "2", "--output-dir", str(tmp_path / "o"),
               "--deepspeed-config", str(bare), "--dry-run"])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert out[0].startswith("recipe: lamb lr 0.0004; schedule mlperf") and "warm-up 5 steps" in out[0]
    assert "gradient clipping at global norm 1 (default" in out[0] and "batches: rows of any length" in out[0]
    assert "deepspeed --num_gpus 2" in out[-1] and "--warmup-steps 5" in out[-1]
    rc = main(["train", "--train-dir", str(golden / "4bins"), "--model", "large", "--max-steps", "50",
               "--warmup-steps", "5", "--warmup-proportion", "0.1", "--output-dir", str(tmp_path / "o"), "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "give one of them" in err and len(err.strip().splitlines()) == 1
