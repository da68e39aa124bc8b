"""Typed parameters of the data flow (pydantic: validated for the CLI, the Prefect UI and deployments).

Defaults are the MLPerf reference's flags (create_pretraining_data: 512 / 76 / dupe 10 / 0.15 / seed
12345 / short_seq 0.1; pick_eval_samples: 10,000). The built-in sample gets sizes that fit it
(5 eval articles, 8 shards per bin, a learned vocab) unless they are given.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: Stages of the data DAG, in order. ``download``/``extract`` exist only for a dump source, ``vocab``
#: only without --vocab.
DATA_STAGES = ("download", "extract", "text", "vocab", "tfrecord", "hdf5", "bins",
               "eval_tfrecord", "eval_10k", "eval_hdf5")
#: Other spellings accepted for --only/--force/stages (the library's stage names).
ALIASES = {"create_pretraining_data": "tfrecord", "tfrecord_to_hdf5": "hdf5", "split_4bins": "bins",
           "4bins": "bins", "pick_eval_samples": "eval_10k", "pick_eval": "eval_10k", "text_stages": "text"}
SAMPLE = "sample"
SAMPLE_TEST_ARTICLES = 5  # eval articles withheld from the sample's ~50 (as `bertpipe demo`)
SAMPLE_SHARDS = 8  # shards per bin for the sample (the reference's 2048 would be 8,192 empty files)
SAMPLE_VOCAB_SIZE = 8000  # the sample supports a few thousand WordPiece tokens
SAMPLE_TIME = "2026-01-01T00:00:00"  # {{CURRENTYEAR}} & co. in the sample (as `bertpipe demo`): same bytes every run


def normalize_stage(name: str) -> str:
    """``--only create-pretraining-data`` -> ``tfrecord``; InputError naming the choices otherwise."""
    n = name.strip().lower().replace("-", "_")
    n = ALIASES.get(n, n)
    if n not in DATA_STAGES:
        from preprocessing.errors import InputError

        raise InputError(f"unknown stage {name!r}; the data stages are: {', '.join(DATA_STAGES)}")
    return n


class DataParams(BaseModel):
    """Everything the data flow needs; every field has a default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    work_dir: str = Field("work", description="work dir: <work>/<stage>/<key>/ per stage")
    source: str = Field(SAMPLE, description="'sample' (built-in dump), a dump path/URL, or a preset "
                        "(enwiki-latest, enwiki-20200101); ignored with text_dir")
    source_md5: str | None = Field(None, description="expected md5 of the dump (default: published one, if any)")
    text_dir: str | None = Field(None, description="MLCommons' text (part-*-of-00500 + eval.txt): skips "
                                 "download/extract/text stages")
    link_text: bool = Field(False, description="hard-link text_dir's files into the work dir instead of copying")
    vocab: str | None = Field(None, description="vocab.txt; without it the vocab stage learns one")
    vocab_size: int | None = Field(None, ge=105, description="size of a learned vocab (default 30522; sample 8000)")
    num_test_articles: int | None = Field(None, ge=1, description="eval articles withheld (10000; sample 5)")
    current_time: str | None = Field(None, description="ISO time for {{CURRENTYEAR}} & co. in extraction")
    max_seq_length: int = Field(512, ge=5)
    max_predictions_per_seq: int = Field(76, ge=1)
    dupe_factor: int = Field(10, ge=1)
    masked_lm_prob: float = Field(0.15, gt=0, lt=1)
    random_seed: int = 12345
    short_seq_prob: float = Field(0.1, ge=0, le=1)
    do_lower_case: bool = True
    num_eval_examples: int = Field(10000, ge=1, description="eval_10k size (fewer records: all kept)")
    n_output_shards: int | None = Field(None, ge=1, description="shards per length bin (2048; sample 8)")
    workers: int = Field(0, ge=0, description="parallel shard tasks (0: one per CPU; 1: serial, in-process)")
    runner: Literal["local", "prefect-process", "dask"] = Field(
        "local", description="local: threads + spawned worker processes; prefect-process: Prefect's "
        "ProcessPoolTaskRunner; dask: prefect-dask DaskTaskRunner (needs dask_address)")
    dask_address: str | None = Field(None, description="tcp://scheduler:8786 -> run shard tasks on that Dask cluster")
    stages: list[str] | None = Field(None, description="run only these stages (their inputs must be done)")
    force: list[str] = Field(default_factory=list, description="redo these stages even if their manifests verify")
    verify_md5: bool = Field(True, description="'done' re-hashes outputs (False: sizes only, fast)")
    wait_lock_s: float = Field(0.0, ge=0, description="wait this long for a busy work dir, else refuse")

    @field_validator("stages", "force")
    @classmethod
    def _known(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [normalize_stage(s) for s in v]

    @property
    def is_sample(self) -> bool:
        return self.text_dir is None and self.source == SAMPLE

    def resolved_test_articles(self) -> int:
        return self.num_test_articles or (SAMPLE_TEST_ARTICLES if self.is_sample else 10000)

    def resolved_shards(self) -> int:
        return self.n_output_shards or (SAMPLE_SHARDS if self.is_sample else 2048)

    def resolved_vocab_size(self) -> int:
        return self.vocab_size or (SAMPLE_VOCAB_SIZE if self.is_sample else 30522)

    def resolved_current_time(self) -> str | None:
        return self.current_time or (SAMPLE_TIME if self.is_sample else None)

    def resolved_runner(self) -> str:
        return "dask" if self.dask_address else self.runner
