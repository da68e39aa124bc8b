"""What every bertpipe flow run does before its first task (issue 24): tie its process tree to itself, check
its parameters in one line each, and keep Prefect's tracebacks out of bertpipe's own errors.

* :func:`flow_start` starts the forkserver of the data pools from the flow run's main thread, tied to it by the
  kernel's parent-death signal (core/pools.py): a ``kill -9`` (or the OOM killer) of a deployment run ends its
  forkserver, resource tracker and pool workers with it, so nothing holds the run's stdout and the Prefect worker
  marks the run Crashed at once. DeepSpeed's launcher and ranks die with it already (pretrain/liveness.py).
* :func:`check_data` and :func:`check_training` check a deployment's parameters as ``bertpipe run`` and
  ``bertpipe train`` check their flags (names, types, bounds, choices, paths), before any task, naming the
  parameter as the deployment spells it (``data.n_output_shards``, ``options.learning_rate``, ``output_dir``).
* :func:`flow_words` turns the CLI flags in a library's message into those names.
* :func:`retried_run` says whether this flow run is a retry of itself (``prefect flow-run retry``).
"""

from __future__ import annotations

import difflib
import logging
import re
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from core.errors import BertpipeError, InputError

# -- the process tree and the logs -------------------------------------------------------------------------

_ENGINE_LINES = ("Engine execution exited with unexpected exception", "exited with unexpected exception")


class _OwnErrors(logging.Filter):
    """On Prefect's run loggers: a bertpipe error (bad input, checksum, ...) is its one line. Prefect's
    tracebacks of it go: the engine's "Engine execution exited with unexpected exception" record is dropped, and
    "Encountered exception during execution" / "Task run failed" keep their text without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, BertpipeError):
            return True
        if any(line in record.getMessage() for line in _ENGINE_LINES):
            return False
        record.exc_info, record.exc_text = None, None
        return True


_LOGGERS = ("prefect.flow_runs", "prefect.task_runs", "prefect.engine", "prefect.flow_engine", "prefect.task_engine")


def quiet_own_errors() -> None:
    """Install :class:`_OwnErrors` on Prefect's run and engine loggers (once)."""
    for name in _LOGGERS:
        lg = logging.getLogger(name)
        if not any(isinstance(f, _OwnErrors) for f in lg.filters):
            lg.addFilter(_OwnErrors())


def flow_start() -> None:
    """First thing in a flow: the forkserver tied to this process (main thread only), quiet known errors."""
    from core.pools import start_forkserver

    start_forkserver()
    quiet_own_errors()


