"""LAMB/LANS under real DeepSpeed on CPU: step counts and per-tensor trust ratios inside ZeRO partitions.

* Bias correction counts t = 1, 2, 3 under ZeRO-0/1/2 in fp32 and bf16 (one rank, in a subprocess), and
  DeepSpeed's state-initialisation call (ZeRO-0 bf16) leaves the weights alone.
* 2 ranks with ZeRO-1 and ZeRO-2 (both ranks fed the same batches, so the averaged gradient is the single-process one)
  give the same weights as unsharded per-tensor LAMB/LANS to fp32 round-off; ``per-group`` does not, and
  equals instead LAMB/LANS over each rank's partition as one tensor (Habana's ZeRO behaviour, written out).

The DeepSpeed work runs in child processes (this file is also their program), so no process group leaks
into the test session; each test takes 10-15 s on a busy 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


def _model(torch):
    torch.manual_seed(0)
    # odd sizes so that ZeRO's 2 partitions cut parameters in the middle
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5), torch.nn.Tanh(), torch.nn.Linear(5, 3),
                               torch.nn.Linear(3, 2))


def _groups(model):
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2]
    other = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() == 2)]
    return [{"params": decay, "weight_decay": 0.01}, {"params": other, "weight_decay": 0.0}]


def _batches(torch, dtype):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 7, generator=g).to(dtype) for _ in range(STEPS)]


def _loss(model, x):
    return (model(x).float() ** 2).mean()


def _engine(deepspeed, model, opt, stage: int, bf16: bool):
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "zero_allow_untested_optimizer": True,
           "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}, "steps_per_print": 10**9}
    cfg["train_batch_size"] = 4 * int(os.environ.get("WORLD_SIZE", "1"))
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    return engine


def _worker_counts(out: Path) -> None:
    import deepspeed
    import torch

    import pretrain.optim as po

    deepspeed.init_distributed(dist_backend="gloo")
    seen: list[int] = []
    orig = po._Base._bias_corrections

    def record(group, step, adjust=False):
        seen.append(step)
        return orig(group, step, adjust)

    po._Base._bias_corrections = staticmethod(record)
    result = {}
    for stage in (0, 1, 2):
        for bf16 in (False, True):
            for name in ("lamb", "lans"):
                model = _model(torch)
                dtype = torch.bfloat16 if bf16 else torch.float32  # the engine casts the model to bf16
                before = [p.detach().to(dtype).float() for p in model.parameters()]
                opt = po.build_optimizer(name, _groups(model), lr=0.01)
                engine = _engine(deepspeed, model, opt, stage, bf16)
                po.attach_zero_partitions(engine, opt)
                unchanged = all(torch.equal(a, p.detach().float()) for a, p in zip(before, model.parameters(), strict=True))
                counts = []
                for x in _batches(torch, torch.bfloat16 if bf16 else torch.float32):
                    seen.clear()
                    engine.backward(_loss(engine, x))
                    engine.step()
                    counts.append(sorted(set(seen)))
                result[f"{name} zero{stage} {'bf16' if bf16 else 'fp32'}"] = {
                    "t": counts, "group_steps": [g["step"] for g in opt.param_groups], "init_unchanged": unchanged,
                    "wrapper": type(engine.optimizer).__name__}
    out.write_text(json.dumps(result))


def _reference(torch, name: str, **kw) -> list:
    import pretrain.optim as po

    model = _model(torch)
    opt = po.build_optimizer(name, _groups(model), lr=0.05, **kw)
    for x in _batches(torch, torch.float32):
        opt.zero_grad()
        _loss(model, x).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _per_partition_reference(torch, name: str, partition_sizes: list[int], world: int, **kw) -> list:
    """Habana's ZeRO behaviour written out: each rank's partition of a group's flat vector is one "tensor"."""
    import pretrain.optim as po

    model = _model(torch)
    groups = _groups(model)
    chunks = []  # per group: its flat vector (padded to world x partition) cut into world leaf tensors
    for g, size in zip(groups, partition_sizes, strict=True):
        flat = torch.cat([p.detach().flatten() for p in g["params"]])
        flat = torch.cat([flat, flat.new_zeros(world * size - len(flat))])
        chunks.append([c.clone().requires_grad_() for c in flat.split(size)])
    opt = po.build_optimizer(name, [{"params": c, "weight_decay": g["weight_decay"]}
                                    for c, g in zip(chunks, groups, strict=True)], lr=0.05, **kw)
    for x in _batches(torch, torch.float32):
        model.zero_grad()
        _loss(model, x).backward()
        for c, g, size in zip(chunks, groups, partition_sizes, strict=True):
            grad = torch.cat([p.grad.flatten() for p in g["params"]])
            grad = torch.cat([grad, grad.new_zeros(world * size - len(grad))])
            for leaf, part in zip(c, grad.split(size), strict=True):
                leaf.grad = part.clone()
        opt.step()
        with torch.no_grad():  # the new weights back into the model for the next gradient
            for c, g in zip(chunks, groups, strict=True):
                flat = torch.cat([leaf.detach() for leaf in c])
                offset = 0
                for p in g["params"]:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
    return [p.detach().clone() for p in model.parameters()]


