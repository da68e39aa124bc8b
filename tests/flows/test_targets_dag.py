"""Every target of `bertpipe run --target`, built by the real data DAG on the built-in sample, handed over with
`bertpipe export-dataset` and read with each trainer's own file discovery and ``Dataset`` rules
(tests/loader_rules.py): Samsung's bins, NVIDIA DeepLearningExamples' and Habana's unpacked readers, NVIDIA's
MLPerf trainer on variable-length rows (v1.1 and later: 0 rows with a wrong attention mask) and on packs (v3.1
--packed_samples), Habana's packed mode (and its metadata). Each set holds the padded parts' sequences, each once
(the unshuffled NVIDIA set in order).

Two runs in the default suite: MLPerf's 512/76 with the 4-bin and NVIDIA's variable-length targets, and 128/20 with
every target but the bins (Samsung's splitter is for 512; SciPy's NNLS of the packing recipe takes ~25 CPU-s a round
at 512 and well under a second at 128). Slow: every target in one run at 512, and the 128 run again on a local
Dask cluster (the same bytes as the local pool).

Cached stays cached (issue 28.4): a second run of each of those runs, with all its targets at once, and a run of each
target alone on a copy of the work dir that built it, run nothing: every stage of the summary is cached, every Prefect
task run of the flow run is Cached (a stage written as pieces and found done has no task run at all), no manifest is
rewritten. The slow run checks every target at once the same way.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from flowhelpers import last_flow_run_task_states, last_run, manifest_mtimes, output_md5s, run_cli

from bertpipe.cli import main
from preprocessing import targets as target_list
from tests.loader_rules import (
    HabanaPackedDataset,
    NvidiaPackedDataset,
    NvidiaVarlenDataset,
    flat_training_files,
    habana_avg_seq_per_sample,
    habana_packed_files,
    mlperf_eval_files,
    nvidia_mlperf_training_files,
    nvidia_packed_batch,
    nvidia_v11_training_files,
    rows_of,
    samsung_bins,
    wrong_masks,
)

ALL = tuple(target_list.names())  # every target of `bertpipe run --target`
AT_512 = ("samsung-4bins", "nvidia-4320", "nvidia-varlength")
AT_128 = tuple(t for t in ALL if t != "samsung-4bins")
SHORT = ("--max-seq-length", "128", "--max-predictions-per-seq", "20")


def _run(work: Path, targets: tuple[str, ...], *extra: str) -> Path:
    args = [a for t in targets for a in ("--target", t)]
    assert run_cli("--work-dir", work, "--workers", "2", *args, *extra) == 0
    return work


@pytest.fixture(scope="session")
def dag_512(prefect_harness, tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("targets512") / "w", AT_512)


@pytest.fixture(scope="session")
def dag_128(prefect_harness, tmp_path_factory) -> Path:
    return _run(tmp_path_factory.mktemp("targets128") / "w", AT_128, *SHORT)


# -- what the sets must hold: the padded parts' sequences ------------------------------------------------------------
Seq = tuple  # (ids, segment ids, masked positions, masked ids, NSP label) of one sequence, as bytes


def _seq(ids, seg, pos, lm, nsp) -> Seq:
    def cast(a) -> bytes:
        return np.asarray(a, np.int64).tobytes()
    return cast(ids), cast(seg), cast(pos), cast(lm), int(nsp)


def padded_sequences(work: Path) -> list[Seq]:
    """Every row of the hdf5 stage's padded parts, in part and row order, cut to its length."""
    import h5py

    st = last_run(work)["stages"]["hdf5"]
    out = []
    for shard in st["shards"]:
        with h5py.File(Path(st["dir"]) / shard / f"{shard}.hdf5", "r") as f:
            rows = [f[k][()] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                                       "masked_lm_ids", "next_sentence_labels")]
        for ids, mask, seg, pos, lm, nsp in zip(*rows, strict=True):
            n, k = int(mask.sum()), int(np.count_nonzero(pos))
            out.append(_seq(ids[:n], seg[:n], pos[:k], lm[:k], nsp))
    return out


