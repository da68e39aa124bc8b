"""The fused tfrecord+hdf5 call (Stage.fused, preprocessing.mlperf.tfrecord_to_hdf5.run_fused).

One call writes part i's TFRecord and its padded HDF5 from the same instances. It must give the bytes and the
manifests of the two stages run one after the other (run_create_pretraining_data, then run_tfrecord_to_hdf5 on
the TFRecord it wrote), with the C engine and with the plain implementation alike.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import h5py
import numpy as np
import pytest

import preprocessing.mlperf.tfrecord_to_hdf5 as t2h
from core.manifest import Manifest, load_manifest, md5_file
from core.stage import Unit
from preprocessing.mlperf import cpd_fast
from preprocessing.mlperf.create_pretraining_data import (
    CreatePretrainingDataConfig,
    run_create_pretraining_data,
)
from preprocessing.mlperf.tfrecord_to_hdf5 import DAG_STAGES, HDF5Config, run_fused, run_tfrecord_to_hdf5

MLPERF = dict(max_seq_length=512, max_predictions_per_seq=76, dupe_factor=10)
SMALL = dict(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
needs_native = pytest.mark.skipif(not cpd_fast.available(), reason="the C extension cannot be built here")


def _units(text: Path, vocab: Path, root: Path, flags: dict, batch_size: int = 1024) -> tuple[Unit, Unit]:
    """The two units the DAG plans for one part (tfrecord, then its hdf5 reading the tfrecord's shard dir)."""
    name = text.name
    cfg = CreatePretrainingDataConfig(vocab_file=str(vocab), do_lower_case=True, **flags)
    tf_dir = root / "tfrecord" / name
    h5cfg = HDF5Config(max_seq_length=flags["max_seq_length"], max_predictions_per_seq=flags["max_predictions_per_seq"],
                       batch_size=batch_size)
    tf = Unit(stage="tfrecord", key="k", shard=name, out_dir=str(tf_dir), run=run_create_pretraining_data,
              args=([str(text)],), kwargs={"cfg": cfg, "output_name": name})
    h5 = Unit(stage="hdf5", key="k", shard=name, out_dir=str(root / "hdf5" / name), run=run_tfrecord_to_hdf5,
              args=(str(tf_dir / name),), kwargs={"cfg": h5cfg, "output_name": name + ".hdf5"},
              upstream_dirs=(str(tf_dir),))
    return tf, h5


def _separate(tf: Unit, h5: Unit) -> list[Manifest]:
    m1 = tf.run(*tf.args, Path(tf.out_dir), **tf.kwargs, upstream=[])
    m2 = run_tfrecord_to_hdf5(*h5.args, Path(h5.out_dir), **h5.kwargs, upstream=[load_manifest(tf.out_dir)])
    return [m1, m2]


def _same_manifest(a: Manifest, b: Manifest) -> None:
    da, db = json.loads(a.to_json()), json.loads(b.to_json())
    for d in (da, db):
        d.pop("seconds")
    assert da == db
    assert a.digest == b.digest


def _compare(fused_root: Path, sep_root: Path, fused: list[Manifest], separate: list[Manifest]) -> None:
    for m_f, m_s in zip(fused, separate, strict=True):
        _same_manifest(m_f, m_s)
    for stage, m in zip(("tfrecord", "hdf5"), separate, strict=True):
        shard = next(iter((sep_root / stage).iterdir())).name
        for f in m.files:
            assert md5_file(fused_root / stage / shard / f.name) == md5_file(sep_root / stage / shard / f.name) == f.md5
        # what is on disk is what the manifest says (the DAG's "done?" check)
        assert load_manifest(fused_root / stage / shard).digest == m.digest


def _forbid_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("the fused path parsed the TFRecord")

    monkeypatch.setattr(t2h, "iter_batches", boom)
    monkeypatch.setattr(t2h, "count_records_fast", boom)


def _same_content(a: Path, b: Path) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert list(fa) == list(fb)
        for k in fb:
            assert fa[k].dtype == fb[k].dtype and fa[k].shape == fb[k].shape, k
            np.testing.assert_array_equal(fa[k][()], fb[k][()], err_msg=k)


def test_the_hdf5_stage_declares_the_fused_call() -> None:
    hdf5 = next(s for s in DAG_STAGES if s.name == "hdf5")
    assert hdf5.fused is run_fused and hdf5.chain and hdf5.reads == ("tfrecord",)


@needs_native
def test_fused_sample_is_the_golden_tfrecord_and_the_separate_hdf5(golden: Path, shared_data: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    text, vocab = golden / "text_chain" / "part-00000-of-00500", shared_data / "vocab.txt"
    sep = _separate(*_units(text, vocab, tmp_path / "sep", MLPERF))
    _forbid_parse(monkeypatch)  # the fused call fills the rows from the engine: no parse of the TFRecord
    fused = run_fused(*_units(text, vocab, tmp_path / "fused", MLPERF))
    _compare(tmp_path / "fused", tmp_path / "sep", fused, sep)
    assert fused[1].counters["records"] == 12606
    name = text.name
    assert md5_file(tmp_path / "fused" / "tfrecord" / name / name) == md5_file(golden / "sample.tfrecord")
    _same_content(tmp_path / "fused" / "hdf5" / name / f"{name}.hdf5", golden / "sample.hdf5")


@needs_native
@pytest.mark.parametrize("flags,golden_name,batch", [(MLPERF, "edge.tfrecord", 1024), (SMALL, "edge_128.tfrecord", 1024),
                                                     (SMALL, "edge_128.tfrecord", 7)])
def test_fused_edge_cases_match_the_separate_stages(golden: Path, shared_data: Path, tmp_path: Path, flags: dict,
                                                    golden_name: str, batch: int) -> None:
    """Odd text (CJK, control characters, long words), other widths, and row chunks that do not divide N."""
    text, vocab = golden / "edge_input.txt", shared_data / "vocab.txt"
    sep = _separate(*_units(text, vocab, tmp_path / "sep", flags, batch))
    fused = run_fused(*_units(text, vocab, tmp_path / "fused", flags, batch))
    _compare(tmp_path / "fused", tmp_path / "sep", fused, sep)
    assert md5_file(tmp_path / "fused" / "tfrecord" / text.name / text.name) == md5_file(golden / golden_name)


def test_without_the_c_engine_the_fused_call_runs_the_two_stages(golden: Path, shared_data: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """BERTPIPE_NATIVE=0 (or no compiler): the plain implementation writes the TFRecord, the HDF5 stage parses it;
    still the golden bytes and the separate stages' manifests."""
    monkeypatch.setattr(cpd_fast._NATIVE, "module", None)
    monkeypatch.setattr(cpd_fast._NATIVE, "reason", "disabled by BERTPIPE_NATIVE=0")
    text, vocab = golden / "edge_input.txt", shared_data / "vocab.txt"
    fused = run_fused(*_units(text, vocab, tmp_path / "fused", MLPERF))
    assert fused[0].counters["impl"] == "plain"
    sep = _separate(*_units(text, vocab, tmp_path / "sep", MLPERF))
    _compare(tmp_path / "fused", tmp_path / "sep", fused, sep)
    assert md5_file(tmp_path / "fused" / "tfrecord" / text.name / text.name) == md5_file(golden / "edge.tfrecord")


@needs_native
def test_other_widths_for_the_hdf5_than_the_records_take_the_separate_path(golden: Path, shared_data: Path,
                                                                            tmp_path: Path) -> None:
    """An HDF5 config that does not match the records' widths is the separate stage's business (its error)."""
    from core.errors import RecordError

    tf, h5 = _units(golden / "edge_input.txt", shared_data / "vocab.txt", tmp_path, SMALL)
    h5 = replace(h5, kwargs={**h5.kwargs, "cfg": HDF5Config(max_seq_length=512, max_predictions_per_seq=76)})
    with pytest.raises(RecordError):
        run_fused(tf, h5)
    assert load_manifest(tf.out_dir) is not None and load_manifest(h5.out_dir) is None


@needs_native
def test_fill_padded_checks_its_rows_and_buffers(golden: Path, shared_data: Path) -> None:
    import random

    from preprocessing.mlperf.tokenization import FullTokenizer, load_vocab

    vocab = load_vocab(str(shared_data / "vocab.txt"))
    engine = cpd_fast.load().Engine(list(vocab), True, vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"],
                                    vocab["[MASK]"])
    fb = cpd_fast._LineTokenizer(FullTokenizer(vocab=vocab, do_lower_case=True), False, engine.tokenize_line)

    def bufs(rows: int, seq: int = 128, pred: int = 20) -> list[np.ndarray]:
        return [np.zeros((rows, seq), "i4"), np.zeros((rows, seq), "i1"), np.zeros((rows, seq), "i1"),
                np.zeros((rows, pred), "i4"), np.zeros((rows, pred), "i4"), np.zeros(rows, "i1")]

    with pytest.raises(IndexError):  # nothing created yet
        engine.fill_padded(0, 1, *bufs(1))
    engine.add_file((golden / "edge_input.txt").read_bytes(), fb, fb.chunk)
    n = engine.create(random.Random(12345).getstate()[1], 128, 20, 2, 0.15, 0.1)
    assert n == 157
    with pytest.raises(IndexError):
        engine.fill_padded(n - 1, n + 1, *bufs(2))
    with pytest.raises(ValueError, match="buffer 3"):
        engine.fill_padded(0, 2, *bufs(2)[:3], np.zeros((2, 19), "i4"), *bufs(2)[4:])
    out = bufs(3)
    engine.fill_padded(5, 8, *out)
    for k, row in enumerate(range(5, 8)):
        tokens, len_a, positions, labels, is_random = engine.instance(row)
        assert out[0][k, :len(tokens)].tolist() == tokens and not out[0][k, len(tokens):].any()
        assert out[1][k].sum() == len(tokens)
        assert out[2][k].tolist() == [0] * (len_a + 2) + [1] * (len(tokens) - len_a - 2) + [0] * (128 - len(tokens))
        assert out[3][k, :len(positions)].tolist() == positions and out[4][k, :len(labels)].tolist() == labels
        assert not out[3][k, len(positions):].any() and not out[4][k, len(labels):].any()
        assert out[5][k] == int(is_random)


@needs_native
def test_create_refuses_an_engine_whose_add_file_failed_part_way(shared_data: Path) -> None:
    """create() takes A and B as ranges of the segments' tokens, so it checks that they lie one after the other: a
    tokenizer callback that failed after some of its ids were taken leaves a stray id between two segments."""
    import random

    from preprocessing.mlperf.tokenization import load_vocab

    vocab = load_vocab(str(shared_data / "vocab.txt"))
    engine = cpd_fast.load().Engine(list(vocab), True, vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"],
                                    vocab["[MASK]"])

    def line(data: bytes, offset: int) -> list[int]:  # the fallback for the invalid UTF-8 line: one good id, one bad
        return [vocab["the"], len(vocab) + 5]

    with pytest.raises(ValueError, match="outside the vocab"):
        engine.add_file(b"hello world\n\xff\xfe\n", line, lambda chunk: [])
    engine.add_file(b"more words here\n\nand another document\n", line, lambda chunk: [])
    with pytest.raises(RuntimeError, match="not contiguous"):
        engine.create(random.Random(12345).getstate()[1], 128, 20, 1, 0.15, 0.1)

    fresh = cpd_fast.load().Engine(list(vocab), True, vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"],
                                   vocab["[MASK]"])
    fresh.add_file(b"hello world\nmore words here\n\nand another document\n", line, lambda chunk: [])
    assert fresh.create(random.Random(12345).getstate()[1], 128, 20, 1, 0.15, 0.1) > 0
