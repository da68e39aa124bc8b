"""Hand-off: Habana's own trainer code reads what pack-habana writes, gzip (habana-packed) and uncompressed
(habana-packed-raw, ``--compression none``) and in narrow dtypes (habana-packed-narrow, ``--dtypes narrow``) alike.

``pretraining_dataset`` is taken from Habana's ``run_pretraining.py`` in ../shared/reference as it is: its source is
parsed and just that class is executed (the module itself imports the HPU stack and Habana's model code). In packed
mode it reads the nine datasets with ``f[key][:]`` and builds each item's tensors; both folders must give the same
items, pack for pack.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import vendor_scripts as vs  # noqa: E402

from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana  # noqa: E402

pytestmark = vs.needs_reference("habana/run_pretraining.py")


def habana_dataset() -> type:
    """``pretraining_dataset`` of Habana's run_pretraining.py, executed from its source."""
    import torch
    from torch.utils.data import Dataset

    src_path = vs.need_reference() / "habana" / "run_pretraining.py"
    tree = ast.parse(src_path.read_text())
    defs = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "pretraining_dataset"]
    assert len(defs) == 1
    ns = {"h5py": h5py, "np": np, "torch": torch, "Dataset": Dataset}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(src_path), "exec"), ns)  # noqa: S102 - vendor code
    return ns["pretraining_dataset"]


def _padded(path: Path, lengths: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, width, preds = len(lengths), 128, 20
    mask = (np.arange(width) < lengths[:, None]).astype(np.int8)
    ids = rng.integers(1000, 30000, (n, width), dtype=np.int32) * mask
    ids[:, 0] = 101
    pos = np.zeros((n, preds), np.int32)
    mids = np.zeros((n, preds), np.int32)
    for i, ln in enumerate(lengths.tolist()):
        k = min(preds, ln - 1, max(1, round(ln * 0.15)))
        if k > 0:
            pos[i, :k] = np.sort(rng.choice(np.arange(1, ln), size=k, replace=False))
            mids[i, :k] = rng.integers(1000, 30000, k)
    with h5py.File(path, "w") as f:
        f["input_ids"], f["input_mask"] = ids, mask
        f["segment_ids"] = ((np.arange(width) >= (lengths // 2)[:, None]) * mask).astype(np.int8)
        f["masked_lm_positions"], f["masked_lm_ids"] = pos, mids
        f["next_sentence_labels"] = rng.integers(0, 2, n).astype(np.int8)


def test_habanas_dataset_reads_the_gzip_the_uncompressed_and_the_narrow_packs_alike(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(3)
    lengths = np.concatenate([np.tile(np.arange(1, 129), 4), rng.integers(10, 120, 1500)])
    rng.shuffle(lengths)
    for k, chunk in enumerate(np.array_split(lengths, 2)):
        _padded(src / f"wiki_training_{k}.hdf5", chunk, seed=k)
    inputs = sorted(src.iterdir())
    outs = {}
    for name, compression, dtypes in (("gzip", "gzip", "script"), ("none", "none", "script"),
                                      ("narrow", "none", "narrow")):
        cfg = HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20, compression=compression,
                               dtypes=dtypes)
        run_pack_habana(inputs, tmp_path / name, cfg, manifest_name=f"../{name}.manifest.json")
        outs[name] = sorted((tmp_path / name).iterdir())
    assert [p.name for p in outs["gzip"]] == [p.name for p in outs["none"]] == [p.name for p in outs["narrow"]] != []
    dataset = habana_dataset()
    items = 0
    for gz, raw, narrow in zip(outs["gzip"], outs["none"], outs["narrow"], strict=True):
        with h5py.File(raw, "r") as f, h5py.File(narrow, "r") as g:
            assert all(f[k].compression is None and g[k].compression is None for k in f)
            assert {k: g[k].dtype.itemsize for k in g} == {
                "input_ids": 2, "input_mask": 1, "segment_ids": 1, "positions": 2, "masked_lm_positions": 2,
                "masked_lm_ids": 2, "next_sentence_positions": 2, "next_sentence_labels": 1,
                "next_sentence_weights": 1}
            assert sum(g[k].id.get_storage_size() for k in g) < 0.5 * sum(f[k].id.get_storage_size() for k in f)
        a, b, c = (dataset(str(p), 20, enable_packed_data_mode=True) for p in (gz, raw, narrow))
        assert len(a) == len(b) == len(c) > 0
        for i in range(len(a)):
            x, y, z = a[i], b[i], c[i]
            assert len(x) == len(y) == len(z) == 7
            for t, u, v in zip(x, y, z, strict=True):
                assert t.dtype == u.dtype == v.dtype and bool((t == u).all()) and bool((t == v).all()), (gz.name, i)
        items += len(a)
    # every real sequence is in some pack: the packs' next-sentence weights count them
    weights = sum(int(h5py.File(p, "r")["next_sentence_weights"][:].sum()) for p in outs["none"])
    assert weights == len(lengths) and items > 0
