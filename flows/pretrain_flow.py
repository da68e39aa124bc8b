"""The pretrain flow: one pre-training run on a 4-bin data set (launched as DeepSpeed ranks).

    bertpipe run pretrain --train-dir work/bins/<key>/data --eval-file work/eval_hdf5/<key>/eval_10k.hdf5 \\
        --output-dir results/run1 --model tiny --max-steps 20
    prefect deployment run 'bertpipe-pretrain/training' --param train_dir=... --param eval_file=...

Before any task: every parameter is checked as ``bertpipe train`` checks its flags (flows/guard.py), in one line
naming the parameter (``max_steps``, ``options.learning_rate``); then the output dir is locked for the whole run
(a second run or a retry never trains into a busy one: refused naming ``output_dir`` and ``wait_lock_s``) and the
data set is read-locked (core/readlock.py: the refresh never prunes a version a training reads). A retry of the
same flow run (``prefect flow-run retry`` after a crash) continues from its newest complete checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow

from core.errors import InputError
from flows.guard import as_flow_error, check_training, check_training_paths, flow_start, retried_run

#: written into the output dir when a flow run starts training there: a retry of that run resumes
RUN_RECORD = ".bertpipe-flow-run.json"


def vocab_lines(vocab: str | None) -> int:
    """Entries of a vocab.txt (the model's vocab_size), 0 when none is given."""
    if not vocab:
        return 0
    with open(vocab, encoding="utf-8") as f:
        return sum(1 for _ in f)


def resolve_dataset(train_dir: str, eval_file: str, vocab: str | None,
                    evaluate: bool = True, prefix: str = "") -> tuple[str, str, str | None]:
    """A data-flow work dir (e.g. ``datasets/latest``) stands for its 4 bins, eval_10k.hdf5 and vocab.

    With ``evaluate`` (the default) an eval file is required: a data set whose eval branch is missing is
    refused here, before any rank starts, rather than trained without evaluation.
    """
    from tasks.workdir import last_run

    if not Path(train_dir).exists():
        raise InputError(f"{prefix}train_dir {train_dir} does not exist; give a data work dir (datasets/latest) or "
                         "a 4-bin folder")
    if (Path(train_dir) / "last_run.json").is_file():
        out = last_run(Path(train_dir)).get("outputs", {})
        if "train_dir" not in out:
            raise InputError(f"{prefix}train_dir {train_dir} is a work dir whose last data run made no 4-bin output; "
                             "run the data flow on it first")
        if evaluate and not eval_file and "eval_hdf5" not in out:
            raise InputError(f"{prefix}train_dir {train_dir} holds no eval HDF5 (its eval stages are not done): run "
                             f"the data flow on it, pass {prefix}eval_file, or set {prefix}evaluate=false to train "
                             "without evaluation")
        train_dir, eval_file, vocab = out["train_dir"], eval_file or out.get("eval_hdf5", ""), vocab or out.get("vocab")
    if evaluate and not eval_file:
        raise InputError(f"no eval file: pass {prefix}eval_file (an eval_10k.hdf5), point {prefix}train_dir at a "
                         f"data work dir, or set {prefix}evaluate=false to train without evaluation")
    if evaluate and not Path(eval_file).is_file():
        raise InputError(f"{prefix}eval_file {eval_file} does not exist; pass the eval HDF5 of the data set")
    return train_dir, eval_file if evaluate else "", vocab


def check_pretrain(*, train_dir: str, eval_file: str, output_dir: str, model: str, max_steps: int, nproc: int,
                   vocab: str | None, resume: bool, options: dict[str, Any] | None, evaluate: bool,
                   prefix: str = "") -> dict[str, Any]:
    """Every parameter of a training run, checked before anything starts; the resolved inputs."""
    opts = check_training(model=model, max_steps=max_steps, nproc=nproc, options=options, resume=resume,
                          prefix=prefix)
    if not isinstance(evaluate, bool):
        raise InputError(f"{prefix}evaluate must be true or false, got {evaluate!r}")
    if not train_dir:
        raise InputError(f"{prefix}train_dir is required: a data work dir (datasets/latest) or a 4-bin folder")
    train_dir, eval_file, vocab = resolve_dataset(train_dir, eval_file, vocab, evaluate, prefix)
    check_training_paths(train_dir=train_dir, eval_file=eval_file, output_dir=output_dir, vocab=vocab, options=opts,
                         prefix=prefix)
    return {"train_dir": train_dir, "eval_file": eval_file, "vocab": vocab, "options": opts}


def _resume_on_retry(output_dir: str, resume: bool, options: dict[str, Any], logger) -> tuple[bool, dict[str, Any]]:
    """A retry of the flow run that started the training in ``output_dir`` continues it (resume, not overwrite);
    any other run records itself there."""
    run_id, count = retried_run()
    if not run_id:
        return resume, options
    record = Path(output_dir) / RUN_RECORD
    try:
        before = json.loads(record.read_text(encoding="utf-8")).get("flow_run")
    except (OSError, ValueError, AttributeError):
        before = None
    if before == run_id and count > 1:
        if not resume:
            logger.info("retry %d of flow run %s: continuing its training in %s from the newest complete "
                        "checkpoint", count - 1, run_id, output_dir)
        return True, {k: v for k, v in options.items() if k != "overwrite"}
    from core.manifest import atomic_write_text
    from pretrain.checkpoint import start_point

    # only a run that will train here records itself (one refused over another run's checkpoints must not
    # take the record from the run whose retry should resume them)
    start_point(output_dir, resume=resume, overwrite=bool(options.get("overwrite")))
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, json.dumps({"flow_run": run_id}) + "\n")
    return resume, options


