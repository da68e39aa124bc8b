"""BERT pre-training with DeepSpeed: the program each rank runs (launched by ``deepspeed`` or ``torchrun``).

Runbook (from the repository root; ``bertpipe train ...`` prints and runs the same commands):

  # 2 CPU ranks, tiny model, golden 4-bin sample (as the tests; 0.2-2 s/step on a busy 2-core box)
  DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 deepspeed --num_gpus 2 pretrain/train.py \\
      --train-dir ../shared/data/golden/4bins --eval-file ../shared/data/golden/eval_100.hdf5 \\
      --model tiny --max-steps 50 --learning-rate 0.05 --output-dir results/tiny --eval-interval-steps 25
  # the same with torchrun (no DeepSpeed launcher), or one process without any launcher
  DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 pretrain/train.py --train-dir ... --output-dir ...
  DS_ACCELERATOR=cpu python pretrain/train.py --train-dir ... --output-dir ...

  # 8 Gaudi cards, BERT-1.5B, Habana's recipe (ZeRO-1, bf16, LANS, lr 0.0015, warm-up 5 %, constant 25 %)
  PT_HPU_LAZY_MODE=0 deepspeed --num_nodes 1 --num_gpus 8 pretrain/train.py --model 1.5b \\
      --deepspeed-config deployments/ds_config_bert_1.5b.json --optimizer lans --learning-rate 0.0015 \\
      --warmup-proportion 0.05 --constant-proportion 0.25 --max-steps 155000 --checkpoint-interval 200 \\
      --train-dir $DATA/4bins --eval-file $DATA/eval_10k.hdf5 --output-dir $RESULTS --resume --compile

  # multi-node (BERT-5B, 4 x 8 cards): a hostfile with one line per node, "10.10.100.101 slots=8", and
  # ~/.deepspeed_env on the launching node holding the environment the ranks need, one VAR=value per line
  # (e.g. PT_HPU_LAZY_MODE=0, PYTHONPATH=/path/to/bertpipe, NCCL_SOCKET_IFNAME=eth0); DeepSpeed's
  # launcher exports those lines to every node over pdsh/ssh (passwordless ssh between nodes required);
  # ./.deepspeed_env or the file named by DS_ENV_FILE work too.
  deepspeed --hostfile hostsfile --num_nodes 4 --num_gpus 8 --master_addr 10.10.100.101 pretrain/train.py \\
      --model 5b --deepspeed-config deployments/ds_config_bert_5b.json --max-steps 75000 ...
  # or one command per node, no ssh (`bertpipe train ... --num-nodes 4 --node-rank K --master-addr 10.10.100.101`):
  deepspeed --hostfile hostsfile --num_nodes 4 --num_gpus 8 --no_ssh --node_rank K --master_addr 10.10.100.101 ...
  torchrun --nnodes 4 --nproc_per_node 8 --rdzv-backend c10d --rdzv-endpoint 10.10.100.101:29500 --rdzv-id RUN ...

  # a rank's exception (bad data: one line naming the file and row; a crash; a peer gone) prints one line
  # "pretrain/train.py [rank N]: error: ..." and ends the rank at once; bertpipe train then stops every rank.

  # resume after a stop / SIGTERM (SIGTERM or Ctrl-C writes a checkpoint and exits 0, an eval in progress
  # included: it stops, and runs first on resume): add --resume, same flags. --resume takes
  # checkpoints/latest when it names a complete checkpoint (its bertpipe_complete.json, written last, lists
  # every file with size and md5), else the newest complete one, saying so (latest missing, empty, a path,
  # a symlink, or naming a checkpoint whose save was killed); it refuses when none is complete. A start
  # without --resume in a dir that holds a run's checkpoints is refused: --overwrite discards them.
  # metrics.jsonl keeps each step once across resumes.
  # After `kill -9` of bertpipe train (or its Prefect run), the launcher and the ranks stop within about a
  # second (pretrain/liveness.py); a rank launched by hand (no BERTPIPE_TRAIN_OWNER) has no watchdog.
  # `bertpipe train` on a busy OUTPUT_DIR is refused, naming the holder (OUTPUT_DIR/.bertpipe.lock).
  # Start-up hangs silently before the first step? A torch extension build lock
  # ($TORCH_EXTENSIONS_DIR or ~/.cache/torch_extensions/py3*_cpu/<op>/lock) left by a killed build:
  # bertpipe train removes it when no build runs (pretrain/extensions.py); each rank names one it waits on.

  # start from pretrained weights (MLPerf's initial checkpoint): the TF1 prefix itself (each rank imports
  # TensorFlow to read it), or convert it once and pass the file; a transformers directory works too.
  # Weights only: the optimizer, step count, schedule and data order start fresh. Every rank loads it
  # before the DeepSpeed engine is built; a tensor of another shape (vocab, hidden size...) stops the run
  # before the first step, naming the tensor and both shapes. With --resume and a checkpoint of this run
  # in OUTPUT_DIR, the init checkpoint is ignored (logged) and the run's own state wins, so the same
  # command line serves the first start and every restart.
  bertpipe import-tf tf1_ckpt/model.ckpt-28252 --config bert_config.json --out-safetensors init.safetensors
  deepspeed --num_gpus 8 pretrain/train.py --model large --init-checkpoint init.safetensors --resume ...
  deepspeed --num_gpus 8 pretrain/train.py --model large --init-checkpoint tf1_ckpt/model.ckpt-28252 ...
  deepspeed --num_gpus 2 pretrain/train.py --model tiny --init-checkpoint hf/tiny ...   # bertpipe export-hf

Outputs in OUTPUT_DIR: config.json (resolved), metrics.jsonl (rank 0, one record per log step and per
eval), tensorboard/, checkpoints/<step>/ and checkpoints/latest (pretrain/checkpoint.py), summary.json (training_sequences_per_second, e2e_time, final eval
masked-LM accuracy vs the MLPerf 0.720 target), mllog.txt (MLPerf ``:::MLLOG`` lines, pretrain/mlperf_log.py;
needs mlperf_logging, the `mlperf` extra). Samples are MLPerf's: on packed data, the sequences the packs held,
summed over the ranks each step (the MLPerf log, the eval interval, metrics' samples and seq_per_s, the step
lines' seq/s, summary's train_samples and training_sequences_per_second; metrics' rows and summary's
training_rows_per_second count the packs); checkpoints keep the count, so a resume continues it. config.json, summary.json and the checkpoints record "vocab"
(--vocab: path, md5, entries), from which `bertpipe export-hf` writes the tokenizer. config.json and
summary.json also hold "init_checkpoint" (this invocation: path, format and tensors loaded, or loaded=false and why) and "weights_from" (the init
checkpoint the run started from; every checkpoint's bertpipe_config.json keeps it, so resumes carry it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script by the launcher: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pretrain import checkpoint as ckpt  # noqa: E402
from pretrain.train_config import TrainConfig, add_train_arguments, from_args, load_ds_config  # noqa: E402

log = logging.getLogger("pretrain.train")
START = time.time()


class NonFiniteLossError(RuntimeError):
    """The loss of a micro-batch is NaN/inf: training stops before the optimizer step."""


def model_config_for(cfg: TrainConfig):
    """The BertConfig of the run: preset, then the JSON overrides, then --vocab-size."""
    from pretrain.config import BertConfig, model_config

    overrides = {}
    if cfg.model_config:
        known = {f for f in BertConfig.__dataclass_fields__}
        overrides = {k: v for k, v in json.loads(Path(cfg.model_config).read_text()).items() if k in known}
    if cfg.vocab_size:
        overrides["vocab_size"] = cfg.vocab_size
    elif cfg.vocab and "vocab_size" not in overrides:  # the data's vocab, unless a size is given
        from pretrain.vocab_file import vocab_entries

        overrides["vocab_size"] = vocab_entries(cfg.vocab)
    return model_config(cfg.model, **overrides)


def to_tensors(arrays: dict, device) -> dict:
    """numpy batch -> device tensors (pinned host memory on CUDA, so the copy is asynchronous)."""
    import torch

    pin = str(device).startswith("cuda")
    return {k: (torch.from_numpy(v).pin_memory() if pin else torch.from_numpy(v)).to(device, non_blocking=True)
            for k, v in arrays.items()}


def check_finite(value: float, step: int, micro: int, gas: int, where: str) -> None:
    """Raise :class:`NonFiniteLossError` naming the step and batch when ``value`` is NaN or inf."""
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"non-finite loss {value} at step {step} (micro-step {micro + 1} of {gas}), {where}; stopped before "
            "the optimizer step. Lower --learning-rate, check this batch's data, or resume from the last checkpoint")


def train_step(engine, sampler, gas: int, step: int, device, mark_step) -> dict[str, float]:
    """One optimizer step = ``gas`` micro-batches; returns this rank's mean losses and samples."""
    import torch

    from pretrain.batch_mix import combined_losses
    from pretrain.packing import real_counts

    totals = [0.0, 0.0, 0.0]
    samples = sequences = tokens = 0
    loader_wait = 0.0  # seconds this step waited for its batches (the loader's share of the step)
    for micro in range(gas):
        t_wait = time.perf_counter()
        batch = sampler.next_batch()
        loader_wait += time.perf_counter() - t_wait
        parts = batch.parts()  # one, or one per length bin of a mixed batch (pretrain/batch_mix.py)
        for arrays in parts:
            n_seq, n_tok = real_counts(arrays)  # (packed rows hold several sequences)
            sequences, tokens = sequences + n_seq, tokens + n_tok
        outs = [engine(**to_tensors(arrays, device)) for arrays in parts]
        loss, mlm_loss, nsp_loss = combined_losses(outs, [len(a["input_ids"]) for a in parts])
        # one host sync per micro-batch: the three losses together
        values = torch.stack([loss.detach(), mlm_loss.detach(), nsp_loss.detach()]).float().tolist()
        check_finite(values[0], step, micro, gas, batch.describe())
        engine.backward(loss)
        mark_step()
        engine.step()
        mark_step()
        totals = [t + v / gas for t, v in zip(totals, values, strict=True)]
        samples += sum(len(a["input_ids"]) for a in parts)
    return {"loss": totals[0], "mlm_loss": totals[1], "nsp_loss": totals[2], "samples": samples,
            "sequences": sequences, "tokens": tokens, "loader_wait": loader_wait}


