"""Kill campaign: `bertpipe run` on the built-in sample, kill -9'd at random moments, re-run, compared.

  .venv/bin/python bench/kill_campaign.py [--trials 20] [--seed 1] [--work-root DIR] [--keep]

1. One uninterrupted run gives the reference: the md5 of every final artifact (every file of every stage
   directory but the manifests) and each stage's file count and duration.
2. Each trial runs the same command in a fresh work dir, in its own session, and SIGKILLs the whole
   process group at a moment chosen by stage, alternating two ways:
   * hook: ``BERTPIPE_FAULT=STAGE:POINT:N:pg`` (core/manifest.py) makes the stage kill the
     group itself at a named point: start, rename (an output complete under its temporary name), file
     (after the N-th output), manifest (the manifest written under its temporary name, not renamed),
     done (after the rename). Stages are cycled so that every stage is hit; a third of the points are
     manifest writes;
   * watch: this script waits for the stage's directory to appear, sleeps a random part of the stage's
     reference duration and kills the group (``kill -9 -PGID``) from outside.
3. Checks after the kill: the group and every process the run started are gone (the run's reaper stops
   those outside the group), and no ``_manifest.json`` in the work dir fails to verify.
4. The same command again, without the hook (same work dir: it resumes). Checks: exit 0; every final
   artifact byte-identical to the reference, none missing, none extra; every stage directory has a
   manifest and it verifies (md5s re-hashed); no temporary debris; every stage directory the run used
   is inside its work dir. All runs share one PREFECT_HOME, whose records are keyed by content; the
   reference's work dir (and each passing trial's) is deleted once done, so a run that still read
   from another work dir would fail.

Printed: one line per trial, then kills per stage (by hook and by watch, and how many caught a manifest
write), failures and wall time. Exit status 1 if any trial failed. Passing trials' work dirs are deleted
unless --keep; failing ones are kept under --work-root (default: a temporary folder) for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.errors import BertpipeError  # noqa: E402
from core.manifest import FAULT_ENV, MANIFEST_NAME, load_manifest, md5_file, verify_manifest  # noqa: E402
from preprocessing import registry  # noqa: E402
from preprocessing.params import DataParams  # noqa: E402
from tasks.workdir import scan  # noqa: E402

BERTPIPE = str(Path(sys.executable).parent / "bertpipe")
#: Small enough for seconds per run, the same for the reference and every killed run and re-run. Two
#: workers: shard calls go to the spawned worker pool, so kills also hit worker processes.
FLAGS = ["--dupe-factor", "1", "--n-output-shards", "2", "--num-examples-to-pick", "50", "--workers", "2", "-q"]
#: Data DAG stages of the sample run (bertpipe run's defaults: the sample dump, --target samsung-4bins), in order.
STAGES = tuple(dict.fromkeys(s.name for s in registry.active(DataParams())))
#: Hook points, cycled over the hook trials: a third of them kill during a manifest write.
POINT_CYCLE = ("manifest", "file", "rename", "manifest", "start", "done")
TOP_FILES = {"last_run.json", "run_config.json"}  # run summaries, not stage artifacts


@dataclass
class Reference:
    md5s: dict[str, str]  # artifact path (relative to the work dir) -> md5
    manifests: list[str]  # stage directories (relative) holding a manifest
    files: dict[str, int]  # stage -> fewest output files of one of its directories
    seconds: dict[str, float]  # stage -> longest time one of its directories took
    wall: float


@dataclass
class Trial:
    index: int
    mode: str  # hook | watch
    stage: str
    point: str = ""
    n: int = 1
    delay: float = 0.0  # watch: seconds after the stage directory appeared
    killed: bool = False
    observed: list[str] = field(default_factory=list)  # stage dirs without a manifest at the kill
    done_at_kill: int = 0  # stage directories with a manifest at the kill
    manifest_write: bool = False
    seconds: float = 0.0
    rerun_s: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"{self.stage}:{self.point}:{self.n}" if self.mode == "hook" else f"{self.stage}+{self.delay:.3f}s"


# -- the work dir --------------------------------------------------------------------------------
def unfinished(work: Path) -> list[str]:
    """Stage (or shard) directories without a manifest: the stages a kill interrupted."""
    return [e.path for e in scan(work) if e.state == "incomplete"] if work.exists() else []


def artifacts(work: Path) -> dict[str, str]:
    """Every final artifact: files under the stage directories, manifests and temporary files excluded."""
    return {p.relative_to(work).as_posix(): md5_file(p) for p in sorted(work.rglob("*"))
            if p.is_file() and p.name != MANIFEST_NAME and not p.name.startswith(".") and p.parent != work
            and not p.relative_to(work).parts[0].startswith(".")}


def manifest_dirs(work: Path) -> list[str]:
    return sorted(p.parent.relative_to(work).as_posix() for p in work.rglob(MANIFEST_NAME)
                  if not p.relative_to(work).parts[0].startswith("."))


def lying_manifests(work: Path) -> list[str]:
    """Stage directories whose _manifest.json does not verify (file missing, size or md5 wrong)."""
    bad = []
    for rel in manifest_dirs(work):
        try:
            verify_manifest(work / rel)
        except BertpipeError as exc:
            bad.append(f"{rel}: {exc}")
    return bad


def debris(work: Path) -> list[str]:
    return sorted(p.relative_to(work).as_posix() for p in work.rglob(".*.tmp-*")
                  if not p.relative_to(work).parts[0].startswith("."))


# -- processes -----------------------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgid, state) of every process (Linux /proc)."""
    table = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = stat.read_text().rsplit(")", 1)[1].split()
            table[int(stat.parent.name)] = (int(f[1]), int(f[2]), f[0])
        except (OSError, IndexError, ValueError):
            continue
    return table


