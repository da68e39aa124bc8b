"""bertpipe's pack-nvidia against NVIDIA's packed chain run as it is (v3.1's ``packed_data/``, ../shared/reference, in
the side venv of tests/preprocessing/vendor_scripts.py): ``gather_per_seqlength_data.py`` for every length,
``generate_packing_strategy.py`` seeded as ../shared/reference/README.md says (``random.seed(12345)`` after its
imports: tests/preprocessing/vendor_run.py seeds ``random`` just before running it, its code untouched) and
``create_packed_trainset.py``; shard lists compared as text, shards dataset by dataset.

Step 1, ``create_per_seqlength_data.py``, is create_pretraining_data.py writing each instance into the file of its
length; it imports TensorFlow and starts from text, so here its output is written from the same padded rows
bertpipe packs (``per_seqlength_parts``: every row of a part into ``part-NNNNN/seqlength_LLL.hdf5`` with the
script's dtypes, in row order). The gather takes the part folders in ``glob`` order; bertpipe gets the parts in
that same order.
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402
import vendor_scripts as vs  # noqa: E402

pytestmark = vs.needs_reference("nvidia-v3.1/input_preprocessing/packed_data")

from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia  # noqa: E402

DTYPES = {"input_ids": "i2", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i2",
          "masked_lm_ids": "i2", "next_sentence_labels": "i1"}


def per_seqlength_parts(parts: list[Path], out: Path, max_len: int) -> None:
    """create_per_seqlength_data.py's output for these padded parts (see the module doc)."""
    for i, p in enumerate(parts):
        d = out / f"part-{i:05d}"
        d.mkdir(parents=True)
        with h5py.File(p, "r") as f:
            rows = {k: f[k][:] for k in DTYPES}
        lengths = rows["input_mask"].sum(axis=1)
        for length in range(1, max_len + 1):
            sel = np.flatnonzero(lengths == length)
            with h5py.File(d / f"seqlength_{length:03d}.hdf5", "w") as w:
                for k, dt in DTYPES.items():
                    w.create_dataset(k, data=rows[k][sel], dtype=dt)


def chain(py: Path, tmp: Path, counts: list[int], max_len: int, shards: int, seed: int = 12345) -> None:
    rng = np.random.default_rng(max_len)
    lengths = [k % max_len + 1 for k in range(sum(counts))]  # every length 1..max_len, several times
    rng.shuffle(lengths)
    src = tmp / "parts"
    src.mkdir()
    parts, a = [], 0
    for i, n in enumerate(counts):
        parts.append(ref.write_padded(src / f"part-{i:05d}-of-00500.hdf5", ref.padded_rows(lengths[a:a + n], i)))
        a += n
    per = tmp / "per_seqlen_parts"
    per_seqlength_parts(parts, per, max_len)
    order = [int(Path(d).name.split("-")[1]) for d in glob.glob(f"{per}/part-*/")]  # the gather's order
    gathered, packed = tmp / "per_seqlen", tmp / "packed_data"
    gathered.mkdir()
    packed.mkdir()
    pd = vs.NV31 / "input_preprocessing" / "packed_data"
    calls = [{"script": pd / "gather_per_seqlength_data.py", "argv": ["--input_hdf5", str(per), "--output_hdf5",
                                                                      str(gathered), "--seq_length", str(length)],
              "cwd": tmp} for length in range(1, max_len + 1)]
    calls.append({"script": pd / "generate_packing_strategy.py", "seed": seed, "cwd": tmp,
                  "argv": ["--input_hdf5", str(gathered), "--output_hdf5", str(packed), "--max_seq_length",
                           str(max_len), "--max_seq_per_sample", "3", "--shards_num", str(shards)]})
    calls.append({"script": pd / "create_packed_trainset.py", "cwd": tmp,
                  "argv": ["--input_hdf5", str(gathered), "--assignment_file", str(packed), "--output_hdf5",
                           str(packed), "--max_seq_length", str(max_len)]})
    assert vs.run_batch(py, calls, tmp / "batch") == [""] * len(calls)
    ours = tmp / "ours"
    m = run_pack_nvidia([parts[i] for i in order], ours, PackNvidiaConfig(max_seq_length=max_len, shards_num=shards,
                                                                          seed=seed, reference_names=True))
    assert m.counters["sequences"] == sum(counts)
    for k in range(shards):
        assert (ours / f"shard_list_{k:05d}.lst").read_text() == (packed / f"shard_list_{k:05d}.lst").read_text(), k
        ref.assert_same_content(ours / f"part_{k:05d}", packed / f"part_{k:05d}")
    assert sorted(p.name for p in packed.iterdir()) == sorted(p.name for p in ours.iterdir() if p.name[0] != "_"
                                                              and not p.name.startswith("."))


@pytest.fixture(scope="module")
def py() -> Path:
    return vs.ref_python()


def test_packed_chain_equals_the_scripts_128(py, tmp_path):
    """Lengths 1..128 in three parts (one of one row), 5 shards."""
    chain(py, tmp_path, [300, 1, 340], 128, 5)


@pytest.mark.slow
def test_packed_chain_equals_the_scripts_512(py, tmp_path):
    """Every length 1..512 (NVIDIA's width), four parts (one empty), 7 shards: the strategy solve over all 512."""
    chain(py, tmp_path, [700, 0, 1, 900], 512, 7)
