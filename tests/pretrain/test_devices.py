"""Device selection without Habana/NVIDIA software: the probes' results are injected."""

from __future__ import annotations

import types

import pytest

from pretrain.devices import (
    DeviceChoice,
    hpu_lazy_mode,
    init_runtime,
    maybe_compile,
    probe_hpu,
    select_device,
)


@pytest.mark.parametrize(
    ("hpu", "cuda", "kind", "backend"),
    [(True, True, "hpu", "hccl"), (True, False, "hpu", "hccl"), (False, True, "cuda", "nccl"),
     (False, False, "cpu", "gloo")],
)
def test_auto_prefers_hpu_then_cuda_then_cpu(hpu, cuda, kind, backend):
    choice = select_device("auto", hpu_available=hpu, cuda_available=cuda, env={})
    assert (choice.kind, choice.backend, choice.accelerator) == (kind, backend, kind)


def test_flag_overrides_detection():
    assert select_device("cpu", hpu_available=True, cuda_available=True, env={}).kind == "cpu"
    assert select_device("cuda", hpu_available=True, cuda_available=True, env={}).kind == "cuda"
    assert select_device("auto", hpu_available=True, cuda_available=True, env={"DS_ACCELERATOR": "cpu"}).kind == "cpu"


def test_requested_but_missing_device_is_an_error():
    with pytest.raises(ValueError, match="habana_frameworks"):
        select_device("hpu", hpu_available=False, cuda_available=True, env={})
    with pytest.raises(ValueError, match="no CUDA device"):
        select_device("cuda", hpu_available=False, cuda_available=False, env={})
    with pytest.raises(ValueError, match="unknown device"):
        select_device("tpu", env={})


def test_hpu_lazy_mode_follows_env():
    assert hpu_lazy_mode({}) is True
    assert hpu_lazy_mode({"PT_HPU_LAZY_MODE": "1"}) is True
    assert hpu_lazy_mode({"PT_HPU_LAZY_MODE": "0"}) is False
    eager = select_device("auto", hpu_available=True, env={"PT_HPU_LAZY_MODE": "0"})
    assert eager.lazy_mode is False
    assert select_device("auto", hpu_available=False, cuda_available=False, env={}).lazy_mode is False


def test_probe_hpu_is_false_here():
    pytest.importorskip("torch")
    try:
        import habana_frameworks  # noqa: F401
    except ImportError:
        assert probe_hpu() is False


def _fake_importer(calls):
    htcore = types.SimpleNamespace(mark_step=lambda: calls.append("mark_step"))

    def importer(name):
        calls.append(name)
        return htcore if name == "habana_frameworks.torch.core" else types.SimpleNamespace()

    return importer


def test_hpu_runtime_marks_steps_only_in_lazy_mode():
    calls: list[str] = []
    rt = init_runtime(DeviceChoice("hpu", "hccl", lazy_mode=True), importer=_fake_importer(calls))
    rt.mark_step()
    assert calls == ["habana_frameworks.torch.core", "habana_frameworks.torch.distributed.hccl", "mark_step"]
    calls.clear()
    init_runtime(DeviceChoice("hpu", "hccl", lazy_mode=False), importer=_fake_importer(calls)).mark_step()
    assert "mark_step" not in calls
    init_runtime(DeviceChoice("cpu", "gloo")).mark_step()  # a no-op off HPU


def test_compile_only_where_it_applies():
    compiled = []
    engine = types.SimpleNamespace(compile=lambda **kw: compiled.append(kw))
    assert maybe_compile(engine, DeviceChoice("hpu", "hccl", lazy_mode=True), True) is False
    assert maybe_compile(engine, DeviceChoice("hpu", "hccl", lazy_mode=False), True) is True
    assert compiled[-1] == {"compile_kwargs": {"dynamic": False}}
    assert maybe_compile(engine, DeviceChoice("cpu", "gloo"), False) is False
    assert len(compiled) == 1
    assert DeviceChoice("cuda", "nccl").torch_device(3) == "cuda:3"