def export(work: Path, layout: str, out: Path, *extra: str) -> Path:
    assert main(["export-dataset", "--layout", layout, "--work-dir", str(work), str(out), *extra, "-q"]) == 0
    return out


def varlen_sequences(files: list[str], max_seq_length: int) -> list[Seq]:
    """Every row of NVIDIA's variable-length shards through its MLPerf reader: masks right, the rows as read."""
    out = []
    for f in files:
        ds = NvidiaVarlenDataset(f, max_seq_length)
        assert len(ds) > 0 and wrong_masks(ds) == 0, f  # the attention mask is the row's tokens, on every row
        for i in range(len(ds)):
            ids, seg, mask, labels, nsp = ds[i]
            n = int(mask.sum())
            pos = np.flatnonzero(labels)  # masked ids are never 0 ([PAD])
            out.append(_seq(ids[:n], seg[:n], pos, labels[pos], nsp))
    return out


def check_nvidia_layout(work: Path, out: Path, target: str, max_seq_length: int) -> None:
    """NVIDIA's MLPerf trainer on `export-dataset --layout nvidia --target T`: both file rules find every shard, every
    row reads with the right mask, the rows are the padded parts' (in order, unshuffled; the same multiset shuffled;
    chop_hdf5_files.py's dropped rows left out), and the eval file reads the same way."""
    export(work, "nvidia", out, "--target", target)
    files = nvidia_v11_training_files(out / "train")
    assert files == nvidia_mlperf_training_files(out / "train") and sorted(os.listdir(out / "train")) == \
        [Path(f).name for f in files]
    got = varlen_sequences(files, max_seq_length)
    want = padded_sequences(work)
    stage = {"nvidia-4320": "nvidia_4320_shuffled", "nvidia-2048": "nvidia_2048_shuffled",
             "nvidia-varlength": "nvidia_4320", "nvidia-2048-varlength": "nvidia_2048"}[target]
    m = json.loads((Path(last_run(work)["stages"][stage]["dir"]) / "_manifest.json").read_text())
    assert len(files) == m["counters"]["files"] and len(got) == m["counters"]["rows"]
    kept = want[:len(got)]  # chop keeps the first rows, in order (shuffled: the same rows)
    assert got == kept if target.endswith("-varlength") else Counter(got) == Counter(kept)
    evals = mlperf_eval_files(out / "eval")
    assert [Path(f).name for f in evals] == ["part_eval_10k.hdf5"]
    ev = NvidiaVarlenDataset(evals[0], max_seq_length)
    assert len(ev) == rows_of(last_run(work)["outputs"]["eval_hdf5"]) and wrong_masks(ev) == 0


def check_samsung_and_flat(work: Path, tmp: Path) -> int:
    """Samsung's bins, and the flat padded layouts of DeepLearningExamples and Habana (unpacked): every shard read."""
    want = len(padded_sequences(work))
    bins = samsung_bins(export(work, "samsung", tmp / "samsung") / "train")
    assert [b for b, _ in bins] == [128, 256, 384, 512]
    assert sum(rows_of(f) for _, fs in bins for f in fs) == want
    for layout in ("nvidia-dle", "habana"):
        files = flat_training_files(export(work, layout, tmp / layout) / "train")
        assert sorted(os.listdir(tmp / layout / "train")) == [Path(f).name for f in files]
        assert sum(rows_of(f) for f in files) == want and all(rows_of(f) > 0 for f in files)
        assert rows_of(mlperf_eval_files(tmp / layout / "eval")[0]) > 0
    # the failure the nvidia layout avoids: padded rows through NVIDIA's variable-length reader
    shard = next(f for _, fs in bins for f in fs if rows_of(f))
    padded = NvidiaVarlenDataset(shard)
    assert wrong_masks(padded) == len(padded) > 0
    return want


