"""Checkpoint bookkeeping without DeepSpeed: latest tag, config refusal, per-rank state, pruning."""

from __future__ import annotations

import pytest
import torch

from core.errors import InputError
from pretrain import checkpoint as ckpt


def _tag(out, step):
    d = ckpt.checkpoint_dir(out) / str(step)
    d.mkdir(parents=True)
    return d


def test_prune_keeps_the_newest_and_latest(tmp_path):
    for s in (5, 10, 15, 20, 100):
        _tag(tmp_path, s)
    (ckpt.checkpoint_dir(tmp_path) / "latest").write_text("10")  # e.g. a resumed run's older latest
    deleted = ckpt.prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["15", "5"]
    assert sorted(p.name for p in ckpt.checkpoint_dir(tmp_path).iterdir()) == ["10", "100", "20", "latest"]
    assert ckpt.prune_checkpoints(tmp_path, keep=0) == []


def test_model_config_mismatch_is_refused(tmp_path):
    ckpt.write_run_config(tmp_path, "7", {"hidden_size": 64, "vocab_size": 30522}, {"optimizer": "lans"})
    ckpt.check_model_config(tmp_path, "7", {"hidden_size": 64, "vocab_size": 30522})
    with pytest.raises(InputError, match=r"another model config \(vocab_size: checkpoint 30522 vs this run 512035\)"):
        ckpt.check_model_config(tmp_path, "7", {"hidden_size": 64, "vocab_size": 512035})
    _tag(tmp_path, 8)
    with pytest.raises(InputError, match="has no readable bertpipe_config.json"):
        ckpt.check_model_config(tmp_path, "8", {"hidden_size": 64})


def test_rank_state_round_trip_and_missing_rank(tmp_path):
    ckpt.save_rank_state(tmp_path, "3", 1, 3, {"torch": torch.get_rng_state()}, {"epoch": 0, "index": 3,
                                                                                  "digest": "abc"})
    state = ckpt.load_rank_state(tmp_path, "3", 1)
    assert state["step"] == 3 and state["data"]["index"] == 3
    with pytest.raises(InputError, match=r"bertpipe_rank0\.pt is missing"):
        ckpt.load_rank_state(tmp_path, "3", 0)
    assert ckpt.latest_tag(tmp_path) is None


class _Payload:
    """An object whose unpickling would call a function: what a hostile checkpoint carries."""

    def __reduce__(self):
        return (print, ("unpickled!",))


def test_weights_only_load_refuses_arbitrary_objects(tmp_path, capsys):
    bad = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": {"w": torch.ones(2)}, "extra": _Payload()}, bad)
    with pytest.raises(InputError, match="refused to load") as e:
        ckpt.weights_only_load(bad)
    assert str(bad) in str(e.value) and "weights_only=True" in str(e.value)
    assert "unpickled!" not in capsys.readouterr().out


def test_weights_only_load_reads_deepspeed_zero_objects(tmp_path):
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    f = tmp_path / "optim_states.pt"
    torch.save({"loss_scaler": LossScaler(1.0), "zero_stage": ZeroStageEnum.optimizer_states,
                "fp32": torch.arange(3.0)}, f)
    state = ckpt.weights_only_load(f, map_location="cpu")
    assert state["zero_stage"] == ZeroStageEnum.optimizer_states and state["loss_scaler"].cur_scale == 1.0
    assert torch.equal(state["fp32"], torch.arange(3.0))

    class Engine:
        class checkpoint_engine:  # noqa: N801 - stands for DeepSpeed's TorchCheckpointEngine instance
            @staticmethod
            def load(path, map_location=None):
                raise AssertionError("DeepSpeed's own (full pickle) loader was called")

    engine = Engine()
    ckpt.safe_deepspeed_loads(engine)
    assert torch.equal(engine.checkpoint_engine.load(f, map_location=lambda s, loc: s)["fp32"], torch.arange(3.0))
