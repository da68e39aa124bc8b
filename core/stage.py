"""How a stage of the data DAG declares itself, once, beside its library function.

A :class:`Stage` names the stage (``work/<name>/<key>/``, ``--only``/``--force``/``stages``, ``status``), the
stages whose outputs it reads, its config class, how the run's parameters make that config, what goes
into its key, whether it runs per shard (one call and one manifest per part file), and its run function
(a real reference). ``preprocessing/registry.py`` lists the declarations in DAG order; the DAG walk
(``flows/dag.py``), the Prefect tasks, the CLI's stage names, ``status`` and the summary table are all
derived from that list, and nothing else keeps a table of stages.

Planning a stage turns its upstream results into :class:`Unit` s: one library call each, with its
output directory. A unit is small and picklable (paths, a frozen config, the function), so it runs
in this process, in a local worker process or on a Dask worker alike.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ManifestError
from core.manifest import Manifest, load_manifest

PART = re.compile(r"^part-\d{5}-of-\d{5}$")


@dataclass(frozen=True)
class Unit:
    """One library call: ``run(*args, Path(out_dir), **kwargs[, upstream=<manifests of upstream_dirs>])``."""

    stage: str  # DAG stage name
    key: str  # the stage's content key (names work/<stage>/<key>)
    shard: str  # part file name for per-shard stages, "" for whole-stage ones (or a piece id)
    out_dir: str
    run: Callable[..., Any]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    upstream_dirs: tuple[str, ...] = ()  # stage/shard dirs whose manifests are passed as upstream=
    pass_upstream: bool = True  # the function takes upstream= (imports of outside files do not)
    fresh: dict[str, Any] | None = None  # counters the manifest must hold to count as done (source stats)
    piece: bool = False  # writes files into a shared stage dir and returns their entries (no manifest)

    @property
    def label(self) -> str:
        return f"{self.stage}[{self.shard}]" if self.shard else self.stage

    def upstream_manifests(self) -> list[Manifest]:
        """The manifests of the upstream directories (each must exist: upstream stages ran first)."""
        out = []
        for d in self.upstream_dirs:
            m = load_manifest(d)
            if m is None:
                raise ManifestError(f"{d}/_manifest.json is missing: the upstream stage of {self.label} is not "
                                    "done; run again to redo it")
            out.append(m)
        return out

    def call(self, upstream: Sequence[Manifest] | None = None) -> Any:
        """Run the library function in this process (``upstream=`` defaults to :meth:`upstream_manifests`)."""
        kwargs = dict(self.kwargs)
        if self.pass_upstream:
            kwargs["upstream"] = self.upstream_manifests() if upstream is None else list(upstream)
        return self.run(*self.args, Path(self.out_dir), **kwargs)


@dataclass
class Result:
    """A finished (or found-done) stage: its directory and its manifests (one per shard, or one)."""

    stage: str
    key: str
    dir: Path
    manifests: dict[str, Manifest]  # shard ("" for whole-stage) -> manifest
    ran: dict[str, bool] = field(default_factory=dict)  # shard -> True when it ran in this run
    dropped: set[str] = field(default_factory=set)  # shards whose files --keep training deleted

    @property
    def manifest(self) -> Manifest:
        """The manifest of a whole-stage output."""
        return self.manifests[""]

    def unit_dir(self, shard: str = "") -> Path:
        return self.dir / shard if shard else self.dir

    def manifest_dirs(self) -> list[Path]:
        """Where this output's manifests are: its directory, or each shard's (a per-shard stage), in shard order."""
        return [self.unit_dir(s) for s in sorted(self.manifests)]

    def path(self, name: str, shard: str = "") -> Path:
        return self.unit_dir(shard) / name

    def names(self, pattern: re.Pattern[str] = PART) -> list[str]:
        """Sorted names of the whole-stage output's files matching ``pattern`` (default: part files)."""
        return sorted(f.name for f in self.manifest.files if pattern.match(f.name))

    @property
    def shards(self) -> list[str]:
        return sorted(s for s in self.manifests if s)