def check_nvidia_packed(work: Path, out: Path, max_seq_length: int) -> None:
    """NVIDIA's trainer with --packed_samples on `--layout nvidia-packed`: every part_ file read, each pack's sequences
    are padded-part sequences, each sequence exactly once; a batch gets restarting positions and per-sequence NSP."""
    export(work, "nvidia-packed", out)
    files = nvidia_mlperf_training_files(out / "train")
    assert sorted(os.listdir(out / "train")) == [Path(f).name for f in files] and files
    got, n_packs = [], 0
    for f in files:
        ds = NvidiaPackedDataset(f, max_seq_length)
        assert len(ds) > 0, f
        n_packs += len(ds)
        ids_v, seg_v, pos_v, lm_v, plen_v, plm_v, nsp_v = ds.inputs
        for i in range(len(ds)):
            starts = np.concatenate([[0], np.cumsum(plen_v[i])])
            mstarts = np.concatenate([[0], np.cumsum(plm_v[i])])
            assert starts[-1] == len(ids_v[i]) <= max_seq_length and len(plen_v[i]) <= 3
            for j in range(len(plen_v[i])):
                a, b = starts[j], starts[j + 1]
                p = pos_v[i][mstarts[j]:mstarts[j + 1]].astype(np.int64)
                assert ((p >= a) & (p < b)).all()  # a sequence's masked positions lie in it
                got.append(_seq(ids_v[i][a:b], seg_v[i][a:b], p - a, lm_v[i][mstarts[j]:mstarts[j + 1]], nsp_v[i][j]))
        batch = nvidia_packed_batch([ds[i] for i in range(min(4, len(ds)))])
        assert (batch["position_ids"][0][:int(ds.inputs[4][0][0])] == np.arange(int(ds.inputs[4][0][0]))).all()
        assert len(batch["labels_nsp"]) == len(batch["cu_seqlens"]) - 1
    assert Counter(got) == Counter(padded_sequences(work))  # every sequence once
    m = json.loads((Path(last_run(work)["outputs"]["nvidia_packed_dir"]) / "_manifest.json").read_text())
    assert n_packs == m["counters"]["packs"] - m["counters"]["empty_packs"]
    ev = NvidiaVarlenDataset(mlperf_eval_files(out / "eval")[0], max_seq_length)
    assert len(ev) > 0 and wrong_masks(ev) == 0


def check_habana_packed(work: Path, out: Path, max_seq_length: int, max_pred: int) -> None:
    """Habana's trainer in packed mode on `--layout habana-packed`: every file of the input dir read with the nine
    datasets, its metadata beside the folder, sequences marked 1, 2, 3 in input_mask with positions restarting; every
    padded-part sequence exactly once."""
    export(work, "habana-packed", out)
    files = habana_packed_files(out / "train")
    assert files and all(Path(f).name.startswith("mixed_strategies_part_") for f in files)
    meta = json.loads((Path(last_run(work)["outputs"]["habana_packed_dir"]).parent / "packed_metadata.json")
                      .read_text())
    assert habana_avg_seq_per_sample(out / "train", max_seq_length) == meta["avg_seq_per_sample"] > 1
    got = []
    for f in files:
        ds = HabanaPackedDataset(f, max_pred + 3)
        assert len(ds) > 0
        for i in range(len(ds)):
            ids, seg, mask, pos, labels, nsp_pos, nsp = ds[i]
            k = int(mask.max())
            assert k <= 3 and (nsp >= 0).sum() == k
            for s in range(1, k + 1):
                where = np.flatnonzero(mask == s)
                a, b = int(where[0]), int(where[-1]) + 1
                assert len(where) == b - a and nsp_pos[s - 1] == a and (pos[a:b] == np.arange(b - a)).all()
                mp = np.flatnonzero(labels[a:b] >= 0)
                got.append(_seq(ids[a:b], seg[a:b], mp, labels[a:b][mp], nsp[s - 1]))
            assert (mask[int(np.flatnonzero(mask)[-1]) + 1:] == 0).all()
    assert Counter(got) == Counter(padded_sequences(work))
    assert rows_of(mlperf_eval_files(out / "eval")[0]) > 0  # Habana's MLPerf eval: the padded file


