"""The pretrain flow: one pre-training run on a 4-bin data set (launched as DeepSpeed ranks).

    bertpipe run pretrain --train-dir work/bins/<key> --eval-file work/eval_hdf5/<key>/eval_10k.hdf5 \\
        --output-dir results/run1 --model tiny --max-steps 20
    prefect deployment run 'bertpipe-pretrain/training' --param train_dir=... --param eval_file=...
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from prefect import flow

from tasks.pretrain import launch_pretraining


def vocab_lines(vocab: str | None) -> int:
    """Entries of a vocab.txt (the model's vocab_size), 0 when none is given."""
    if not vocab:
        return 0
    with open(vocab, encoding="utf-8") as f:
        return sum(1 for _ in f)


def resolve_dataset(train_dir: str, eval_file: str, vocab: str | None) -> tuple[str, str, str | None]:
    """A data-flow work dir (e.g. ``datasets/latest``) stands for its 4 bins, eval_10k.hdf5 and vocab."""
    summary = Path(train_dir) / "last_run.json"
    if not summary.is_file():
        return train_dir, eval_file, vocab
    out = json.loads(summary.read_text(encoding="utf-8")).get("outputs", {})
    if "train_dir" not in out:
        from preprocessing.errors import InputError

        raise InputError(f"{train_dir} is a work dir whose last data run made no 4-bin output; run the data flow")
    return out["train_dir"], eval_file or out.get("eval_hdf5", ""), vocab or out.get("vocab")


@flow(name="bertpipe-pretrain", description="BERT pre-training with DeepSpeed on a 4-bin HDF5 data set")
def pretrain_flow(train_dir: str, eval_file: str = "", output_dir: str = "results/pretrain", model: str = "tiny",
                  max_steps: int = 20, nproc: int = 1, vocab: str | None = None, resume: bool = False,
                  options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Launch training; ``vocab`` (a vocab.txt) sets the model's vocab size when it is not the preset's.

    ``train_dir`` may also be a data work dir (``datasets/latest``): its bins, eval file and vocab are used.
    """
    train_dir, eval_file, vocab = resolve_dataset(train_dir, eval_file, vocab)
    return launch_pretraining(train_dir, eval_file, output_dir, model=model, max_steps=max_steps, nproc=nproc,
                              vocab_size=vocab_lines(vocab), resume=resume, options=options)


def train_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """TrainConfig fields set on the command line (``--learning-rate``)."""
    lr = getattr(args, "learning_rate", None)
    return {"learning_rate": lr} if lr is not None else None


def run_from_args(args: argparse.Namespace) -> int:
    """``bertpipe run pretrain|e2e``."""
    from preprocessing.errors import InputError

    if args.flow == "pretrain":
        if not args.train_dir:
            raise InputError("bertpipe run pretrain needs --train-dir (a 4-bin folder) and usually --eval-file")
        pretrain_flow(train_dir=args.train_dir, eval_file=args.eval_file or "",
                      output_dir=args.output_dir or str(Path(args.work_dir) / "pretrain"), model=args.model,
                      max_steps=args.max_steps, nproc=args.nproc, vocab=args.vocab, options=train_options(args))
        return 0
    from bertpipe.commands.run import data_params, print_summary
    from flows.e2e_flow import e2e_flow

    out = e2e_flow(data=data_params(args).model_dump(), output_dir=args.output_dir, model=args.model,
                   max_steps=args.max_steps, nproc=args.nproc, options=train_options(args))
    print_summary(out["data"])
    s = out["pretrain"]["summary"]
    brief = ", ".join(f"{k}={s[k]:.4g}" if isinstance(s[k], float) else f"{k}={s[k]}"
                      for k in ("steps", "final_loss", "training_sequences_per_second", "final_eval_mlm_accuracy")
                      if s.get(k) is not None)
    print(f"pre-training: {out['pretrain']['output_dir']}/  {brief or 'no summary.json written'}")
    return 0
