"""Two work dirs, one PREFECT_HOME (a user's default ~/.prefect): Prefect's records are keyed by content, so
the second work dir's re-run gets records written for the first. Each must describe its own directory:
downstream stages read only inside their work dir, and deleting the first work dir breaks nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

from flowhelpers import FAST, last_run, output_md5s, run_cli


def test_rerun_in_a_second_work_dir_reads_only_its_own_files(prefect_harness, three_part_text: Path,
                                                             shared_data: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    # a seed of this test's own: content keys no other test's records share
    args = ("--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", *FAST, "--random-seed", "4242")
    assert run_cli(*args, "--work-dir", a) == 0
    assert run_cli(*args, "--work-dir", b) == 0  # a's records exist but b has no outputs yet: everything runs
    first = output_md5s(b)
    shutil.rmtree(a)
    assert run_cli(*args, "--work-dir", b) == 0  # every stage cached: Prefect hands back the records made for a
    summary = last_run(b)
    outputs = {k: v for k, v in summary["outputs"].items() if k != "vocab"}  # --vocab is the given file
    dirs = [s["dir"] for s in summary["stages"].values()] + list(outputs.values())
    assert len(dirs) > 7 and [d for d in dirs if not d.startswith(f"{b}/")] == []
    assert all(s["cached"] == s["calls"] for s in summary["stages"].values()), summary["stages"]
    assert output_md5s(b) == first