class Plan:
    """What a stage's ``plan`` function sees: the run's parameters, its config and key, the results of
    the stages it reads (``result``), and for a chained stage the units planned for its upstream."""

    def __init__(self, stage: Stage, params: Any, cfg: Any, key: str, work: Path,
                 results: dict[str, Result], planned: dict[str, list[Unit]]) -> None:
        self.stage, self.params, self.cfg, self.key, self.work = stage, params, cfg, key, work
        self._results, self._planned = results, planned

    @property
    def dir(self) -> Path:
        return self.work / self.stage.name / self.key

    def result(self, stage: str) -> Result:
        return self._results[stage]

    def units_of(self, stage: str) -> list[Unit]:
        return self._planned[stage]

    def unit(self, *args: Any, shard: str = "", upstream: Sequence[str | Path] | None = None,
             **kwargs: Any) -> Unit:
        """A unit of this stage; ``upstream`` defaults to the directories of every stage it reads: a whole-stage
        output's directory, or each shard's directory of a per-shard one (where its manifests are: the stage's
        own directory holds none)."""
        if upstream is None:
            upstream = [d for s in self.stage.reads if s in self._results for d in self._results[s].manifest_dirs()]
        return Unit(stage=self.stage.name, key=self.key, shard=shard, out_dir=str(self.dir / shard if shard
                    else self.dir), run=self.stage.run, args=args, kwargs=kwargs,
                    upstream_dirs=tuple(str(u) for u in upstream), pass_upstream=self.stage.pass_upstream)


def no_params(cfg: Any) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Stage:
    """One stage of the data DAG (see the module docstring).

    ``when``: whether the stage belongs to a run with these parameters (two declarations may share a
    name when exactly one of them applies: the text of a dump, or imported text). ``chain``: a per-shard
    stage that reads one per-shard stage is planned with it, shard by shard, into the same calls (part
    i's HDF5 follows part i's TFRecord in one call; ``fused`` then writes both in one pass when both
    are due). ``finish``: for a stage planned as pieces (``Unit.piece``: calls that return a JSON value
    and may write into the one stage directory), called in the flow process once every piece planned so
    far has returned, with the :class:`Plan` and all their values in order; it returns the next pieces
    (another phase: the bins count their inputs, then write groups of shards) or the stage manifest. The
    DAG asks "done?" of the whole stage first, so a finished stage runs no piece.
    """

    name: str
    title: str  # one line: what it makes (status, --help)
    reads: tuple[str, ...]
    run: Callable[..., Any]
    version: str  # the library's STAGE_VERSION: changing the code's output changes the key
    configure: Callable[[Any], Any]  # run parameters -> the stage's config (a frozen dataclass)
    plan: Callable[[Plan], list[Unit]]
    config: type | None = None
    key_params: Callable[[Any], dict[str, Any]] = no_params  # config -> what decides the bytes
    key_extra: Callable[[Any], dict[str, Any]] | None = None  # params -> inputs outside the work dir
    check: Callable[[Any], None] | None = None  # params -> InputError for a bad input, before the run starts
    per_shard: bool = False
    chain: bool = False
    when: Callable[[Any], bool] = lambda p: True
    fused: Callable[..., Any] | None = None  # (upstream unit, this unit) -> both manifests, one pass
    finish: Callable[[Plan, list[Any]], Manifest | list[Unit]] | None = None
    outputs: dict[str, str] = field(default_factory=dict)  # last_run.json name -> path in the stage dir
    pass_upstream: bool = True
    droppable: bool = False  # an intermediate (TFRecords, padded HDF5): --keep training deletes its files
    aliases: tuple[str, ...] = ()  # other spellings for --only/--force/stages (the library's stage name)
    retries: int = 0
