"""set_determinism: seed + rank everywhere, strict flags, and a round trip of the RNG state."""

from __future__ import annotations

import random
import types

import numpy as np
import torch

from pretrain.determinism import CUBLAS_WORKSPACE, rng_state, set_determinism, set_rng_state


class FakeTorch:
    def __init__(self):
        self.calls = []
        self.cuda = types.SimpleNamespace(manual_seed_all=lambda s: self.calls.append(("cuda", s)))
        self.hpu = types.SimpleNamespace(manual_seed_all=lambda s: self.calls.append(("hpu", s)))
        self.backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(deterministic=False, benchmark=True))

    def manual_seed(self, s):
        self.calls.append(("torch", s))

    def use_deterministic_algorithms(self, flag):
        self.calls.append(("deterministic", flag))


def test_rank_offsets_and_device_seeds():
    for rank in (0, 1, 7):
        fake, env = FakeTorch(), {}
        assert set_determinism(100, rank, False, "cuda", torch_mod=fake, env=env) == 100 + rank
        assert fake.calls == [("torch", 100 + rank), ("cuda", 100 + rank)]
        assert env == {}
    fake = FakeTorch()
    set_determinism(5, 2, False, "hpu", torch_mod=fake, env={})
    assert fake.calls == [("torch", 7), ("hpu", 7)]


def test_python_and_numpy_seeded_with_rank_offset():
    set_determinism(42, 3, False, "cpu", torch_mod=FakeTorch(), env={})
    a, b = random.random(), np.random.rand()
    random.seed(45)
    np.random.seed(45)
    assert (a, b) == (random.random(), np.random.rand())


def test_strict_mode_flags():
    fake, env = FakeTorch(), {}
    set_determinism(1, 0, True, "cuda", torch_mod=fake, env=env)
    assert env["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE
    assert fake.backends.cudnn.deterministic is True and fake.backends.cudnn.benchmark is False
    assert ("deterministic", True) in fake.calls
    fake, env = FakeTorch(), {}
    set_determinism(1, 0, True, "cpu", torch_mod=fake, env=env)
    assert env == {} and ("deterministic", True) in fake.calls


def test_rng_state_round_trip_is_weights_only_loadable(tmp_path):
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    state = rng_state("cpu")
    torch.save(state, tmp_path / "s.pt")
    expected = (torch.rand(3), random.random(), np.random.rand())
    set_rng_state(torch.load(tmp_path / "s.pt", weights_only=True), "cpu")
    got = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(expected[0], got[0]) and expected[1:] == got[1:]
