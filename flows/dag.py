"""Wiring of the data DAG: stage calls, their keys and directories, waves of parallel shard tasks.

No algorithm lives here: each call names a library stage function (preprocessing/), its inputs (paths
from upstream manifests) and its config; the tasks (tasks/stages.py) run them.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from flows.params import DataParams
from preprocessing.errors import InputError, ManifestError
from preprocessing.hdf5_io import stage_params
from preprocessing.manifest import Manifest, load_manifest, md5_file, stage_key
from tasks.artifacts import ShardProgress, dataset_summary, stage_table, summarize
from tasks.calls import StageCall, check_done, manifest_of, result_dict, shutdown_pool

PART = re.compile(r"^part-\d{5}-of-\d{5}$")
_LIB = "preprocessing"
#: stage -> the stages whose outputs it reads.
INPUTS = {"extract": {"download"}, "text": {"extract"}, "vocab": {"text"}, "tfrecord": {"text", "vocab"},
          "eval_tfrecord": {"text", "vocab"}, "hdf5": {"tfrecord"}, "eval_10k": {"eval_tfrecord"},
          "bins": {"hdf5"}, "eval_hdf5": {"eval_10k"}}


def _with_ancestors(stages: set[str]) -> set[str]:
    """``stages`` and every stage they (transitively) read from."""
    out, todo = set(), list(stages)
    while todo:
        s = todo.pop()
        if s not in out:
            out.add(s)
            todo.extend(INPUTS.get(s, ()))
    return out


class DataDag:
    """One run of the data DAG for :class:`DataParams` (used inside a flow run)."""

    def __init__(self, p: DataParams, logger: logging.Logger | logging.LoggerAdapter) -> None:
        self.p, self.log = p, logger
        self.work = Path(p.work_dir).resolve()
        self.workers = p.workers or os.cpu_count() or 1
        self.kind = p.resolved_runner()
        self.inline = self.kind != "local" or self.workers == 1  # shard calls: here, or in the local pool
        self.only = set(p.stages) if p.stages else None
        self.needed = _with_ancestors(self.only) if self.only else None
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.summary: dict[str, dict[str, Any]] = {}
        self.runner: Any = None

    # -- plumbing ----------------------------------------------------------------------------------
    def _make_runner(self) -> Any:
        if self.kind == "dask":
            if not self.p.dask_address:
                raise InputError("runner 'dask' needs a scheduler address: pass --dask-address tcp://HOST:8786")
            from prefect_dask import DaskTaskRunner

            return DaskTaskRunner(address=self.p.dask_address)
        if self.kind == "prefect-process":
            from prefect.task_runners import ProcessPoolTaskRunner

            return ProcessPoolTaskRunner(max_workers=self.workers)
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=self.workers)

    def _task(self, stage: str) -> Any:
        from tasks.stages import TASKS

        return TASKS[stage]

    def selected(self, stage: str) -> bool:
        return self.only is None or stage in self.only

    def call(self, stage: str, key: str, func: str, *args: Any, shard: str = "", upstream: tuple[str, ...] = (),
             inline: bool = True, **kwargs: Any) -> StageCall:
        out = self.work / stage / key / shard if shard else self.work / stage / key
        return StageCall(stage=stage, key=key, out_dir=str(out), func=f"{_LIB}.{func}", args=args, kwargs=kwargs,
                         shard=shard, upstream_dirs=upstream, force=stage in self.p.force, inline=inline,
                         check_md5=self.p.verify_md5, root=str(self.work))

    def _existing(self, stage: str, calls: list[StageCall]) -> list[dict[str, Any]]:
        """A stage left out by --only: its outputs must be done (sizes checked; its consumer checks md5s)."""
        out = []
        for c in calls:
            m = check_done(replace(c, check_md5=False))
            if m is None:
                raise InputError(
                    f"stage '{stage}' is not done in {self.work} ({c.out_dir} has no complete output), but "
                    f"{', '.join(sorted(self.only or ()))} needs it; run it first (--only {stage}) or run without "
                    "--only")
            out.append(result_dict(c, m, cached=True, seconds=0.0))
        return out

    def wave(self, calls_by_stage: dict[str, list[StageCall]]) -> dict[str, list[dict[str, Any]]]:
        """Run the calls of one or more stages in parallel; a stage not selected must already be done."""
        from prefect.futures import as_completed

        from preprocessing.progress import progress

        results: dict[str, list[dict[str, Any]]] = {}
        todo = {}
        calls_by_stage = {s: c for s, c in calls_by_stage.items() if self.needed is None or s in self.needed}
        for stage, calls in calls_by_stage.items():
            if self.selected(stage):
                todo.update({self.runner.submit(self._task(stage), {"call": c, "workers": self.workers}): (stage, c)
                             for c in calls})
            else:
                results[stage] = self._existing(stage, calls)
        if not todo:
            self._record(results)
            return results
        names = " + ".join(s for s in calls_by_stage if self.selected(s))
        bar, prog, failed = progress(total=len(todo), desc=names, unit="call"), ShardProgress(names, len(todo)), []
        for fut in as_completed(list(todo)):
            stage, c = todo[fut]
            try:
                r = fut.result()
                if fut.state.name == "Cached":  # Prefect's record (its manifest verified): nothing ran
                    r = self._cached_result(c)
                results.setdefault(stage, []).append(r)
            except Exception as exc:  # noqa: BLE001 - let the other shards finish, then re-raise
                self.log.error("%s failed: %s", c.label, exc)
                failed.append(exc)
            bar.update(1)
            prog.step()
        bar.close()
        if failed:
            raise failed[0]
        self._record(results)
        return results

    @staticmethod
    def _cached_result(c: StageCall) -> dict[str, Any]:
        """The result of a call Prefect found cached, describing *this* call's directory.

        Prefect's record is keyed by content, so it may come from another work dir (same PREFECT_HOME,
        same inputs) and name that dir: downstream stages would then read, and depend on, files outside
        this work dir. The cache policy only hit because this call's own manifest verified: use it.
        """
        m = load_manifest(c.out_dir)
        if m is None:
            raise ManifestError(f"{c.out_dir}/_manifest.json disappeared during the run; run again to redo {c.label}")
        return result_dict(c, m, cached=True, seconds=0.0)

    def _record(self, results: dict[str, list[dict[str, Any]]]) -> None:
        for stage, rs in results.items():
            rs.sort(key=lambda r: r["shard"])
            self.results[stage] = rs
            self.summary[stage] = summarize(rs)
            stage_table(stage, rs)

    def one(self, stage: str, call: StageCall) -> Manifest | None:
        """Run (or find) a whole-stage call; None when --only leaves the stage out of this run."""
        rs = self.wave({stage: [call]}).get(stage)
        return manifest_of(rs[0]) if rs else None

    # -- the DAG -------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        self._check_selection()
        with self._make_runner() as runner:
            self.runner = runner
            try:
                text_dir, text_m = self._text()
                if text_m is None:  # --only download / extract
                    return self._finish({})
                parts = sorted(f.name for f in text_m.files if PART.match(f.name))
                if not parts or "eval.txt" not in {f.name for f in text_m.files}:
                    raise InputError(f"the text stage in {text_dir} produced no part files or no eval.txt")
                vocab_file = self._vocab(text_dir, text_m, parts)
                outputs = {"text_dir": str(text_dir)}
                if vocab_file is not None:
                    outputs = self._data(text_dir, text_m, parts, vocab_file)
            finally:
                shutdown_pool()
        return self._finish(outputs)

    def _finish(self, outputs: dict[str, str]) -> dict[str, Any]:
        source = self.p.text_dir or self.p.source
        dataset_summary(source, self.summary, self.results)
        return {"work_dir": str(self.work), "source": source, "stages": self.summary, "outputs": outputs}

    def _check_selection(self) -> None:
        absent = {"download", "extract"} if self.p.text_dir else set()
        if self.p.vocab:
            absent.add("vocab")
        for s in sorted((self.only or set()) | set(self.p.force)):
            if s in absent:
                why = "--text-dir was given" if s != "vocab" else "--vocab was given"
                raise InputError(f"stage '{s}' is not part of this run ({why})")

    def _text(self) -> tuple[Path, Manifest | None]:
        p = self.p
        if p.text_dir:
            from preprocessing.text_import import (
                STAGE_VERSION,
                TextImportConfig,
                list_text_files,
                source_stats,
            )

            src = Path(p.text_dir).resolve()
            files = list_text_files(src)
            key = stage_key("text", STAGE_VERSION, {"text_dir": str(src), "names": [f.name for f in files]})
            cfg = TextImportConfig(link=p.link_text)
            c = replace(self.call("text", key, "text_import:run_import_text", str(src), cfg=cfg), pass_upstream=False,
                        source_stats=source_stats(files))
            return Path(c.out_dir), self.one("text", c)
        from preprocessing import download, extract, text_pipeline

        src, md5 = p.source, p.source_md5
        if p.is_sample:
            from preprocessing.sample import SAMPLE_MD5, sample_dump_path

            src, md5 = str(sample_dump_path()), SAMPLE_MD5
        key = stage_key("download", download.STAGE_VERSION, {"source": src, "md5": md5})
        c = replace(self.call("download", key, "download:run_download", src, md5=md5), pass_upstream=False)
        dl = self.one("download", c)
        if dl is None:
            return Path(c.out_dir), None
        dump = Path(c.out_dir) / dl.files[0].name
        xcfg = extract.ExtractConfig(current_time=p.resolved_current_time(), processes=self.workers)
        key = stage_key("extract", extract.STAGE_VERSION, xcfg.params(), [dl.digest])
        c = self.call("extract", key, "extract:run_extract", str(dump), cfg=xcfg, upstream=(c.out_dir,))
        ex = self.one("extract", c)
        if ex is None:
            return Path(c.out_dir), None
        tcfg = text_pipeline.TextConfig(num_test_articles=p.resolved_test_articles(), workers=self.workers)
        key = stage_key("text", text_pipeline.STAGE_VERSION, tcfg.params(), [ex.digest])
        c = self.call("text", key, "text_pipeline:run_text_stages", c.out_dir, cfg=tcfg, upstream=(c.out_dir,))
        return Path(c.out_dir), self.one("text", c)

    def _vocab(self, text_dir: Path, text_m: Manifest, parts: list[str]) -> Path | None:
        if self.p.vocab:
            path = Path(self.p.vocab).resolve()
            if not path.is_file():
                raise InputError(f"--vocab {self.p.vocab} does not exist; pass a BERT vocab.txt or leave it out "
                                 "to learn one (vocab stage)")
            return path
        from preprocessing import vocab

        cfg = vocab.VocabConfig(vocab_size=self.p.resolved_vocab_size(), lowercase=self.p.do_lower_case)
        key = stage_key("vocab", vocab.STAGE_VERSION, stage_params(cfg), [text_m.digest])
        c = self.call("vocab", key, "vocab:run_vocab", [str(text_dir / n) for n in parts], cfg=cfg,
                      upstream=(str(text_dir),))
        if self.one("vocab", c) is None:
            return None
        return Path(c.out_dir) / vocab.VOCAB_NAME

    def _data(self, text_dir: Path, text_m: Manifest, parts: list[str], vocab_file: Path) -> dict[str, str]:
        from preprocessing import create_pretraining_data as cpd
        from preprocessing import pick_eval_samples as pick
        from preprocessing import split_4bins as bins
        from preprocessing import tfrecord_to_hdf5 as h5

        p, up = self.p, (str(text_dir),)
        ccfg = cpd.CreatePretrainingDataConfig(
            vocab_file=str(vocab_file), do_lower_case=p.do_lower_case, max_seq_length=p.max_seq_length,
            max_predictions_per_seq=p.max_predictions_per_seq, random_seed=p.random_seed, dupe_factor=p.dupe_factor,
            masked_lm_prob=p.masked_lm_prob, short_seq_prob=p.short_seq_prob)
        params = {**ccfg.output_params(), "vocab_file": md5_file(vocab_file)}  # the vocab's bytes, not its path
        tkey = stage_key("tfrecord", cpd.STAGE_VERSION, params, [text_m.digest])
        ekey = stage_key("eval_tfrecord", cpd.STAGE_VERSION, params, [text_m.digest])
        run_cpd = "create_pretraining_data:run_create_pretraining_data"
        self.wave({
            "tfrecord": [self.call("tfrecord", tkey, run_cpd, [str(text_dir / n)], cfg=ccfg, output_name=n, shard=n,
                                   upstream=up, inline=self.inline) for n in parts],
            "eval_tfrecord": [self.call("eval_tfrecord", ekey, run_cpd, [str(text_dir / "eval.txt")], cfg=ccfg,
                                        output_name="eval_intermediate", upstream=up, inline=self.inline)]})
        hcfg = h5.HDF5Config(max_seq_length=p.max_seq_length, max_predictions_per_seq=p.max_predictions_per_seq)
        pcfg = pick.PickEvalConfig(num_examples_to_pick=p.num_eval_examples, allow_fewer=True,
                                   max_seq_length=p.max_seq_length, max_predictions_per_seq=p.max_predictions_per_seq)
        wave: dict[str, list[StageCall]] = {}
        if tf_rs := self.results.get("tfrecord"):
            hkey = stage_key("hdf5", h5.STAGE_VERSION, stage_params(hcfg), [r["manifest"]["digest"] for r in tf_rs])
            wave["hdf5"] = [self.call("hdf5", hkey, "tfrecord_to_hdf5:run_tfrecord_to_hdf5",
                                      str(Path(r["dir"]) / r["shard"]), cfg=hcfg, output_name=r["shard"] + ".hdf5",
                                      shard=r["shard"], upstream=(r["dir"],), inline=self.inline) for r in tf_rs]
        if ev := self.results.get("eval_tfrecord"):
            pkey = stage_key("eval_10k", pick.STAGE_VERSION, stage_params(pcfg), [ev[0]["manifest"]["digest"]])
            wave["eval_10k"] = [self.call("eval_10k", pkey, "pick_eval_samples:run_pick_eval_samples",
                                          str(Path(ev[0]["dir"]) / "eval_intermediate"), cfg=pcfg,
                                          output_name="eval_10k", upstream=(ev[0]["dir"],), inline=self.inline)]
        self.wave(wave)
        bcfg = bins.Split4BinsConfig(n_output_shards=p.resolved_shards(),
                                     max_predictions_per_seq=p.max_predictions_per_seq)
        wave = {}
        if h_rs := self.results.get("hdf5"):
            bkey = stage_key("bins", bins.STAGE_VERSION, stage_params(bcfg), [r["manifest"]["digest"] for r in h_rs])
            files = sorted((str(Path(r["dir"]) / (r["shard"] + ".hdf5")) for r in h_rs), key=lambda f: Path(f).name)
            wave["bins"] = [self.call("bins", bkey, "split_4bins:run_split_4bins", files, cfg=bcfg,
                                      upstream=tuple(r["dir"] for r in h_rs))]
        if e10 := self.results.get("eval_10k"):
            xkey = stage_key("eval_hdf5", h5.STAGE_VERSION, stage_params(hcfg), [e10[0]["manifest"]["digest"]])
            wave["eval_hdf5"] = [self.call("eval_hdf5", xkey, "tfrecord_to_hdf5:run_tfrecord_to_hdf5",
                                           str(Path(e10[0]["dir"]) / "eval_10k"), cfg=hcfg,
                                           output_name="eval_10k.hdf5", upstream=(e10[0]["dir"],),
                                           inline=self.inline)]
        self.wave(wave)
        outputs = {"text_dir": str(text_dir), "vocab": str(vocab_file)}
        if "bins" in self.results:
            outputs["train_dir"] = self.results["bins"][0]["dir"]
        if "eval_hdf5" in self.results:
            outputs["eval_hdf5"] = str(Path(self.results["eval_hdf5"][0]["dir"]) / "eval_10k.hdf5")
        return outputs