def run_training(*, train_dir: str, eval_file: str = "", output_dir: str, model: str = "tiny", max_steps: int = 20,
                 nproc: int = 1, vocab: str | None = None, resume: bool = False,
                 options: dict[str, Any] | None = None, evaluate: bool = True, wait_lock_s: float = 0.0,
                 prefix: str = "", checked: dict[str, Any] | None = None) -> dict[str, Any]:
    """The body of a training flow (call it inside a flow run; the e2e flow calls it too, so the training's logs
    are the run's own): check, lock the output dir, read-lock the data set, launch."""
    from prefect import get_run_logger

    from core.readlock import reading
    from pretrain.launch import output_dir_lock
    from tasks.pretrain import launch_pretraining

    logger = get_run_logger()
    c = checked or check_pretrain(train_dir=train_dir, eval_file=eval_file, output_dir=output_dir, model=model,
                                  max_steps=max_steps, nproc=nproc, vocab=vocab, resume=resume, options=options,
                                  evaluate=evaluate, prefix=prefix)
    if isinstance(wait_lock_s, bool) or not isinstance(wait_lock_s, (int, float)) or not 0 <= wait_lock_s <= 1e7:
        raise InputError(f"{prefix}wait_lock_s must be a number of seconds >= 0, got {wait_lock_s!r}")
    options = dict(c["options"])
    if c["vocab"] and "vocab" not in options:
        options["vocab"] = str(c["vocab"])
    try:
        with output_dir_lock(output_dir, wait_lock_s, flag=f"{prefix}output_dir (or set {prefix}wait_lock_s)"), \
                reading(c["train_dir"], f"{prefix}train_dir"):
            resume, options = _resume_on_retry(output_dir, resume, options, logger)
            return launch_pretraining(c["train_dir"], c["eval_file"], output_dir, model=model, max_steps=max_steps,
                                      nproc=nproc, vocab_size=vocab_lines(c["vocab"]), resume=resume,
                                      options=options)
    except InputError as exc:
        raise as_flow_error(exc, prefix) from None


@flow(name="bertpipe-pretrain", description="BERT pre-training with DeepSpeed on a 4-bin HDF5 data set",
      persist_result=True, result_serializer="json")
def pretrain_flow(train_dir: str, eval_file: str = "", output_dir: str = "results/pretrain", model: str = "tiny",
                  max_steps: int = 20, nproc: int = 1, vocab: str | None = None, resume: bool = False,
                  options: dict[str, Any] | None = None, evaluate: bool = True,
                  wait_lock_s: float = 0.0) -> dict[str, Any]:
    """Launch training; ``vocab`` (a vocab.txt) sets the model's vocab size and is recorded with the run
    (``bertpipe export-hf`` writes its tokenizer).

    ``train_dir`` may also be a data work dir (``datasets/latest``): its bins, eval file and vocab are used.
    ``evaluate``: evaluate on the eval file (required then); false trains without evaluation.
    ``options``: more ``bertpipe train`` settings (TrainConfig fields, e.g. ``{"learning_rate": 0.01}``).
    ``wait_lock_s``: wait this long for an output dir another training holds, else refuse at once.
    The launcher's output (step lines, eval progress, errors) streams into this flow run's logs.
    """
    flow_start()
    return run_training(train_dir=train_dir, eval_file=eval_file, output_dir=output_dir, model=model,
                        max_steps=max_steps, nproc=nproc, vocab=vocab, resume=resume, options=options,
                        evaluate=evaluate, wait_lock_s=wait_lock_s)
