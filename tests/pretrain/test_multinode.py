"""`bertpipe train` on two nodes of this one machine, for real (slow; issue 33 item 7).

Two "nodes" are two `bertpipe train` commands, one rank each, started side by side as on two machines:

* torchrun's c10d rendezvous (``--launcher torchrun --num-nodes 2 --node-rank K --master-addr 127.0.0.1``):
  the same losses as one node of 2 ranks (the same global batch), then a resume of its checkpoint on one node;
* DeepSpeed's multi-node launcher without ssh (``--hostfile`` of two names for 127.0.0.1, ``--node-rank K``:
  DeepSpeed's ``--no_ssh --node_rank K``): a resume of the one-node run's checkpoint on two nodes, the same
  losses as the one-node run;
* DeepSpeed's launcher over ssh (pdsh or ssh to 127.0.0.1), when ``scripts/multinode_ssh.sh`` could set up
  sshd (root, apt): the same losses; else skipped in one line;
* one node killed (SIGKILL of its command, launcher and rank, as a node that dies): the other node's command
  exits within 60 s, in one error line, and no process of the training is left.

Nothing here needs more than the project's own environment (torch, DeepSpeed); run as root, ``scripts/
multinode_ssh.sh`` installs openssh-server and pdsh for the ssh case.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
psutil = pytest.importorskip("psutil")

from pretrain import checkpoint as ckpt  # noqa: E402
from pretrain.launch import free_port  # noqa: E402
from pretrain.metrics import read_metrics  # noqa: E402

slow = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
STEPS, STOP_AT = 6, 3


def _argv(golden: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-dir", str(golden / "4bins"), "--output-dir", str(out), "--model", "tiny",
            "--device", "cpu", "--micro-batch", "4", "--no-tensorboard", "--learning-rate", "0.05",
            "--max-steps", str(STEPS), "--checkpoint-interval", str(STOP_AT), *extra]


def _start(argv: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "bertpipe", *argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "BERTPIPE_PROGRESS": "0",
                                 "TORCH_EXTENSIONS_DIR": str(EXTENSIONS)}, start_new_session=True, text=True)


def _training_pids(out: Path) -> list[int]:
    return [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
            if str(out) in " ".join(p.info["cmdline"] or []) and p.info["pid"] != os.getpid()]


def _kill_all(procs: list[subprocess.Popen], out: Path) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    for pid in _training_pids(out):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run_nodes(argvs: list[list[str]], logs: list[Path], out: Path, timeout: float = 1500) -> None:
    """Start every node's command at once and wait for all of them: each exits 0."""
    procs = [_start(a, log) for a, log in zip(argvs, logs, strict=True)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed or time.monotonic() > deadline:
                time.sleep(5)  # (the other node's last lines)
                pytest.fail(f"node {failed[0] if failed else '?'} failed or the run timed out:\n" + "\n".join(
                    f"--- node {i}:\n{log.read_text()[-2500:]}" for i, log in enumerate(logs)))
            time.sleep(0.2)
    finally:
        _kill_all(procs, out)


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


#: Two nodes' ranks all-reduce through gloo, one node's through DeepSpeed's shared-memory op: the same sums in
#: another order (bf16 gradients): step 1 is bit-equal, later steps differ by ~1e-5 relative
REL = 1e-4


def _same(got: dict[int, float], expected: dict[int, float], steps) -> float:
    """The largest relative difference of the losses of ``steps`` (asserted below REL)."""
    worst = max(abs(got[s] - expected[s]) / abs(expected[s]) for s in steps)
    assert worst < REL, ({s: got[s] for s in steps}, {s: expected[s] for s in steps})
    return worst


def _nodes(golden: Path, out: Path, launcher: str, *extra: str, hostfile: Path | None = None) -> list[list[str]]:
    port = str(free_port())
    common = ["--nproc", "1", "--num-nodes", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    common += ["--launcher", launcher] + (["--hostfile", str(hostfile)] if hostfile else [])
    return [_argv(golden, out, *common, "--node-rank", str(k), *extra) for k in (0, 1)]


def _hostfile(tmp_path: Path) -> Path:
    path = tmp_path / "hostfile"  # two names for 127.0.0.1: two "nodes" of one slot
    path.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    return path


@pytest.fixture(scope="module")
def one_node(golden, tmp_path_factory):  # (slow tests only)
    """The reference: one node, 2 ranks (global batch 8), checkpoints at steps 3 and 6."""
    out = tmp_path_factory.mktemp("one_node") / "run"
    _run_nodes([_argv(golden, out, "--nproc", "2")], [out.parent / "node.log"], out)
    losses = _losses(out)
    assert sorted(losses) == list(range(1, STEPS + 1))
    return out, losses


@slow
def test_torchrun_rendezvous_two_nodes_same_losses_then_resume_on_one_node(golden, one_node, tmp_path):
    ref, expected = one_node
    out = tmp_path / "run"
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    t0 = time.monotonic()
    _run_nodes(_nodes(golden, out, "torchrun", "--steps-this-run", str(STOP_AT)), logs, out)
    took = time.monotonic() - t0
    got = _losses(out)
    assert sorted(got) == list(range(1, STOP_AT + 1))
    assert got[1] == expected[1]  # (before any all-reduce of gradients)
    two_nodes = _same(got, expected, range(1, STOP_AT + 1))
    config = json.loads((out / "config.json").read_text())
    assert config["world_size"] == 2 and config["deepspeed"]["train_batch_size"] == 8
    assert ckpt.latest_tag(out) == str(STOP_AT) and not _training_pids(out)
    # resume on one node of 2 ranks (another node count, the same world): the one-node run's losses 4..6
    _run_nodes([_argv(golden, out, "--nproc", "2", "--resume")], [tmp_path / "resume.log"], out)
    got = _losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    resumed = _same(got, expected, range(STOP_AT + 1, STEPS + 1))
    print(f"\ntorchrun c10d, 2 nodes x 1 rank: steps 1-{STOP_AT} in {took:.0f} s, losses = one node's (largest "
          f"relative difference {two_nodes:.1e}); resumed on one node: steps {STOP_AT + 1}-{STEPS} ({resumed:.1e})")


def _from_step(ref: Path, out: Path, tag: int) -> None:
    """A copy of ``ref``'s run as it was at checkpoint ``tag``."""
    (out / "checkpoints").mkdir(parents=True)
    shutil.copytree(ref / "checkpoints" / str(tag), out / "checkpoints" / str(tag))
    (out / "checkpoints" / "latest").write_text(str(tag))
    lines = [ln for ln in (ref / "metrics.jsonl").read_text().splitlines() if json.loads(ln)["step"] <= tag]
    (out / "metrics.jsonl").write_text("".join(ln + "\n" for ln in lines))


@slow
def test_deepspeed_multinode_launcher_resumes_a_one_node_checkpoint_on_two_nodes(golden, one_node, tmp_path):
    ref, expected = one_node
    out = tmp_path / "run"
    _from_step(ref, out, STOP_AT)
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    argvs = _nodes(golden, out, "deepspeed", "--resume", hostfile=_hostfile(tmp_path))
    assert "--no_ssh" not in " ".join(argvs[0])  # (bertpipe's flag is --node-rank; the command line says --no_ssh)
    _run_nodes(argvs, logs, out)
    assert "--no_ssh --node_rank 1" in logs[1].read_text()
    got = _losses(out)
    assert sorted(got) == list(range(1, STEPS + 1))
    worst = _same(got, expected, range(STOP_AT + 1, STEPS + 1))
    assert json.loads((out / "summary.json").read_text())["world_size"] == 2 and not _training_pids(out)
    print(f"\nDeepSpeed --no_ssh, 2 nodes x 1 rank, resumed from the one-node checkpoint {STOP_AT}: losses "
          f"{STOP_AT + 1}-{STEPS} = one node's (largest relative difference {worst:.1e})")


def _ssh_ready() -> str:
    """'' when ssh to 127.0.0.1 works without a password (scripts/multinode_ssh.sh sets it up), else why not."""
    script = ROOT / "scripts" / "multinode_ssh.sh"
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600)
    return "" if r.returncode == 0 else (r.stdout + r.stderr).strip().splitlines()[-1:][0] if (r.stdout + r.stderr
                                                                                                ).strip() else "failed"


@slow
def test_deepspeed_multinode_launcher_over_ssh_same_losses(golden, one_node, tmp_path):
    why = _ssh_ready()
    if why:
        pytest.skip(f"no sshd on 127.0.0.1 ({why})")
    ref, expected = one_node
    out = tmp_path / "run"
    argv = _argv(golden, out, "--nproc", "1", "--hostfile", str(_hostfile(tmp_path)), "--master-addr", "127.0.0.1",
                 "--master-port", str(free_port()), "--steps-this-run", str(STOP_AT))
    _run_nodes([argv], [tmp_path / "node.log"], out)
    got = _losses(out)
    assert got[1] == expected[1]
    worst = _same(got, expected, range(1, STOP_AT + 1))
    assert not _training_pids(out)
    print(f"\nDeepSpeed over ssh (pdsh), 2 nodes x 1 rank: losses 1-{STOP_AT} = one node's ({worst:.1e})")


@slow
@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_one_node_killed_the_other_exits_within_60_s_nothing_left(golden, tmp_path, launcher):
    out = tmp_path / "run"
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    argvs = _nodes(golden, out, launcher, hostfile=_hostfile(tmp_path) if launcher == "deepspeed" else None)
    argvs = [[*a[:a.index("--max-steps") + 1], "400", *a[a.index("--max-steps") + 2:]] for a in argvs]
    procs = [_start(a, log) for a, log in zip(argvs, logs, strict=True)]
    try:
        deadline = time.monotonic() + 1500
        while not (out / "metrics.jsonl").is_file() or max(_losses(out), default=0) < 2:
            if any(p.poll() is not None for p in procs) or time.monotonic() > deadline:
                pytest.fail("the two-node run never got to step 2:\n" + "\n".join(
                    log.read_text()[-2500:] for log in logs))
            time.sleep(0.2)
        # node 1 dies: its command, launcher and rank at once (listed first: a killed parent's children move)
        victim = psutil.Process(procs[1].pid)
        tree = [victim, *victim.children(recursive=True)]
        for p in tree:
            p.send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        procs[0].wait(timeout=120)
        took = time.monotonic() - t0
        time.sleep(1)
        left = _training_pids(out)
    finally:
        _kill_all(procs, out)
    text = logs[0].read_text()
    assert took < 60, (took, text[-3000:])
    assert procs[0].returncode != 0, text[-3000:]
    errors = [ln for ln in text.splitlines() if "error" in ln.lower() or "Traceback" in ln]
    assert len(errors) == 1 and "lost contact with another rank" in errors[0], text[-3000:]
    assert not left, f"left running: {[' '.join(psutil.Process(p).cmdline()) for p in left if psutil.pid_exists(p)]}"
    print(f"\n{launcher}: node 1 killed; node 0's command exited {took:.1f} s later (exit {procs[0].returncode}): "
          f"{errors[0]}")


# --- fast: the commands each node runs, and the refusals ------------------------------------------------------

def test_each_nodes_command(golden, tmp_path):
    from pretrain.launch import build_command, rdzv_id_for
    from pretrain.train_config import TrainConfig

    cfg = TrainConfig(train_dir=str(golden / "4bins"), output_dir=str(tmp_path / "o"), model="tiny")
    ds = build_command(cfg, 8, hostfile="hosts", num_nodes=2, master_addr="10.0.0.1", master_port=2222, node_rank=1)
    assert ds[1:13] == ["--hostfile", "hosts", "--num_nodes", "2", "--num_gpus", "8", "--no_ssh", "--node_rank", "1",
                        "--master_addr", "10.0.0.1", "--master_port"]
    tr = build_command(cfg, 8, launcher="torchrun", num_nodes=2, master_addr="10.0.0.1", node_rank=0)
    assert tr[1:11] == ["--nproc_per_node", "8", "--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                        "10.0.0.1:29500", "--rdzv-id", rdzv_id_for(tmp_path / "o")]
    assert rdzv_id_for(tmp_path / "o") == rdzv_id_for(str(tmp_path / "x" / ".." / "o"))


@pytest.mark.parametrize(("flags", "says"), [
    (["--launcher", "torchrun", "--num-nodes", "2"], "torchrun on several nodes: run `bertpipe train"),
    (["--num-nodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1"], "needs --hostfile"),
    (["--num-nodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1", "--launcher", "torchrun"], "0 <= K < N"),
    (["--num-nodes", "2", "--node-rank", "1", "--launcher", "torchrun"], "--node-rank needs --master-addr"),
])
def test_a_set_up_the_launchers_would_fail_on_is_refused_in_one_line(golden, tmp_path, capsys, flags, says):
    from bertpipe.cli import main

    rc = main(["train", "--train-dir", str(golden / "4bins"), "--output-dir", str(tmp_path / "o"), "--model", "tiny",
               "--device", "cpu", "--dry-run", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and says in err[0], err


def test_over_ssh_every_node_gets_the_device_threads_and_owner(tmp_path, monkeypatch):
    from pretrain.launch import ds_env_file

    home = tmp_path / "home"
    home.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_SOCKET_IFNAME=eth0\nDS_ACCELERATOR=hpu\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    path = ds_env_file(tmp_path / "out", {"DS_ACCELERATOR": "cpu", "BERTPIPE_TRAIN_OWNER": "1:2:h"})
    assert path == (tmp_path / "out" / ".deepspeed_env").resolve()
    assert path.read_text() == "NCCL_SOCKET_IFNAME=eth0\nDS_ACCELERATOR=cpu\nBERTPIPE_TRAIN_OWNER=1:2:h\n"
