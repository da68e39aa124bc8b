"""Smaller points of issue 33 (item 8): one rule for a flag however it is spelled, and a flag that cannot be honoured
is refused in one line instead of being ignored.

- ``run --pack-seed`` has pack-nvidia ``--seed``'s range (0 .. 2**63 - 1): -1 is refused by both, in the same words,
  and by the flow's parameters (deployments) too;
- ``train --no-packed`` on packed data (Habana's or NVIDIA's layout) is refused in one line: bertpipe never unpacks
  packs, so the flag cannot be honoured; without the flag the packs are detected and trained as packs, and
  ``--no-packed`` on padded rows is what it says.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import pytest

from bertpipe.cli import main


def _argparse_refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_pack_seed_minus_one_is_refused_as_pack_nvidia_seed_is(tmp_path, capsys):
    rule = "expected an integer >= 0 and <= 9223372036854775807, got '-1'"
    run = _argparse_refusal(["run", "--work-dir", str(tmp_path / "w"), "--target", "nvidia-packed",
                             "--pack-seed", "-1"], capsys)
    pack = _argparse_refusal(["pack-nvidia", "--input_dir", str(tmp_path), "--output_dir", str(tmp_path / "o"),
                              "--seed", "-1"], capsys)
    assert f"--pack-seed/--pack_seed: {rule}" in run and f"--seed: {rule}" in pack
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
    _argparse_refusal(["run", "--work-dir", str(tmp_path / "w"), "--pack-seed", str(1 << 63)], capsys)


def test_pack_seed_range_in_the_flows_parameters():
    from core.errors import InputError
    from preprocessing.params import DataParams

    with pytest.raises(InputError, match=r"pack.seed must be >= 0, got -1"):
        DataParams(pack_seed=-1)
    assert DataParams(pack_seed=0).pack_seed == 0 and DataParams(pack_seed=2**63 - 1).pack_seed == 2**63 - 1


@pytest.fixture(scope="module")
def packed_dirs(golden: Path, tmp_path_factory) -> tuple[Path, Path]:
    """60 golden rows packed (at most 3 a pack) as Habana's files and as NVIDIA's."""
    from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths, write_habana, write_nvidia

    with h5py.File(golden / "sample.hdf5", "r") as f:
        rows = {k: f[k][:60] for k in f}
    packed = pack_rows(rows, best_fit_packs(sequence_lengths(rows), 512, 3), 512)
    root = tmp_path_factory.mktemp("packed")
    (root / "habana").mkdir()
    (root / "nvidia").mkdir()
    write_habana(root / "habana" / "mixed_strategies_part_0.hdf5", packed)
    write_nvidia(root / "nvidia" / "part_00000", packed)
    return root / "habana", root / "nvidia"


@pytest.mark.parametrize("layout", ["habana", "nvidia"])
def test_no_packed_on_packed_data_is_one_line(packed_dirs, layout, tmp_path, capsys):
    data = packed_dirs[0 if layout == "habana" else 1]
    base = ["train", "--train-dir", str(data), "--output-dir", str(tmp_path / "out"), "--dry-run"]
    assert main([*base, "--no-packed"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bertpipe train: error: --no-packed: {data} holds {layout} packed "
                                               "rows"), err
    assert "drop --no-packed" in err[0]
    assert main(base) == 0  # detected: trained as packs
    assert "batches: packed rows" in capsys.readouterr().out


def test_no_packed_on_padded_rows_trains_them(golden, tmp_path, capsys):
    assert main(["train", "--train-dir", str(golden / "4bins"), "--output-dir", str(tmp_path / "out"), "--dry-run",
                 "--no-packed"]) == 0
    out = capsys.readouterr().out
    assert "batches: packed rows" not in out and "--packed" not in out
