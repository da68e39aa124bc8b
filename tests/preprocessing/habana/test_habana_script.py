"""bertpipe's pack-habana against Habana's ``pack_pretraining_data_pytorch.py`` run as it is (../shared/reference/
habana, in the side venv of tests/preprocessing/vendor_scripts.py, with the stand-in torch its README describes),
on made-up padded files: every length 1..128, several files, and a file without "training" in its name that the
script skips. The script takes its files in ``os.listdir`` order; bertpipe gets them in that same order here (its
CLI sorts them). ``keep_partial_last=False`` is the script's output exactly (it drops the last, partial file of
fewer than 4,480 packs); its files are compared dataset by dataset, its metadata figure by figure."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402
import vendor_scripts as vs  # noqa: E402

pytestmark = vs.needs_reference("habana/pack_pretraining_data_pytorch.py")

from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana  # noqa: E402


def test_pack_habana_equals_the_script(tmp_path):
    py = vs.ref_python()
    src = tmp_path / "in"
    src.mkdir()
    rng = np.random.default_rng(5)
    lengths = np.concatenate([np.tile(np.arange(1, 129), 40), rng.integers(1, 129, 5000)])
    rng.shuffle(lengths)
    for k, chunk in enumerate(np.split(lengths, [1, 4000, 6000])):
        ref.write_padded(src / f"wiki_training_{k}.hdf5", ref.padded_rows(chunk.tolist(), k, max_seq_length=128,
                                                                          max_pred=20))
    ref.write_padded(src / "eval_part.hdf5", ref.padded_rows([5, 9], 9, max_seq_length=128, max_pred=20))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    script = vs.HABANA / "pack_pretraining_data_pytorch.py"
    res = vs.run_batch(py, [{"script": script, "cwd": tmp_path,
                             "argv": ["--input_dir", str(src), "--output_dir", str(theirs), "--max_sequence_length",
                                      "128", "--max_predictions_per_sequence", "20", "--disable_progress_bar"]}],
                       tmp_path / "batch", pythonpath=vs.torch_stub(tmp_path / "stub"))
    assert res == [""], res
    order = [src / f for f in os.listdir(src) if (src / f).is_file() and "training" in f]  # the script's order
    ours = tmp_path / "ours"
    m = run_pack_habana(order, ours, HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20,
                                                      keep_partial_last=False), manifest_name="../ours.manifest.json")
    names = sorted(p.name for p in theirs.iterdir())
    assert names and names == sorted(p.name for p in ours.iterdir())
    for n in names:
        with h5py.File(ours / n, "r") as a, h5py.File(theirs / n, "r") as b:
            assert sorted(a) == sorted(b)
            for k in b:
                assert (a[k].dtype, a[k].shape, a[k].compression) == (b[k].dtype, b[k].shape, b[k].compression), k
                np.testing.assert_array_equal(a[k][:], b[k][:], err_msg=f"{n}:{k}")
    assert m.counters["files"] == len(names)
    # habana-packed-narrow (--compression none --dtypes narrow): the script's values, each dataset in its narrowest
    # integer type, uncompressed
    narrow = tmp_path / "narrow"
    run_pack_habana(order, narrow, HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20,
                                                    keep_partial_last=False, compression="none", dtypes="narrow"),
                    manifest_name="../narrow.manifest.json")
    assert sorted(p.name for p in narrow.iterdir()) == names
    for n in names:
        with h5py.File(narrow / n, "r") as a, h5py.File(theirs / n, "r") as b:
            assert list(a) == list(b)
            for k in b:
                assert a[k].shape == b[k].shape and a[k].compression is None and a[k].dtype.itemsize <= 2, k
                np.testing.assert_array_equal(a[k][:], b[k][:], err_msg=f"narrow {n}:{k}")
    # <output_dir>_metadata.json: every figure the same (avg_seq_per_sample is what Habana's trainer reads); only
    # top_8_strategies, the argsort of tied use counts, may order the ties otherwise
    theirs_meta = json.loads((tmp_path / "theirs_metadata.json").read_text())
    ours_meta = json.loads((tmp_path / "ours_metadata.json").read_text())
    assert theirs_meta.keys() == ours_meta.keys()
    assert {k: v for k, v in theirs_meta.items() if k != "top_8_strategies"} == \
        {k: v for k, v in ours_meta.items() if k != "top_8_strategies"}
