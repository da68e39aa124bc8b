"""The stages of the data DAG, in order: each module's own declaration (``DAG_STAGES``, beside its run function).

    download -> extract -> text -> vocab -> tfrecord -> hdf5 -> bins          (per part file to hdf5)
                              (or imported text)     |       |-> nvidia_4320, nvidia_4320_shuffled (each from hdf5)
                                                     |       |-> nvidia_2048, nvidia_2048_shuffled (each from hdf5)
                                                     |       |-> nvidia_packed, habana_packed
                                                     \\-> eval_tfrecord -> eval_10k -> eval_hdf5 -> nvidia_eval

Which of the stages after ``hdf5`` a run builds follows from its targets (``bertpipe run --target``,
preprocessing/targets.py): each declaration says, in its ``when``, which targets need it; ``eval_hdf5`` is built
for every target.

Everything that needs the list of stages derives it from :data:`STAGES`: the DAG walk, the Prefect
tasks, ``--only``/``--force``/``stages`` names, ``status`` rows and the summary table. To add a stage,
declare it in its library module and add that module here (docs/development.md, "Adding a stage").
"""

from __future__ import annotations

from typing import Any

from core.errors import InputError
from core.stage import Stage
from preprocessing import targets
from preprocessing.habana import pack as pack_habana
from preprocessing.mlperf import create_pretraining_data, pick_eval_samples, split_4bins, tfrecord_to_hdf5
from preprocessing.nvidia import chop as nvidia_chop
from preprocessing.nvidia import eval_pick as nvidia_eval
from preprocessing.nvidia import pack as pack_nvidia
from preprocessing.nvidia import shuffle as nvidia_shuffle
from preprocessing.text import download, extract, text_import, vocab
from preprocessing.text import pipeline as text_pipeline

#: Every declaration, in DAG order (a stage comes after the stages it reads).
STAGES: tuple[Stage, ...] = (
    *download.DAG_STAGES,
    *extract.DAG_STAGES,
    *text_pipeline.DAG_STAGES,
    *text_import.DAG_STAGES,
    *vocab.DAG_STAGES,
    *create_pretraining_data.DAG_STAGES[:1],  # tfrecord
    *tfrecord_to_hdf5.DAG_STAGES[:1],  # hdf5
    *split_4bins.DAG_STAGES,
    nvidia_chop.DAG_STAGES[0],  # nvidia_4320
    nvidia_shuffle.DAG_STAGES[0],  # nvidia_4320_shuffled
    nvidia_chop.DAG_STAGES[1],  # nvidia_2048
    nvidia_shuffle.DAG_STAGES[1],  # nvidia_2048_shuffled
    nvidia_chop.DAG_STAGES[2],  # nvidia_4320_v11 (v1.1's rule)
    *pack_nvidia.DAG_STAGES,
    *pack_habana.DAG_STAGES,
    *create_pretraining_data.DAG_STAGES[1:],  # eval_tfrecord
    *pick_eval_samples.DAG_STAGES,
    *tfrecord_to_hdf5.DAG_STAGES[1:],  # eval_hdf5
    *nvidia_eval.DAG_STAGES,
)


def for_target(target: str, params: Any) -> list[str]:
    """The stages a run of ``target`` alone builds, beyond those every run builds (text ... hdf5, the eval chain),
    for the run's ``params`` (a DataParams: the registry never imports the parameters, they import it)."""
    from dataclasses import replace

    base = params
    every = set.intersection(*({s.name for s in active(replace(base, targets=[t]))} for t in targets.names()))
    return [s.name for s in active(replace(base, targets=[target])) if s.name not in every]


class _WithTargets:
    """``params`` as a run of other targets would see them (for asking a declaration's ``when``)."""

    def __init__(self, params: Any, chosen: list[str]) -> None:
        self._params, self.targets = params, chosen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._params, name)


def targets_adding(name: str, params: Any) -> list[str]:
    """The targets that would put stage ``name`` into a run with these parameters ([] when it is in the run
    already, or when no target adds it: a stage of another source)."""
    decls = [s for s in STAGES if s.name == name]
    if any(s.when(params) for s in decls):
        return []
    return [t for t in targets.names() if any(s.when(_WithTargets(params, [t])) for s in decls)]


def names() -> list[str]:
    """The stage names, in DAG order, each once."""
    return list(dict.fromkeys(s.name for s in STAGES))


def per_shard() -> set[str]:
    """Stages with one directory (and manifest) per part file."""
    return {s.name for s in STAGES if s.per_shard}


def droppable() -> set[str]:
    """Stages whose files ``--keep training`` may delete: a drop record (``_dropped.json``) counts only there."""
    return {s.name for s in STAGES if s.droppable}


def titles() -> dict[str, str]:
    return {n: " / ".join(dict.fromkeys(s.title for s in STAGES if s.name == n)) for n in names()}


def active(params: Any) -> list[Stage]:
    """The declarations that apply to a run with these parameters, in order (one per name)."""
    out = [s for s in STAGES if s.when(params)]
    seen = [s.name for s in out]
    assert len(seen) == len(set(seen)), f"two declarations of one stage apply: {seen}"
    return out


def normalize_stage(name: str, what: str = "stages") -> str:
    """``create-pretraining-data`` -> ``tfrecord``; InputError naming the choices otherwise (``what``: the flag or
    parameter as the user spells it; the caller spells it, the registry does not import the parameters)."""
    n = name.strip().lower().replace("-", "_")
    for s in STAGES:
        if n == s.name or n in s.aliases:
            return s.name
    raise InputError(f"{what}: unknown stage {name!r}; the data stages are: {', '.join(names())}")
