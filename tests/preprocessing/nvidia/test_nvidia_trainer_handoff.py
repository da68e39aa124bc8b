"""Hand-off: NVIDIA's own trainer code reads the folders bertpipe's DAG stages hand it, under a path that contains
``part`` (its eval discovery keeps every file of --eval_dir whose *full path* contains ``part``).

``create_eval_dataset``, ``pretraining_dataset`` (padded-free variable-length rows, and --packed_samples with and
without --order_samples) and ``batched`` are taken from v3.1's ``run_pretraining.py`` in ../shared/reference as they
are: its source is parsed and just those definitions are executed (the module itself imports apex, CUDA
extensions and NVIDIA's model code), with ``torch.distributed`` stubbed as one rank of one (the function reads
``chunk_size`` only on that path). The training-file rule is the one expression of its ``main()`` (``'part_' in
f``), applied here to the folder's listing.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402
import vendor_scripts as vs  # noqa: E402
from nvidia_dag import part_hdf5_result, run_pieces  # noqa: E402

from core.manifest import StageOutput  # noqa: E402
from core.stage import Result  # noqa: E402
from preprocessing.nvidia import chop as nvidia_chop  # noqa: E402
from preprocessing.nvidia import eval_pick as nvidia_eval  # noqa: E402
from preprocessing.nvidia import pack as pack_nvidia  # noqa: E402
from preprocessing.nvidia import shuffle as nvidia_shuffle  # noqa: E402

pytestmark = vs.needs_reference("nvidia-v3.1/run_pretraining.py")

WANTED = ("batched", "create_eval_dataset", "pretraining_dataset")


def nvidia_trainer() -> SimpleNamespace:
    """The definitions WANTED of v3.1's run_pretraining.py, executed from its source."""
    import itertools

    import torch
    from torch.utils.data import DataLoader, Dataset, SequentialSampler

    src_path = vs.need_reference() / "nvidia-v3.1" / "run_pretraining.py"
    tree = ast.parse(src_path.read_text())
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in WANTED]
    assert sorted(n.name for n in defs) == sorted(WANTED)
    one_rank = SimpleNamespace(is_initialized=lambda: True, get_world_size=lambda: 1, get_rank=lambda: 0)
    ns = {"os": os, "h5py": h5py, "np": np, "itertools": itertools, "DataLoader": DataLoader, "Dataset": Dataset,
          "SequentialSampler": SequentialSampler,
          "torch": SimpleNamespace(distributed=one_rank, from_numpy=torch.from_numpy)}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(src_path), "exec"), ns)  # noqa: S102 - vendor code
    return SimpleNamespace(**{k: ns[k] for k in WANTED})


def training_files(folder: Path) -> list[str]:
    """run_pretraining.py main()'s rule: files of --input_dir whose name holds ``part_``, sorted."""
    return sorted(str(folder / f) for f in os.listdir(folder) if (folder / f).is_file() and "part_" in f)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """bertpipe's DAG stages on made-up parts (lengths 1..512), in a work dir under a path holding ``part``."""
    base = tmp_path_factory.mktemp("x") / "data_part1"
    src = base / "src"
    src.mkdir(parents=True)
    lengths = [k * 37 % 512 + 1 for k in range(700)]
    parts = [ref.write_padded(src / f"part-{i:05d}-of-00500.hdf5", ref.padded_rows(lengths[a:b], i))
             for i, (a, b) in enumerate([(0, 300), (300, 301), (301, 700)])]
    work = base / "work"
    h5 = part_hdf5_result(parts, work)
    chop = run_pieces(nvidia_chop.DAG_STAGES[0], {"hdf5": h5}, work, targets=("nvidia-varlength",), is_sample=True,
                      n_output_shards=8)
    chop_dir = work / "nvidia_4320" / "key"
    shuffled = run_pieces(nvidia_shuffle.DAG_STAGES[0], {"hdf5": h5}, work, targets=("nvidia-4320",), is_sample=True,
                          n_output_shards=8)
    ev = base / "eval_hdf5"
    ev.mkdir()
    ref.write_padded(ev / "eval_10k.hdf5", ref.padded_rows(lengths[:120], 99))
    with StageOutput(ev, "tfrecord_to_hdf5") as out:
        out.add_file("eval_10k.hdf5")
    eval_m = run_pieces(nvidia_eval.DAG_STAGES[0], {"eval_hdf5": Result(stage="eval_hdf5", key="key", dir=ev,
                                                                         manifests={"": out.manifest})},
                        work, targets=("nvidia-4320",))
    # packed: a 64-token set (the packer's strategy solve at 512 takes a minute; the loader takes any width)
    short = base / "short"
    short.mkdir()
    packed_parts = [ref.write_padded(short / f"part-{i:05d}-of-00500.hdf5",
                                     ref.padded_rows([k % 64 + 1 for k in range(a, b)], i, max_seq_length=64,
                                                     max_pred=10)) for i, (a, b) in enumerate([(0, 150), (150, 400)])]
    packed = run_pieces(pack_nvidia.DAG_STAGES[0], {"hdf5": part_hdf5_result(packed_parts, base / "work64")},
                        base / "work64", targets=("nvidia-packed",), nvidia_packed_shards=4, max_seq_length=64,
                        max_predictions_per_seq=10)
    return SimpleNamespace(lengths=lengths, chop=(chop_dir, chop), shuffled=(work / "nvidia_4320_shuffled" / "key",
                                                                               shuffled),
                           eval=(work / "nvidia_eval" / "key", eval_m),
                           packed=(base / "work64" / "nvidia_packed" / "key", packed),
                           packed_lengths=[k % 64 + 1 for k in range(400)])


