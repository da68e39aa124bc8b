"""The launcher's console: quiet by default (whole output in launcher.log), everything with -v."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import pretrain.launch as launch_mod
from pretrain.launch import LAUNCHER_LOG, console_line, launch
from pretrain.train_config import TrainConfig

CHATTY = r"""
import sys
print("[2026-11-25 07:59:45,159] [WARNING] [runner.py:214:fetch_hostfile] Unable to find hostfile", flush=True)
print("[2026-11-25 07:59:49,433] [INFO] [launch.py:152:main] WORLD INFO DICT: {'localhost': [0, 1]}", flush=True)
print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully", flush=True)
print("  return func(*args, **kwargs)", file=sys.stderr, flush=True)
for k in range(1, 41):
    print(f"08:00:0{k % 10} [rank0] INFO pretrain.train: step {k}/40: loss 6.4 lr 0.05 30.0 seq/s", file=sys.stderr,
          flush=True)
print("08:00:26 [rank0] INFO pretrain.train: step 40: eval masked-LM accuracy 0.0625 (target 0.720)",
      file=sys.stderr, flush=True)
print("08:00:27 [rank1] WARNING pretrain.train: --init-checkpoint x ignored", file=sys.stderr, flush=True)
print('SUMMARY {"steps": 40}', flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def fake_launcher(monkeypatch, tmp_path):
    """A "launcher" that writes what DeepSpeed's launcher and two ranks write, then exits with ``.rc``."""
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)

    def build(cfg, nproc, **kw):
        return [sys.executable, str(script), str(build.rc)]

    build.rc = 0
    monkeypatch.setattr(launch_mod, "build_command", build)
    monkeypatch.delenv(launch_mod.VERBOSE_ENV, raising=False)
    return build


def _cfg(tmp_path: Path) -> TrainConfig:
    return TrainConfig(train_dir=str(tmp_path), output_dir=str(tmp_path / "out"), device="cpu")


def test_console_lines() -> None:
    steps = [k for k in range(1, 41) if console_line(f"08:00 [rank0] INFO pretrain.train: step {k}/40: loss 1")]
    assert steps == [1, 10, 20, 30, 40]
    assert console_line("08:00 [rank1] ERROR pretrain.train: boom")
    assert console_line("pretrain/train.py [rank 0]: error: --train-dir x: no shards")
    assert not console_line("[2026-11-25 07:59:49,433] [INFO] [launch.py:170:main] dist_world_size=2")
    assert console_line("08:00 [rank0] INFO pretrain.data: data: 57 micro-batches per epoch per rank")
    assert not console_line("08:00 [rank0] INFO torch.distributed: something")
    assert not console_line("/x/c10d_logger.py:83: FutureWarning: `all_gather_into_tensor` is deprecated.")


def test_quiet_by_default_everything_in_the_log(fake_launcher, tmp_path, capfd) -> None:
    assert launch(_cfg(tmp_path), 2, check=False) == 0
    out, err = capfd.readouterr()
    shown = (out + err).splitlines()
    # recipe, command, log path; 5 step lines; eval result, rank warning
    assert len(shown) == 3 + 5 + 2, shown
    assert shown[0].startswith("recipe: lans lr ") and "warm-up" in shown[0], shown[0]
    assert "ignored" in err and "eval masked-LM accuracy" in err and "SUMMARY" not in out + err
    assert "Unable to find hostfile" not in out + err and "Traceback" not in out + err
    log = (tmp_path / "out" / LAUNCHER_LOG).read_text()
    assert "Unable to find hostfile" in log and "step 17/40" in log and 'SUMMARY {"steps": 40}' in log


def test_a_failed_launch_shows_the_last_lines(fake_launcher, tmp_path, capfd) -> None:
    fake_launcher.rc = 3
    assert launch(_cfg(tmp_path), 2, check=False) == 3
    err = capfd.readouterr().err
    assert f"training failed (exit status 3); the last lines of {tmp_path / 'out' / LAUNCHER_LOG}:" in err
    assert '  SUMMARY {"steps": 40}' in err


def test_verbose_shows_everything(fake_launcher, tmp_path, capfd, monkeypatch) -> None:
    monkeypatch.setenv(launch_mod.VERBOSE_ENV, "1")
    assert launch(_cfg(tmp_path), 2, check=False) == 0
    out, err = capfd.readouterr()
    assert "Unable to find hostfile" in out and "step 17/40" in err and "SUMMARY" in out
    assert not (tmp_path / "out" / LAUNCHER_LOG).exists()


def test_a_callback_gets_every_line_and_the_log_too(fake_launcher, tmp_path, capfd) -> None:
    lines: list[str] = []
    assert launch(_cfg(tmp_path), 2, check=False, on_output=lines.append) == 0
    assert capfd.readouterr().out == ""
    # the recipe and the command, then every line
    assert len(lines) == 2 + 47 and "step 17/40" in "\n".join(lines) and lines[0].startswith("recipe: ")
    assert (tmp_path / "out" / LAUNCHER_LOG).read_text().splitlines()[1:] == lines[2:]