def run_eval(model, eval_set, device, should_stop=None) -> dict[str, float]:
    """Masked-LM accuracy of ``model`` over ``eval_set``, summed over all ranks (``{"eval_interrupted": True}``
    when ``should_stop`` said so on any rank: see :func:`pretrain.evaluate.evaluate`)."""
    import torch

    from pretrain.evaluate import evaluate

    def forward(arrays):
        out = model(**to_tensors(arrays, device))
        return float(out.mlm_correct), float(out.mlm_count), float(out.mlm_loss)

    def all_reduce(x):
        t = torch.tensor([float(v) for v in x], dtype=_reduce_dtype(device), device=device)  # (no host float64)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(t)
        return t.cpu().numpy()

    was_training = model.training
    model.eval()
    t0 = time.perf_counter()
    with torch.no_grad():
        result = evaluate(forward, eval_set, all_reduce, should_stop)
    model.train(was_training)
    return {**result, "eval_time": time.perf_counter() - t0}


def _reduce_dtype(device):
    """float64 for exact sums where the device has it; float32 on Gaudi, which has no float64 tensors."""
    import torch

    from pretrain.devices import has_float64

    return torch.float64 if has_float64(device) else torch.float32


def _mean_over_ranks(values: dict[str, float], device) -> dict[str, float]:
    import torch

    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=_reduce_dtype(device), device=device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
        t /= torch.distributed.get_world_size()
    return dict(zip(keys, t.cpu().tolist(), strict=True))


