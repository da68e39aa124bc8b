"""The data DAG's parameters, declared once.

:class:`DataParams` is the only declaration: ``bertpipe run``'s flags (``bertpipe/commands/run.py``), the
Prefect data flow's parameters and so the deployments' (``flows/data_flow.py``) are generated from its
fields, with the reference's spellings as aliases (``--max_seq_length`` beside ``--max-seq-length``).
Each stage's config is made from it by the stage's declaration (``configure``, beside the library
function). Defaults are MLPerf's flags (create_pretraining_data 512 / 76 / dupe 10 / 0.15 / seed 12345 /
short_seq 0.1; pick_eval_samples 10,000; 2,048 shards per bin); the built-in sample gets sizes that fit
it unless they are given.

Errors about a parameter name it as the caller knows it: ``--num-test-articles`` on the command line,
``num_test_articles`` in a deployment run, ``data.num_test_articles`` inside the refresh flow
(:func:`spell`, :func:`surface`).
"""

from __future__ import annotations

import contextvars
import math
import types
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal

from core.errors import InputError
from preprocessing.targets import DEFAULT as DEFAULT_TARGET
from preprocessing.targets import TARGETS

SAMPLE = "sample"
MLCOMMONS = "mlcommons"
SAMPLE_TEST_ARTICLES = 5  # eval articles withheld from the sample's ~50 (as `bertpipe demo`)
SAMPLE_SHARDS = 8  # shards per bin for the sample (the reference's 2048 would be 8,192 nearly empty files)
SAMPLE_VOCAB_SIZE = 8000  # the sample supports a few thousand WordPiece tokens
SAMPLE_TIME = "2026-01-01T00:00:00"  # {{CURRENTYEAR}} & co. in the sample: the same bytes on every run
MLPERF_SHARDS = 2048  # shards per length bin (Samsung's default)
NVIDIA_SHARDS = 4320  # shards of NVIDIA's sets (chop_hdf5_files.py, generate_packing_strategy.py --shards_num)
MLPERF_VOCAB_SIZE = 30522


