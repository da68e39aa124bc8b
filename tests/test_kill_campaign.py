"""bench/kill_campaign.py: its plan covers every stage and manifest writes (fast), and a reduced campaign of
4 killed-and-resumed `bertpipe run`s on the built-in sample passes (slow: about a minute and a half)."""

from __future__ import annotations

import importlib.util
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "kill_campaign.py"


def _campaign():
    spec = importlib.util.spec_from_file_location("kill_campaign", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("kill_campaign", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_plan_of_20_trials_hits_every_stage_both_ways_and_manifest_writes() -> None:
    kc = _campaign()
    files = dict.fromkeys(kc.STAGES, 1) | {"bins": 8, "text": 3}
    ref = kc.Reference({}, [], files, dict.fromkeys(kc.STAGES, 0.1), 1.0)
    trials = kc.plan(20, random.Random(1), ref)
    hooks = [t for t in trials if t.mode == "hook"]
    watches = [t for t in trials if t.mode == "watch"]
    assert sorted(t.stage for t in hooks) == sorted(kc.STAGES) == sorted(t.stage for t in watches)
    # the stages the campaign's command runs (the default target): no stage of another target, every stage of it
    assert {"download", "extract", "text", "tfrecord", "bins", "eval_hdf5"} <= set(kc.STAGES)
    assert not any(s.startswith(("nvidia", "habana")) for s in kc.STAGES)
    assert sum(t.point == "manifest" for t in hooks) >= 3
    assert {t.point for t in hooks} == {"start", "rename", "file", "manifest", "done"}
    assert all(1 <= t.n <= files[t.stage] for t in hooks)
    assert not any(t.stage == "download" and t.point == "rename" for t in hooks)
    assert all(0 <= t.delay <= 0.2 for t in watches)


@pytest.mark.slow
def test_reduced_kill_campaign(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--trials", "4", "--seed", "11", "--work-root",
                        str(tmp_path / "k")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    m = re.search(r"trials (\d+) \| killed (\d+) \| kills during a manifest write (\d+) \| failures (\d+)", r.stdout)
    assert m, r.stdout
    trials, killed, _, failures = map(int, m.groups())
    assert (trials, failures) == (4, 0)
    assert killed >= 2, r.stdout  # the two hook trials kill for sure; a watch kill may come after the run ended
    assert r.stdout.count(" ok\n") + r.stdout.count(" ok (") >= 4