# -- the default suite ----------------------------------------------------------------------------------------------
def test_mlperf_shape_bins_and_nvidia_varlength(dag_512: Path, tmp_path: Path) -> None:
    s = last_run(dag_512)
    assert set(s["targets"]) == set(AT_512) and s["targets"]["samsung-4bins"]["train"] == s["outputs"]["train_dir"]
    assert s["targets"]["nvidia-4320"]["eval"] == s["outputs"]["nvidia_eval_varlength"]
    assert "nvidia_packed" not in s["stages"] and "nvidia_2048" not in s["stages"]  # only what the targets need
    check_samsung_and_flat(dag_512, tmp_path)
    check_nvidia_layout(dag_512, tmp_path / "nv4320", "nvidia-4320", 512)
    check_nvidia_layout(dag_512, tmp_path / "nvvar", "nvidia-varlength", 512)
    assert main(["status", "--work-dir", str(dag_512)]) == 0 and main(["verify", "--work-dir", str(dag_512)]) == 0


def test_packed_and_every_nvidia_set(dag_128: Path, tmp_path: Path) -> None:
    s = last_run(dag_128)
    assert set(s["targets"]) == set(AT_128) and "bins" not in s["stages"] and "train_dir" not in s["outputs"]
    assert {"nvidia_4320", "nvidia_4320_shuffled", "nvidia_2048", "nvidia_2048_shuffled", "nvidia_packed",
            "habana_packed", "nvidia_eval", "eval_hdf5"} <= set(s["stages"])
    for target in ("nvidia-4320", "nvidia-2048", "nvidia-varlength", "nvidia-2048-varlength"):
        check_nvidia_layout(dag_128, tmp_path / target, target, 128)
    check_nvidia_packed(dag_128, tmp_path / "nvp", 128)
    check_habana_packed(dag_128, tmp_path / "hbp", 128, 20)
    assert main(["export-dataset", "--layout", "samsung", "--work-dir", str(dag_128), str(tmp_path / "no"), "-q"]) == 2
    assert not (tmp_path / "no").exists()  # no 4-bin set was built: refused, nothing made


# -- cached stays cached (issue 28.4) -----------------------------------------------------------------------------------
def assert_runs_nothing(work: Path, targets: tuple[str, ...], *extra: str) -> dict:
    """`bertpipe run` of ``targets`` again on ``work``: every stage cached in the summary (none redone), every task
    run of the flow run Cached in Prefect, no manifest rewritten. The run's summary."""
    before = manifest_mtimes(work)
    _run(work, targets, *extra)
    s = last_run(work)
    assert set(s["targets"]) == set(targets)
    ran = {n: (st["calls"], st["cached"], st.get("redone")) for n, st in s["stages"].items()
           if st["cached"] != st["calls"] or st.get("redone")}
    assert s["stages"] and not ran, ran
    states = last_flow_run_task_states()
    assert all(v == "Cached" for v in states.values()), {k: v for k, v in states.items() if v != "Cached"}
    assert manifest_mtimes(work) == before
    return s


def _built(target: str) -> str:
    return "dag_512" if target not in AT_128 else "dag_128"


@pytest.fixture
def copy_of(request, tmp_path: Path):
    """A copy of a module run's work dir (mtimes kept: the manifests' size/mtime checks hold), so re-running it with
    other targets leaves that run's last_run.json alone."""
    import shutil

    def make(fixture: str) -> Path:
        return Path(shutil.copytree(request.getfixturevalue(fixture), tmp_path / "w", symlinks=True))
    return make


