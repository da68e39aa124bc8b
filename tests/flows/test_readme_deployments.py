"""The deployment section (docs/deployments.md, where the README points), run as written: every shell line
of its block, in order, on a fresh copy of the checkout (its own HOME, so Prefect's database is new), against
the real `prefect server` it starts and the real process worker. Then the outputs are checked: the data set, the redone stage, the refresh's
version and `latest`, the training run on it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def readme_block(heading: str = "# The Prefect deployments", page: str = "docs/deployments.md") -> list[str]:
    """The shell lines of the first ```bash block under ``heading`` of ``page`` (continuations joined)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    section = text[text.index(heading):]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, f"no ```bash block under {heading!r}"
    return [line for line in block.group(1).replace("\\\n", " ").splitlines() if line.strip()]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def _copy_checkout(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)


def test_the_readme_deployment_lines_run_as_written(tmp_path: Path) -> None:
    lines = readme_block()
    assert any(line.startswith("prefect deploy") for line in lines)
    port = 4200
    if not _port_free(port):  # someone else's server: the same lines on another port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        lines = [line.replace(":4200", f":{port}").replace("--background", f"--port {port} --background")
                 for line in lines]
    repo, home = tmp_path / "checkout", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    _copy_checkout(repo)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(HOME=str(home), PATH=f"{BIN}:{env['PATH']}", DS_ACCELERATOR="cpu",
               TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR",
                                                   str(Path.home() / ".cache" / "torch_extensions")))
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    log = tmp_path / "readme.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=repo, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=1800)
        finally:
            subprocess.run([str(BIN / "prefect"), "server", "stop"], cwd=repo, env=env, capture_output=True)
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the background worker
            except ProcessLookupError:
                pass
    text = log.read_text(errors="replace")
    assert rc == 0, text[-6000:]  # set -e, and `--watch` exits non-zero unless the run completed

    work = repo / "work" / "data"
    summary = json.loads((work / "last_run.json").read_text())
    assert {"train_dir", "eval_hdf5", "vocab", "text_dir"} <= set(summary["outputs"])
    assert summary["stages"]["hdf5"]["cached"] == 0 and summary["stages"]["tfrecord"]["cached"] > 0  # force=hdf5
    latest = repo / "datasets" / "latest"
    source = json.loads((latest / "SOURCE.json").read_text())
    assert source["source"] == "sample" and latest.resolve().parent.name == "versions"
    r = subprocess.run([str(BIN / "bertpipe"), "status", "--work-dir", str(latest)], capture_output=True, text=True)
    assert r.returncode == 0 and "0 of the current data set not done" in r.stdout, r.stdout
    train = json.loads((repo / "results" / "pretrain" / "summary.json").read_text())
    assert train["steps"] == 20 and train["final_eval_mlm_accuracy"] is not None
