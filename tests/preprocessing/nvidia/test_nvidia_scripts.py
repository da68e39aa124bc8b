"""bertpipe against NVIDIA's own scripts, run as they are (../shared/reference/nvidia-v1.1 and nvidia-v3.1, in the
side venv of tests/preprocessing/vendor_scripts.py), on made-up inputs; content compared dataset by dataset.

* chop: both rounds' ``chop_hdf5_files.py`` (rule v1.1 and v3.1) and v3.1's ``chop_hdf5_files_to_varlength.py``
  (v1.1: ``chop_hdf5_files.py`` then ``convert_fixed2variable.py`` on each shard, as v1.1's prepare_data does), on
  row counts around each rule's edges: fewer rows than shards, ``n_excess`` 0 and 1, shards that come out empty,
  one shard, several input parts (one empty, one of one row), every sequence length 1..512. Where a script crashes,
  bertpipe refuses (InputError naming --num_shards), except v3.1 with ``n_excess`` 0, where bertpipe gives every
  shard ``nominal`` rows on purpose (the script dies with IndexError on the last row);
* ``shuffle_indices.py`` + ``shuffle_samples.py`` (v3.1) on bertpipe's chopped shards = ``shuffle-samples``;
* ``pick_eval_samples_varlength.py`` = ``pick-eval-samples-varlength``; ``hdf5_md5.py`` = nvidia_md5.hdf5_md5.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402  (made-up inputs and the content comparison only)
import vendor_scripts as vs  # noqa: E402

pytestmark = vs.needs_reference("nvidia-v3.1/input_preprocessing", "nvidia-v1.1/input_preprocessing")

from core.errors import InputError  # noqa: E402
from preprocessing.nvidia.chop import ChopConfig, chop_layout, input_files, run_nvidia_chop, shard_name  # noqa: E402

#: (input parts' row counts, shard counts): 563 rows in 4 parts (one empty, one of one row; 563 is prime: n_excess 0
#: only at 1 and 563 shards; 282 shards give n_excess 1), 5 rows (fewer rows than shards; 6 shards: shard 0 empty
#: under v3.1; 7: the second empty shard crashes v3.1), 24 rows in 2 parts (8 shards: n_excess 0; 25: n_excess 1
#: with nominal 1). The hundreds-of-shards cases run with -m slow.
CASES = {"p563": ([200, 1, 0, 362], [1, 7, 8]),
         "p563-many": ([200, 1, 0, 362], [93, 100, 282, 563]),
         "p5": ([3, 0, 2], [1, 2, 4, 5, 6, 7]),
         "p24": ([12, 12], [3, 7, 8, 23, 25])}
SLOW = {"p563-many"}
CASE_PARAMS = [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in sorted(CASES)]
SCRIPT = {"v3.1": vs.NV31 / "input_preprocessing" / "chop_hdf5_files.py",
          "v1.1": vs.NV11 / "input_preprocessing" / "chop_hdf5_files.py"}


def md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


def same_values(a: Path, b: Path, their_compression: tuple) -> None:
    """Names, dtypes, shapes and values, dataset by dataset; ``b``'s datasets carry ``their_compression``, ``a``'s
    none (shuffle_samples.py passes compression=False, which h5py takes as gzip level 0: bertpipe writes them
    uncompressed, on purpose; the values and NVIDIA's digest are the same)."""
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        assert sorted(x) == sorted(y), (a, sorted(x), sorted(y))
        for k in y:
            dx, dy = x[k], y[k]
            assert (dx.dtype, dx.shape) == (dy.dtype, dy.shape), (a, k)
            assert (dx.compression, (dy.compression, dy.compression_opts)) == (None, their_compression), (a, k)
            for i, (u, v) in enumerate(zip(dx[:], dy[:], strict=True)):
                assert np.asarray(u).dtype == np.asarray(v).dtype and np.array_equal(u, v), f"{a} {k} row {i}"


def make_parts(d: Path, counts: list[int], seed: int) -> Path:
    """Padded part files part-0000k-of-00500.hdf5 with ``counts`` rows; lengths run through 1..512."""
    d.mkdir(parents=True)
    start = 0
    for i, n in enumerate(counts):
        lengths = [(start + j) * 37 % 512 + 1 for j in range(n)]
        ref.write_padded(d / f"part-{i:05d}-of-00500.hdf5", ref.padded_rows(lengths, seed + i))
        start += n
    return d


@pytest.fixture(scope="module")
def py() -> Path:
    return vs.ref_python()


_RUNS: dict[str, tuple[Path, dict]] = {}


@pytest.fixture(scope="module")
def vendor_base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vendor_chop")


def runs(py: Path, base: Path, case: str) -> tuple[Path, dict]:
    """One case through both chop scripts and v3.1's to_varlength (one side interpreter), once per session."""
    if case in _RUNS:
        return _RUNS[case]
    counts, shard_counts = CASES[case]
    calls, keys = [], []
    parts = make_parts(base / case / "in", counts, seed=len(counts))
    for n in shard_counts:
        for rule, script in SCRIPT.items():
            out = base / case / f"{rule}_{n}"
            out.mkdir(parents=True)
            calls.append({"script": script, "argv": ["--input_hdf5_dir", str(parts), "--output_hdf5_dir",
                                                      str(out), "--num_shards", str(n)], "cwd": out})
            keys.append((case, n, rule, "padded"))
        out = base / case / f"var_{n}"
        out.mkdir(parents=True)
        calls.append({"script": vs.NV31 / "input_preprocessing" / "chop_hdf5_files_to_varlength.py",
                      "argv": ["--input_hdf5_dir", str(parts), "--output_hdf5_dir", str(out), "--num_shards",
                               str(n)], "cwd": out})
        keys.append((case, n, "v3.1", "varlength"))
    res = vs.run_batch(py, calls, base / case / "batch")
    _RUNS[case] = base, dict(zip(keys, res, strict=True))
    return _RUNS[case]


def _their_folder(base: Path, name: str, n: int, rule: str, form: str) -> Path:
    if form == "varlength":
        return base / name / f"var_{n}" / f"{n}_shards_varlength"
    return base / name / f"{rule}_{n}" / f"hdf5_{n}_shards_uncompressed"


@pytest.mark.parametrize("rule", ["v3.1", "v1.1"])
@pytest.mark.parametrize("case", CASE_PARAMS)
def test_chop_equals_the_script(py, vendor_base, tmp_path, case, rule):
    """Per shard count: the script's crash is bertpipe's one-line refusal, or its shards are bertpipe's (same bytes
    for the padded shards, same content dataset by dataset), rows dropped only under v1.1."""
    base, res = runs(py, vendor_base, case)
    counts, shard_counts = CASES[case]
    parts = base / case / "in"
    for n in shard_counts:
        err = res[(case, n, rule, "padded")]
        rows = sum(counts)
        layout = None
        try:
            layout = chop_layout(rows, n, rule)
        except InputError as e:
            assert "--num_shards" in str(e) and len(str(e).splitlines()) == 1
        if rule == "v3.1" and n * -(-rows // n) == rows:  # n_excess 0: the script dies at the last row, on purpose
            assert err.startswith("IndexError"), (case, n, err)
            assert layout is not None and layout.sizes() == [rows // n] * n and layout.dropped == 0
            continue
        if err:
            assert err.startswith(("IndexError", "ValueError")) and layout is None, (case, n, rule, err)
            continue
        assert layout is not None, (case, n, rule)
        m = run_nvidia_chop(input_files(parts), tmp_path / f"{case}_{rule}_{n}",
                            ChopConfig(num_shards=n, rule=rule, chunk_rows=5))
        theirs = _their_folder(base, case, n, rule, "padded")
        assert sorted(p.name for p in theirs.iterdir()) == [shard_name(k, n) for k in range(n)]
        sizes = []
        for k in range(n):
            ours = tmp_path / f"{case}_{rule}_{n}" / shard_name(k, n)
            ref.assert_same_content(ours, theirs / shard_name(k, n))
            assert md5(ours) == md5(theirs / shard_name(k, n)), (case, n, rule, k)
            with h5py.File(ours, "r") as f:
                sizes.append(len(f["next_sentence_labels"]))
        assert sizes == layout.sizes() and m.counters["rows_dropped"] == rows - sum(sizes)
        assert (rule == "v3.1") == (m.counters["rows_dropped"] == 0) or rows - sum(sizes) == 0


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_varlength_chop_equals_the_scripts(py, vendor_base, tmp_path, case):
    """--varlength, rule v3.1 = v3.1's chop_hdf5_files_to_varlength.py; rule v1.1 = v1.1's chop_hdf5_files.py then
    its convert_fixed2variable.py on every shard (v1.1's prepare_data)."""
    base, res = runs(py, vendor_base, case)
    counts, shard_counts = CASES[case]
    parts = base / case / "in"
    rows = sum(counts)
    calls, want = [], []
    for n in shard_counts:
        if not res[(case, n, "v1.1", "padded")]:
            padded = _their_folder(base, case, n, "v1.1", "padded")
            conv = tmp_path / f"conv_{n}"
            conv.mkdir()
            for k in range(n):
                calls.append({"script": vs.NV11 / "input_preprocessing" / "convert_fixed2variable.py",
                              "argv": ["--input_hdf5_file", str(padded / shard_name(k, n)), "--output_hdf5_file",
                                       str(conv / shard_name(k, n))], "cwd": conv})
            want.append(("v1.1", n, conv))
        err = res[(case, n, "v3.1", "varlength")]
        if n * -(-rows // n) == rows:  # n_excess 0: the script makes shard n too (part_<n>_of_<n>) or dies
            continue
        if err:
            assert err.startswith(("IndexError", "ValueError", "TypeError")), err
            with pytest.raises(InputError):
                chop_layout(rows, n, "v3.1")
            continue
        want.append(("v3.1", n, _their_folder(base, case, n, "v3.1", "varlength")))
    assert vs.run_batch(py, calls, tmp_path / "batch") == [""] * len(calls)
    for rule, n, theirs in want:
        ours = tmp_path / f"ours_{rule}_{n}"
        run_nvidia_chop(input_files(parts), ours, ChopConfig(num_shards=n, rule=rule, varlength=True, chunk_rows=4))
        assert sorted(p.name for p in theirs.iterdir()) == [shard_name(k, n) for k in range(n)], (rule, n)
        for k in range(n):
            ref.assert_same_content(ours / shard_name(k, n), theirs / shard_name(k, n))


def test_shuffle_and_md5_equal_the_scripts(py, tmp_path):
    """v3.1's shuffle_indices.py + shuffle_samples.py on bertpipe's v3.1 shards = shuffle-samples (the rows of each
    shard, dataset by dataset); hdf5_md5.py's line = nvidia_md5's digest."""
    from preprocessing.nvidia.md5 import hdf5_md5
    from preprocessing.nvidia.shuffle import ShuffleConfig, run_nvidia_shuffle
    from preprocessing.nvidia.shuffle import input_files as shuffle_inputs

    parts = make_parts(tmp_path / "in", [200, 1, 0, 362], seed=9)
    shards = tmp_path / "shards"
    run_nvidia_chop(input_files(parts), shards, ChopConfig(num_shards=9, varlength=True))
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    ip = vs.NV31 / "input_preprocessing"
    vs.run(py, ip / "shuffle_indices.py", "--input_hdf5", str(shards), "--output_hdf5", str(theirs), cwd=theirs)
    vs.run(py, ip / "shuffle_samples.py", "--input_hdf5", str(shards), "--output_hdf5", str(theirs), cwd=theirs)
    ours = tmp_path / "ours"
    run_nvidia_shuffle(shuffle_inputs(shards), ours, ShuffleConfig(index_lists=True))
    for k in range(9):
        name = shard_name(k, 9)
        same_values(ours / name, theirs / name.replace(".hdf5", ".hdf"), their_compression=("gzip", 0))
        assert (ours / f"shard_indices_{k:05d}.lst").read_text() == (theirs / f"shard_indices_{k:05d}.lst").read_text()
    import subprocess

    some = sorted(ours.glob("part_*.hdf5"))[:3] + [shards / shard_name(0, 9)]
    lines = [subprocess.run([str(py), str(ip / "hdf5_md5.py"), "--input_hdf5", str(p)], capture_output=True,
                            text=True, check=True, cwd=tmp_path).stdout.strip() for p in some]
    assert lines == [f"{p.name}\t{hdf5_md5(p)}" for p in some]


@pytest.mark.parametrize("rows,pick", [(1, 1), (37, 10), (100, 100), (563, 17), (563, 562)])
def test_eval_pick_equals_the_script(py, tmp_path, rows, pick):
    """pick_eval_samples_varlength.py (v3.1) = pick-eval-samples-varlength, evenly spaced rows of every length."""
    from preprocessing.nvidia.eval_pick import PickVarlenConfig, pick_eval_varlength_file

    src = make_parts(tmp_path / "in", [rows], seed=rows) / "part-00000-of-00500.hdf5"
    vs.run(py, vs.NV31 / "input_preprocessing" / "pick_eval_samples_varlength.py", "--input_hdf5_file", str(src),
           "--output_hdf5_file", str(tmp_path / "theirs"), "--num_examples_to_pick", str(pick), cwd=tmp_path)
    pick_eval_varlength_file(src, tmp_path / "ours.hdf5", PickVarlenConfig(num_examples_to_pick=pick))
    ref.assert_same_content(tmp_path / "ours.hdf5", tmp_path / "theirs.hdf5")
    with h5py.File(tmp_path / "ours.hdf5", "r") as f:
        assert len(f["input_ids"]) == pick and all(np.asarray(r).size for r in f["input_ids"][:])