@pytest.mark.parametrize("built", ["dag_512", "dag_128"])
def test_a_second_run_of_every_target_at_once_runs_nothing(built: str, copy_of) -> None:
    work = copy_of(built)
    first = {n: st["key"] for n, st in last_run(work)["stages"].items()}
    targets, extra = (AT_512, ()) if built == "dag_512" else (AT_128, SHORT)
    s = assert_runs_nothing(work, targets, *extra)
    assert {n: st["key"] for n, st in s["stages"].items()} == first  # the same stages, found by the same keys


@pytest.mark.parametrize("target", ALL)
def test_each_target_alone_runs_nothing_on_a_built_work_dir(target: str, copy_of) -> None:
    """Every target of --target, run alone on the work dir that built it (with others): all its stages cached."""
    built = _built(target)
    work = copy_of(built)
    s = assert_runs_nothing(work, (target,), *(SHORT if built == "dag_128" else ()))
    assert s["targets"][target]["train"]  # its trainer's folder, found done


def test_nvidia_shards_recuts_the_nvidia_sets_and_their_trainer_reads_the_same_rows(copy_of, tmp_path: Path) -> None:
    """--nvidia-shards 3 on a built work dir: only the NVIDIA sets' stages run again (their key names the count; the
    padded parts and the eval are taken as they are), each set in 3 shards, and NVIDIA's MLPerf trainer reads the
    padded parts' rows from them as from the 8-shard sets (in order unshuffled, the same rows shuffled, each
    sequence once packed)."""
    work = copy_of("dag_128")
    before = {n: st["key"] for n, st in last_run(work)["stages"].items()}
    nv = ("nvidia-4320", "nvidia-varlength", "nvidia-packed")
    _run(work, nv, *SHORT, "--nvidia-shards", "3")
    s = last_run(work)
    ran = {n for n, st in s["stages"].items() if st["cached"] != st["calls"]}
    assert ran == {"nvidia_4320", "nvidia_4320_shuffled", "nvidia_packed"}, ran
    assert all(s["stages"][n]["key"] != before[n] for n in ran)
    assert s["stages"]["hdf5"]["key"] == before["hdf5"] and s["stages"]["nvidia_eval"]["key"] == before["nvidia_eval"]
    for target in ("nvidia-4320", "nvidia-varlength"):
        check_nvidia_layout(work, tmp_path / target, target, 128)
        assert len(os.listdir(tmp_path / target / "train")) == 3
    check_nvidia_packed(work, tmp_path / "nvp", 128)
    assert len(nvidia_mlperf_training_files(tmp_path / "nvp" / "train")) == 3


# -- slow ---------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_every_target_in_one_run_at_mlperf_shape(prefect_harness, tmp_path: Path) -> None:
    work = _run(tmp_path / "w", ALL)
    assert set(last_run(work)["targets"]) == set(ALL)
    stages = set(last_run(work)["stages"])
    assert set(assert_runs_nothing(work, ALL)["stages"]) == stages  # every target at once, again: nothing runs
    check_samsung_and_flat(work, tmp_path)
    for target in ("nvidia-4320", "nvidia-2048", "nvidia-varlength", "nvidia-2048-varlength"):
        check_nvidia_layout(work, tmp_path / target, target, 512)
    check_nvidia_packed(work, tmp_path / "nvp", 512)
    check_habana_packed(work, tmp_path / "hbp", 512, 76)


@pytest.mark.slow
def test_new_targets_on_a_dask_cluster_give_the_local_bytes(dag_128: Path, tmp_path: Path) -> None:
    """The NVIDIA and Habana stages (counted, planned and written as pieces) on a local Dask cluster of two worker
    processes: the same keys and bytes as the local pool's run."""
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("prefect_dask")
    work = tmp_path / "w"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
        args = [a for t in AT_128 for a in ("--target", t)]
        assert run_cli("--work-dir", work, "--workers", "2", *args, *SHORT, "--dask-address",
                       cl.scheduler_address) == 0
    assert {k: v["key"] for k, v in last_run(work)["stages"].items()} == \
        {k: v["key"] for k, v in last_run(dag_128)["stages"].items()}
    assert output_md5s(work) == output_md5s(dag_128)