def _sum_over_ranks(n: int, device) -> int:
    """``n`` summed over all ranks: one small all-reduce (int64; int32 where the device lacks 64-bit types, e.g.
    Gaudi: exact for a step's sequence count) and one host sync."""
    import torch

    from pretrain.devices import has_float64

    t = torch.tensor([n], dtype=torch.int64 if has_float64(device) else torch.int32, device=device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return int(t.item())


class StopFlag:
    """SIGTERM or SIGINT (Ctrl-C) sets the flag; ranks agree (all-reduce MAX) at each step boundary to stop
    together, with a checkpoint, instead of dying in a KeyboardInterrupt traceback."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handler)
        signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum, frame) -> None:
        self.requested = True

    def agreed(self, device) -> bool:
        import torch

        t = torch.tensor([1.0 if self.requested else 0.0], device=device)
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return bool(t.item() > 0)


def setup(cfg: TrainConfig, tag: str | None):
    """Device, process group, determinism, data, model and the DeepSpeed engine (``tag``: the checkpoint the
    run resumes from, or None)."""
    from pretrain.devices import init_runtime, select_device

    choice = select_device(cfg.device)
    os.environ.setdefault("DS_ACCELERATOR", choice.accelerator)
    import deepspeed
    import torch

    from pretrain.data import PrefetchingSampler
    from pretrain.determinism import set_determinism
    from pretrain.evaluate import EvalSet
    from pretrain.model import BertForPreTraining
    from pretrain.optim import attach_zero_partitions, build_optimizer
    from pretrain.recipe import schedule_spec
    from pretrain.schedule import RecipeScheduler

    if "RANK" not in os.environ:  # `python pretrain/train.py ...` without a launcher: one process
        from pretrain.launch import free_port

        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    runtime = init_runtime(choice, local_rank)
    from pretrain.extensions import watch_build_locks

    started = threading.Event()  # until then, a torch extension build lock this rank waits on is named
    watch_build_locks(started)
    try:
        deepspeed.init_distributed(dist_backend=choice.backend)
    finally:
        started.set()
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    agreed = [tag]
    torch.distributed.broadcast_object_list(agreed, src=0)  # every rank resumes what rank 0 resumes
    if agreed[0] != tag:
        from core.errors import InputError

        raise InputError(f"rank {rank} found checkpoint {tag!r} to resume in {cfg.output_dir}, rank 0 found "
                         f"{agreed[0]!r}: do the ranks see the same --output-dir? (a shared file system is needed)")
    set_determinism(cfg.seed, rank, cfg.deterministic, choice.kind)
    mcfg = model_config_for(cfg)
    ds_cfg = load_ds_config(cfg, world)
    micro = ds_cfg["train_micro_batch_size_per_gpu"]
    from pretrain.batch_mix import split_counts
    from pretrain.packing import training_sampler

    binned, _ = training_sampler(cfg.train_dir, cfg.packed, micro, rank, world, cfg.seed, mcfg.vocab_size,
                                 mix=cfg.batch_mix, counts=split_counts(cfg))
    sampler = PrefetchingSampler(binned)  # packed rows when the data is packed (pretrain/packing.py)
    eval_set = None
    if cfg.eval_file:
        eval_set = EvalSet(cfg.eval_file, cfg.eval_batch_size, rank, world, mcfg.vocab_size,
                           cfg.max_eval_samples or None)
    if tag:
        ckpt.check_model_config(cfg.output_dir, tag, mcfg.to_dict())
    with torch.random.fork_rng():  # identical initial weights on every rank, whatever the rank seed
        torch.manual_seed(cfg.seed)
        model = BertForPreTraining(mcfg, static_mlm=cfg.static_mlm or choice.kind == "hpu")
    from pretrain.init_checkpoint import init_weights

    init = init_weights(model, cfg.init_checkpoint, tag)  # before the engine: every rank, same weights
    opt = build_optimizer(cfg.optimizer, model.param_groups(cfg.weight_decay), cfg.learning_rate,
                          lamb_trust_ratio_no_decay=cfg.lamb_trust_ratio_no_decay)
    sched = RecipeScheduler(opt, schedule_spec(cfg))  # mlperf f(k-1) or habana f(k): pretrain/recipe.py
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=ds_cfg)
    attach_zero_partitions(engine, opt, cfg.trust_ratio)  # ZeRO-1/2: per-tensor norms inside the flat partitions
    return choice, runtime, engine, sampler, eval_set, mcfg, ds_cfg, rank, world, init


def _recorded_init(output_dir: str | Path, tag: str) -> str | None:
    """The init checkpoint a checkpoint's run started from (None: random init, or not recorded)."""
    try:
        return json.loads((ckpt.checkpoint_dir(output_dir) / tag / ckpt.CONFIG_NAME).read_text())["run"].get(
            "init_checkpoint")
    except (OSError, ValueError, KeyError, AttributeError):
        return None


class Run:
    """One training process: the engine, data, metrics and the step loop (``Run(cfg).loop()``)."""

    def __init__(self, cfg: TrainConfig) -> None:
        from pretrain.devices import maybe_compile
        from pretrain.liveness import hold_ranks_lock
        from pretrain.metrics import MetricsWriter
        from pretrain.mlperf_log import MLPerfLog
        from pretrain.schedule import mlperf_eval_interval_samples
        from pretrain.vocab_file import vocab_record

        self.cfg, self.stop = cfg, StopFlag()  # SIGTERM during start-up stops before the first step
        self._ranks_lock = hold_ranks_lock(cfg.output_dir)  # (a later `bertpipe train` waits for these ranks)
        # the checkpoint to resume (or a refusal: never step 1 over a run's checkpoints without --overwrite)
        start = ckpt.start_point(cfg.output_dir, resume=cfg.resume, overwrite=cfg.overwrite)
        tag = start.tag if start else None
        self.mllog = MLPerfLog(cfg.output_dir, enabled=os.environ.get("RANK", "0") == "0", resumed_from=tag)
        self.mllog.init_start(START)
        self.vocab = vocab_record(cfg.vocab)  # {"path", "md5", "entries"}: export-hf's tokenizer
        (self.choice, self.runtime, self.engine, self.sampler, self.eval_set, self.mcfg, self.ds_cfg,
         self.rank, self.world, self.init) = setup(cfg, tag)
        if self.rank == 0 and start and start.note:
            log.warning("%s", start.note)
        if self.rank == 0 and cfg.overwrite and not tag:
            gone = ckpt.discard_run(cfg.output_dir)
            if gone:
                log.info("--overwrite: removed the earlier run's %s", ", ".join(gone))
        # the weights' origin, kept in every checkpoint of the run (a resume carries it over)
        self.init_origin = _recorded_init(cfg.output_dir, tag) if tag else (self.init or {}).get("path")
        self.out_dir, self.device = Path(cfg.output_dir), self.engine.device
        self.gas, self.global_batch = self.engine.gradient_accumulation_steps(), self.ds_cfg["train_batch_size"]
        # packed rows: MLPerf's samples are the sequences trained (all ranks), counted per step; else rows
        self.layout = getattr(self.sampler, "sampler", self.sampler).layout
        self.packed, self.sequences = bool(self.layout), 0
        # MLPerf's global batch in sequences (its eval interval is computed from it): on packed data packs x the
        # packing rate, as NVIDIA logs it (pretrain/packing.py: the flag, the data's figure, else 2.0)
        self.packing_rate, self.rate_from = 1.0, ""
        if self.packed:
            from pretrain.packing import packing_rate

            self.packing_rate, self.rate_from = packing_rate(cfg.average_packing_rate, cfg.train_dir)
        self.mlperf_batch = self.global_batch
        if self.packed:
            from pretrain.packing import mlperf_global_batch

            self.mlperf_batch = mlperf_global_batch(self.global_batch, self.packing_rate)
        self.eval_pending = False  # the eval of this step was stopped by SIGTERM: the checkpoint says so
        self.step = self._resume(tag) if tag else 0
        self.resumed, self.saved_step = bool(tag), self.step
        maybe_compile(self.engine, self.choice, cfg.compile)
        self.metrics = MetricsWriter(self.out_dir, enabled=self.rank == 0, tensorboard=cfg.tensorboard,
                                     start_step=self.step)
        self.interval = cfg.eval_interval_samples or mlperf_eval_interval_samples(self.mlperf_batch)
        from pretrain.recipe import gradient_clipping, recipe_line

        self.schedule = getattr(self.engine.lr_scheduler, "spec", None)  # (a resume: the checkpoint's schedule)
        clip = (self.ds_cfg["gradient_clipping"], gradient_clipping(cfg)[1])
        self.recipe = recipe_line(cfg, self.schedule, clip, packed=self.packed)
        if self.rank == 0:
            self._write_config()
        self.mllog.run_start(cfg, self.mcfg, self.world, self.choice.kind, self.mlperf_batch, self.gas,
                             self.engine.optimizer, self.eval_set.total_rows if self.eval_set else 0,
                             self.samples_trained(), self.sampler.epoch, schedule=self.schedule)

    def samples_trained(self) -> int:
        """MLPerf's samples trained so far, all ranks: the sequences for packed rows (each pack holds several),
        else step x global batch."""
        return self.sequences if self.packed else self.step * self.global_batch

    def _resume(self, tag: str) -> int:
        import torch

        from pretrain.determinism import set_rng_state

        ckpt.safe_deepspeed_loads(self.engine)  # DeepSpeed's own loader would unpickle anything
        self.engine.load_checkpoint(str(ckpt.checkpoint_dir(self.out_dir)), tag)
        state = ckpt.load_rank_state(self.out_dir, tag, self.rank)
        set_rng_state(state["rng"], self.choice.kind)
        self.sampler.load_state_dict(state["data"])
        if self.packed:
            self.sequences = self._resumed_sequences(state, tag)
        # the eval a SIGTERM stopped at this step runs first, unless a later life of the run has done it since
        # (rank 0 reads metrics.jsonl; every rank follows it)
        from pretrain.metrics import has_eval_record

        pending = [bool(state.get("eval_pending", False)) and not (
            self.rank == 0 and has_eval_record(self.out_dir / "metrics.jsonl", int(state["step"])))]
        if torch.distributed.is_initialized():
            torch.distributed.broadcast_object_list(pending, src=0)
        self.eval_pending = pending[0]
        log.info("resumed from checkpoint %s at step %d%s", tag, state["step"],
                 " (its eval, stopped by SIGTERM, runs first)" if self.eval_pending else "")
        return int(state["step"])

    def _resumed_sequences(self, state: dict, tag: str) -> int:
        """The sequences trained up to the checkpoint; a checkpoint written before they were kept gets
        step x global batch x the data set's mean sequences per pack (Habana's avg_seq_per_sample), said once."""
        import torch

        if "samples" in state:
            return int(state["samples"])
        from pretrain.packing import mean_sequences_per_pack, recorded_packing_rate

        got: list = [None]
        if self.rank == 0:
            try:  # the data's recorded figure (the packs' own mean: a JSON read), else every pack counted
                recorded = recorded_packing_rate(self.cfg.train_dir)
                got = [recorded[0] if recorded else mean_sequences_per_pack(self.cfg.train_dir)]
            except Exception as exc:  # noqa: BLE001 - every rank must hear of it, not hang in the broadcast
                got = [f"{type(exc).__name__}: {exc}"]
        if torch.distributed.is_initialized():
            torch.distributed.broadcast_object_list(got, src=0)
        if isinstance(got[0], str):
            from core.errors import InputError

            raise InputError(f"checkpoint {tag} predates the sequence count of packed runs and the packs of "
                             f"{self.cfg.train_dir} could not be counted to estimate it ({got[0]})")
        step = int(state["step"])
        estimate = round(step * self.global_batch * got[0])
        if self.rank == 0:
            log.warning("checkpoint %s predates the sequence count of packed runs: the %d steps before it count as "
                        "%d sequences (step x global batch %d x %.4f, the data's mean sequences per pack), an "
                        "estimate; the sequences of every later step are counted exactly", tag, step, estimate,
                        self.global_batch, got[0])
        return estimate

    def _write_config(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / "config.json").write_text(json.dumps(
            {"train": self.cfg.to_dict(), "model": self.mcfg.to_dict(), "deepspeed": self.ds_cfg,
             "world_size": self.world, "device": self.choice.kind, "init_checkpoint": self.init,
             "weights_from": self.init_origin, "vocab": self.vocab, "recipe": self.recipe,
             "schedule": dataclasses.asdict(self.schedule) if self.schedule else None}, indent=2))
        every = (f"{self.cfg.eval_interval_steps} steps" if self.cfg.eval_interval_steps else
                 f"{self.interval} {'sequences' if self.packed else 'samples'}")
        log.info("%d ranks on %s: global batch %d = micro %d x %d ranks x %d accumulation; eval every %s",
                 self.world, self.choice.kind, self.global_batch, self.ds_cfg["train_micro_batch_size_per_gpu"],
                 self.world, self.gas, every)
        if self.packed:
            log.info("packed rows: MLPerf global batch %d sequences = %d packs x %.4g sequences a pack (%s)",
                     self.mlperf_batch, self.global_batch, self.packing_rate, self.rate_from)
        log.info("%s", self.recipe)

    def save(self) -> None:
        """DeepSpeed checkpoint + per-rank RNG and data position + the model config (rank 0); then, once every
        rank's files are written, the completion record (sizes and md5s, each rank hashing a share), then
        ``latest``, then pruning (rank 0). Nothing is saved when this step is already saved (or resumed)."""
        import torch

        from pretrain.determinism import rng_state

        if self.step == self.saved_step:
            return
        t0, tag, dist = time.perf_counter(), str(self.step), torch.distributed.is_initialized()
        if self.rank == 0:  # an earlier folder of this tag (a killed save, a rolled-back timeline): its files go
            ckpt.remove_stale_tag(self.out_dir, tag)
        if dist:
            torch.distributed.barrier()
        ckpt.save_rank_state(self.out_dir, tag, self.rank, self.step, rng_state(self.choice.kind),
                             self.sampler.state_dict(), eval_pending=self.eval_pending,
                             samples=self.samples_trained())
        if self.rank == 0:
            ckpt.write_run_config(self.out_dir, tag, self.mcfg.to_dict(),
                                  {"optimizer": self.cfg.optimizer, "world_size": self.world,
                                   "init_checkpoint": self.init_origin, "vocab": self.vocab})
        self.engine.save_checkpoint(str(ckpt.checkpoint_dir(self.out_dir)), tag=tag, client_state={"step": self.step},
                                    save_latest=False)  # (ends with a barrier: every rank's files are written)
        names = ckpt.tag_files(self.out_dir, tag)
        mine = ckpt.describe_files(self.out_dir, tag, names[self.rank::self.world])  # each rank hashes a share
        shares = [mine]
        if dist:
            shares = [None] * self.world
            torch.distributed.all_gather_object(shares, mine)
        if self.rank == 0:
            files = {k: v for share in shares for k, v in share.items()}
            ckpt.write_completion(self.out_dir, tag, self.step, self.world, files)
            ckpt.write_latest(self.out_dir, tag)  # only now: `latest` always names a complete checkpoint
            pruned = ckpt.prune_checkpoints(self.out_dir, self.cfg.keep_checkpoints, protect=tag)
            log.info("checkpoint %s saved: %d files, %.1f MB, %.1f s%s", tag, len(files),
                     sum(f["size"] for f in files.values()) / 1e6, time.perf_counter() - t0,
                     f" (removed {', '.join(p.name for p in pruned)})" if pruned else "")
        self.saved_step = self.step

    def evaluate(self) -> dict:
        if self.eval_set is None:
            return {}
        self.mllog.eval_start(self.samples_trained())
        if self.rank == 0:  # (an eval of eval_10k takes a while: the console says what runs)
            log.info("step %d: evaluating %d samples", self.step, self.eval_set.total_rows)
        r = run_eval(self.engine.module, self.eval_set, self.device, should_stop=lambda: self.stop.requested)
        self.eval_pending = bool(r.get("eval_interrupted"))
        if self.eval_pending:  # SIGTERM: no partial result; the checkpoint of this step runs it on resume
            if self.rank == 0:
                log.info("step %d: eval stopped by SIGTERM; it runs when this checkpoint is resumed", self.step)
            return {}
        self.mllog.eval_stop(self.samples_trained(), r["eval_mlm_accuracy"])
        self.metrics.write({"step": self.step, **r})
        if self.rank == 0:
            log.info("step %d: eval masked-LM accuracy %.4f (target %.3f)", self.step, r["eval_mlm_accuracy"],
                     r["eval_target"])
        return r

    def _eval_due(self, before: int) -> bool:
        """Whether this step evaluates: every --eval-interval-steps steps, else when the samples trained
        (``before`` this step, now :meth:`samples_trained`) reach the next multiple of the interval."""
        from pretrain.schedule import crosses_multiple, is_eval_step

        if self.cfg.eval_interval_steps:
            return self.step % self.cfg.eval_interval_steps == 0
        if self.packed:
            return crosses_multiple(before, self.sequences, self.interval)
        return is_eval_step(self.step, self.global_batch, self.interval)

    def loop(self) -> dict:
        """Train to max_steps (or steps_this_run, or SIGTERM), checkpoint, and return the summary."""
        cfg = self.cfg
        target = cfg.max_steps if cfg.steps_this_run < 0 else min(cfg.max_steps, self.step + cfg.steps_this_run)
        train_time, steps_done, stopped_by, last, last_eval = 0.0, 0, "max_steps", {}, {}
        evaluated = self.resumed  # a checkpoint is saved after its step's eval (unless that eval is pending)
        window_time, window_steps, window_start = 0.0, 0, self.samples_trained()  # since the last metrics record
        window_wait = self.loader_wait = 0.0  # seconds the steps waited for batches (window, this run)
        first_sequences = self.sequences
        self.real = {"sequences": 0, "tokens": 0}  # this rank's real sequences and tokens (summary.json)
        if self.eval_pending:  # resumed from a checkpoint whose eval a SIGTERM stopped: that eval first
            last_eval = self.evaluate()
        self.engine.train()
        while self.step < target and not self.eval_pending:
            if self.stop.agreed(self.device):  # all ranks stop at the same step
                stopped_by = "sigterm"
                break
            lr = self.engine.get_lr()[0]  # the lr this step uses (the scheduler steps after the optimizer)
            self.mllog.block(self.samples_trained(),  # a block per eval interval (reopened after each eval)
                             cfg.eval_interval_steps * self.mlperf_batch or self.interval)
            t0 = time.perf_counter()
            r = train_step(self.engine, self.sampler, self.gas, self.step + 1, self.device, self.runtime.mark_step)
            dt = time.perf_counter() - t0
            before = self.samples_trained()
            self.step, steps_done, train_time = self.step + 1, steps_done + 1, train_time + dt
            if self.packed:  # MLPerf's samples: the step's sequences, all ranks (one int all-reduced)
                self.sequences += _sum_over_ranks(r["sequences"], self.device)
            self.real = {k: v + r[k] for k, v in self.real.items()}
            if steps_done == 1 and self.rank == 0 and getattr(self.engine.module, "packed_attention", ""):
                log.info("packed rows: attention %s", self.engine.module.packed_attention)
            self.mllog.epoch(self.sampler.epoch, self.samples_trained())
            window_time, window_steps = window_time + dt, window_steps + 1
            window_wait, self.loader_wait = window_wait + r["loader_wait"], self.loader_wait + r["loader_wait"]
            if self.step % cfg.log_interval == 0 or self.step == target:
                last = _mean_over_ranks({k: r[k] for k in ("loss", "mlm_loss", "nsp_loss")}, self.device)
                seq_per_s = (self.samples_trained() - window_start) / window_time  # sequences when packed
                rows = {"rows": self.step * self.global_batch} if self.packed else {}  # (samples: sequences)
                attention = getattr(self.engine.module, "packed_attention", "")  # packed rows: the kernel that ran
                self.metrics.write({"step": self.step, **last, "lr": lr, "seq_per_s": seq_per_s,
                                    "step_time": window_time / window_steps, "loader_wait": window_wait / window_steps,
                                    "epoch": self.sampler.epoch, "samples": self.samples_trained(), **rows,
                                    **({"attention": attention} if attention else {})})
                if self.rank == 0:  # the launcher's output (and a Prefect run's logs) show progress
                    log.info("step %d/%d: loss %.4f lr %.4g %.1f seq/s, loader wait %.1f ms/step%s", self.step,
                             cfg.max_steps, last["loss"], lr, seq_per_s, 1e3 * window_wait / window_steps,
                             f", attention {attention}" if attention else "")
                window_time, window_steps, window_start, window_wait = 0.0, 0, self.samples_trained(), 0.0
            evaluated = self._eval_due(before)
            if evaluated:
                last_eval = self.evaluate() or last_eval
                if self.eval_pending:  # stopped by SIGTERM: checkpoint now
                    break
            if cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0 and self.step < target:
                self.save()
        if self.step == cfg.max_steps and not evaluated and not self.eval_pending:
            last_eval = self.evaluate() or last_eval
        if self.eval_pending:
            stopped_by = "sigterm"
        elif stopped_by != "sigterm" and self.step < cfg.max_steps:
            stopped_by = "steps_this_run"
        self.save()
        return self._finish(stopped_by, steps_done, train_time, last, last_eval, self.sequences - first_sequences)

    def _finish(self, stopped_by: str, steps_done: int, train_time: float, last: dict, last_eval: dict,
                sequences: int = 0) -> dict:
        from pretrain.metrics import write_summary

        acc = last_eval.get("eval_mlm_accuracy")
        real = {k: v * self.world for k, v in _mean_over_ranks(getattr(self, "real", {"sequences": 0, "tokens": 0}),
                                                               self.device).items()}  # all ranks
        summary = {"model": self.cfg.model, "device": self.choice.kind, "world_size": self.world,
                   "global_batch": self.global_batch, "steps": self.step, "steps_this_run": steps_done,
                   "stopped_by": stopped_by, "final_loss": last.get("loss"), "raw_train_time": train_time,
                   # MLPerf's samples (sequences: for packed rows, those the packs held) per second
                   "training_sequences_per_second": (sequences if self.packed else self.global_batch * steps_done)
                   / train_time if train_time else 0.0,
                   "train_samples": self.samples_trained(),
                   # real (unpadded) sequences and tokens: packed rows count each of their sequences
                   "training_real_sequences_per_second": real["sequences"] / train_time if train_time else 0.0,
                   "training_real_tokens_per_second": real["tokens"] / train_time if train_time else 0.0,
                   "data_layout": self.layout or "padded",
                   # packed rows: the attention kernel that ran (pretrain/model.py); the loader's wait per step
                   "packed_attention": getattr(self.engine.module, "packed_attention", "") or None,
                   "loader_wait_per_step": getattr(self, "loader_wait", 0.0) / steps_done if steps_done else 0.0,
                   "e2e_time": time.time() - START, "final_eval_mlm_accuracy": acc, "eval_target": 0.720,
                   "reached_target": acc is not None and acc >= 0.720, "init_checkpoint": self.init,
                   "weights_from": self.init_origin, "vocab": self.vocab, "eval_pending": self.eval_pending,
                   "mllog": str(self.mllog.path) if self.mllog.enabled else None}
        if self.packed:  # rows = packs
            summary["training_rows_per_second"] = self.global_batch * steps_done / train_time if train_time else 0.0
            summary.update(mlperf_global_batch=self.mlperf_batch, average_packing_rate=self.packing_rate,
                           average_packing_rate_from=self.rate_from)
        self.mllog.run_stop(self.samples_trained(), acc)
        if self.rank == 0:
            write_summary(self.out_dir, summary)
        self.metrics.close()
        self.sampler.close()
        return summary


def train(cfg: TrainConfig) -> dict:
    """Run (or resume) training; returns the summary (every rank; rank 0 writes it)."""
    run = Run(cfg)
    try:
        return run.loop()
    except BaseException:  # (a non-finite loss, a bad batch...): the MLPerf log ends with run_stop aborted
        run.mllog.run_stop(run.samples_trained(), None)
        raise


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="BERT pre-training with DeepSpeed (see the module docstring).")
    add_train_arguments(p)
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    from pretrain.liveness import guard_rank

    guard_rank()  # launched by bertpipe: die with that command, even when it is killed with kill -9
    args = p.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    from core.errors import BertpipeError

    try:
        train(from_args(args))
    except (BertpipeError, NonFiniteLossError) as exc:
        _fail(rank, str(exc), 2)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - a crash, or a peer's end seen in a collective
        _fail(rank, _crash_line(exc), 1, traceback=True)
    return 0