def retried_run() -> tuple[str, int]:
    """(this flow run's id, its run count): a run count above 1 is ``prefect flow-run retry`` (or a flow retry)
    of the same run. ("", 0) outside a flow run."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return "", 0
    return str(ctx.flow_run.id), int(ctx.flow_run.run_count or 0)


# -- names -----------------------------------------------------------------------------------------------

def unknown_names(given: typing.Iterable[str], known: typing.Iterable[str], prefix: str, what: str) -> None:
    """Refuse names that are not parameters, in one line: the closest valid one, and the whole list."""
    known = list(known)
    bad = [k for k in given if k not in known]
    if not bad:
        return
    k = bad[0]
    close = difflib.get_close_matches(k, known, n=1)
    hint = f"did you mean {prefix}{close[0]}? " if close else ""
    raise InputError(f"{prefix}{k} is not {what}; {hint}the {what.split(' ', 1)[1]}s are: {', '.join(known)}")


def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(t, str(t))


def check_type(name: str, value: Any, hint: Any) -> Any:
    """``value`` for a parameter annotated ``hint`` (int, float, str, bool, list[str], Literal, their Optional):
    returned (an int where a float is expected becomes one) or refused naming ``name``."""
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return check_type(name, value, inner[0]) if len(inner) == 1 else value
    if origin is typing.Literal:
        if value not in args:
            raise InputError(f"{name} {value!r}: choose one of {', '.join(map(str, args))}")
        return value
    if origin is list:
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise InputError(f"{name} must be a list of names (e.g. [\"hdf5\"]), got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise InputError(f"{name} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{name} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{name} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise InputError(f"{name} must be a string, got {value!r}")
        return value
    return value


# -- the data parameters ------------------------------------------------------------------------------------

def check_source(name: str, source: str) -> None:
    """A URL is one token (no spaces or control characters); a source is never empty (as `bertpipe run`)."""
    if "://" in source:
        bad = next((c for c in source if c.isspace() or ord(c) < 32 or ord(c) == 127), None)
        if bad is not None:
            raise InputError(f"{name} URL {source!r} contains {bad!r}: a URL cannot hold spaces or control "
                             "characters; percent-encode them (a space is %20)")
    elif not source.strip():
        raise InputError(f"{name} is empty; give a preset (enwiki-latest), a URL or a local path")


def _data_parameters_model() -> Any:
    """A pydantic model of DataParams' fields (types, defaults, help) for the ``data`` parameter of the e2e and
    refresh flows: the deployments' schema and the UI show every field. Extra keys are kept (not dropped, as
    pydantic would) so that :func:`check_data` refuses a misspelt one naming the valid ones."""
    from dataclasses import MISSING

    from pydantic import ConfigDict, Field, create_model

    from preprocessing.params import DataParams

    hints = typing.get_type_hints(DataParams)
    spec = {}
    for f in fields(DataParams):
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        spec[f.name] = (hints[f.name], Field(default=default, description=f.metadata["help"]))
    return create_model("DataParameters", __config__=ConfigDict(extra="allow"), **spec)


DataParameters = _data_parameters_model()


def data_values(values: Any) -> Any:
    """The keys a caller gave in a ``data`` parameter (a dict, DataParams or :data:`DataParameters`)."""
    from pydantic import BaseModel

    if isinstance(values, BaseModel):
        return {**values.model_dump(exclude_unset=True), **(values.model_extra or {})}
    return values


def check_data(values: Any, prefix: str = "", fixed: dict[str, Any] | None = None):  # -> DataParams
    """The :class:`~preprocessing.params.DataParams` of a deployment's parameters, checked as ``bertpipe run``
    checks its flags (names, types, bounds, paths: ``DataParams.preflight``), naming each as the deployment does
    (``prefix``: "" for the data flow's own parameters, "data." for the ``data`` parameter of e2e and refresh).
    ``fixed``: fields the flow sets itself (refused when given)."""
    from preprocessing.params import DataParams, surface

    fixed = fixed or {}
    values = data_values(values)
    if isinstance(values, DataParams):
        values = values.to_dict()
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise InputError(f"{prefix.rstrip('.') or 'data'} must be an object of data parameters, got {values!r}")
    names = [f.name for f in fields(DataParams)]
    unknown_names(values, names, prefix, "a data parameter")
    for k in values:
        if k in fixed and values[k] != fixed[k] and values[k] is not None:
            raise InputError(f"{prefix}{k} is set by this flow ({fixed[k]!r}); leave it out")
    hints = typing.get_type_hints(DataParams)
    checked = {k: check_type(f"{prefix}{k}", v, hints[k]) for k, v in values.items() if k not in fixed}
    from contextlib import nullcontext

    with surface(prefix) if prefix else nullcontext():  # (`bertpipe run` keeps its --flags)
        p = DataParams(**checked, **fixed)
        check_source(f"{prefix}source", p.source)
        p.preflight()
    return p


# -- the training parameters --------------------------------------------------------------------------------

#: TrainConfig's "not given" values (outside BOUNDS: the --model preset's value is taken)
_UNSET = {"learning_rate": 0.0, "warmup_proportion": -1.0, "constant_proportion": -1.0, "clip_grad_norm": -1.0,
          "warmup_steps": -1}

#: the training flows' own parameters that are TrainConfig fields too (``options`` may not set them again)
TRAINING_PARAMETERS = ("train_dir", "eval_file", "output_dir", "model", "max_steps", "resume", "vocab")


def check_training(*, model: str, max_steps: int, nproc: int, options: dict[str, Any] | None,
                   resume: bool = False, prefix: str = "") -> dict[str, Any]:
    """The training options (TrainConfig fields) of a deployment, checked as ``bertpipe train`` checks its flags:
    known names (``options.<name>``), types, bounds (pretrain.train_config.BOUNDS), choices; ``model``,
    ``max_steps`` and ``nproc`` too. Returns the options to pass on."""
    from pretrain.train_config import BOUNDS, CHOICES, TrainConfig

    options = dict(options or {})
    if not isinstance(options, dict):
        raise InputError(f"{prefix}options must be an object of training options, got {options!r}")
    unknown_names(options, [f.name for f in fields(TrainConfig)], f"{prefix}options.", "a training option")
    for k in options:
        if k in TRAINING_PARAMETERS:
            raise InputError(f"{prefix}options.{k} repeats the parameter {prefix}{k}: set {prefix}{k} instead")
    types = {f.name: {"int": int, "float": float, "str": str, "bool": bool}[str(f.type)] for f in fields(TrainConfig)}
    out = {}
    for k, v in options.items():
        if k == "split_batch_cnt" and isinstance(v, list):
            if len(v) != 4 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v):
                raise InputError(f"{prefix}options.split_batch_cnt must be 4 integers >= 0 (rows of the bins 128, "
                                 f"256, 384, 512), got {v!r}")
            v = " ".join(map(str, v))
        out[k] = check_type(f"{prefix}options.{k}", v, types[k])
    for name, value in (("model", model), ("max_steps", max_steps), *((f"options.{k}", v) for k, v in out.items())):
        field = name.split(".")[-1]
        spelled = f"{prefix}{name}"
        if field == "max_steps":
            check_type(spelled, value, int)
        if field in CHOICES and value not in CHOICES[field] and not (field in ("optimizer", "schedule_convention",
                                                                                "batch_mix") and value == ""):
            raise InputError(f"{spelled} {value!r}: choose one of {', '.join(CHOICES[field])}")
        if field in BOUNDS and isinstance(value, (int, float)) and not isinstance(value, bool):
            lo, hi = BOUNDS[field]
            if field in _UNSET and value == _UNSET[field]:  # "not given": the model's default
                continue
            if value != value or not lo <= value <= hi:
                raise InputError(f"{spelled} must be between {_num(lo)} and {_num(hi)}, got {value}")
    check_type(f"{prefix}nproc", nproc, int)
    if not 1 <= nproc <= 1024:
        raise InputError(f"{prefix}nproc must be between 1 and 1024 (ranks on this node), got {nproc}")
    check_type(f"{prefix}resume", resume, bool)
    from preprocessing.params import current_surface

    if resume and out.get("overwrite") and current_surface() != "cli":  # (the CLI's own line names its flags)
        raise InputError(f"{prefix}resume and {prefix}options.overwrite contradict each other: resume continues the "
                         "run in output_dir, overwrite discards it and starts at step 1; give one")
    return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def check_training_paths(*, train_dir: str, eval_file: str, output_dir: str, vocab: str | None,
                         options: dict[str, Any], prefix: str = "") -> None:
    """The paths of a training, as ``bertpipe train`` checks them: inputs exist and are what they should be, and
    ``output_dir`` is none of them. ``train_dir`` first: a missing one says so (not "no eval file")."""
    from core.paths import PathCheck
    from pretrain.train_config import DEFAULT_DS_CONFIG

    pc = PathCheck()
    if not train_dir:
        raise InputError(f"{prefix}train_dir is required: a data work dir (datasets/latest) or a 4-bin folder")
    if Path(train_dir).is_dir():
        pc.input_dir(f"{prefix}train_dir", train_dir, "4-bin HDF5 folder or data work dir")
    else:
        pc.input_file(f"{prefix}train_dir", train_dir, "data work dir, 4-bin HDF5 folder or HDF5 file")
    for name, value, what in ((f"{prefix}eval_file", eval_file, "eval HDF5"), (f"{prefix}vocab", vocab, "vocab.txt"),
                              (f"{prefix}options.deepspeed_config", options.get("deepspeed_config",
                                                                                str(DEFAULT_DS_CONFIG)), "DeepSpeed JSON"),
                              (f"{prefix}options.model_config", options.get("model_config"), "model config JSON")):
        if value:
            pc.input_file(name, value, what)
    init = options.get("init_checkpoint")
    if init and Path(init).exists():
        (pc.input_dir if Path(init).is_dir() else pc.input_file)(f"{prefix}options.init_checkpoint", init)
    pc.output_dir(f"{prefix}output_dir", output_dir, ["metrics.jsonl", "summary.json", "config.json"])


_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9]*(?:[-_][a-z0-9]+)*)")


def flow_words(message: str, prefix: str = "", top: typing.Iterable[str] = (*TRAINING_PARAMETERS, "nproc",
                                                                              "wait_lock_s", "evaluate")) -> str:
    """``message`` with the CLI flags of ``bertpipe train`` named as a training deployment's parameters:
    ``--output-dir`` -> ``output_dir``, ``--learning-rate`` -> ``options.learning_rate``."""
    from pretrain.train_config import TrainConfig

    config = {f.name for f in fields(TrainConfig)}
    top = set(top)

    def name(m: re.Match) -> str:
        field = m.group(1).replace("-", "_")
        if field == "wait_lock":
            field = "wait_lock_s"
        if field in top:
            return prefix + field
        if field in config:
            return f"{prefix}options.{field}"
        return m.group(0)

    return _FLAG.sub(name, message)


def as_flow_error(exc: BaseException, prefix: str = "") -> BaseException:
    """An InputError of the training libraries with its flags named as deployment parameters (unchanged under
    ``bertpipe run``, whose users gave flags)."""
    from preprocessing.params import current_surface

    if isinstance(exc, InputError) and current_surface() != "cli":
        return InputError(flow_words(str(exc), prefix))
    return exc
