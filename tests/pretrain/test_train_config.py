"""TrainConfig flags round-trip through the launcher argv; DeepSpeed batch fields are made consistent."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from core.errors import InputError
from pretrain.train_config import TrainConfig, add_train_arguments, from_args, load_ds_config, to_argv

DEPLOY = Path(__file__).resolve().parents[2] / "deployments"


def _parse(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return from_args(p.parse_args(argv))


def test_argv_round_trip():
    cfg = TrainConfig(train_dir="d", eval_file="e.hdf5", output_dir="o", model="large", max_steps=7,
                      learning_rate=0.0015, deterministic=True, tensorboard=False, steps_this_run=3)
    assert _parse(to_argv(cfg)) == cfg
    assert _parse(["--max_steps=9", "--train-dir", "x"]).max_steps == 9  # reference spelling too


@pytest.mark.parametrize("path", ["tf1 ckpt/model.ckpt-28252", "/abs/init.safetensors", "hf/tiny"])
def test_init_checkpoint_round_trips(path):
    cfg = TrainConfig(train_dir="d", output_dir="o", init_checkpoint=path, resume=True)
    argv = to_argv(cfg)
    assert argv[argv.index("--init-checkpoint") + 1] == path  # one argv element, even with a space
    assert _parse(argv) == cfg
    assert _parse(["--init_checkpoint=" + path]).init_checkpoint == path  # the underscore spelling too
    assert "--init-checkpoint" not in to_argv(TrainConfig(train_dir="d"))  # default: not on the command line
    assert TrainConfig().init_checkpoint == "" and cfg.to_dict()["init_checkpoint"] == path


def test_unknown_choices_are_rejected():
    with pytest.raises(SystemExit):
        _parse(["--model", "huge"])
    with pytest.raises(SystemExit):
        _parse(["--optimizer", "sgd"])


def test_habana_presets_give_their_accumulation_steps():
    ds = load_ds_config(TrainConfig(deepspeed_config=str(DEPLOY / "ds_config_bert_1.5b.json")), world_size=8)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == \
        (12288, 32, 48)
    ds = load_ds_config(TrainConfig(deepspeed_config=str(DEPLOY / "ds_config_bert_5b.json")), world_size=32)
    assert ds["gradient_accumulation_steps"] == 12 and ds["zero_optimization"]["stage"] == 2
    assert ds["zero_allow_untested_optimizer"] is True and "optimizer" not in ds


def test_flag_overrides_and_bad_batch(tmp_path):
    ds = load_ds_config(TrainConfig(micro_batch=4, global_batch=32, zero_stage=2), world_size=2)
    assert (ds["train_batch_size"], ds["gradient_accumulation_steps"], ds["zero_optimization"]["stage"]) == (32, 4, 2)
    assert ds["bf16"]["enabled"] is True
    with pytest.raises(InputError, match="not a multiple"):
        load_ds_config(TrainConfig(micro_batch=3, global_batch=32), world_size=2)
    bad = tmp_path / "ds.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="cannot read DeepSpeed config"):
        load_ds_config(TrainConfig(deepspeed_config=str(bad)), world_size=1)
    with_opt = tmp_path / "opt.json"
    with_opt.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "Lamb"}}))
    assert "optimizer" not in load_ds_config(TrainConfig(deepspeed_config=str(with_opt)), world_size=1)


def test_optimizer_settings_follow_the_model_and_explicit_flags_win():
    from pretrain.train_config import MODEL_DEFAULTS

    tiny, large, big = TrainConfig(), TrainConfig(model="large"), _parse(["--model", "1.5b"])
    assert (tiny.optimizer, tiny.learning_rate, tiny.warmup_proportion, tiny.constant_proportion) == \
        ("lans", 0.05, 0.05, 0.0)
    assert (large.optimizer, large.learning_rate, large.warmup_proportion) == ("lamb", 4e-4, 0.0)  # MLPerf
    assert (big.optimizer, big.learning_rate, big.warmup_proportion, big.constant_proportion) == \
        ("lans", 0.0015, 0.05, 0.25)  # Habana's BERT-1.5B
    mine = _parse(["--model", "1.5b", "--learning-rate", "0.002", "--optimizer", "lamb", "--constant-proportion", "0"])
    assert (mine.optimizer, mine.learning_rate, mine.warmup_proportion, mine.constant_proportion) == \
        ("lamb", 0.002, 0.05, 0.0)
    assert _parse(to_argv(mine)) == mine and _parse(to_argv(big)) == big
    assert set(MODEL_DEFAULTS) == {"tiny", "base", "large", "1.5b", "5b"}
    assert _parse(["--trust-ratio", "per-group"]).trust_ratio == "per-group" and TrainConfig().trust_ratio == "per-tensor"
    assert _parse(["--lamb-trust-ratio-no-decay"]).lamb_trust_ratio_no_decay is True
    with pytest.raises(SystemExit):
        _parse(["--trust-ratio", "per-layer"])
