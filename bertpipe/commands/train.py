"""Pre-train BERT: print the exact DeepSpeed (or torchrun) launcher command, then run it.

Examples:
  bertpipe train --train-dir work/4bins --eval-file work/eval_10k.hdf5 --model tiny --max-steps 50 \\
      --nproc 2 --output-dir results/tiny              # 2 CPU ranks (DS_ACCELERATOR=cpu is set for you)
  bertpipe train ... --model 1.5b --deepspeed-config deployments/ds_config_bert_1.5b.json --nproc 8
  bertpipe train ... --hostfile hostsfile --num-nodes 4 --nproc 8 --master-addr 10.10.100.101   # over ssh (pdsh)
  bertpipe train ... --num-nodes 2 --node-rank K --master-addr 10.0.0.1 --nproc 8 --hostfile hostsfile
                                                       # on each node K: DeepSpeed's --no_ssh, no ssh needed
  bertpipe train ... --launcher torchrun --num-nodes 2 --node-rank K --master-addr 10.0.0.1 --nproc 8
                                                       # on each node K: torchrun's c10d rendezvous
  bertpipe train ... --resume                          # continue from OUTPUT_DIR/checkpoints/latest
  bertpipe train ... --overwrite                       # start at step 1 over a run's checkpoints (removed)
  bertpipe train ... --model large --init-checkpoint tf1_ckpt/model.ckpt-28252   # MLPerf's initial weights
  bertpipe train ... --model large --init-checkpoint init.safetensors    # from `bertpipe import-tf`
  bertpipe train ... --init-checkpoint hf/tiny          # a transformers directory (`bertpipe export-hf`)
  bertpipe train ... --model large --warmup-steps 100 --start-warmup-step -25   # an NVIDIA MLPerf config's schedule
  bertpipe train ... --model large --split-batch-cnt 6 3 2 5   # Samsung's batches: 6/3/2/5 rows of the 4 bins

--init-checkpoint loads weights only (optimizer, step, LR schedule and data order start fresh), on every
rank before the DeepSpeed engine is built; a tensor of another shape (vocab, hidden size, layers) stops the
run before the first step with a line naming it and both shapes (safetensors/transformers: already here,
before any rank starts). With --resume and a checkpoint of this run in OUTPUT_DIR it is ignored (logged):
the run's own state wins, so one command line serves the first start and every restart. config.json and
summary.json record it ("init_checkpoint").

The first line says the run's recipe: the lr schedule (--schedule-convention mlperf: step k at f(k-1), NVIDIA's
MLPerf scheduler, with MLPerf's integer --warmup-steps/--start-warmup-step; habana: f(k), Habana's DeepSpeed BERT;
default per --model), the gradient clipping (1.0 unless the DeepSpeed config's gradient_clipping or
--clip-grad-norm, 0 = off) and the batches' length bins (--batch-mix random: rows of any length, as the
references; split: --split-batch-cnt 6 3 2 5, Samsung's; one-bin: bertpipe's fastest). pretrain/recipe.py and
pretrain/batch_mix.py explain them.

--packed (or a --train-dir of packed files, detected): train on packed rows, Habana's
pack_pretraining_data_pytorch.py layout or NVIDIA's packed_data one (pretrain/packing.py); a token attends only
within its sequence, positions restart per sequence, NSP per sequence; --micro-batch counts packs.

--train-dir may be a data work dir (`bertpipe run --work-dir W`, or W/datasets/latest): its 4 bins, and its
eval file and vocab unless --eval-file/--vocab are given. --vocab (the data's vocab.txt) sets the model's
vocab_size unless --vocab-size is given, and is recorded (path, md5) so `bertpipe export-hf` writes the
matching tokenizer.

--resume takes the newest complete checkpoint when checkpoints/latest is missing, empty, damaged or names an
incomplete one (one line says so); without --resume, an OUTPUT_DIR holding a run's checkpoints is refused
unless --overwrite. OUTPUT_DIR is locked (OUTPUT_DIR/.bertpipe.lock): a second training there is refused,
naming the holder. The launcher and the ranks die with this command, even on kill -9. The data set's work dir (when
--train-dir lies in one, e.g. datasets/latest) is read-locked meanwhile: the refresh never prunes it.

Outputs: OUTPUT_DIR/metrics.jsonl, summary.json, config.json, tensorboard/, checkpoints/, and mllog.txt
(MLPerf `:::MLLOG` lines, when mlperf_logging is installed: the `mlperf` extra; --mlperf-division closed|open,
--mlperf-org, --mlperf-platform, --mlperf-status name the submission).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    from bertpipe.commands._common import nonneg_int, number, positive_int
    from pretrain.train_config import add_train_arguments

    g = p.add_argument_group("launch")
    g.add_argument("--nproc", "--nproc-per-node", "--num-gpus", dest="nproc", type=positive_int(1024), default=1,
                   help="ranks per node (GPUs, Gaudi cards or CPU processes) (default: 1)")
    g.add_argument("--launcher", choices=("deepspeed", "torchrun"), default="deepspeed",
                   help="process launcher (default: deepspeed)")
    g.add_argument("--hostfile", default="", help="DeepSpeed hostfile for multi-node runs ('host slots=8' lines)")
    g.add_argument("--num-nodes", "--num_nodes", dest="num_nodes", type=nonneg_int(1 << 16), default=0,
                   help="nodes to use from the hostfile (0: all)")
    g.add_argument("--master-addr", "--master_addr", dest="master_addr", default="",
                   help="address of the first node (multi-node)")
    g.add_argument("--master-port", "--master_port", dest="master_port", type=number(int, 0, 65535), default=0,
                   help="rendezvous port (0: a free port for local runs, 29500 for multi-node)")
    g.add_argument("--node-rank", "--node_rank", dest="node_rank", type=number(int, 0, 1 << 16), default=-1,
                   help="start this node's ranks only, one command per node (no ssh): K = 0 on the node that owns "
                        "--output-dir (it takes its lock), 1 .. N-1 on the others; needs --num-nodes and "
                        "--master-addr (deepspeed: --hostfile too; torchrun: c10d rendezvous at "
                        "MASTER_ADDR:MASTER_PORT)")
    g.add_argument("--rdzv-id", dest="rdzv_id", default="",
                   help="torchrun's rendezvous id, the same on every node (default: from the output dir's path)")
    g.add_argument("--dry-run", action="store_true", help="check the inputs and print the command only")
    add_train_arguments(p)
    for a in p._actions:  # --packed / --no-packed: None when neither is given (detected from the data)
        if a.dest == "packed":
            a.default = None


def check_paths(args: argparse.Namespace) -> None:
    """Every path flag, before anything heavy is imported: inputs exist and are what they should be, and
    --output-dir is none of them."""
    from core.paths import PathCheck

    pc = PathCheck()
    if args.train_dir:
        if Path(args.train_dir).is_dir():
            pc.input_dir("--train-dir", args.train_dir, "4-bin HDF5 folder")
        else:
            pc.input_file("--train-dir", args.train_dir, "HDF5 file or folder")
    for flag, value, what in (("--eval-file", args.eval_file, "eval HDF5"),
                              ("--deepspeed-config", args.deepspeed_config, "DeepSpeed JSON"),
                              ("--model-config", args.model_config, "model config JSON"),
                              ("--vocab", args.vocab, "vocab.txt"), ("--hostfile", args.hostfile, "hostfile")):
        if value or flag == "--deepspeed-config":  # (an empty --eval-file means: no evaluation)
            pc.input_file(flag, value, what)
    if args.init_checkpoint and Path(args.init_checkpoint).exists():
        (pc.input_dir if Path(args.init_checkpoint).is_dir() else pc.input_file)(
            "--init-checkpoint", args.init_checkpoint)
    pc.output_dir("--output-dir", args.output_dir, ["metrics.jsonl", "summary.json", "config.json"])


def from_work_dir(args: argparse.Namespace) -> None:
    """--train-dir naming a data work dir (it holds last_run.json, e.g. `datasets/latest`) stands for its
    4 bins, and for its eval file and vocab unless --eval-file / --vocab are given (as the pretrain flow)."""
    if not args.train_dir or not (Path(args.train_dir) / "last_run.json").is_file():
        return
    from core.errors import InputError
    from tasks.workdir import last_run

    out = last_run(Path(args.train_dir)).get("outputs", {})
    if "train_dir" not in out:
        raise InputError(f"--train-dir {args.train_dir} is a work dir whose last data run made no 4-bin output; run "
                         "the data flow on it first (bertpipe run), or pass the 4-bin folder")
    args.train_dir = out["train_dir"]
    args.eval_file = args.eval_file or out.get("eval_hdf5", "")
    args.vocab = args.vocab or out.get("vocab", "")


def check_no_packed(args: argparse.Namespace) -> None:
    """``--no-packed`` on packed data is refused in one line (bertpipe never unpacks packs: the flag cannot be
    honoured, and training on the packs anyway would not be what was asked); then ``args.packed`` is a bool."""
    if args.packed is False and args.train_dir:
        from core.errors import InputError
        from pretrain.packing import packed_files

        found = packed_files(args.train_dir)
        if found is not None:
            raise InputError(f"--no-packed: {args.train_dir} holds {found[0]} packed rows, and bertpipe trains packs "
                             "only as packs (it does not unpack them): drop --no-packed to train on them, or give "
                             "--train-dir padded rows (a 4-bin folder)")
    args.packed = bool(args.packed)


def run(args: argparse.Namespace) -> int:
    from core.readlock import reading
    from pretrain.launch import launch
    from pretrain.train_config import from_args

    from_work_dir(args)
    check_paths(args)
    from core.errors import InputError
    from pretrain.launch import check_nodes

    try:
        check_nodes(args.launcher, args.hostfile, args.num_nodes, args.master_addr, args.node_rank)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    if args.hostfile and args.launcher == "torchrun":
        raise InputError("--hostfile needs the deepspeed launcher (torchrun takes --num-nodes, --node-rank and "
                         "--master-addr)")
    check_no_packed(args)
    with reading(args.train_dir, "--train-dir"):  # a refresh never prunes the data set a training reads
        return launch(from_args(args), args.nproc, launcher=args.launcher, hostfile=args.hostfile,
                      num_nodes=args.num_nodes, master_addr=args.master_addr, master_port=args.master_port,
                      dry_run=args.dry_run, node_rank=args.node_rank, rdzv_id=args.rdzv_id)
