"""core.costs: the md5 and fsync counters the writers keep (bench/bench_scale.py prints them per step)."""

from __future__ import annotations

from pathlib import Path

from core import costs
from core.manifest import StageOutput, md5_file, md5_files


def test_md5s_and_fsyncs_are_counted(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * (3 << 20))
        files.append(p)
    before = costs.snapshot()
    md5_files(files)
    md5_file(files[0])
    spent = costs.since(before)
    assert spent["md5_bytes"] == 4 * (3 << 20)
    assert spent["md5_calls"] == 2
    assert spent["md5_cpu"] > 0
    before = costs.snapshot()
    with StageOutput(tmp_path / "s", "st") as out, out.open("a") as f:
        f.write(b"x")
    spent = costs.since(before)
    assert spent["fsyncs"] >= 2  # the file and the manifest (and their folder)
    assert spent["fsync_wait"] > 0
    assert set(spent) >= {"user", "sys", "minflt", "majflt"}
