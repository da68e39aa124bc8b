"""shuffle-samples = NVIDIA's v3.x shuffle (index lists from random.Random(24), then shuffle_samples.py), compared
with both scripts re-enacted row by row on shards made by the reference chain (chop_hdf5_files.py then
convert_fixed2variable.py, re-enacted too), and the permutation with the interpreter's own random module."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402

from core.errors import InputError  # noqa: E402
from preprocessing.nvidia.shuffle import (  # noqa: E402
    DAG_STAGES,
    PaddedShuffleConfig,
    ShuffleConfig,
    input_files,
    list_name,
    run_nvidia_shuffle,
    run_nvidia_shuffle_padded,
    shard_name,
)
from preprocessing.pyrandom import PY_TAIL, shuffle_permutation  # noqa: E402


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 1000, PY_TAIL - 1, PY_TAIL, PY_TAIL + 1, 200_003])
@pytest.mark.parametrize("seed", [24, 0, 12345, 2**40 + 3])
def test_permutation_is_random_shuffle(n, seed):
    x = list(range(n))
    random.Random(seed).shuffle(x)
    assert shuffle_permutation(n, seed).tolist() == x


@pytest.fixture(scope="module")
def varlength(tmp_path_factory) -> Path:
    """7 variable-length shards from the reference chain (chop 7 + convert): 560 rows, lengths 1..512."""
    d = tmp_path_factory.mktemp("vl")
    (d / "in").mkdir()
    lengths = list(range(1, 513)) + [512] * 30 + [7] * 21
    np.random.default_rng(0).shuffle(lengths)
    for i, chunk in enumerate([lengths[:200], lengths[200:201], [], lengths[201:]]):
        ref.write_padded(d / "in" / f"part-{i:05d}-of-00500.hdf5", ref.padded_rows(chunk, i))
    padded = Path(ref.chop_hdf5_files(str(d / "in"), str(d / "chop"), 7))
    out = d / "hdf5_7_shards_varlength"
    out.mkdir()
    for p in sorted(padded.iterdir()):
        ref.convert_fixed2variable(str(p), str(out / p.name))
    return out


@pytest.fixture(scope="module")
def reference(varlength, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref")
    ref.shuffle_index_lists(str(varlength), str(out))
    ref.shuffle_samples_write(str(varlength), str(out))
    return out


def _compare(ours: Path, theirs: Path, n: int, lists: bool) -> None:
    for k in range(n):
        mine = ours / shard_name(k, n)
        script = theirs / f"part_{k:05d}_of_{n:05d}.hdf"  # the script's name; the published list says .hdf5
        ref.assert_same_content(mine, script)
        assert ref.hdf5_md5(mine) == ref.hdf5_md5(script)
        if lists:
            assert (ours / list_name(k)).read_text() == (theirs / list_name(k)).read_text()


def test_shards_and_lists_equal_the_scripts(varlength, reference, tmp_path):
    m = run_nvidia_shuffle(input_files(varlength), tmp_path, ShuffleConfig(index_lists=True, chunk_rows=33))
    _compare(tmp_path, reference, 7, lists=True)
    assert m.counters == {"files": 7, "rows": 560}
    assert sorted(f.name for f in m.files) == sorted([shard_name(k, 7) for k in range(7)] +
                                                     [list_name(k) for k in range(7)])
    assert not (tmp_path / ".shuffle-scratch").exists()
    for k in range(7):  # each shard keeps its input's row count, and the rows really moved across shards
        with h5py.File(tmp_path / shard_name(k, 7), "r") as a, h5py.File(varlength / shard_name(k, 7), "r") as b:
            assert a["input_ids"].shape == b["input_ids"].shape
    with h5py.File(tmp_path / shard_name(0, 7), "r") as a, h5py.File(varlength / shard_name(0, 7), "r") as b:
        assert [r.tolist() for r in a["input_ids"][:10]] != [r.tolist() for r in b["input_ids"][:10]]


def test_buckets_and_workers_do_not_change_the_bytes(varlength, reference, tmp_path):
    """Small buckets (several gathers), two workers: the same files as one bucket in one process. (The rows
    written per call, chunk_rows, shape the HDF5 heap of a vlen file: the same content, other bytes.)"""
    one = run_nvidia_shuffle(input_files(varlength), tmp_path / "one", ShuffleConfig(chunk_rows=17))
    many = run_nvidia_shuffle(input_files(varlength), tmp_path / "many", ShuffleConfig(bucket_rows=50, chunk_rows=17),
                              workers=2)
    assert [(f.name, f.md5) for f in one.files] == [(f.name, f.md5) for f in many.files]
    assert not (tmp_path / "one" / list_name(0)).exists()  # the lists only on request
    _compare(tmp_path / "many", reference, 7, lists=False)


def test_scratch_past_the_page_cache_and_its_batches_do_not_change_the_bytes(varlength, reference, tmp_path,
                                                                             monkeypatch):
    """Scratch larger than memory goes past the page cache (BERTPIPE_DIRECT_IO=1 forces it here), appended in
    batches padded to a block: with many small batches (a flush every ~1 kB: records that end anywhere in a block,
    padding between them) and with the default batches, the same shards as through the page cache; the gathers'
    buffer, kept from one call to the next and filled with junk between runs, changes nothing."""
    import preprocessing.nvidia.shuffle as shuffle
    from preprocessing import scratch

    monkeypatch.delenv("BERTPIPE_DIRECT_IO", raising=False)
    seen = []
    real = shuffle._read_bucket

    def spy(folder, bucket):
        seen.append(shuffle._direct(folder))
        return real(folder, bucket)

    monkeypatch.setattr(shuffle, "_read_bucket", spy)
    cached = run_nvidia_shuffle(input_files(varlength), tmp_path / "cached", ShuffleConfig(bucket_rows=200))
    assert seen and not any(seen)  # 560 rows: far less than half the memory
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "1")
    seen.clear()
    direct = run_nvidia_shuffle(input_files(varlength), tmp_path / "direct", ShuffleConfig(bucket_rows=200))
    assert seen and all(seen) == bool(scratch._O_DIRECT)
    # the gathers read each bucket into the worker's buffer, kept from call to call: junk left there changes nothing
    from preprocessing import pack_fast

    held = pack_fast.process_space("shuffle-gather")._bufs
    assert bool(held) == bool(scratch._O_DIRECT)
    for buf in held.values():
        buf.fill(0xFF)
    monkeypatch.setattr(shuffle, "FLUSH_BYTES", 1000)
    small = run_nvidia_shuffle(input_files(varlength), tmp_path / "small", ShuffleConfig(bucket_rows=200))
    assert [(f.name, f.md5) for f in cached.files] == [(f.name, f.md5) for f in direct.files] == \
        [(f.name, f.md5) for f in small.files]
    _compare(tmp_path / "small", reference, 7, lists=False)


def test_another_seed_another_order(varlength, tmp_path):
    a = run_nvidia_shuffle(input_files(varlength), tmp_path / "a", ShuffleConfig())
    b = run_nvidia_shuffle(input_files(varlength), tmp_path / "b", ShuffleConfig(seed=25))
    assert a.files[0].md5 != b.files[0].md5 and a.key != b.key


def test_cli(varlength, reference, tmp_path, monkeypatch):
    from bertpipe.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["shuffle-samples", "--input_hdf5", str(varlength), "--output_hdf5", "shuf", "--index_lists"]) == 0
    _compare(tmp_path / "shuf", reference, 7, lists=True)
    assert main(["shuffle-samples", "--input-hdf5", str(varlength), "--output-hdf5", "shuf", "--workers", "1"]) == 0
    (tmp_path / "shuf" / "notes.txt").write_text("mine")
    assert main(["shuffle-samples", "--input_hdf5", str(varlength), "--output_hdf5", "shuf"]) == 2  # not ours


def test_padded_shards_are_refused_naming_the_file(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    ref.write_padded(d / "part_00000_of_00001.hdf5", ref.padded_rows([3, 4], 0))
    with pytest.raises(InputError, match=r"part_00000_of_00001.hdf5: no variable-length 'input_ids'"):
        run_nvidia_shuffle(input_files(d), tmp_path / "out")
    with pytest.raises(InputError, match="no input files"):
        run_nvidia_shuffle([], tmp_path / "out")


@pytest.mark.parametrize("name,shards", [("eval_100", 4), pytest.param("sample", 8, marks=pytest.mark.slow)])
def test_golden_chain(golden, tmp_path, name, shards):
    """A golden file (the reference converter's output) through chop-hdf5 --varlength and the shuffle: the
    scripts agree with us (the 12,606-row sample takes the re-enacted scripts a minute: slow)."""
    from preprocessing.nvidia.chop import ChopConfig, run_nvidia_chop

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-00000-of-00500.hdf5").symlink_to(golden / f"{name}.hdf5")
    vl = tmp_path / "vl"
    run_nvidia_chop([tmp_path / "in" / "part-00000-of-00500.hdf5"], vl,
                    ChopConfig(num_shards=shards, varlength=True))
    theirs = tmp_path / "ref"
    theirs.mkdir()
    ref.shuffle_index_lists(str(vl), str(theirs))
    ref.shuffle_samples_write(str(vl), str(theirs))
    run_nvidia_shuffle(input_files(vl), tmp_path / "ours", ShuffleConfig(index_lists=True))
    _compare(tmp_path / "ours", theirs, shards, lists=True)


def _parts(varlength: Path) -> list[Path]:
    """The padded parts the fixture's reference chain chopped (part-0000{0..3}-of-00500.hdf5; one is empty)."""
    return sorted((varlength.parent / "in").glob("part-*-of-00500.hdf5"))


@pytest.mark.parametrize("workers,bucket_rows,padded_rows,direct_io", [
    (1, 524288, 65536, "auto"), (1, 90, 37, "auto"), (2, 150, 65536, "auto"), (1, 90, 37, "1"), (2, 150, 65536, "1")])
def test_padded_route_equals_the_scripts_on_the_chopped_shards(varlength, reference, tmp_path, monkeypatch,
                                                              workers, bucket_rows, padded_rows, direct_io):
    """The padded route (nvidia-4320's stage): the padded parts' rows shuffled into the shards the chop would cut,
    without them: the scripts' shards and index lists (the fixture's chain: v1.1's chop_hdf5_files.py, which
    keeps 560 of the 563 rows, convert_fixed2variable.py, shuffle_samples.py), whatever the buckets, workers and
    the parts' pieces, and with the scratch past the page cache (BERTPIPE_DIRECT_IO=1: the scatter's and the
    gather's calls, in this process and in a pool's, take it from the plan's mark)."""
    import preprocessing.nvidia.shuffle as shuffle

    monkeypatch.setenv("BERTPIPE_DIRECT_IO", direct_io)
    monkeypatch.setattr(shuffle, "PADDED_ROWS", padded_rows)  # one worker: read in this process
    m = run_nvidia_shuffle_padded(_parts(varlength), tmp_path / "ours", PaddedShuffleConfig(
        num_shards=7, rule="v1.1", index_lists=True, bucket_rows=bucket_rows, chunk_rows=33), workers=workers)
    _compare(tmp_path / "ours", reference, 7, lists=True)
    assert m.counters == {"files": 7, "rows": 560}
    assert not (tmp_path / "ours" / ".shuffle-scratch").exists()
    direct = run_nvidia_shuffle(input_files(varlength), tmp_path / "direct",
                                ShuffleConfig(index_lists=True, chunk_rows=33))
    assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in direct.files]