def param(default: Any = MISSING, help: str = "", *, flags: tuple[str, ...] = (), group: str = "data",
          ge: float | None = None, gt: float | None = None, le: float | None = None, lt: float | None = None,
          cli: bool = True, factory: Any = MISSING, metavar: str | None = None) -> Any:
    """A DataParams field: default, one-line help, the CLI flags (default ``--dashed`` and ``--under_scored``),
    the --help group, numeric bounds checked on construction, and (lists) the CLI's name for one value."""
    meta = {"help": help, "flags": flags, "group": group, "ge": ge, "gt": gt, "le": le, "lt": lt, "cli": cli,
            "metavar": metavar}
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class DataParams:
    """Everything the data DAG needs; every field has a default."""

    work_dir: str = param("work", "work dir: every stage writes <work>/<stage>/<key>/", group="run")
    source: str = param(SAMPLE, "'sample' (the built-in dump), a dump path or URL, a preset (enwiki-latest, "
                        "enwiki-20200101) or 'mlcommons' (MLCommons' published text and vocab, from their R2 distribution: "
                        "token in $MLCOMMONS_CF_ACCESS_TOKEN); not with text_dir",
                        flags=("--source", "--dump"), group="source")
    source_md5: str | None = param(None, "expected md5 of the dump (default: the one published next to it)",
                                   flags=("--dump-md5", "--dump_md5", "--source-md5"), group="source")
    text_dir: str | None = param(None, "MLCommons' text (part-*-of-00500 + eval.txt): skips download, extract "
                                 "and the text stages", group="source")
    link_text: bool = param(False, "hard-link text_dir's files into the work dir instead of copying them",
                            group="source")
    vocab: str | None = param(None, "a BERT vocab.txt; without it the vocab stage learns one",
                              flags=("--vocab", "--vocab_file", "--vocab-file"), group="source")
    vocab_size: int | None = param(None, f"entries of a learned vocab (default {MLPERF_VOCAB_SIZE}; sample "
                                   f"{SAMPLE_VOCAB_SIZE})", ge=105, le=1 << 24, group="source")
    num_test_articles: int | None = param(None, "articles of a dump withheld for eval (default: 10% of the "
                                          "articles, at most 10000, as MLPerf; sample 5)", ge=1, le=2**31 - 1,
                                          group="source")
    current_time: str | None = param(None, "ISO time that {{CURRENTYEAR}} & co. expand to during extraction "
                                     "(default: now; sample 2026-01-01)", group="source")
    extractor: str | None = param(None, "the dump's extractor: 'mlperf' (WikiExtractor.py @ 3162bb6c, the script "
                                  "MLPerf pins: MLPerf's bytes) or 'wikiextractor-3.1' (the PyPI package 3.1.0) "
                                  "(default: mlperf for enwiki-20200101, else wikiextractor-3.1)", group="source")
    extractor_script: str | None = param(None, "mlperf: a copy of the pinned WikiExtractor.py (sha256-checked; "
                                         "default: fetched from its commit into ~/.cache/bertpipe)", group="source",
                                         metavar="PATH")
    max_seq_length: int = param(512, "tokens per instance", ge=5, le=1 << 16)
    max_predictions_per_seq: int = param(76, "masked positions per instance", ge=1, le=1 << 16)
    dupe_factor: int = param(10, "passes over the documents, each with other masks", ge=1, le=100_000)
    masked_lm_prob: float = param(0.15, "fraction of tokens masked", gt=0, lt=1)
    random_seed: int = param(12345, "create_pretraining_data seed (one random.Random per part file)",
                             ge=-(2**63), le=2**63 - 1)
    short_seq_prob: float = param(0.1, "probability of a shorter target length", ge=0, le=1)
    do_lower_case: bool = param(True, "lower-case the text (uncased vocab)")
    num_eval_examples: int = param(10000, "eval_10k size (fewer eval records: all are kept)", ge=1, le=2**31 - 1,
                                   flags=("--num-examples-to-pick", "--num_examples_to_pick",
                                          "--num-eval-examples"))
    n_output_shards: int | None = param(None, f"shards per length bin (default {MLPERF_SHARDS}; sample "
                                        f"{SAMPLE_SHARDS})", ge=1, le=1 << 20)
    targets: list[str] = param(help="what the run builds (several share their upstream stages): "
                               + "; ".join(f"{t.name}: {t.help}" for t in TARGETS) + f" (default {DEFAULT_TARGET})",
                               flags=("--target", "--targets"), group="target", metavar="TARGET",
                               factory=lambda: [DEFAULT_TARGET])
    nvidia_shards: int | None = param(None, f"shards of every chopped, shuffled or packed NVIDIA set, whatever its "
                                      f"name (prepare_data.sh --shards; default: {NVIDIA_SHARDS} for the 4,320-shard "
                                      f"targets and nvidia-packed, {MLPERF_SHARDS} for the 2,048 ones; sample: its "
                                      "shards per bin). The same rows in that many files, which no published list "
                                      "checks",
                                      flags=("--nvidia-shards",), ge=1, le=1 << 20, group="target")
    nvidia_packed_shards: int | None = param(None, f"shards of the nvidia-packed set (generate_packing_strategy.py "
                                             f"--shards_num; default --nvidia-shards, else {NVIDIA_SHARDS}; sample: its "
                                             "shards per bin)",
                                             flags=("--nvidia-packed-shards", "--nvidia_packed_shards", "--shards_num"),
                                             ge=1, le=1 << 20, group="target")
    max_sequences_per_pack: int = param(3, "sequences a pack holds at most (nvidia-packed: --max_seq_per_sample; "
                                        "habana-packed: --max_sequences_per_pack)",
                                        flags=("--max-sequences-per-pack", "--max_sequences_per_pack",
                                               "--max_seq_per_sample"), ge=2, le=3, group="target")
    pack_seed: int = param(12345, "seed of NVIDIA's packing (its generate_packing_strategy.py is unseeded; bertpipe "
                           "draws from random.Random(seed); pack-nvidia --seed's range)", ge=0, le=2**63 - 1,
                           group="target")
    habana_pack_seed: int = param(42, "seed of Habana's packing (pack_pretraining_data_pytorch.py --seed; with its "
                                  "--local_rank -1 it seeds random and NumPy with seed - 1)", ge=1, le=2**32,
                                  group="target")
    keep: Literal["all", "training"] = param("all", "'training' deletes TFRecords and padded HDF5 once the "
                                             "stages that read them are done and verified (bins, eval HDF5, vocab "
                                             "and every manifest stay; a later run rebuilds what it needs)",
                                             group="run")
    workers: int = param(0, "parallel shard tasks (0: one per CPU; 1: serial, in this process)", ge=0, le=4096,
                         group="run")
    runner: Literal["local", "prefect-process", "dask"] = param(
        "local", "local: threads + worker processes; prefect-process: Prefect's ProcessPoolTaskRunner; dask: "
        "prefect-dask on dask_address", group="run")
    dask_address: str | None = param(None, "tcp://scheduler:8786: run shard tasks on that Dask cluster (needs a "
                                     "standing Prefect server: PREFECT_API_URL; every worker must reach it and see "
                                     "the work dir at the same path: checked before any work)", group="run")
    stages: list[str] | None = param(None, "run only these stages (and whatever they need that is not done)",
                                     flags=("--only",), group="run")
    force: list[str] = param(help="redo these stages even if their manifests verify", group="run", factory=list)
    verify_md5: bool = param(True, "'done' re-hashes outputs whose size, mtime or inode changed since they "
                             "were written (False: sizes only)", flags=("--no-md5",), group="run")
    wait_lock_s: float = param(0.0, "wait this long (seconds) for a work dir in use, else refuse at once",
                               flags=("--wait-lock",), ge=0, le=1e7, group="run")

    def __post_init__(self) -> None:
        for f in fields(self):
            check_bounds(f.name, getattr(self, f.name), f.metadata)
        from preprocessing.registry import normalize_stage

        object.__setattr__(self, "stages", None if self.stages is None else
                           [normalize_stage(s, spell("stages")) for s in self.stages])
        object.__setattr__(self, "force", [normalize_stage(s, spell("force")) for s in self.force or []])
        from preprocessing.targets import normalize as normalize_targets

        object.__setattr__(self, "targets", normalize_targets(self.targets, spell("targets")))
        from preprocessing.registry import targets_adding

        for what in ("stages", "force"):
            for s in getattr(self, what) or []:
                if adding := targets_adding(s, self):
                    raise InputError(f"{spell(what)}: stage '{s}' is built only for {spell('targets')} "
                                     f"{' or '.join(adding)}, and this run's targets are {', '.join(self.targets)}; "
                                     f"add {spell('targets')} {adding[0]}")
        if self.text_dir and self.source not in (SAMPLE, ""):
            raise InputError(f"give either {spell('text_dir')} or {spell('source')}, not both")
        if self.extractor is not None:
            from preprocessing.text.extract import check_extractor

            check_extractor(self.extractor, spell("extractor"))
        if self.runner not in ("local", "prefect-process", "dask"):
            raise InputError(f"{spell('runner')} {self.runner!r}: choose local, prefect-process or dask")
        if self.keep not in ("all", "training"):
            raise InputError(f"{spell('keep')} {self.keep!r}: choose all or training")

    # -- the sample's sizes, and the source kind ------------------------------------------------
    @property
    def is_sample(self) -> bool:
        return self.text_dir is None and self.source == SAMPLE

    @property
    def source_kind(self) -> str:
        """'text' (text_dir), 'mlcommons' (MLCommons' published text) or 'dump' (the sample, a path, URL, preset)."""
        if self.text_dir:
            return "text"
        return MLCOMMONS if self.source == MLCOMMONS else "dump"

    def resolved_test_articles(self) -> int | None:
        """None: the text stage sizes the eval split from the articles it finds (10%, at most 10000)."""
        return self.num_test_articles or (SAMPLE_TEST_ARTICLES if self.is_sample else None)

    def resolved_shards(self) -> int:
        return self.n_output_shards or (SAMPLE_SHARDS if self.is_sample else MLPERF_SHARDS)

    def resolved_vocab_size(self) -> int:
        return self.vocab_size or (SAMPLE_VOCAB_SIZE if self.is_sample else MLPERF_VOCAB_SIZE)

    def resolved_current_time(self) -> str | None:
        return self.current_time or (SAMPLE_TIME if self.is_sample else None)

    def resolved_extractor(self) -> str:
        from preprocessing.text.extract import default_extractor

        return self.extractor or default_extractor(self.source)

    def resolved_nvidia_shards(self, n: int = NVIDIA_SHARDS) -> int:
        """Shards of an NVIDIA set of ``n`` shards: ``--nvidia-shards`` if given, else ``n``, or on the built-in
        sample its shards per bin (NVIDIA's 4,320 shards of a few thousand rows would be nearly all empty, and
        chop_hdf5_files.py refuses that)."""
        if self.nvidia_shards:
            return self.nvidia_shards
        return self.resolved_shards() if self.is_sample else n

    def resolved_nvidia_packed_shards(self) -> int:
        return self.nvidia_packed_shards or self.resolved_nvidia_shards()

    def resolved_runner(self) -> str:
        return "dask" if self.dask_address else self.runner

    def preflight(self) -> None:
        """Check every input outside the work dir, and the work dir itself, before anything starts."""
        from pathlib import Path

        from preprocessing.registry import active

        work = Path(self.work_dir)
        if work.exists() and not work.is_dir():
            raise InputError(f"{spell('work_dir')} {self.work_dir} is a file; give a folder (it is created if missing)")
        from core.paths import PathCheck

        PathCheck().output_dir(spell("work_dir"), self.work_dir)  # a path under a file, a read-only folder
        for s in active(self):
            if s.check is not None:
                s.check(self)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# -- how a parameter is spelled where the user gave it ----------------------------------------------
