"""The pretrain flow: one pre-training run on a 4-bin data set (launched as DeepSpeed ranks).

    bertpipe run pretrain --train-dir work/bins/<key>/data --eval-file work/eval_hdf5/<key>/eval_10k.hdf5 \\
        --output-dir results/run1 --model tiny --max-steps 20
    prefect deployment run 'bertpipe-pretrain/training' --param train_dir=... --param eval_file=...
"""

from __future__ import annotations

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


def resolve_dataset(train_dir: str, eval_file: str, vocab: str | None,
                    evaluate: bool = True) -> tuple[str, str, str | None]:
    """A data-flow work dir (e.g. ``datasets/latest``) stands for its 4 bins, eval_10k.hdf5 and vocab.

    With ``evaluate`` (the default) an eval file is required: a data set whose eval branch is missing is
    refused here, before any rank starts, rather than trained without evaluation.
    """
    from core.errors import InputError
    from tasks.workdir import last_run

    if (Path(train_dir) / "last_run.json").is_file():
        out = last_run(Path(train_dir)).get("outputs", {})
        if "train_dir" not in out:
            raise InputError(f"{train_dir} is a work dir whose last data run made no 4-bin output; run the data flow "
                             "on it first")
        if evaluate and not eval_file and "eval_hdf5" not in out:
            raise InputError(f"{train_dir} holds no eval HDF5 (its eval stages are not done): run the data flow on "
                             "it, pass eval_file, or set evaluate=false to train without evaluation")
        train_dir, eval_file, vocab = out["train_dir"], eval_file or out.get("eval_hdf5", ""), vocab or out.get("vocab")
    if evaluate and not eval_file:
        raise InputError("no eval file: pass eval_file (an eval_10k.hdf5), point train_dir at a data work dir, or "
                         "set evaluate=false to train without evaluation")
    if evaluate and not Path(eval_file).is_file():
        raise InputError(f"eval_file {eval_file} does not exist; pass the eval HDF5 of the data set")
    return train_dir, eval_file if evaluate else "", vocab


@flow(name="bertpipe-pretrain", description="BERT pre-training with DeepSpeed on a 4-bin HDF5 data set")
def pretrain_flow(train_dir: str, eval_file: str = "", output_dir: str = "results/pretrain", model: str = "tiny",
                  max_steps: int = 20, nproc: int = 1, vocab: str | None = None, resume: bool = False,
                  options: dict[str, Any] | None = None, evaluate: bool = True) -> dict[str, Any]:
    """Launch training; ``vocab`` (a vocab.txt) sets the model's vocab size and is recorded with the run
    (``bertpipe export-hf`` writes its tokenizer).

    ``train_dir`` may also be a data work dir (``datasets/latest``): its bins, eval file and vocab are used.
    ``evaluate``: evaluate on the eval file (required then); false trains without evaluation.
    The launcher's output (step lines, errors) streams into this flow run's logs.
    """
    train_dir, eval_file, vocab = resolve_dataset(train_dir, eval_file, vocab, evaluate)
    if vocab and "vocab" not in (options or {}):
        options = {**(options or {}), "vocab": str(vocab)}
    return launch_pretraining(train_dir, eval_file, output_dir, model=model, max_steps=max_steps, nproc=nproc,
                              vocab_size=vocab_lines(vocab), resume=resume, options=options)