def _worker_sharded(out: Path) -> None:
    import deepspeed
    import torch

    import pretrain.optim as po

    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    result = {}
    for name, kw in (("lamb", {}), ("lamb", {"lamb_trust_ratio_no_decay": True}), ("lans", {})):
        ref = _reference(torch, name, **kw)
        for mode, stage in (("per-tensor", 1), ("per-group", 1), ("per-tensor", 2)):
            model = _model(torch)
            opt = po.build_optimizer(name, _groups(model), lr=0.05, **kw)
            engine = _engine(deepspeed, model, opt, stage, False)
            attached = po.attach_zero_partitions(engine, opt, mode)
            for x in _batches(torch, torch.float32):  # the same batch on both ranks
                engine.backward(_loss(engine, x))
                engine.step()
            diff = max(float((a - b).abs().max()) for a, b in zip(ref, model.parameters(), strict=True))
            scale = max(float(a.abs().max()) for a in ref)
            key = f"{name}{'+no-decay-ratio' if kw else ''} zero{stage} {mode}"
            result[key] = {"max_abs_diff": diff, "max_abs_weight": scale, "groups_attached": attached,
                           "flat_groups": [len(g["params"]) for g in opt.param_groups]}
            if mode == "per-group":
                habana = _per_partition_reference(torch, name, [int(n) for n in engine.optimizer.partition_size],
                                                  torch.distributed.get_world_size(), **kw)
                result[key]["max_abs_diff_per_partition_ref"] = max(
                    float((a - b).abs().max()) for a, b in zip(habana, model.parameters(), strict=True))
    if rank == 0:
        out.write_text(json.dumps(result))


def _run(args: list[str], out: Path, timeout: int = 300) -> dict:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(args + [__file__, str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_bias_correction_counts_1_2_3_under_every_zero_stage_and_precision(tmp_path):
    pytest.importorskip("deepspeed")
    from pretrain.launch import free_port

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    try:
        result = _run([sys.executable], tmp_path / "counts.json")
    finally:
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(k, None)
    assert len(result) == 12
    for mode, r in result.items():
        assert r["t"] == [[1], [2], [3]], (mode, r)
        assert r["group_steps"] == [STEPS, STEPS], (mode, r)
        assert r["init_unchanged"], mode  # DeepSpeed's zero-gradient state-init step moved nothing
    # the wrapper that makes that state-init call is really exercised
    assert result["lans zero0 bf16"]["wrapper"] == "FP16_UnfusedOptimizer"
    assert result["lans zero1 fp32"]["wrapper"] == "DeepSpeedZeroOptimizer"


def test_two_rank_zero1_and_2_per_tensor_equal_unsharded(tmp_path):
    pytest.importorskip("deepspeed")
    from pretrain.launch import free_port

    result = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                   str(free_port())], tmp_path / "sharded.json")
    assert set(result) == {f"{k} {m}" for k in ("lamb", "lamb+no-decay-ratio", "lans")
                           for m in ("zero1 per-tensor", "zero1 per-group", "zero2 per-tensor")}
    for key, r in result.items():
        assert r["flat_groups"] == [1, 1], key  # ZeRO really flattened the groups
        assert r["groups_attached"] == 2, key
        if key.endswith("per-tensor"):
            assert r["max_abs_diff"] < 2e-6 * max(1.0, r["max_abs_weight"]), (key, r)
        else:  # one ratio per rank's partition: measurably another update, and exactly Habana's
            assert r["max_abs_diff"] > 1e-4, (key, r)
            assert r["max_abs_diff_per_partition_ref"] < 2e-6 * max(1.0, r["max_abs_weight"]), (key, r)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    target = Path(sys.argv[1])
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        _worker_sharded(target)
    else:
        _worker_counts(target)