_SURFACE: contextvars.ContextVar[str] = contextvars.ContextVar("bertpipe_surface", default="flow")


@contextmanager
def surface(name: str) -> Iterator[None]:
    """Within this block, errors spell parameters for ``name``: "cli", "flow" or a prefix such as "data."."""
    token = _SURFACE.set(name)
    try:
        yield
    finally:
        _SURFACE.reset(token)


def current_surface() -> str:
    return _SURFACE.get()


def spell(name: str) -> str:
    """``num_test_articles`` as the user gives it here: a CLI flag, a flow parameter, or ``data.<name>``."""
    where = _SURFACE.get()
    if where == "cli":
        meta = PARAM_FIELDS[name].metadata if name in PARAM_FIELDS else {}
        return cli_flags(name, meta)[0]
    if where == "flow":
        return name
    return where + name


def cli_flags(name: str, meta: Any) -> list[str]:
    """The flags of a field: its declared ones, else ``--dashed-name`` and the reference's ``--under_name``."""
    if meta.get("flags"):
        return list(meta["flags"])
    dashed, under = "--" + name.replace("_", "-"), "--" + name
    return [dashed] if dashed == under else [dashed, under]


def check_bounds(name: str, value: Any, meta: Any) -> None:
    if value is None or isinstance(value, (bool, str, list)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{spell(name)} must be a finite number, got {value}")
    for bound, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                            ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        b = meta.get(bound)
        if b is not None and not ok(value, b):
            raise InputError(f"{spell(name)} must be {word} {b:g}, got {value}")


def base_type(annotation: Any) -> tuple[type, bool]:
    """(the value type, whether None is allowed) of a field annotation: ``int | None`` -> (int, True)."""
    hint = typing.get_type_hints(DataParams)[annotation] if isinstance(annotation, str) else annotation
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return non_none[0], len(non_none) < len(args)
    return hint, False


PARAM_FIELDS = {f.name: f for f in fields(DataParams)}