def test_padded_route_under_v31_keeps_every_row(varlength, tmp_path, monkeypatch):
    """Rule v3.1 (nvidia-4320's): 563 rows in 7 shards of 80, 80, 80, 80, 81, 81, 81; the padded route gives the
    bytes of our chop's v3.1 shards shuffled (the chop is checked against v3.1's script in test_nvidia_chop)."""
    import preprocessing.nvidia.shuffle as shuffle
    from preprocessing.nvidia.chop import ChopConfig, run_nvidia_chop

    monkeypatch.setattr(shuffle, "PADDED_ROWS", 100)
    chopped = run_nvidia_chop(_parts(varlength), tmp_path / "chop", ChopConfig(num_shards=7, rule="v3.1",
                                                                                varlength=True))
    assert chopped.counters["rows_dropped"] == 0 and chopped.counters["rows"] == 563
    direct = run_nvidia_shuffle(input_files(tmp_path / "chop"), tmp_path / "direct", ShuffleConfig(index_lists=True))
    m = run_nvidia_shuffle_padded(_parts(varlength), tmp_path / "padded",
                                  PaddedShuffleConfig(num_shards=7, rule="v3.1", index_lists=True))
    assert m.counters == {"files": 7, "rows": 563}
    assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in direct.files]


def test_padded_route_refuses_what_the_chop_refuses(tmp_path):
    """A padded part the chop refuses (an id outside int16, a shard count the script crashes on): the same error,
    naming the file, and no shard written."""
    from preprocessing.nvidia.chop import ChopConfig, run_nvidia_chop

    d = tmp_path / "in"
    d.mkdir()
    rows = ref.padded_rows([5, 9, 3], 0)
    rows["input_ids"][1][2] = 40000
    part = ref.write_padded(d / "part-00000-of-00500.hdf5", rows)
    with pytest.raises(InputError) as chop_err:
        run_nvidia_chop([part], tmp_path / "chop", ChopConfig(num_shards=2, varlength=True))
    with pytest.raises(InputError) as ours:
        run_nvidia_shuffle_padded([part], tmp_path / "out", PaddedShuffleConfig(num_shards=2))
    assert str(ours.value) == str(chop_err.value) and "part-00000-of-00500.hdf5" in str(ours.value)
    assert not list((tmp_path / "out").glob("part_*"))
    good = ref.write_padded(tmp_path / "part-00000-of-00500.hdf5", ref.padded_rows([5, 9, 3, 7, 2], 1))
    with pytest.raises(InputError, match=r"cannot cut these inputs into 3 shards"):  # 5 rows: v1.1's script crashes
        run_nvidia_shuffle_padded([good], tmp_path / "out", PaddedShuffleConfig(num_shards=3, rule="v1.1"))


