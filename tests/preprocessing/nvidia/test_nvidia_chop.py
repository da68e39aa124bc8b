"""chop-hdf5 --rule v1.1 = v1.1's chop_hdf5_files.py (and chop_hdf5_files_to_varlength.py), compared with the script's
loop re-enacted row by row (tests/preprocessing/nvidia_reference.py) on the golden sample and on made-up inputs:
several parts (one empty, one of one row), every length from 1 to 512, shard counts that leave rows out, and the
counts where the script crashes. Fast and without ../shared; tests/preprocessing/nvidia/test_nvidia_scripts.py runs the
scripts themselves (both rules) against bertpipe."""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402

from core.errors import InputError  # noqa: E402
from preprocessing.nvidia.chop import (  # noqa: E402
    DAG_STAGES,
    ChopConfig,
    chop_layout,
    input_files,
    reference_crash,
    run_nvidia_chop,
    shard_name,
    shards_folder,
)
from preprocessing.nvidia.md5 import hdf5_md5  # noqa: E402


def md5(p: Path) -> str:
    return hashlib.md5(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    """Four part files: 200 rows, 1 row, 0 rows, 362 rows; every length 1..512 appears (563 rows)."""
    d = tmp_path_factory.mktemp("parts") / "in"
    d.mkdir()
    lengths = list(range(1, 513)) + [512] * 30 + [7] * 21
    np.random.default_rng(0).shuffle(lengths)
    for i, chunk in enumerate([lengths[:200], lengths[200:201], [], lengths[201:]]):
        ref.write_padded(d / f"part-{i:05d}-of-00500.hdf5", ref.padded_rows(chunk, i))
    (d / "part-00004-of-00499.hdf5").write_bytes(b"not matched by the reference's glob")
    return d


def test_shard_sizes_are_the_scripts_on_every_count():
    """The layout (sizes, rows left out) and the crash cases equal the script's loop, for 0..300 rows x 1..70
    shards, rows spread over several files."""
    for rows in range(0, 301, 7):
        for n in range(1, 71):
            files = [rows // 3, 0, rows - rows // 3 - rows // 5, rows // 5]
            try:
                sizes, left = ref.chop_shard_sizes(files, n)
            except (IndexError, ValueError):
                assert reference_crash(rows, n, "v1.1"), (rows, n)
                with pytest.raises(InputError, match="--num_shards"):
                    chop_layout(rows, n, "v1.1")
                continue
            assert not reference_crash(rows, n, "v1.1"), (rows, n)
            lay = chop_layout(rows, n, "v1.1")
            assert sizes == [lay.size(k) for k in range(n)], (rows, n)
            assert left == lay.dropped and sum(sizes) == lay.kept, (rows, n)


def test_a_large_layout():
    """4320 shards of ~36,000 rows (NVIDIA's default count): under v1.1 every shard nominal-1 rows when rows don't
    divide; under v3.1 the first `excess` shards, nothing dropped."""
    lay = chop_layout(4320 * 36280 - 3947, 4320, "v1.1")
    assert (lay.nominal, lay.excess) == (36280, 3947)
    assert lay.size(0) == lay.size(4319) == 36279 and lay.dropped == 4320 - 3947
    lay = chop_layout(4320 * 36280 - 3947, 4320)
    assert (lay.rule, lay.size(0), lay.size(3946), lay.size(3947), lay.size(4319)) == ("v3.1", 36279, 36279, 36280,
                                                                                       36280)
    assert lay.dropped == 0 and lay.kept == lay.rows


@pytest.mark.parametrize("n", [1, 8, 93])
def test_padded_shards_equal_the_scripts_bytes(parts, tmp_path, n):
    want = Path(ref.chop_hdf5_files(str(parts), str(tmp_path / "ref"), n))
    cfg = ChopConfig(num_shards=n, chunk_rows=37, rule="v1.1")
    m = run_nvidia_chop(input_files(parts), tmp_path / "ours", cfg)
    assert m.counters["rows_in"] == 563 and m.counters["rows"] + m.counters["rows_dropped"] == 563
    names = sorted(p.name for p in (tmp_path / "ours").iterdir())
    assert names == sorted([shard_name(k, n) for k in range(n)] + ["_manifest.json"])
    assert sorted(p.name for p in want.iterdir()) == [nm for nm in names if nm != "_manifest.json"]
    for k in range(n):
        ours, theirs = tmp_path / "ours" / shard_name(k, n), want / shard_name(k, n)
        ref.assert_same_content(ours, theirs)
        with h5py.File(ours, "r") as f:
            assert [f[d].dtype.str for d in ref.SIX] == ["<i2", "|i1", "|i1", "<i2", "<i2", "|i1"]
        assert md5(ours) == md5(theirs), f"shard {k}: bytes differ from the script's (same h5py/HDF5)"
        assert m.file(shard_name(k, n)).md5 == md5(ours)


def test_workers_and_chunks_do_not_change_the_bytes(parts, tmp_path):
    a = run_nvidia_chop(input_files(parts), tmp_path / "a", ChopConfig(num_shards=8), workers=1)
    b = run_nvidia_chop(input_files(parts), tmp_path / "b", ChopConfig(num_shards=8, chunk_rows=5), workers=2)
    assert [f.md5 for f in a.files] == [f.md5 for f in b.files]


@pytest.mark.parametrize("direct", ["1", "0"])
def test_shards_built_in_memory_past_the_page_cache_or_through_it_are_the_scripts_bytes(parts, tmp_path, monkeypatch,
                                                                                      direct):
    """Each shard is built by HDF5's core driver and written in one call (O_DIRECT with BERTPIPE_DIRECT_IO=1, as
    at full size), its md5 taken from memory: the script's bytes either way, the manifest's md5s the files'."""
    from core import manifest
    from preprocessing import packing

    monkeypatch.setenv("BERTPIPE_DIRECT_IO", direct)
    made, known = [], []
    init, then_fsync = packing.ImageOutputs.__init__, manifest.md5_then_fsync

    def spy_init(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    def spy_md5s(paths, known_md5s=None, *a, **k):
        known.append(dict(known_md5s or {}))
        return then_fsync(paths, known_md5s, *a, **k)

    monkeypatch.setattr(packing.ImageOutputs, "__init__", spy_init)
    import preprocessing.nvidia.chop as chop_mod

    monkeypatch.setattr(chop_mod, "md5_then_fsync", spy_md5s)
    n = 5
    want = Path(ref.chop_hdf5_files(str(parts), str(tmp_path / "ref"), n))
    m = run_nvidia_chop(input_files(parts), tmp_path / "ours", ChopConfig(num_shards=n, rule="v1.1", chunk_rows=64),
                        workers=1)
    assert made and all(o.direct == (direct == "1") for o in made)
    hashed = {Path(p).name for k in known for p in k}
    for k in range(n):
        ours = tmp_path / "ours" / shard_name(k, n)
        assert md5(ours) == md5(want / shard_name(k, n)) == m.file(shard_name(k, n)).md5
        if made[0].usable:  # the C extension and HDF5's library at hand: hashed from memory, not read back
            assert ours.name in hashed
    assert not list((tmp_path / "ours").glob(".*tmp*"))


def test_a_shard_too_large_for_an_image_is_written_by_the_file_driver_with_the_same_bytes(parts, tmp_path,
                                                                                       monkeypatch):
    """A shard whose bound passes IMAGE_MAX_BYTES (few shards of many rows) is written chunk by chunk by HDF5's
    file driver, its memory bounded by chunk_rows, and hashed from the page cache: the script's bytes."""
    from preprocessing import packing
    from preprocessing.nvidia import chop as chop_mod

    sizes = []
    create = packing.ImageOutputs.create

    def spy(self, path, bound):
        sizes.append(bound)
        return create(self, path, bound)

    monkeypatch.setattr(packing.ImageOutputs, "create", spy)
    n = 5
    want = Path(ref.chop_hdf5_files(str(parts), str(tmp_path / "ref"), n))
    # v1.1's 5 shards of 563 rows: 112 rows each, bounds of 112 x ROW_BYTES + 1 MiB, one byte over the limit
    monkeypatch.setattr(chop_mod, "IMAGE_MAX_BYTES", 112 * chop_mod.ROW_BYTES + (1 << 20) - 1)
    m = run_nvidia_chop(input_files(parts), tmp_path / "ours", ChopConfig(num_shards=n, rule="v1.1", chunk_rows=16))
    assert sizes == []  # no shard built in memory
    for k in range(n):
        ours = tmp_path / "ours" / shard_name(k, n)
        assert md5(ours) == md5(want / shard_name(k, n)) == m.file(shard_name(k, n)).md5
    assert not list((tmp_path / "ours").glob(".*tmp*"))


def test_the_chop_goes_past_the_page_cache_where_its_files_would_not_stay_in_it(monkeypatch, tmp_path):
    """stage_output_bytes: a group's rows x the stage's shards / the group's, at ROW_BYTES a row; use_direct then
    weighs it against the memory available (the full set's ~156.7 M rows: ~376 GB, past it; 563 rows: not)."""
    from preprocessing import scratch
    from preprocessing.nvidia import chop as chop_mod

    g = chop_mod.ChopGroup(n_shards=4320, k0=0, k1=16, starts=tuple(range(0, 36_300 * 17, 36_300)), files=())
    assert chop_mod.stage_output_bytes(g) == chop_mod.ROW_BYTES * 36_300 * 4320
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "auto")
    monkeypatch.setattr(scratch, "memory_available", lambda: 24 << 30)
    small = chop_mod.ChopGroup(n_shards=8, k0=0, k1=8, starts=tuple(range(0, 563, 70)), files=())
    assert not scratch.use_direct(tmp_path, chop_mod.stage_output_bytes(small))
    if scratch.direct_io_enabled():  # the probe needs O_DIRECT on tmp_path's file system
        got = scratch.use_direct(tmp_path, chop_mod.stage_output_bytes(g))
        assert got or not _takes_direct(tmp_path)


def _takes_direct(folder: Path) -> bool:
    import os

    try:
        fd = os.open(folder / ".probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    (folder / ".probe").unlink()
    return True


def test_varlength_shards_equal_chop_then_convert_fixed2variable(parts, tmp_path):
    """chop_hdf5_files_to_varlength.py = chop_hdf5_files.py then convert_fixed2variable.py on each shard."""
    n = 7
    padded = Path(ref.chop_hdf5_files(str(parts), str(tmp_path / "ref"), n))
    m = run_nvidia_chop(input_files(parts), tmp_path / "ours", ChopConfig(num_shards=n, varlength=True, chunk_rows=50,
                                                                           rule="v1.1"))
    assert m.counters["rows"] == 560 and m.counters["rows_dropped"] == 3
    for k in range(n):
        theirs = tmp_path / f"conv_{k}.hdf5"
        ref.convert_fixed2variable(str(padded / shard_name(k, n)), str(theirs))
        ours = tmp_path / "ours" / shard_name(k, n)
        ref.assert_same_content(ours, theirs)
        assert hdf5_md5(ours) == ref.hdf5_md5(theirs)
    with h5py.File(tmp_path / "ours" / shard_name(3, n), "r") as f:  # full-length rows keep their 512 tokens
        assert max(len(r) for r in f["input_ids"][:]) == 512


def test_golden_sample_as_the_only_part(golden, tmp_path):
    """The golden sample.hdf5 (12,606 rows, the reference's own converter output) as part-00000-of-00500.hdf5."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "part-00000-of-00500.hdf5").symlink_to(golden / "sample.hdf5")
    want = Path(ref.chop_hdf5_files(str(src), str(tmp_path / "ref"), 8))
    m = run_nvidia_chop(input_files(src), tmp_path / "ours", ChopConfig(num_shards=8, rule="v1.1"))
    assert (m.counters["rows"], m.counters["rows_dropped"]) == (12600, 6)
    for k in range(8):
        assert md5(tmp_path / "ours" / shard_name(k, 8)) == md5(want / shard_name(k, 8))
    with pytest.raises(InputError, match="at most 4202 shards"):  # NVIDIA's 4320 would crash the script here
        run_nvidia_chop(input_files(src), tmp_path / "big", ChopConfig(num_shards=4320, rule="v1.1"))
    assert run_nvidia_chop(input_files(src), tmp_path / "v31", ChopConfig(num_shards=8)).counters["rows_dropped"] == 0
    with pytest.raises(IndexError):  # the script's loop (counters only: 4,320 real files take a minute)
        ref.chop_shard_sizes([12606], 4320)


def test_cli_writes_the_reference_folder_and_refuses_crash_cases(parts, tmp_path, monkeypatch):
    from bertpipe.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["chop-hdf5", "--input-hdf5-dir", str(parts), "--output-hdf5-dir", "out", "--num-shards", "8"]) == 0
    assert main(["chop-hdf5", f"--input_hdf5_dir={parts}", "--output_hdf5_dir=out", "--num_shards=8", "--varlength",
                 "--workers=1"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["hdf5_8_shards_uncompressed",
                                                                     "hdf5_8_shards_varlength"]
    assert shards_folder(ChopConfig(num_shards=8, varlength=True)) == "hdf5_8_shards_varlength"
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    assert main(["chop-hdf5", "--input_hdf5_dir", str(parts), "--output_hdf5_dir", "out", "--num_shards", "100",
                 "--rule", "v1.1"]) == 2
    assert main(["chop-hdf5", "--input_hdf5_dir", str(parts), "--output_hdf5_dir", "out", "--num_shards", "600"]) == 2
    with pytest.raises(SystemExit):
        main(["chop-hdf5", "--input_hdf5_dir", str(parts), "--output_hdf5_dir", "out", "--num_shards", "8",
              "--rule", "v2.0"])
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written


def test_bad_inputs_are_one_line_naming_the_file(parts, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(parts, bad)
    with h5py.File(bad / "part-00001-of-00500.hdf5", "a") as f:
        del f["segment_ids"]
    with pytest.raises(InputError, match="part-00001-of-00500.hdf5 has no dataset 'segment_ids'"):
        run_nvidia_chop(input_files(bad), tmp_path / "o1", ChopConfig(num_shards=4))
    big = tmp_path / "big"
    big.mkdir()
    rows = ref.padded_rows([5, 9, 12], 3)
    rows["input_ids"][1, 3] = 40000  # a vocabulary over 32,767: the script's cast to i2 would wrap it
    ref.write_padded(big / "part-00000-of-00500.hdf5", rows)
    with pytest.raises(InputError, match=r"part-00000-of-00500.hdf5: row 1: input_ids holds a value outside int16"):
        run_nvidia_chop(input_files(big), tmp_path / "o2", ChopConfig(num_shards=1))
    assert not list((tmp_path / "o2").glob("part_*"))


def test_dag_declaration_runs_as_pieces(parts, tmp_path):
    """The declared stage's plan/finish phases (as flows/dag.py runs them) give the same shards as one call."""
    from nvidia_dag import part_hdf5_result, run_pieces

    work = tmp_path / "work"
    h5 = part_hdf5_result(input_files(parts), work)
    m = run_pieces(DAG_STAGES[0], {"hdf5": h5}, work, targets=("nvidia-4320",), is_sample=True, n_output_shards=8)
    direct = run_nvidia_chop(input_files(parts), tmp_path / "direct", ChopConfig(num_shards=8, varlength=True))
    assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in direct.files]
    assert m.counters["rows_dropped"] == 0 and m.params["rule"] == "v3.1"  # the rule is in the stage key
    m11 = run_pieces(DAG_STAGES[2], {"hdf5": h5}, work, targets=("nvidia-4320-v1.1",), is_sample=True,
                     n_output_shards=8)
    assert m11.counters["rows_dropped"] == 3 and m11.params["rule"] == "v1.1"
    assert [s.name for s in DAG_STAGES] == ["nvidia_4320", "nvidia_2048", "nvidia_4320_v11"]
    p = type("P", (), {"max_seq_length": 512, "max_predictions_per_seq": 76, "is_sample": False})()
    assert [s.configure(p).rule for s in DAG_STAGES] == ["v3.1", "v1.1", "v1.1"]
    assert DAG_STAGES[2].when(type("P", (), {"targets": ("nvidia-4320-v1.1",)})())
    assert DAG_STAGES[0].when(type("P", (), {"targets": ("nvidia-varlength",)})())
    assert not DAG_STAGES[0].when(type("P", (), {"targets": ("nvidia-packed",)})())  # it packs the padded parts
    assert not DAG_STAGES[0].when(type("P", (), {"targets": ("samsung-4bins",)})())
    assert not DAG_STAGES[1].when(type("P", (), {})())
    assert DAG_STAGES[1].when(type("P", (), {"targets": ("nvidia-2048-varlength",)})())
    assert not DAG_STAGES[1].when(type("P", (), {"targets": ("nvidia-2048",)})())  # it shuffles the padded parts
