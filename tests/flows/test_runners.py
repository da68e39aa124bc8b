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
    _check_artifacts(w)


def _check_artifacts(work: Path) -> None:
    """The run left a table per stage, a progress artifact at 100 % and a markdown dataset summary, each key
    ending with the work dir's id (tasks/artifacts.py)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
    from prefect.client.schemas.sorting import FlowRunSort

    from tasks.artifacts import scope_id

    sid = scope_id(work)
    names = ["stage-tfrecord", "stage-bins", "progress-tfrecord-hdf5", "dataset-summary"]
    keys = [f"{n}-{sid}" for n in names]
    with get_client(sync_client=True) as client:
        run = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=1)[0]  # the run of this test
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=keys), flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    arts = {a.key.removesuffix(f"-{sid}"): a for a in found}
    assert set(names) <= set(arts), sorted(a.key for a in found)
    assert arts["stage-tfrecord"].type == "table" and "part-00002-of-00500" in str(arts["stage-tfrecord"].data)
    assert arts["progress-tfrecord-hdf5"].type == "progress"
    assert "md5" in arts["dataset-summary"].data and "| bins |" in arts["dataset-summary"].data


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