def test_dag_declaration_runs_as_pieces(varlength, reference, tmp_path):
    """nvidia-4320's stage (rule v3.1) and nvidia-2048's (rule v1.1), both the padded route from the hdf5 stage's
    parts, run as the DAG runs them: the bytes of our chop's shards shuffled in one call, and for v1.1 the
    scripts' own shuffled shards (the fixture's chain: v1.1's chop_hdf5_files.py, shuffle_samples.py)."""
    from nvidia_dag import part_hdf5_result, run_pieces

    assert DAG_STAGES[0].name == "nvidia_4320_shuffled" and DAG_STAGES[0].reads == ("hdf5",)
    m = run_pieces(DAG_STAGES[0], {"hdf5": part_hdf5_result(_parts(varlength), tmp_path / "w1")}, tmp_path / "w1",
                   targets=("nvidia-4320",), workers=2, is_sample=True, n_output_shards=7)
    chop_v31 = tmp_path / "chop"
    from preprocessing.nvidia.chop import ChopConfig, run_nvidia_chop

    run_nvidia_chop(_parts(varlength), chop_v31, ChopConfig(num_shards=7, varlength=True))
    direct = run_nvidia_shuffle(input_files(chop_v31), tmp_path / "direct")
    assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in direct.files]
    assert not (tmp_path / "w1" / "nvidia_4320_shuffled" / "key" / ".shuffle-scratch").exists()

    assert DAG_STAGES[1].name == "nvidia_2048_shuffled" and DAG_STAGES[1].reads == ("hdf5",)
    m = run_pieces(DAG_STAGES[1], {"hdf5": part_hdf5_result(_parts(varlength), tmp_path / "w2")}, tmp_path / "w2",
                   targets=("nvidia-2048",), workers=2, is_sample=True, n_output_shards=7)
    assert m.counters == {"files": 7, "rows": 560}  # v1.1 drops the 3 rows past the last shard, as the script
    _compare(tmp_path / "w2" / "nvidia_2048_shuffled" / "key", reference, 7, lists=False)
    direct = run_nvidia_shuffle(input_files(varlength), tmp_path / "direct2")
    assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in direct.files]
    assert not (tmp_path / "w2" / "nvidia_2048_shuffled" / "key" / ".shuffle-scratch").exists()
