"""The fault-injection hook (BERTPIPE_FAULT, core/manifest.py) on real stages: a stage SIGKILLed at a
named point leaves no manifest that lies (none before the manifest rename, a verifying one after it) and
the re-run writes the bytes of an uninterrupted run. bench/kill_campaign.py uses the same hook on the DAG."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ChecksumError, ManifestError
from core.manifest import (
    FAULT_ENV,
    MANIFEST_NAME,
    StageOutput,
    md5_file,
    parse_fault,
    verify_manifest,
)

BERTPIPE = str(Path(sys.executable).parent / "bertpipe")
TEXT_OUT = ("eval.md5", "eval.txt", "part-00000-of-00500")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def run_killed(cmd: list[str], spec: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``cmd`` in its own session with BERTPIPE_FAULT=spec; the group must be gone afterwards."""
    env = {**os.environ, FAULT_ENV: spec}
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    out, err = p.communicate(timeout=timeout)
    deadline = time.monotonic() + 10
    while group_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_members(p.pid), f"processes of the killed group survived: {group_members(p.pid)}"
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def dot_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.rglob(".*") if p.is_file())


def test_parse_fault() -> None:
    assert parse_fault("text:manifest") == ("text", "manifest", 1, False)
    assert parse_fault("bins:file:3:pg") == ("bins", "file", 3, True)
    assert parse_fault("hdf5:rename:pg:2") == ("hdf5", "rename", 2, True)
    for bad in ("text", "text:nowhere", ":manifest", "text:file:0", "text:file:x"):
        with pytest.raises(ValueError, match=FAULT_ENV):
            parse_fault(bad)


def test_hook_is_inert_when_unset_or_aimed_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for spec in (None, "other_stage:manifest", "mystage:file:2"):
        if spec is None:
            monkeypatch.delenv(FAULT_ENV, raising=False)
        else:
            monkeypatch.setenv(FAULT_ENV, spec)
        d = tmp_path / f"s{len(str(spec))}"
        with StageOutput(d, "mystage") as out, out.open("one.bin") as f:
            f.write(b"1")
        assert [f.name for f in verify_manifest(d).files] == ["one.bin"]
    monkeypatch.setenv(FAULT_ENV, "mystage:bogus")
    with pytest.raises(ValueError, match="POINT"), StageOutput(tmp_path / "bad", "mystage"):
        pass
    assert not (tmp_path / "bad" / MANIFEST_NAME).exists()


@pytest.mark.parametrize("point", ["start", "rename", "file", "manifest", "done"])
def test_text_stage_killed_at_point_then_rerun_gives_golden_bytes(golden: Path, tmp_path: Path, point: str) -> None:
    src, out = golden / "text_chain", tmp_path / "text"
    cmd = [BERTPIPE, "text", "--extracted", str(src / "text"), "--out", str(out), "--num-test-articles", "20",
           "--workers", "2", "-q"]  # two worker processes: the whole group goes
    r = run_killed(cmd, f"text:{point}:pg")
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert f"SIGKILL at '{point}'" in r.stderr
    final = sorted(p.name for p in out.iterdir() if p.name in TEXT_OUT)
    debris = dot_files(out)
    if point == "done":  # the manifest was renamed into place: the stage is done and verifies
        assert [f.name for f in verify_manifest(out).files] == list(TEXT_OUT)
        assert debris == []
    else:
        assert not (out / MANIFEST_NAME).exists()
        with pytest.raises((ManifestError, ChecksumError)):
            verify_manifest(out)
        # outputs in place, and the temporary file the kill caught (eval.md5 is the first output closed)
        in_place, caught = {"start": ([], ""), "rename": ([], ".eval.md5.tmp-"), "file": (["eval.md5"], ""),
                            "manifest": (list(TEXT_OUT), f".{MANIFEST_NAME}.tmp-")}[point]
        assert final == in_place
        assert all(".tmp-" in d for d in debris), debris
        assert not caught or any(d.startswith(caught) for d in debris), debris

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [f.name for f in verify_manifest(out).files] == list(TEXT_OUT)
    for name in TEXT_OUT:
        assert md5_file(out / name) == md5_file(src / name), name
    assert dot_files(out) == []  # the re-run swept the killed run's temporary files


def test_hdf5_stage_killed_before_rename_then_rerun(golden: Path, tmp_path: Path) -> None:
    """The h5py path (stage_file): killed with the HDF5 complete under its temporary name."""
    src = golden / "eval_100.tfrecord"
    out, ref = tmp_path / "h5", tmp_path / "ref"
    cmd = [BERTPIPE, "tfrecord-to-hdf5", "--input", str(src), "--output", f"{out}/", "-q"]
    r = run_killed(cmd, "tfrecord_to_hdf5:rename")
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (out / MANIFEST_NAME).exists() and not (out / "eval_100.tfrecord.hdf5").exists()
    assert [d.split(".tmp-")[0] for d in dot_files(out)] == [".eval_100.tfrecord.hdf5"]
    assert subprocess.run(cmd, capture_output=True).returncode == 0
    assert subprocess.run([*cmd[:-2], f"{ref}/", "-q"], capture_output=True).returncode == 0
    verify_manifest(out)
    assert md5_file(out / "eval_100.tfrecord.hdf5") == md5_file(ref / "eval_100.tfrecord.hdf5")
    assert dot_files(out) == []
