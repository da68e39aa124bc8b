"""Output bytes do not depend on where shard tasks run: serial, local worker processes, a Dask cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from flowhelpers import FAST, last_run, output_md5s, run_cli


def _args(text: Path, vocab: Path, work: Path) -> list:
    return ["--text-dir", text, "--vocab", vocab, "--work-dir", work, *FAST]


def test_local_process_pool_gives_the_serial_bytes(serial_run, three_part_text: Path, shared_data: Path,
                                                   tmp_path: Path) -> None:
    _, serial = serial_run
    w = tmp_path / "w"
    assert run_cli(*_args(three_part_text, shared_data / "vocab.txt", w), "--workers", "2") == 0
    assert output_md5s(w) == serial  # same keys (dirs) and same bytes
    assert last_run(w)["stages"]["tfrecord"]["cached"] == 0


def test_dask_local_cluster_with_two_workers_gives_the_serial_bytes(serial_run, three_part_text: Path,
                                                                    shared_data: Path, tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    pytest.importorskip("prefect_dask")
    _, serial = serial_run
    w = tmp_path / "w"
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl:
        assert run_cli(*_args(three_part_text, shared_data / "vocab.txt", w), "--dask-address",
                       cl.scheduler_address, "--workers", "2") == 0
        assert len(cl.workers) == 2
    assert output_md5s(w) == serial