def _peer_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank (or its node) ended."""
    text = f"{type(exc).__name__}: {exc}"
    return any(k in text for k in ("DistBackendError", "DistNetworkError", "Connection closed by peer",
                                   "Connection reset by peer", "Broken pipe", "Socket Timeout", "Gloo", "gloo",
                                   "NCCL", "ProcessGroup", "TCPStore", "recvValue", "Connection refused"))


def _crash_line(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if _peer_lost(exc):
        first = first.split(". This is typically", 1)[0]  # (gloo's advice: the next words say it)
        return (f"lost contact with another rank ({type(exc).__name__}: {first}): a rank or a node ended; its own "
                f"error line says why (traceback: {LAUNCHER_LOG_HINT})")
    return f"{type(exc).__name__}: {first} (traceback: {LAUNCHER_LOG_HINT})"


#: where a rank's traceback goes (its stderr: the launcher's log, OUTPUT_DIR/launcher.log under bertpipe train)
LAUNCHER_LOG_HINT = "launcher.log"


def _fail(rank: int, message: str, status: int, traceback: bool = False) -> None:
    """End this rank at once with one error line (the launcher shows the first rank's and stops the others):
    ``os._exit``, as a rank whose peers are gone can hang in the process group's and threads' shutdown."""
    try:
        if traceback:
            import traceback as tb

            tb.print_exc(file=sys.stderr)  # into the launcher's log; the console shows the line below
        sys.stdout.flush()
        print(f"pretrain/train.py [rank {rank}]: error: {message}", file=sys.stderr, flush=True)
    finally:
        logging.shutdown()
        os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