def descendants(pid: int) -> set[int]:
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for p, (pp, _, _) in table.items():
        kids.setdefault(pp, []).append(p)
    seen, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def alive(pids: set[int], pgid: int) -> list[str]:
    """Live (non-zombie) processes among ``pids`` or in group ``pgid``, with their command lines."""
    out = []
    for p, (_, g, state) in _proc_table().items():
        if state != "Z" and (p in pids or g == pgid):
            try:
                cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
            except OSError:
                cmd = "?"
            out.append(f"{p} {cmd}")
    return out


def base_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, "PREFECT_API_URL", "BERTPIPE_RUN_TOKEN")}
    env.update(PREFECT_HOME=str(root / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               BERTPIPE_PROGRESS="0", PYTHONUNBUFFERED="1")
    return env


def command(work: Path) -> list[str]:
    return [BERTPIPE, "run", "--work-dir", str(work), *FLAGS]


# -- reference -----------------------------------------------------------------------------------
def reference_run(root: Path, env: dict[str, str], keep: bool) -> Reference:
    """The uninterrupted run. Its work dir is deleted afterwards (unless ``keep``): Prefect's records of it
    stay in PREFECT_HOME, and a trial that still read from it would fail."""
    work = root / "reference"
    t0 = time.perf_counter()
    r = subprocess.run(command(work), env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"the reference run failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    files: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for rel in manifest_dirs(work):
        m = load_manifest(work / rel)
        stage = rel.split("/")[0]
        files[stage] = min(files.get(stage, 1 << 30), len(m.files))
        seconds[stage] = max(seconds.get(stage, 0.0), m.seconds)
    missing = [s for s in STAGES if s not in files]
    if missing:
        raise SystemExit(f"the reference run has no output for stage(s) {missing}")
    ref = Reference(artifacts(work), manifest_dirs(work), files, seconds, wall)
    if not keep:
        shutil.rmtree(work)
    return ref


# -- one trial -------------------------------------------------------------------------------------
def plan(trials: int, rng: random.Random, ref: Reference) -> list[Trial]:
    """Alternate hook and watch trials; each mode cycles through every stage (a new shuffle per cycle)."""
    cycles: dict[str, list[str]] = {"hook": [], "watch": []}
    out = []
    for i in range(trials):
        mode = "hook" if i % 2 == 0 else "watch"
        if not cycles[mode]:
            cycles[mode] = rng.sample(STAGES, len(STAGES))
        stage = cycles[mode].pop()
        t = Trial(i + 1, mode, stage)
        if mode == "hook":
            t.point = POINT_CYCLE[(i // 2) % len(POINT_CYCLE)]
            if t.point == "rename" and stage == "download":
                t.point = "file"  # download renames its .part file itself, not through StageOutput
            if t.point in ("rename", "file"):
                t.n = rng.randint(1, ref.files[stage])
        else:
            t.delay = rng.uniform(0.0, ref.seconds[stage] + 0.005)
        out.append(t)
    return out


def _kill_phase(t: Trial, work: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    env = dict(env)
    if t.mode == "hook":
        env[FAULT_ENV] = f"{t.stage}:{t.point}:{t.n}:pg"
    with open(log, "w") as out:
        proc = subprocess.Popen(command(work), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    family: set[int] = set()
    deadline = time.monotonic() + 600
    appeared = None
    last_scan = 0.0
    while proc.poll() is None and time.monotonic() < deadline:
        now = time.monotonic()
        if now - last_scan > 0.2 and appeared is None:  # (a /proc scan takes ms: none once the stage is on)
            family |= descendants(proc.pid)
            last_scan = now
        if t.mode == "watch":
            if appeared is None and (work / t.stage).exists():
                appeared = now
            if appeared is not None and now - appeared >= t.delay:
                family |= descendants(proc.pid)
                os.killpg(proc.pid, signal.SIGKILL)
                break
        time.sleep(0.002 if t.mode == "watch" else 0.02)
    if proc.poll() is None and time.monotonic() >= deadline:
        os.killpg(proc.pid, signal.SIGKILL)
        t.failures.append("the killed run did not end within 600 s")
    proc.wait()
    proc.family = family  # type: ignore[attr-defined]
    return proc


def run_trial(t: Trial, root: Path, env: dict[str, str], ref: Reference) -> None:
    tdir = root / f"trial-{t.index:02d}"
    work, log = tdir / "w", tdir / "killed.log"
    tdir.mkdir(parents=True)
    t0 = time.perf_counter()
    proc = _kill_phase(t, work, env, log)
    t.killed = proc.returncode == -signal.SIGKILL
    if proc.returncode == 0 and t.mode == "hook":
        t.failures.append(f"the hook {FAULT_ENV}={t.stage}:{t.point}:{t.n}:pg never fired (exit 0)")
    elif not t.killed and proc.returncode != 0:
        t.failures.append(f"the run failed by itself (exit {proc.returncode}), see {log}")
    # (a watch trial whose run ended before the kill moment is reported as not killed, not as a failure)
    t.observed = sorted({path.split("/")[0] for path in unfinished(work)})
    t.done_at_kill = len(manifest_dirs(work)) if work.exists() else 0
    t.manifest_write = (t.mode == "hook" and t.point == "manifest") or bool(list(work.rglob(f".{MANIFEST_NAME}.tmp-*")))
    deadline = time.monotonic() + 15  # the run's reaper polls every second
    while (left := alive(proc.family, proc.pid)) and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.2)
    if left:
        t.failures.append(f"processes of the killed run survived: {left}")
    if work.exists():
        t.failures += [f"after the kill, a manifest does not verify: {b}" for b in lying_manifests(work)]

    t1 = time.perf_counter()
    r = subprocess.run(command(work), env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    t.rerun_s = time.perf_counter() - t1
    (tdir / "rerun.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        t.failures.append(f"the re-run failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    else:
        got = artifacts(work)
        for name in sorted(ref.md5s.keys() | got.keys()):
            if name not in got:
                t.failures.append(f"missing after the re-run: {name}")
            elif name not in ref.md5s:
                t.failures.append(f"not in the reference: {name}")
            elif got[name] != ref.md5s[name]:
                t.failures.append(f"differs from the reference: {name} ({got[name]} != {ref.md5s[name]})")
        t.failures += [f"after the re-run, a manifest does not verify: {b}" for b in lying_manifests(work)]
        if manifest_dirs(work) != ref.manifests:
            t.failures.append(f"stage directories with a manifest differ: {sorted(set(manifest_dirs(work)) ^ set(ref.manifests))}")
        undone = unfinished(work)
        if undone:
            t.failures.append(f"stage directories left without a manifest: {undone}")
        if debris(work):
            t.failures.append(f"temporary debris left: {debris(work)}")
        summary = json.loads((work / "last_run.json").read_text(encoding="utf-8"))
        elsewhere = [s["dir"] for s in summary["stages"].values() if not s["dir"].startswith(f"{work}/")]
        if elsewhere:
            t.failures.append(f"the re-run used stage directories outside its work dir: {elsewhere}")
    t.seconds = time.perf_counter() - t0


# -- report --------------------------------------------------------------------------------------
def report(trials: list[Trial], ref: Reference, wall: float, root: Path, out=None) -> int:
    out = out or sys.stdout
    print(f"\n{'trial':>5}  {'mode':<5}  {'target':<26} {'killed':<6} {'in progress at the kill':<28} "
          f"{'mfw':<3} {'rerun s':>7}  result", file=out)
    for t in trials:
        res = "ok" if not t.failures else "FAIL: " + "; ".join(t.failures)[:300]
        print(f"{t.index:>5}  {t.mode:<5}  {t.target:<26} {'yes' if t.killed else 'no':<6} "
              f"{','.join(t.observed) or '-':<28} {'yes' if t.manifest_write else '-':<3} {t.rerun_s:>7.1f}  {res}",
              file=out)
    rows: dict[str, list[int]] = {s: [0, 0, 0] for s in STAGES}
    other = {"(before the first stage)": [0, 0, 0], "(between stages)": [0, 0, 0]}
    for t in trials:
        if not t.killed:
            continue
        col = 0 if t.mode == "hook" else 1
        if t.mode == "hook":
            names = [t.stage]
        elif t.observed:
            names = t.observed
        else:
            names = ["(between stages)" if t.done_at_kill else "(before the first stage)"]
        for name in names:
            row = rows.get(name) or other[name]
            row[col] += 1
            row[2] += t.manifest_write
    print(f"\n{'kills per stage':<26} {'hook':>5} {'watch':>6} {'during a manifest write':>24}", file=out)
    for name, (h, w, m) in [*rows.items(), *other.items()]:
        print(f"{name:<26} {h:>5} {w:>6} {m:>24}", file=out)
    killed = sum(t.killed for t in trials)
    mfw = sum(t.manifest_write for t in trials if t.killed)
    failed = [t for t in trials if t.failures]
    uncovered = [s for s, (h, w, _) in rows.items() if h + w == 0]
    if len(trials) >= 2 * len(STAGES) and uncovered:
        failed.append(Trial(0, "-", "-", failures=[f"stages never killed: {uncovered}"]))
        print(f"coverage: stages never killed: {uncovered}", file=out)
    print(f"\ntrials {len(trials)} | killed {killed} | kills during a manifest write {mfw} | failures {len(failed)} | "
          f"wall {wall:.1f} s (reference run {ref.wall:.1f} s; {len(ref.md5s)} artifacts in "
          f"{len(ref.manifests)} stage directories) | work root {root}", file=out)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="kill_campaign.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=20, help="killed runs (default 20; >= 20 covers every stage twice)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the stage order, points and delays (default 1)")
    ap.add_argument("--work-root", type=Path, help="folder for the reference, the trials and PREFECT_HOME "
                    "(default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the work dirs of passing trials too")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error("--trials must be at least 1")
    if not Path("/proc/self/stat").exists():
        ap.error("needs Linux (/proc) to follow the run's processes")
    root = Path(args.work_root or tempfile.mkdtemp(prefix="bertpipe-kills-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    if any(root.glob("trial-*")) or (root / "reference").exists():
        ap.error(f"--work-root {root} already holds a campaign; choose an empty folder")
    env = base_env(root)
    t0 = time.perf_counter()
    print(f"kill campaign: {args.trials} trials, seed {args.seed}, `bertpipe run {' '.join(FLAGS)}` on the "
          f"built-in sample, work root {root}", flush=True)
    ref = reference_run(root, env, args.keep)
    print(f"reference run: {ref.wall:.1f} s, {len(ref.md5s)} artifacts", flush=True)
    trials = plan(args.trials, random.Random(args.seed), ref)
    for t in trials:
        run_trial(t, root, env, ref)
        print(f"  trial {t.index:>2}/{len(trials)} {t.mode:<5} {t.target:<26} "
              f"{'ok' if not t.failures else 'FAIL'} ({t.seconds:.1f} s)", flush=True)
        if not t.failures and not args.keep:
            shutil.rmtree(root / f"trial-{t.index:02d}", ignore_errors=True)
    rc = report(trials, ref, time.perf_counter() - t0, root)
    if rc == 0 and not args.keep and args.work_root is None:
        shutil.rmtree(root, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