def _rows(ds) -> list[tuple]:
    out = []
    for i in range(len(ds)):
        ids, seg, mask, labels, *rest = ds[i]
        n = int(mask.sum())
        assert ids[n:].abs().sum() == 0 and bool(mask[:n].all())
        out.append((n, ids[:n].tolist()))
    return out


def test_eval_folder_holds_only_its_hdf5_and_nvidia_reads_it(built):
    nv = nvidia_trainer()
    stage_dir, m = built.eval
    eval_dir = stage_dir / nvidia_eval.DAG_DATA_DIR
    assert "part" in str(eval_dir) and os.listdir(eval_dir) == ["part_eval_10k.hdf5"]
    assert (stage_dir / "_manifest.json").is_file()  # the manifest one level up, as train_dir's
    assert stage_dir / nvidia_eval.DAG_FILE == eval_dir / "part_eval_10k.hdf5"
    args = SimpleNamespace(eval_dir=str(eval_dir), max_predictions_per_seq=76, max_seq_length=512,
                           num_eval_examples=10000, eval_batch_size=8)
    loader = nv.create_eval_dataset(args, None)
    rows = [r for batch in loader for r in zip(*[t.tolist() for t in batch], strict=True)]
    assert len(rows) == 120 and [sum(r[2]) for r in rows] == built.lengths[:120]
    # why the file has a folder of its own: under this path, the manifest would be taken for data
    with pytest.raises(OSError, match="file signature not found"):
        nv.create_eval_dataset(SimpleNamespace(**{**vars(args), "eval_dir": str(stage_dir)}), None)


@pytest.mark.parametrize("which", ["chop", "shuffled"])
def test_training_folders_read_by_nvidia(built, which):
    nv = nvidia_trainer()
    folder, m = getattr(built, which)
    files = training_files(folder)
    others = sorted(set(os.listdir(folder)) - {Path(f).name for f in files})
    assert "part" in str(folder) and "_manifest.json" in others
    assert not [f for f in others if "part_" in f or f.endswith((".hdf5", ".hdf"))]  # nothing its trainer could take
    assert [Path(f).name for f in files] == [f.name for f in m.files if "part_" in f.name]
    got = [r for f in files for r in _rows(nv.pretraining_dataset(f, max_pred_length=76, max_seq_length=512))]
    assert len(got) == 700  # rule v3.1: no row dropped
    if which == "chop":
        assert [n for n, _ in got] == built.lengths
    else:
        assert sorted(n for n, _ in got) == sorted(built.lengths)


@pytest.mark.parametrize("order", [False, True])
def test_packed_folder_read_by_nvidia(built, order):
    nv = nvidia_trainer()
    folder, m = built.packed
    files = training_files(folder)
    assert files and all(Path(f).name.startswith("part_") for f in files)
    assert not [f for f in os.listdir(folder) if "part_" in f and f not in {Path(x).name for x in files}]
    np.random.seed(0)
    seqs = []
    for f in files:
        ds = nv.pretraining_dataset(f, max_pred_length=10, max_seq_length=64, packed_samples=True,
                                    order_samples=order)
        for i in range(len(ds)):
            ids, seg, mask, labels, nsp, packed_len = ds[i]
            lens = [int(x) for x in packed_len.tolist() if x]
            assert sum(lens) == int(mask.sum()) <= 64
            seqs += lens
    assert sorted(seqs) == sorted(built.packed_lengths)
