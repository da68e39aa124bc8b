"""The whole MLPerf job at its real shape: 500 part files, 2,048 shards per bin, 10,000 eval picks.

  .venv/bin/python bench/bench_scale.py                       # 500 parts of 60 lines, eval.txt ~3.7 MB
  .venv/bin/python bench/bench_scale.py --part-mb 1 --parts 500 --workers 16
  .venv/bin/python bench/bench_scale.py --real-part-only      # just the one 27 MB part through cpd/hdf5/bins
  .venv/bin/python bench/bench_scale.py --keep-work DIR       # keep the corpus and the work dir

1. **Corpus**: ``--parts`` part files ``part-XXXXX-of-00500`` and an ``eval.txt``, made deterministically of whole
   documents of ``../shared/data/mlperf_sample`` (MLCommons' sample text; the built-in sample's text when that
   folder is absent), taken in order and round the sample again: each part gets ``--part-lines`` lines
   (default 60, the issue's small parts) or ``--part-mb`` MB (up to 27, a real MLPerf part); ``eval.txt`` gets
   ``--eval-mb`` MB (default 3.7: more than 10,000 eval instances, as MLPerf's).
2. **The run**: ``bertpipe run --text-dir CORPUS --vocab VOCAB --n-output-shards 2048 --workers W`` in a fresh
   work dir and PREFECT_HOME (a temporary Prefect server, as a new user gets). While it runs, every process of
   its tree is sampled (``/proc/PID/status`` VmHWM: each process's own peak RSS). Printed per stage: wall time
   (from its manifests: first start to last finish), work (core-seconds summed over its calls) and throughput
   (MB of text per second of wall), bytes on disk, Prefect task runs; then the run's wall, the orchestration
   overhead (wall minus work / W) per task run, and the peak RSS of every process.
3. **One real-size part** (``--real-mb``, default 27 MB, built the same way) through
   ``create-pretraining-data`` -> ``tfrecord-to-hdf5`` (the CLI, one process each, one core), through the DAG's
   fused tfrecord+hdf5 call alone (one process, the stage functions with their manifests and md5s), and through
   the bins stage's own work (``run_split_4bins`` in one process, inputs checked by stat as the DAG does:
   2,048 shards per bin with 1 and with 2 workers, and 8 shards per bin): seconds, CPU seconds, peak RSS and
   output bytes, and the seconds the split spent on its shards' md5s.
   The same part also goes through ``bertpipe run --n-output-shards 8 --workers 1``: each stage's work as the DAG
   does it (manifests, md5s and input checks included). There part i's TFRecord and padded HDF5 are written by
   one fused call (the C engine fills the HDF5 rows from the instances it wrote: no second parse), whose time
   the run's table splits evenly between ``tfrecord`` and ``hdf5``; the separate CLI steps above still parse.
4. **Projection** to the full MLPerf set (500 x 27 MB = 13.5 GB of text) from step 3: per-part work x 500, plus
   the 8,192 bin files once (the 2,048- minus the 8-shard split), in core-hours: from the CPU time (user + system)
   of the one-process steps (the fused tfrecord+hdf5 call, the 8-shard split with its md5s counted at the speed
   of the 2,048-shard split's, many files a call side by side, as at full size), and from the DAG's stage seconds
   (wall: on a loaded machine or a slow disk these run higher); wall at 2, 16 and 64 cores from the CPU figures
   (every stage's calls run side by side; the eval chain runs beside the parts).

5. **The other targets' stages** (``bertpipe run --target``), each in one process on the same part's padded HDF5
   (``--target-stages``, on by default; ``--targets-only`` skips steps 2-4 but for the part's HDF5): NVIDIA's chop
   into variable-length shards (nvidia_4320: this part's share of the 4,320 shards, ~5: nvidia-varlength's), the
   shuffle of those rows straight from the padded part (nvidia_4320_shuffled: nvidia-4320's), the same into the
   part's share of v1.1's 2,048 shards (nvidia_2048_shuffled: nvidia-2048's), the variable-length eval pick
   (nvidia_eval, 10,000 rows), pack-nvidia (nvidia_packed, ~5 of the 4,320 packed shards, in one call as at full
   size a call writes ~29) and pack-habana (habana_packed): CPU seconds (stage work, md5s and manifests included), with the packers' recipe (``packing_recipe``: the
   strategies and SciPy's NNLS, one solve a round; it depends on the lengths' histogram, not the row count) timed
   apart, and the NNLS within it. Projected per target: the per-row work scaled to the full set plus the recipe
   once, by rows (an upper bound: this part's sequences average ~400 tokens, the full set's ~256) and by tokens (a
   lower bound), added to the full set's 4-bin figure, and against it for a run of the target alone (no bins).
   ``--targets-only --target-short-seq-prob 1.0`` makes the part with rows of about the full set's mean length
   (~256 tokens; MLPerf's 0.1 gives the sample text ~400), where the two projections nearly agree.
   Each stage's **floor** beside it: the CPU of moving its bytes and nothing else, in a child timed as the stage
   (its inputs read into one buffer, files of its output files' sizes written and hashed all at once by
   core.manifest's md5), printed as the stage's multiple of it and projected per target as the stage is: what no
   code that reads the same inputs and writes and hashes the same files goes under. ``--base TREE`` (an earlier
   commit's worktree, its C extensions built) runs each stage again with that tree's code just after this tree's:
   its CPU against this tree's, and every output file compared byte for byte. ``--repeat N`` runs each stage N
   times, the stages in turn (run 1 of each, then run 2 of each, ...): every run's CPU is printed, their bytes
   compared, and the run of median CPU is the one reported and projected (a single run moves by up to a third
   with the machine's memory state). The shuffles' scratch is as a full-size run has it (``--scratch full-size``,
   the default): past the page cache where the full set's (~160 GB: 40 G tokens of 3 bytes and 157 M rows of ~40
   masked positions of 4) exceeds half the memory; ``--scratch auto`` lets this part's own size decide (through
   the page cache).
   With the real part (not ``--targets-only``), the DAG's run of its copies goes again with every other target added
   (``--target ... --nvidia-shards N``: their share of the full set's 4,320 shards, so shards of about the full
   set's rows): only the target stages run (the rest is taken from its manifests), and each prints its seconds as
   the DAG took them (CPU, waits for a core, blocked), the packers' recipe apart (from their log), projected per
   target beside the CPU figures ("from the DAG's stage seconds").

**Steady state** (``--steady``): each target stage's 1-worker run is timed as the second run of the stage in its
process, after an untimed first: the arrays a worker keeps from call to call (pack_fast.Space: their fresh pages,
~0.25-1 CPU-s a GB to zero) are made once, as a full-size worker makes them once for hundreds of parts, where the
8-part run would count them 105 times in the projection by rows. Every buffer the first run made is made again
before the timed run (untimed, its pages touched) and kept for it, each step's (each ``process_space`` owner's)
at once: a full-size worker makes its scatter calls' buffers once for hundreds of parts, then its groups' once,
where a second run of a whole stage in one process would make each again (the next step's owner, or pack-nvidia's
``Space.keep_only``, frees the last one's). The peak RSS printed is the first run's: the timed run holds every
step's buffers at once, which no real run does (printed beside it). The first run's extra CPU is printed beside
it ("once a process"); the baseline tree's runs are timed the same way.

**Memory state** (``--memory``): by default (``full``) every timed step starts with the machine's free memory filled
with the clean page cache of a fill file (down to ``--leave-mb``, 1 GB), as a full-size run's earlier outputs fill it
(the full set writes ~935 GB): the kernel then reclaims cache pages for a step's writes and arrays, and kswapd's CPU
during the step (that reclaim, beside it) is counted with the step's CPU. ``--memory free`` times the steps as the
machine is. On a VM whose host takes free memory back (virtio balloon free page reporting), writing 1 GiB to the
page cache costs ~1.0-1.3 system seconds from free memory the host has taken back, ~0.21 right after it was freed
and ~0.23-0.26 with the memory full of page cache (``bench/memory_state.py`` measures the three).

Timings depend on the machine and its load: say which machine and how loaded it was when quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_state import (  # noqa: E402
    FullPageCache,
    balloon_reporting,
    block_device,
    cpu_model,
    disk_io,
    kswapd_cpu,
    machine_busy,
    meminfo,
)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SHARED = ROOT.parent / "shared" / "data"
FULL_PARTS, FULL_PART_MB = 500, 27.15  # MLCommons' results/: 500 parts, 13.5 GB
FULL_ROWS = 156_725_653  # training instances of the full set (NVIDIA's 4,320 shards: 4320 x 36280 - 3947)
#: Their tokens, estimated: NVIDIA's packing of the full set prints an expected speed-up of 1.999 (<= 3 sequences a
#: pack of 512, packing efficiency ~100 %): ~256 tokens a sequence, half the padded rows' 512.
FULL_TOKENS = FULL_ROWS * 256
CORES = (2, 16, 64)


# -- the corpus ------------------------------------------------------------------------------------------
def sample_documents() -> list[list[str]]:
    """Whole documents (lists of sentence lines) of MLCommons' sample text, or of the built-in sample's."""
    src = SHARED / "mlperf_sample" / "part-00000-of-00500"
    if src.is_file():
        text = src.read_text(encoding="utf-8")
    else:  # a clone without ../shared: the built-in sample's articles, one sentence per line
        sys.path.insert(0, str(ROOT))
        from preprocessing.sample.articles import ARTICLES  # type: ignore[attr-defined]

        text = "\n\n".join("\n".join(s.strip() + "." for s in body.split(". ") if s.strip())
                           for _, body in ARTICLES) + "\n"
    docs, cur = [], []
    for line in text.splitlines():
        if line.strip():
            cur.append(line)
        elif cur:
            docs.append(cur)
            cur = []
    if cur:
        docs.append(cur)
    return docs


class DocStream:
    """The sample's documents in order, round and round (deterministic: part i's text never depends on a seed)."""

    def __init__(self, docs: list[list[str]]) -> None:
        self.docs, self.i = docs, 0

    def take(self, *, lines: int = 0, nbytes: int = 0) -> str:
        out: list[str] = []
        got_lines = got_bytes = 0
        while (lines and got_lines < lines) or (nbytes and got_bytes < nbytes):
            doc = self.docs[self.i % len(self.docs)]
            self.i += 1
            if lines:
                doc = doc[:lines - got_lines]
            out.append("\n".join(doc) + "\n")
            got_lines += len(doc)
            got_bytes += sum(len(x.encode()) + 1 for x in doc) + 1
        return "\n".join(out)


def build_corpus(out: Path, parts: int, part_lines: int, part_mb: float, eval_mb: float) -> dict[str, float]:
    """Write ``parts`` part files and eval.txt into ``out``; returns sizes in MB."""
    out.mkdir(parents=True, exist_ok=True)
    stream = DocStream(sample_documents())
    ev = SHARED / "mlperf_sample" / "eval.txt"
    eval_text = ev.read_text(encoding="utf-8") if ev.is_file() else ""
    eval_text = eval_text.rstrip("\n") + "\n\n" if eval_text else ""
    need = int(eval_mb * 1e6) - len(eval_text.encode())
    if need > 0:
        eval_text += stream.take(nbytes=need)
    (out / "eval.txt").write_text(eval_text, encoding="utf-8")
    stream = DocStream(sample_documents())  # parts start at the sample's first document again
    total = 0
    for i in range(parts):
        text = stream.take(nbytes=int(part_mb * 1e6)) if part_mb else stream.take(lines=part_lines)
        (out / f"part-{i:05d}-of-00500").write_text(text, encoding="utf-8")
        total += len(text.encode())
    return {"parts_mb": total / 1e6, "eval_mb": len(eval_text.encode()) / 1e6}


# -- watching a process tree ---------------------------------------------------------------------------------
class TreeWatch:
    """Samples a process tree every ``every_s``: each member's own peak RSS (VmHWM) and its command line."""

    def __init__(self, root_pid: int, every_s: float = 0.1) -> None:
        self.root, self.every = root_pid, every_s
        self.peak: dict[int, tuple[float, str]] = {}
        self.parent: dict[int, int] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def _children(self) -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                kids.setdefault(ppid, []).append(int(d))
        return kids

    def _loop(self) -> None:
        while not self._stop.is_set():
            kids, todo = self._children(), [self.root]
            while todo:
                pid = todo.pop()
                for k in kids.get(pid, []):
                    self.parent[k] = pid
                    todo.append(k)
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                hwm = next((int(x.split()[1]) / 1024 for x in status.splitlines() if x.startswith("VmHWM:")), 0.0)
                if hwm >= self.peak.get(pid, (0.0, ""))[0]:
                    self.peak[pid] = (hwm, cmd.strip())
            self._stop.wait(self.every)

    def report(self) -> list[tuple[float, str]]:
        """(peak MB, what) of every process of the tree but short-lived helpers (under 20 MB: ``sleep``...)."""
        out = []
        for pid, (mb, cmd) in self.peak.items():
            parent_cmd = self.peak.get(self.parent.get(pid, -1), (0.0, ""))[1]
            if mb >= 20:
                out.append((mb, _short(cmd, parent_cmd)))
        return sorted(out, reverse=True)


def _short(cmd: str, parent_cmd: str) -> str:
    if "multiprocessing" in cmd:
        return "pool worker" if "multiprocessing" in parent_cmd else "forkserver"
    if "prefect" in cmd and "server" in cmd or "uvicorn" in cmd:
        return "prefect server (temporary)"
    if "bertpipe" in cmd:
        return "bertpipe run (the flow)"
    return cmd[:60]


#: The memory state the timed steps run in (``--memory``): None (as the machine is), or the page cache kept full.
MEMORY: dict[str, FullPageCache | None] = {"fill": None}
#: kswapd's CPU seconds during the last timed child (the kernel's reclaim for it, beside its own CPU).
KSWAPD = {"last": 0.0}
#: The whole machine's busy core-seconds during the last timed child (memory_state.machine_busy): its own CPU, the
#: kernel's threads beside it (writeback, reclaim), and anything else running.
BUSY = {"last": 0.0}
#: The disk's bytes read and written and its seconds with I/O in flight during the last timed child
#: (memory_state.disk_io; ``DISK["device"]``: the device of the bench's work folder, set by main).
DISK: dict[str, Any] = {"last": (0.0, 0.0, 0.0), "device": None}


def _memory_ready() -> None:
    """Before a timed step: with ``--memory full``, free memory filled again with clean page cache."""
    fill = MEMORY["fill"]
    if fill is not None:
        os.sync()
        fill.top_up()


def run_watched(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, int, TreeWatch]:
    _memory_ready()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        with TreeWatch(p.pid) as watch:
            rc = p.wait()
    return time.perf_counter() - t0, rc, watch


def timed_child(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> tuple[float, float, float]:
    """(seconds, peak RSS MB, CPU seconds) of one subprocess (RSS: its own and its children's largest, wait4's
    ru_maxrss; CPU: user + system, so waits for the disk or for other jobs' cores do not count). The disk is
    synced first: the previous step's written bytes (gigabytes, for the target stages) would otherwise be written
    back while this one runs, and a 2-worker run timed right after its 1-worker run paid for both."""
    os.sync()
    _memory_ready()
    k0, b0, d0 = kswapd_cpu(), machine_busy(), disk_io(DISK["device"])
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read() if p.stdout else b""
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    dt = time.perf_counter() - t0
    KSWAPD["last"], BUSY["last"] = kswapd_cpu() - k0, machine_busy() - b0
    DISK["last"] = tuple(b - a for a, b in zip(d0, disk_io(DISK["device"]), strict=True))
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{out.decode(errors='replace')[-3000:]}")
    return dt, ru.ru_maxrss / 1024, ru.ru_utime + ru.ru_stime


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def breakdown(c: dict[str, float], gzip_cpu: float = 0.0) -> str:
    """One step's costs (core.costs.since, per part): where its CPU seconds went, and its waits."""
    cpu = c["user"] + c["sys"]
    md5 = c.get("md5_cpu", 0.0)
    compute = max(0.0, cpu - md5 - gzip_cpu)
    parts = [f"cpu {cpu:.2f} s = compute {compute:.2f} ({compute / max(cpu, 1e-9):.0%})"]
    if gzip_cpu:
        parts.append(f"compression {gzip_cpu:.2f} ({gzip_cpu / max(cpu, 1e-9):.0%})")
    parts.append(f"md5 {md5:.2f} ({md5 / max(cpu, 1e-9):.0%}, {c.get('md5_bytes', 0) / 1e6 / max(md5, 1e-9):,.0f} MB/s)")
    out = " + ".join(parts) + f"; of the cpu, system {c['sys']:.2f} s (page faults: {c['minflt'] / 1e3:,.0f} k minor, "
    out += f"{c['majflt']:,.0f} major; the kernel's copies into the page cache)"
    if "wall" in c:
        out += f"; wall {c['wall']:.2f} s, of it fsync waits {c.get('fsync_wait', 0.0):.2f} s ({c.get('fsyncs', 0):,.0f})"
    return out


def disk_speed(folder: Path, mb: int = 512) -> float:
    """MB/s of a {mb} MB write and fdatasync into ``folder`` (the disk's own speed: what the fsyncs wait for)."""
    p = folder / ".disk-probe"
    block = os.urandom(1 << 20)
    t = time.perf_counter()
    with open(p, "wb") as f:
        for _ in range(mb):
            f.write(block)
        f.flush()
        os.fdatasync(f.fileno())
    dt = time.perf_counter() - t
    p.unlink()
    return mb * 1.048576 / dt


def disk_ceiling(folder: Path, mb: int = 1024) -> dict[str, float] | None:
    """MB/s the disk under ``folder`` moves past the page cache (``O_DIRECT``, 8 MB requests, two threads, as two
    workers' scratch and shards go): ``write`` (two writers), ``read`` (two readers) and ``mixed`` (one of each,
    reads and writes added). None where the file system refuses ``O_DIRECT``."""
    import mmap

    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    step = 8 << 20
    half = max(1, mb // 2) << 20
    paths = [folder / f".disk-ceiling-{i}" for i in range(3)]

    def write(p: Path, n: int) -> None:
        buf = mmap.mmap(-1, step)
        buf.write(os.urandom(step))
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
        try:
            for _ in range(n // step):
                os.write(fd, buf)
            os.fdatasync(fd)
        finally:
            os.close(fd)
            buf.close()

    def read(p: Path, at: int, n: int) -> None:
        buf = mmap.mmap(-1, step)
        fd = os.open(p, os.O_RDONLY | flag)
        try:
            for off in range(at, at + n, step):
                os.preadv(fd, [buf], off)
        finally:
            os.close(fd)
            buf.close()

    def timed(jobs: list[tuple[Any, tuple]]) -> float:
        threads = [threading.Thread(target=fn, args=a) for fn, a in jobs]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return time.perf_counter() - t

    try:
        write(paths[2], 2 * half)  # what the readers read
    except OSError:
        for p in paths:
            p.unlink(missing_ok=True)
        return None
    try:
        w = timed([(write, (paths[0], half)), (write, (paths[1], half))])
        r = timed([(read, (paths[2], 0, half)), (read, (paths[2], half, half))])
        m = timed([(write, (paths[0], half)), (read, (paths[2], 0, half))])
    finally:
        for p in paths:
            p.unlink(missing_ok=True)
    mbs = 2 * half / 1e6
    return {"write": mbs / w, "read": mbs / r, "mixed": mbs / m}


# -- the DAG run -------------------------------------------------------------------------------------------
def stage_walls(work: Path, summary: dict) -> dict[str, float]:
    """Each stage's wall: from its first call's start (manifest mtime - seconds) to its last manifest."""
    out = {}
    ends: dict[str, float] = {}
    for name, st in summary["stages"].items():
        d = Path(st["dir"])
        mans = list(d.rglob("_manifest.json")) + list(d.parent.glob("*/_manifest.json"))
        mans = [m for m in dict.fromkeys(mans) if m.is_file()]
        if not mans:
            continue
        times = []
        for m in mans:
            try:
                secs = json.loads(m.read_text())["seconds"]
            except (OSError, ValueError, KeyError):
                secs = 0.0
            times.append((m.stat().st_mtime - secs, m.stat().st_mtime))
        ends[name] = max(t[1] for t in times)
        out[name] = (min(t[0] for t in times), ends[name])
    walls = {}
    for name, (start, end) in out.items():
        if name == "bins" and "hdf5" in ends:  # pieces: it starts when the last part's HDF5 is done
            start = ends["hdf5"]
        walls[name] = max(0.0, end - start)
    return walls


def dag_run(args: argparse.Namespace, corpus: Path, work: Path, sizes: dict[str, float]) -> None:
    env = dict(os.environ, PREFECT_HOME=str(work.parent / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW="ignore", DS_ACCELERATOR="cpu")
    env.pop("PREFECT_API_URL", None)
    workers = args.workers or os.cpu_count() or 1
    cmd = [str(BIN / "bertpipe"), "run", "--text-dir", str(corpus), "--vocab", str(args.vocab), "--work-dir",
           str(work), "--n-output-shards", str(args.shards), "--workers", str(workers), "-q"]
    print(f"\n## bertpipe run: {args.parts} parts ({sizes['parts_mb']:.1f} MB) + eval.txt ({sizes['eval_mb']:.2f} MB), "
          f"--n-output-shards {args.shards}, --workers {workers}")
    wall, rc, watch = run_watched(cmd, env, work.parent / "run.log")
    if rc != 0:
        raise SystemExit(f"bertpipe run failed ({rc}); see {work.parent / 'run.log'}:\n"
                         + (work.parent / "run.log").read_text()[-3000:])
    summary = json.loads((work / "last_run.json").read_text())
    walls = stage_walls(work, summary)
    runs = summary.get("task_runs", {})
    runs_of = {s: n for label, n in runs.items() for s in label.split("+")}
    text_mb = sizes["parts_mb"]
    print(f"{'stage':<14}{'calls':>6}{'task runs':>10}{'wall s':>9}{'work s':>9}{'MB/s':>8}{'disk MB':>10}{'files':>8}")
    work_total = 0.0
    sys.path.insert(0, str(ROOT))
    from preprocessing.registry import names

    order = [n for n in names() if n in summary["stages"]]
    for name, st in ((n, summary["stages"][n]) for n in order):
        mb = sizes["eval_mb"] if name.startswith("eval") else text_mb
        w = walls.get(name, 0.0)
        work_total += st["seconds"]
        disk = du(Path(st["dir"])) / 1e6
        print(f"{name:<14}{st['calls']:>6}{runs_of.get(name, 0):>10}{w:>9.2f}{st['seconds']:>9.2f}"
              f"{(mb / w if w else 0):>8.1f}{disk:>10.1f}{st['files']:>8}")
    n_runs = sum(runs.values())
    flow = summary.get("wall_seconds", 0.0)
    in_flow = flow - work_total / workers
    print(f"run wall {wall:.1f} s = start-up and shutdown (interpreter, imports, temporary Prefect server) "
          f"{wall - flow:.1f} s + the flow's DAG {flow:.1f} s; stage work {work_total:.1f} core-s = "
          f"{work_total / workers:.1f} s on {workers} workers; {n_runs} task runs ({runs}); orchestration inside "
          f"the flow {in_flow:.1f} s ({in_flow / max(n_runs, 1) * 1000:.0f} ms per task run)")
    print(f"rows in the bins: {summary['stages'].get('bins', {}).get('rows', '?')}; eval picks: "
          f"{summary['stages'].get('eval_10k', {}).get('picked', '?')}")
    print("peak RSS per process (MB): " + ", ".join(f"{mb:.0f} {what}" for mb, what in watch.report()))


STARTUP = "import bertpipe.cli, h5py, numpy, preprocessing.mlperf.split_4bins, preprocessing.mlperf.create_pretraining_data"

#: Parts through the hdf5 stage's fused call (preprocessing.mlperf.tfrecord_to_hdf5.run_fused), units as the DAG plans
#: them, in one group as a DAG worker runs them (tasks.calls.execute_group: the group's files hashed together): argv =
#: part, vocab, output folder, parts in the group (copies of the part under the names part-0000i-of-00500). The
#: call's own CPU seconds per part (no interpreter start-up: a worker process pays that once, not per part) go to
#: <output folder>/cpu_seconds.txt, its breakdown per part (core.costs: md5s, fsync waits, page faults; wall) to
#: <output folder>/costs.json.
FUSED_CALL = """
import json
import os
import sys
import time
from pathlib import Path
from core import costs
from core.stage import Unit
from preprocessing.mlperf.create_pretraining_data import CreatePretrainingDataConfig, run_create_pretraining_data
from preprocessing.mlperf.tfrecord_to_hdf5 import HDF5Config, run_fused, run_tfrecord_to_hdf5
from tasks.calls import Call, execute_group
part, vocab, out, n = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
cfg = CreatePretrainingDataConfig(vocab_file=vocab, do_lower_case=True, max_seq_length=512, max_predictions_per_seq=76,
                                  dupe_factor=10, masked_lm_prob=0.15, short_seq_prob=0.1, random_seed=12345)
calls = []
for i in range(n):
    text = out / "text" / f"part-{i:05d}-of-00500"
    text.parent.mkdir(parents=True, exist_ok=True)
    os.link(part, text)
    tf_dir = out / "tfrecord" / text.name
    tf = Unit(stage="tfrecord", key="k", shard=text.name, out_dir=str(tf_dir), run=run_create_pretraining_data,
              args=([str(text)],), kwargs={"cfg": cfg, "output_name": text.name})
    h5 = Unit(stage="hdf5", key="k", shard=text.name, out_dir=str(out / "hdf5" / text.name), run=run_tfrecord_to_hdf5,
              args=(str(tf_dir / text.name),), kwargs={"cfg": HDF5Config(), "output_name": text.name + ".hdf5"},
              upstream_dirs=(str(tf_dir),))
    calls.append(Call(units=(tf, h5), fused=run_fused))
c0, t0 = costs.snapshot(), time.perf_counter()
execute_group(calls)
spent = costs.since(c0)
spent["wall"] = time.perf_counter() - t0
(out / "cpu_seconds.txt").write_text(f"{(spent['user'] + spent['sys']) / n:.3f}\\n")
(out / "costs.json").write_text(json.dumps({k: v / n for k, v in spent.items()}))
"""


#: The bins stage's work on the real part's padded HDF5, as the DAG does it (preprocessing.mlperf.split_4bins: counts,
#: then shard groups; inputs checked against their manifest by stat, not re-hashed: no upstream here), in one
#: process with ``workers`` pool workers: argv = HDF5 folder, output folder, shards per bin, workers. Wall and (for
#: 1 worker: a forkserver's workers are not this process's children) CPU seconds go to <output>.seconds.txt.
SPLIT_CALL = """
import resource
import sys
import time
from pathlib import Path
import json
from core import costs
from preprocessing.mlperf.split_4bins import Split4BinsConfig, run_split_4bins
src, out, n, workers = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
costs0 = costs.snapshot()
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
import core.manifest.format as fmt  # the shards' md5s: md5_then_fsync takes them through fmt.md5_files
hashing = [0.0, 0]  # seconds and bytes of the shards' md5s (this process's: 1 worker)
def timed_md5_files(paths, real=fmt.md5_files, **kw):
    paths = list(paths)
    t = time.perf_counter()
    out = real(paths, **kw)
    hashing[0] += time.perf_counter() - t
    hashing[1] += sum(Path(p).stat().st_size for p in paths)
    return out
fmt.md5_files = timed_md5_files
c0, t0 = cpu(), time.perf_counter()
run_split_4bins(sorted(src.glob("part*")), out, Split4BinsConfig(n_output_shards=n), workers=workers,
                manifest_name=f"../{out.name}.manifest.json")
Path(f"{out}.seconds.txt").write_text(f"{time.perf_counter() - t0:.3f} {cpu() - c0:.3f} {hashing[0]:.3f} {hashing[1]}\\n")
Path(f"{out}.costs.json").write_text(json.dumps({**costs.since(costs0), "wall": time.perf_counter() - t0}))
"""

#: The other targets' stages on one part's padded HDF5, in one process each (workers=1: every CPU second is this
#: process's): argv = the part's HDF5, output folder, what. SciPy's NNLS is timed apart (CPU seconds, rounds), and so
#: is the packers' whole recipe (``packing_recipe``: the strategies, the NNLS rounds and their arithmetic, all from the
#: lengths' histogram: once at full size). Writes <output>/<what>.json: {"cpu": s, "nnls_cpu": s, "nnls_rounds": n,
#: "recipe_cpu": s, "rows": n, "bytes": n}.
TARGET_CALL = """
import core  # first, as in every bertpipe process (bertpipe -> core): its settings (one OpenBLAS thread) hold
import json
import os
import resource
import sys
import time
from pathlib import Path
import scipy.optimize
part, out, what = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
workers = int(sys.argv[4]) if len(sys.argv) > 4 else 1
nparts = int(sys.argv[5]) if len(sys.argv) > 5 else 1
tag = sys.argv[6] if len(sys.argv) > 6 else ""  # "base": the baseline tree's run (its code: the cwd)
dest = out / (what if workers == 1 else f"{what}.w{workers}")
if tag:
    dest = dest.with_name(f"{dest.name}.{tag}")
parts = [part]
if nparts > 1:  # the part's HDF5 under nparts names (hard links): a stage's work split over more shards
    import os
    (out / "inputs").mkdir(exist_ok=True)
    parts = [out / "inputs" / f"part-{i:05d}-of-00500.hdf5" for i in range(nparts)]
    for p in parts:
        if not p.exists():
            os.link(part, p)
nnls = [0.0, 0]
real_nnls = scipy.optimize.nnls
def timed_nnls(*a, **k):
    t = time.process_time()
    try:
        return real_nnls(*a, **k)
    finally:
        nnls[0] += time.process_time() - t
        nnls[1] += 1
scipy.optimize.nnls = timed_nnls
recipe = [0.0, 0.0]  # CPU and wall seconds
loaded = [0.0, 0.0]  # of them, a cached recipe's (not spent in this run: added to its CPU and wall)
RECIPES = os.environ.get("BENCH_RECIPE_CACHE")
def time_recipe(mod):
    # with BENCH_RECIPE_CACHE: the recipe (from the lengths alone, once at full size) computed by an earlier run
    # of the same inputs is loaded, and that run's CPU, wall and NNLS figures are counted for it: the stage's own
    # steps then follow the memory fill as a full-size run's follow its earlier writes, not 60-70 s of NNLS later
    # (by then the VM's host has taken the free pages back, and the first GB of writes cost several times more)
    real = mod.packing_recipe
    if getattr(real, "bench_timed", False):  # wrapped already (--steady: the stage's second run)
        return
    def timed(*a, **k):
        import hashlib, pickle
        import numpy as np
        cached = None
        if RECIPES:
            key = hashlib.md5(repr([np.asarray(x).tobytes() if hasattr(x, "__len__") else x for x in a]).encode()
                              + repr(sorted((kk, v) for kk, v in k.items() if kk != "say")).encode()).hexdigest()
            cached = Path(RECIPES) / f"recipe_{mod.__name__}_{key}.pkl"
            if cached.exists():
                t = time.process_time()
                got, cpu_s, wall_s, nnls_s, rounds = pickle.loads(cached.read_bytes())
                recipe[0] += cpu_s + time.process_time() - t
                recipe[1] += wall_s
                loaded[0] += cpu_s
                loaded[1] += wall_s
                nnls[0] += nnls_s
                nnls[1] += rounds
                return got
        t, w, n0 = time.process_time(), time.perf_counter(), list(nnls)
        try:
            got = real(*a, **k)
        finally:
            recipe[0] += time.process_time() - t
            recipe[1] += time.perf_counter() - w
        if cached is not None:
            Path(RECIPES).mkdir(parents=True, exist_ok=True)
            cached.write_bytes(pickle.dumps((got, time.process_time() - t, time.perf_counter() - w,
                                             nnls[0] - n0[0], nnls[1] - n0[1])))
        return got
    timed.bench_timed = True
    mod.packing_recipe = timed
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
import h5py
with h5py.File(part, "r") as f:
    rows = int(f["next_sentence_labels"].shape[0])
    tokens = int(sum(int(f["input_mask"][a:a + 65536].sum()) for a in range(0, rows, 65536)))
if what != "nvidia_eval":
    rows, tokens = rows * nparts, tokens * nparts
shards = max(1, round(4320 * rows / 156_725_653))  # this part's share of NVIDIA's 4,320 shards
def run_stage(dest):
    if what == "nvidia_4320":
        from preprocessing.nvidia.chop import ChopConfig, run_nvidia_chop
        return run_nvidia_chop(parts, dest, ChopConfig(num_shards=shards, varlength=True), workers=workers)
    elif what == "nvidia_4320_shuffled":  # nvidia-4320's stage: straight from the padded parts
        from preprocessing.nvidia.shuffle import PaddedShuffleConfig, run_nvidia_shuffle_padded
        return run_nvidia_shuffle_padded(parts, dest, PaddedShuffleConfig(num_shards=shards), workers=workers)
    elif what == "nvidia_2048_shuffled":  # nvidia-2048's: the part's share of v1.1's 2,048 shards, shuffled
        from preprocessing.nvidia.shuffle import PaddedShuffleConfig, run_nvidia_shuffle_padded
        return run_nvidia_shuffle_padded(parts, dest, PaddedShuffleConfig(
            num_shards=max(1, round(2048 * rows / 156_725_653)), rule="v1.1"), workers=workers)
    elif what == "nvidia_eval":
        from preprocessing.nvidia.eval_pick import PickVarlenConfig, run_pick_eval_varlength
        return run_pick_eval_varlength(part, dest, PickVarlenConfig(num_examples_to_pick=10000))
    elif what == "nvidia_packed":
        import preprocessing.nvidia.pack as mod
        from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia
        time_recipe(mod)
        # one part: one call for its shards: at full size each call writes ~29 shards (156.7 M sequences in calls of
        # ~0.5 M) and hashes them side by side (8-16 files at once); this part's ~5 shards alone would get 4
        # calls of 1-2 shards, hashed at a third of that speed. More parts (--target-parts): the stage's own groups
        if workers == 1 and nparts == 1:
            mod.group_bounds = lambda n_seq, shards_num, workers: [(0, shards_num)]
        elif workers == 1 and os.environ.get("BENCH_GROUPS_OF_WORKERS"):  # the w-worker run's groups, on one worker
            _own = mod.group_bounds
            mod.group_bounds = lambda n_seq, shards_num, w: _own(n_seq, shards_num, int(os.environ["BENCH_GROUPS_OF_WORKERS"]))
        elif workers == 1:  # more parts on one worker: its groups as big as a full-size run's (~SEQS_PER_GROUP sequences;
            # the stage's own minimum of 4 groups a worker, for small runs' parallelism, made them smaller here), so
            # that the peak memory and the costs a group are full size's
            import math
            def full_size_groups(n_seq, shards_num, workers):
                k = max(1, min(shards_num, math.ceil(n_seq / mod.SEQS_PER_GROUP)))
                return [(shards_num * g // k, shards_num * (g + 1) // k) for g in range(k)]
            mod.group_bounds = full_size_groups
        return run_pack_nvidia(parts, dest, PackNvidiaConfig(shards_num=shards), workers=workers)
    elif what in ("habana_packed", "habana_packed_raw", "habana_packed_narrow"):
        import preprocessing.habana.pack as mod
        from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana
        time_recipe(mod)
        return run_pack_habana(parts, dest, HabanaPackConfig(max_predictions_per_sequence=76, compression="gzip"
                            if what == "habana_packed" else "none", dtypes="narrow" if what == "habana_packed_narrow"
                            else "script"), data_dir="packed", workers=workers)
    raise SystemExit(f"unknown stage {what}")
def peak_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None
# --steady (BENCH_STEADY=1, one worker): the stage run once before the timed run, in this process: the timed run is
# its second, as a full-size worker's calls after its first: every buffer the first run made (pack_fast.Space, per
# owner: a step's buffers) is made again before it, untimed, its pages touched, and each owner's kept for it, none
# freed (a full-size worker makes each owner's once: its scatter calls' for hundreds of parts, then its groups';
# in a second run of the whole stage each owner's would come again, freed by the next owner or Space.keep_only).
# The first run's CPU besides the recipe is kept as "first_cpu", its peak RSS as "first_peak_mb" (the stage's
# peak: the timed run holds every owner's buffers at once, which no real run does)
first = first_peak = fresh = None
if os.environ.get("BENCH_STEADY") == "1" and workers == 1:
    import shutil
    import numpy as np
    from preprocessing import pack_fast as pf
    made, owner_of = {}, {}  # owner -> {buffer name: (largest n asked, dtype)}; id(Space) -> owner
    real_ps, real_get = pf.process_space, pf.Space.get
    def ps(owner):
        sp = real_ps(owner)
        owner_of[id(sp)] = owner
        return sp
    def get(self, name, n, dtype):
        if id(self) in owner_of:
            had = made.setdefault(owner_of[id(self)], {}).get(name)
            if had is None or had[1] != np.dtype(dtype) or had[0] < n:
                made[owner_of[id(self)]][name] = (n, np.dtype(dtype))
        return real_get(self, name, n, dtype)
    pf.process_space, pf.Space.get = ps, get
    f0, r0 = cpu(), recipe[0] - loaded[0]
    run_stage(dest.with_name(dest.name + ".first"))
    first = cpu() - f0 - (recipe[0] - loaded[0] - r0)
    first_peak = peak_mb()
    shutil.rmtree(dest.with_name(dest.name + ".first"), ignore_errors=True)
    recipe[:], loaded[:], nnls[:] = [0.0, 0.0], [0.0, 0.0], [0.0, 0]
    pf.Space.get = real_get
    pf.release_spaces()
    kept = {}
    for owner, bufs in made.items():
        kept[owner] = pf.Space()
        for name, (n, dt) in bufs.items():
            kept[owner].get(name, n, dt).reshape(-1).view(np.uint8)[::4096] = 0  # its pages made now
    pf.process_space = lambda owner: kept.setdefault(owner, pf.Space())
    pf.release_spaces = lambda: None
    pf.Space.keep_only = lambda self, names: None
    fresh = [0]  # buffers the timed run still makes (0 where the first run made every one it needs)
    def counting_get(self, name, n, dtype):
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != np.dtype(dtype) or len(buf) < n:
            fresh[0] += 1
        return real_get(self, name, n, dtype)
    pf.Space.get = counting_get
from core import costs
costs0, t0 = costs.snapshot(), time.perf_counter()
c0 = cpu()
m = run_stage(dest)
c1 = cpu()
(out / f"{dest.name}.json").write_text(json.dumps({"cpu": c1 - c0 + loaded[0], "nnls_cpu": nnls[0], "nnls_rounds": nnls[1],
                                              "recipe_cpu": recipe[0], "recipe_wall": recipe[1], "rows": rows, "tokens": tokens,
                                              "bytes": sum(f.bytes for f in m.files), "sizes": [f.bytes for f in m.files],
                                              "inputs": [str(p) for p in parts], "first_cpu": first, "first_peak_mb": first_peak,
                                              "steady_new_buffers": fresh[0] if fresh else None,
                                              "costs": {**costs.since(costs0), "wall": time.perf_counter() - t0 + loaded[1]}}))
"""

#: A stage's floor: the CPU of moving its bytes and nothing else, in one process, in the memory state its run had
#: (argv: the stage's json from TARGET_CALL, a scratch folder). Its inputs read once each into one reused buffer
#: (read(2) from the page cache), files of its output files' sizes written from one reused buffer in 1 MiB writes
#: (no fsync: its CPU is the copy into the page cache), and their md5s by core.manifest's md5_files all at once
#: (every file in one call, mapped as a stage's just-written outputs are: the most lanes side by side). Writes
#: <scratch>/floor.json: {"read": s, "write": s, "md5": s, "cpu": s} (user + system CPU seconds).
FLOOR_CALL = """
import core
import json
import os
import resource
import sys
from pathlib import Path
from core.manifest.format import md5_files
fig, scratch = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
scratch.mkdir(parents=True, exist_ok=True)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
buf = bytearray(1 << 22)
view = memoryview(buf)
c0 = cpu()
for p in fig["inputs"]:
    with open(p, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
c1 = cpu()
block = memoryview(os.urandom(1 << 20))
paths = [scratch / f"floor-{i:05d}" for i in range(len(fig["sizes"]))]
for p, size in zip(paths, fig["sizes"]):
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    left = size
    while left:
        left -= os.write(fd, block[:min(left, len(block))])
    os.close(fd)
c2 = cpu()
md5_files(paths, written=True)
c3 = cpu()
for p in paths:
    p.unlink()
(scratch / "floor.json").write_text(json.dumps({"read": c1 - c0, "write": c2 - c1, "md5": c3 - c2, "cpu": c3 - c0}))
"""
#: Stage -> what it is, for the table; and which targets need which stages (preprocessing/registry.for_target).
TARGET_STAGES = {"nvidia_4320": "chop into variable-length shards",
                 "nvidia_4320_shuffled": "shuffle_samples from the padded parts",
                 "nvidia_2048_shuffled": "the same into v1.1's 2,048 shards",
                 "nvidia_eval": "pick_eval_samples_varlength (10,000 rows)", "nvidia_packed": "pack-nvidia",
                 "habana_packed": "pack-habana", "habana_packed_raw": "pack-habana --compression none",
                 "habana_packed_narrow": "pack-habana --compression none --dtypes narrow"}


def target_stages(args: argparse.Namespace, h5: Path, tmp: Path) -> dict[str, dict[str, float]]:
    """Each other target's stage on the part's padded HDF5, one process each: CPU, NNLS CPU and rounds, bytes."""
    part = next(h5.glob("part-*.hdf5"))
    out = tmp / "targets"
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    print(f"\n## the other targets' stages on one part's padded HDF5 ({part.stat().st_size / 1e6:,.0f} MB), one process "
          "each, one core")
    if args.scratch == "full-size":
        # the shuffles' scratch is about half the padded parts: the full set's goes past the page cache wherever
        # it exceeds half the memory (preprocessing.scratch.use_direct); this part's alone would not
        sys.path.insert(0, str(ROOT))
        from preprocessing.scratch import MEMORY_SHARE, memory_available

        full = part.stat().st_size // 2 * FULL_ROWS / max(1, _rows(part))
        direct = full > MEMORY_SHARE * memory_available()
        env["BERTPIPE_DIRECT_IO"] = "1" if direct else "0"
        print(f"  scratch as at full size (--scratch full-size): the full set's ~{full / 1e9:,.0f} GB "
              + ("past the page cache (O_DIRECT)" if direct else "through the page cache"))
    figures = {}
    disk = 0.0
    ceiling = None
    if args.target_workers > 1:  # what a stage's fsyncs wait for: at some worker count its writes outrun the disk
        disk = disk_speed(out, 2048)
        print(f"  the disk: {disk:,.0f} MB/s (2 GB written and fdatasync'd)")
        ceiling = disk_ceiling(out, 2048)
        if ceiling:
            print(f"  the disk past the page cache (O_DIRECT, 8 MB requests, 2 threads): {ceiling['write']:,.0f} MB/s "
                  f"writing, {ceiling['read']:,.0f} reading, {ceiling['mixed']:,.0f} one of each")
    stages = [w for w in TARGET_STAGES if not args.only_stages or w in args.only_stages.split(",")]
    # every stage's runs first, the stages taken in turn (run i of each stage, then run i + 1): each stage's runs
    # spread over the same phases of the machine as the others'
    every: dict[str, list[dict]] = {w: [] for w in stages}
    # the packers' recipe: once per run of the bench, in a first untimed run of each packer (TARGET_CALL's
    # time_recipe); the timed runs load it and count its CPU as that run measured it
    env["BENCH_RECIPE_CACHE"] = str(out / "recipe-cache")
    if args.steady:  # each 1-worker run timed as its process's second run of the stage (TARGET_CALL)
        env["BENCH_STEADY"] = "1"
    warm = {"nvidia_packed": "preprocessing.nvidia.pack", "habana_packed": "preprocessing.habana.pack",
            "habana_packed_raw": "preprocessing.habana.pack", "habana_packed_narrow": "preprocessing.habana.pack"}
    for what in sorted(stages, key=lambda w: w != "habana_packed_raw"):  # pack-habana's recipe: the faster run
        if what in warm and not any((out / "recipe-cache").glob(f"recipe_{warm[what]}_*")):
            print(f"  {what}: its packing recipe computed first, in an untimed run (the timed runs load it and count "
                  "the CPU it took)", flush=True)
            target_run(part, out, what, args.target_parts, dict(env, BENCH_STEADY="0"), tag="warm")
            shutil.rmtree(out / f"{what}.warm", ignore_errors=True)
    for i in range(max(1, args.repeat)):
        for what in stages:
            every[what].append(target_run(part, out, what, args.target_parts, env, tag=f"r{i}" if i else ""))
    for what in stages:
        title = TARGET_STAGES[what]
        runs = every[what]
        f = median_run(runs)
        dt, rss, own, busy1 = f["wall"], f["rss"], f["own"], f["busy"]
        if len(runs) > 1:
            same = all(_same_files(out / what, out / f"{what}.r{i}", data_only=True) for i in range(1, len(runs)))
            for i in range(1, len(runs)):
                shutil.rmtree(out / f"{what}.r{i}", ignore_errors=True)
            print(f"    {len(runs)} runs, each stage's in turn with the others': "
                  + ", ".join(f"{c:.2f}" for c in f["runs"]) + " CPU-s" + (" besides the recipe" if _once(f) else "")
                  + f"; the median run's figures below; bytes {'identical' if same else 'DIFFER'} in every run")
        if what == "habana_packed_raw" and "habana_packed" in figures:
            # the gzip at level 4 (zlib's deflate, which the script's bytes depend on): the gzip run's CPU less the
            # same packs' run without it, besides the md5s (the uncompressed files are ~5.7x the bytes to hash)
            g, r = figures["habana_packed"], f
            figures["habana_packed"]["gzip_cpu"] = gzip_share(g, r)
            print(f"    (habana_packed above: of its cpu besides the recipe, the gzip at level 4 {g['gzip_cpu']:.2f} s, "
                  f"{g['gzip_cpu'] / max(g['cpu'] - _once(g), 1e-9):.0%}: the run without it less its md5s)")
        figures[what] = f
        once = _once(f)
        if args.target_workers > 1 and what != "nvidia_eval":  # the same stage on more workers: its speed-up
            w = args.target_workers
            dt_w, _, _ = timed_child([sys.executable, "-c", TARGET_CALL, str(part), str(out), what, str(w),
                                      str(args.target_parts)], env)
            busy_w, disk_w = BUSY["last"], DISK["last"]
            fw = json.loads((out / f"{what}.w{w}.json").read_text())
            serial1, serial_w = f.get("recipe_wall", 0.0), fw.get("recipe_wall", 0.0)  # the recipe: once, serial
            ratio = (f["costs"]["wall"] - serial1) / max(fw["costs"]["wall"] - serial_w, 1e-9)
            if what == "nvidia_packed" and args.target_parts > 1:  # its 1-worker run above has full size's groups,
                # fewer and larger than the w workers' (4 a worker at least): the same calls on one worker as well
                g = target_run(part, out, what, args.target_parts, dict(env, BENCH_GROUPS_OF_WORKERS=str(w)),
                               tag=f"g{w}")
                same_calls = (g["costs"]["wall"] - g.get("recipe_wall", 0.0)) / max(fw["costs"]["wall"] - serial_w,
                                                                                     1e-9)
                shutil.rmtree(out / f"{what}.g{w}", ignore_errors=True)
                print(f"    the {w} workers' groups on 1 worker: {g['costs']['wall'] - g.get('recipe_wall', 0.0):.2f} s "
                      f"besides the recipe ({g['cpu'] - _once(g):.2f} CPU-s): {w} workers {same_calls:.2f}x that; "
                      f"against its full-size groups {ratio:.2f}x")
                f["speedup_same_calls"] = same_calls
            same = _same_files(out / what, out / f"{what}.w{w}", data_only=True)
            f["speedup"] = ratio
            floor = f["bytes"] / 1e6 / max(disk, 1e-9)  # the disk's own time for the stage's output files
            f["disk_floor"] = floor
            print(f"    {w} workers: {fw['costs']['wall']:.2f} s against {f['costs']['wall']:.2f} s (the serial "
                  f"recipe's {serial_w:.1f} / {serial1:.1f} s taken off): {ratio:.2f}x, bytes {'identical' if same else 'DIFFER'}; the "
                  f"disk alone takes {floor:.2f} s for its {f['bytes'] / 1e6:,.0f} MB of output (at most "
                  f"{(f['costs']['wall'] - serial1) / max(floor, 1e-9):.2f}x on this disk)")
            # what the machine did beside each run (its whole life, start-up included): the 1-worker run's
            # process is one core, but the kernel's writeback and reclaim for its writes run on the other. With
            # w workers on as many cores that work competes with them: the busy cores of the 1-worker run bound
            # the speed-up to (cores) / (busy cores)
            cores = os.cpu_count() or 1
            r1, rw = busy1 / max(dt, 1e-9), busy_w / max(dt_w, 1e-9)
            f["busy_cores_1"], f["busy_cores_w"] = r1, rw
            if DISK["device"] and ceiling:  # what the disk did: a run that moves its bytes at the disk's speed is
                # bound by it, whatever its cores do
                d1 = f["disk"]
                mb1, mbw = (d1[0] + d1[1]) / 1e6, (disk_w[0] + disk_w[1]) / 1e6
                least = mbw / ceiling["mixed"]
                f["disk_moved"], f["disk_least"] = [d1, list(disk_w)], least
                # the walls of the speed-up above: the packers' serial recipe (no I/O) taken off, whether it ran in
                # the child or was loaded and counted (BENCH_RECIPE_CACHE: the child's own wall never held it)
                io1 = max(f["costs"]["wall"] - serial1, 1e-9)
                iow = max(fw["costs"]["wall"] - serial_w, 1e-9)
                print(f"    the disk ({DISK['device']}, /proc/diskstats): the 1-worker run read {d1[0] / 1e6:,.0f} MB "
                      f"and wrote {d1[1] / 1e6:,.0f} MB ({mb1 / io1:,.0f} MB/s, I/O in flight "
                      f"{d1[2] / io1:.0%} of its wall); the {w}-worker run read {disk_w[0] / 1e6:,.0f} MB and "
                      f"wrote {disk_w[1] / 1e6:,.0f} MB ({mbw / iow:,.0f} MB/s, in flight "
                      f"{disk_w[2] / iow:.0%}); at its ceiling ({ceiling['mixed']:,.0f} MB/s, one reader "
                      f"and one writer) those bytes take {least:.2f} s: at most {io1 / max(least, 1e-9):.2f}x on this "
                      "disk, start-up included" + (" (the serial recipe taken off)" if serial1 else ""))
            print(f"    the machine's busy cores (/proc/stat): {r1:.2f} during the 1-worker run (its own CPU "
                  f"{own:.2f} s of {busy1:.2f} core-s in {dt:.2f} s; the rest the kernel's threads and anything "
                  f"else), {rw:.2f} of {cores} during the {w}-worker run: at most {min(w, cores) / max(r1, 1e-9):.2f}x "
                  f"if all that work scales")
        if "sizes" in f:
            f["floor"] = stage_floor(out / f"{what}.json", out / "floor", env)
        if args.base:  # the same stage with the baseline tree's code (its folder the cwd): CPU and every file
            timed_child([sys.executable, "-c", TARGET_CALL, str(part), str(out), what, "1", str(args.target_parts),
                         "base"], env, cwd=args.base)
            fb = json.loads((out / f"{what}.base.json").read_text())
            fb["cpu"] += KSWAPD["last"]
            f["base_cpu"], f["base_once"] = fb["cpu"], _once(fb)
            f["base_same"] = _same_files(out / what, out / f"{what}.base", data_only=True)
        print(f"{what:<22}{title:<44} cpu {f['cpu']:6.2f} s (NNLS {f['nnls_cpu']:5.1f} s in {f['nnls_rounds']} "
              f"round(s); the recipe in all {once:5.1f} s) {f['rows'] / max(f['cpu'] - once, 1e-9) / 1e3:7.1f} k "
              "rows/CPU-s "
              f"{rss:6.0f} MB peak RSS -> {f['bytes'] / 1e6:,.0f} MB")
        if "costs" in f:
            print(f"    {breakdown(f['costs'], f.get('gzip_cpu', 0.0))}"
                  + (f"; kswapd beside it {f['kswapd']:.2f} s (counted in the cpu figure above)"
                     if MEMORY["fill"] is not None else ""))
        if f.get("first_cpu") is not None:
            f["once_process"] = f["first_cpu"] - (f["cpu"] - once - f["kswapd"])
            print(f"    --steady: the figures above are the stage's second run in its process (its buffers kept, as a "
                  f"full-size worker's calls after its first); its first run took {f['first_cpu']:.2f} CPU-s besides "
                  f"the recipe: {f['once_process']:+.2f} CPU-s once a process; the timed run made "
                  f"{f.get('steady_new_buffers', 0)} buffer(s) of its own. The peak RSS is the first run's (the "
                  f"second ran with every step's buffers made before it and kept at once: "
                  f"{f.get('rss_both', rss):,.0f} MB)")
        if "base_cpu" in f:
            n_files = sum(1 for p in (out / what).rglob("*") if p.is_file() and not p.name.startswith(("_", ".")))
            print(f"    against the baseline tree ({args.base}), the same stage just after: {f['base_cpu']:.2f} CPU-s; "
                  f"this tree {(f['cpu'] - _once(f)) / max(f['base_cpu'] - f['base_once'], 1e-9):.2f}x it"
                  + (" (besides the recipe)" if _once(f) else "")
                  + f"; its {n_files} files {'IDENTICAL' if f['base_same'] else 'DIFFER'} (every byte)")
        if "floor" in f:
            fl = f["floor"]
            print(f"    its floor, moving its bytes and nothing else: {fl['cpu']:.2f} CPU-s = read its "
                  f"{sum(os.path.getsize(p) for p in f['inputs']) / 1e6:,.0f} MB {fl['read']:.2f} + write its "
                  f"{f['bytes'] / 1e6:,.0f} MB {fl['write']:.2f} + their md5s {fl['md5']:.2f}"
                  + (f" + kswapd {fl['kswapd']:.2f}" if fl.get("kswapd") else "")
                  + f"; the stage {(f['cpu'] - _once(f)) / max(fl['cpu'], 1e-9):.2f}x its floor"
                  + (" (besides the recipe)" if _once(f) else ""))
    _md5_at_full_size(figures)
    return figures


def _rows(part: Path) -> int:
    import h5py

    with h5py.File(part, "r") as f:
        return int(f["next_sentence_labels"].shape[0])


def target_run(part: Path, out: Path, what: str, nparts: int, env: dict[str, str], tag: str = "") -> dict:
    """One 1-worker run of target stage ``what`` (:data:`TARGET_CALL`; ``tag``: its output folder and figures
    ``<what>.<tag>``): its figures, with the wall, peak RSS, its own CPU, the machine's busy core-seconds and
    kswapd's CPU beside it (counted in ``cpu``)."""
    dt, rss, own = timed_child([sys.executable, "-c", TARGET_CALL, str(part), str(out), what, "1", str(nparts)]
                               + ([tag] if tag else []), env)
    f = json.loads((out / f"{what}{'.' + tag if tag else ''}.json").read_text())
    f["wall"], f["rss"], f["own"], f["busy"] = dt, rss, own, BUSY["last"]
    if f.get("first_peak_mb"):  # --steady: the first run's peak (the timed run holds every owner's buffers at once)
        f["rss_both"], f["rss"] = rss, f["first_peak_mb"]
    f["kswapd"] = KSWAPD["last"]  # the kernel's reclaim for the stage, beside it: counted with its CPU
    f["disk"] = list(DISK["last"])
    f["cpu"] += f["kswapd"]
    return f


def median_run(runs: list[dict]) -> dict:
    """Of runs of one stage, the run whose CPU besides the recipe is the median (of an even count, the lower of
    the middle two), with ``runs``: every run's CPU besides the recipe, in run order."""
    if not runs:
        raise ValueError("median_run: no runs")
    order = sorted(range(len(runs)), key=lambda i: runs[i]["cpu"] - _once(runs[i]))
    pick = dict(runs[order[(len(runs) - 1) // 2]])
    pick["runs"] = [r["cpu"] - _once(r) for r in runs]
    return pick


def stage_floor(fig_json: Path, scratch: Path, env: dict[str, str]) -> dict[str, float]:
    """The CPU of moving a stage's bytes and nothing else (:data:`FLOOR_CALL`): its inputs read, its output files'
    sizes written and hashed, in a child timed as the stage was (the same memory state; kswapd beside it counted)."""
    timed_child([sys.executable, "-c", FLOOR_CALL, str(fig_json), str(scratch)], env)
    fl = json.loads((scratch / "floor.json").read_text())
    fl["kswapd"] = KSWAPD["last"]
    fl["cpu"] += fl["kswapd"]
    shutil.rmtree(scratch, ignore_errors=True)
    return fl


def gzip_share(gz: dict[str, float], raw: dict[str, float]) -> float:
    """pack-habana's gzip at level 4, CPU-s: its run less the same packs' run stored uncompressed, each without
    its recipe (the NNLS rounds' CPU moves by seconds from run to run) and its md5s (the uncompressed files are
    ~5.7x the bytes to hash)."""
    return max(0.0, (gz["cpu"] - _once(gz) - gz["costs"]["md5_cpu"]) - (raw["cpu"] - _once(raw) - raw["costs"]["md5_cpu"]))


def _md5_at_full_size(figures: dict[str, dict[str, float]]) -> None:
    """nvidia-2048's shuffle cuts one part into ~2 shards, hashed in 2 lanes side by side; at full size a gather
    call holds ~7 of its shards (a bucket of 524,288 rows), hashed as the 4,320 shuffle's ~5 are. Its md5s are
    counted at the faster of its own speed and that shuffle's (the same code, the same bytes in more files), as
    the 8-shard split's are at the 2,048-shard split's."""
    f, ref = figures.get("nvidia_2048_shuffled"), figures.get("nvidia_4320_shuffled")
    if not f or not ref or "costs" not in f or "costs" not in ref:
        return
    md5, nbytes = f["costs"].get("md5_cpu", 0.0), f["costs"].get("md5_bytes", 0)
    rate = ref["costs"].get("md5_bytes", 0) / max(ref["costs"].get("md5_cpu", 0.0), 1e-9)
    if "floor" in f and "floor" in ref and ref["floor"]["md5"] > 0:  # its floor's md5s likewise (all at once: 2 lanes)
        fast = ref["bytes"] / ref["floor"]["md5"]
        if f["floor"]["md5"] > f["bytes"] / fast:
            f["floor"]["cpu"] -= f["floor"]["md5"] - f["bytes"] / fast
            f["floor"]["md5"] = f["bytes"] / fast
    if nbytes and md5 > nbytes / rate:
        f["cpu"] -= md5 - nbytes / rate
        print(f"    (nvidia_2048_shuffled: its md5s counted at nvidia_4320_shuffled's {rate / 1e6:,.0f} MB/s, "
              f"{nbytes / rate:.2f} s for its {nbytes / 1e6:,.0f} MB instead of {md5:.2f} s with its few files side "
              "by side: the projection's cpu less that)")


def _once(f: dict[str, float]) -> float:
    """CPU seconds of a stage that do not grow with the rows: the packers' recipe (NNLS included; older figures:
    the NNLS alone)."""
    return max(f.get("recipe_cpu", 0.0), f["nnls_cpu"])


def target_projection(fig: dict[str, dict[str, float]], today: float | None, bins: float | None = None,
                      dag: dict[str, dict[str, float]] | None = None) -> None:
    """Each target's extra core-hours at full size: its stages' per-row CPU scaled to the full set (the eval pick:
    once), plus the packers' recipe once (the strategies and the NNLS rounds come from the lengths' histogram and
    do not grow with the rows). The chops into v1.1's 2,048 and 4,320 shards are counted at the 4,320 chop's
    figure (the same rows in other files).

    Two scales, as this part's rows are not the full set's: by rows (x the full set's rows / this part's: an upper
    bound, this part's sequences being longer than the full set's ~256 tokens, so more tokens and packs a row) and
    by tokens (x the full set's estimated tokens / this part's: a lower bound for the per-row work). With today's
    figures: the full set with the target added to today's run, and a run of the target alone (``--target X``:
    no 4-bin stage; the bins' core-hours, today per text part, rescaled to the same rows or tokens). With ``dag``
    (:func:`dag_targets`): the same from the DAG's stage seconds, a part's seconds scaled alike plus the recipe and
    the eval pick once."""
    sys.path.insert(0, str(ROOT))
    from preprocessing.params import DataParams
    from preprocessing.registry import for_target
    from preprocessing.targets import names

    # the part's rows from a stage that reads all of them (the eval pick, counted once, may report fewer: with it
    # first, 8 parts were projected at one part's rows, 8x too high); each stage is scaled by its own rows below
    ref = next((f for s, f in fig.items() if s != "nvidia_eval"), next(iter(fig.values())))
    rows, tokens = ref["rows"], ref.get("tokens") or ref["rows"]
    scales = {"rows": FULL_ROWS / rows, "tokens": FULL_TOKENS / tokens}

    def own_scale(f: dict[str, float], basis: str) -> float:
        if basis == "rows":
            return FULL_ROWS / f["rows"]
        return FULL_TOKENS / (f.get("tokens") or f["rows"])
    print(f"\n## the other targets at full size ({FULL_ROWS:,} rows, ~{FULL_TOKENS / 1e9:.1f} G tokens; this part: "
          f"{rows:,} rows of {tokens / rows:.0f} tokens on average; {'today' if today else 'the 4-bin set'}: "
          + (f"{today:.2f} core-hours)" if today else "not measured in this run)"))
    for target in names():
        if target == "samsung-4bins":
            continue
        for basis, scale in scales.items():
            extra = floor = 0.0
            parts = []
            for stage in for_target(target, DataParams()):
                f = fig.get(stage) or fig.get(stage.replace("2048", "4320").replace("_v11", ""))
                if f is None:
                    continue
                per_rows = f["cpu"] - _once(f)
                k = 1.0 if stage == "nvidia_eval" else own_scale(f, basis)
                cost = per_rows * k + _once(f)
                extra += cost
                if f.get("floor") and floor is not None:
                    floor += f["floor"]["cpu"] * k
                else:
                    floor = None
                parts.append(f"{stage} {cost / 3600:.3f}" + (f" (recipe {_once(f) / 3600:.3f})" if _once(f) else ""))
            total = f"; today's 4-bin set and it: {(today + extra / 3600):.2f} core-hours" if today else ""
            if today and bins is not None:
                # today's bins are counted per text part (500 of this one's): the same rows or tokens as the target
                bins_here = bins * scale / FULL_PARTS
                alone = extra / 3600 - bins_here
                total += (f"; the full set with --target {target} (no 4 bins): {alone:+.2f} against today (bins "
                          f"{bins_here:.2f} not built)")
            if floor is not None and parts:  # what moving the target's bytes alone costs: no code goes under it
                total += f"; its floor (reading, writing and hashing its bytes alone) +{floor / 3600:.2f}"
            if dag:  # the DAG's stage seconds (wall), scaled the same way
                secs, n = 0.0, 0
                for stage in for_target(target, DataParams()):
                    d = dag.get(stage) or dag.get(stage.replace("2048", "4320").replace("_v11", ""))
                    if d is not None:
                        secs += d["per_part"] * scale + d["once"]
                        n += 1
                if n:
                    total += f"; from the DAG's stage seconds +{secs / 3600:.2f}"
            print(f"  --target {target:<17} by {basis:<6} +{extra / 3600:.2f} core-hours ({', '.join(parts)}){total}")


def marginal_projection(fig_n: dict[str, dict[str, float]], fig_m: dict[str, dict[str, float]]) -> None:
    """Each target's extra core-hours from what a stage's CPU grows by from N parts to M (``--marginal-parts``):
    the cost a part adds once the process runs, without what a process pays once however many parts it runs (the
    first touch of the arrays it keeps from call to call, its imports, its plan): at full size each of a stage's
    workers runs hundreds of parts, so that is paid a few times over the set, where a run on N parts counts it
    N times in 500. Prints each stage's fixed and per-part CPU and the projections from the growth alone (the
    packers' recipe still counted once); today's projection (from N parts) stays the upper bound."""
    growth = {}
    for what, fm in fig_m.items():
        fn = fig_n.get(what)
        if fn is None or what == "nvidia_eval":
            continue
        dn, dm = fn["cpu"] - _once(fn), fm["cpu"] - _once(fm)
        rows = fm["rows"] - fn["rows"]
        if rows <= 0:
            continue
        per_row = (dm - dn) / rows
        fixed = dn - per_row * fn["rows"]
        print(f"  {what:<22} {dn:6.2f} CPU-s on {fn['rows']:,} rows, {dm:6.2f} on {fm['rows']:,}: "
              f"{rows / max(dm - dn, 1e-9) / 1e3:6.1f} k rows/CPU-s past the first, {fixed:+.2f} CPU-s once a process")
        growth[what] = {**fn, "cpu": dm - dn + _once(fn), "rows": rows,
                        "tokens": (fm.get("tokens") or fm["rows"]) - (fn.get("tokens") or fn["rows"])}
        growth[what].pop("floor", None)
    if growth:
        print("  projected from the growth alone (each part's own cost; the fixed cost above is paid once a worker):")
        target_projection(growth, None)


# -- one real-size part ----------------------------------------------------------------------------------------
def fit_projection(fig_a: dict[str, dict[str, float]], fig_b: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each target's extra core-hours at full size from two parts of different mean lengths (``--fit-lengths``):
    per stage, its CPU besides the packers' recipe as ``a x rows + b x tokens`` through the two parts' figures,
    then ``a x`` the full set's rows ``+ b x`` its tokens, plus the recipe once (the mean of the two parts': it
    depends on the lengths' histogram). One part's rows average more tokens than the full set's, the other's fewer,
    so this lies between the bounds each gives alone. Returns {target: core-hours}."""
    sys.path.insert(0, str(ROOT))
    from preprocessing.params import DataParams
    from preprocessing.registry import for_target
    from preprocessing.targets import names

    def point(fa: dict[str, float], fb: dict[str, float], once_only: bool) -> tuple[float, float, float]:
        once = (_once(fa) + _once(fb)) / 2
        ca, cb = fa["cpu"] - _once(fa), fb["cpu"] - _once(fb)
        if once_only:  # the eval pick: 10,000 rows whatever the set's size
            return (ca + cb) / 2 + once, 0.0, 0.0
        ra, ta, rb, tb = fa["rows"], fa.get("tokens") or fa["rows"], fb["rows"], fb.get("tokens") or fb["rows"]
        det = ra * tb - rb * ta
        if abs(det) < 1e-9 * ra * tb:  # the same mean length: no fit, the rows' scale
            return ca * FULL_ROWS / ra + once, ca / ra, 0.0
        a = (ca * tb - cb * ta) / det  # CPU-s a row
        b = (ra * cb - rb * ca) / det  # CPU-s a token
        return a * FULL_ROWS + b * FULL_TOKENS + once, a, b

    any_a, any_b = next(iter(fig_a.values())), next(iter(fig_b.values()))
    print(f"\n## the other targets at full size, fitted: CPU = a x rows + b x tokens through two parts ({any_a['rows']:,} "
          f"rows of {any_a['tokens'] / any_a['rows']:.0f} tokens on average, {any_b['rows']:,} of "
          f"{any_b['tokens'] / any_b['rows']:.0f}; the full set: {FULL_ROWS:,} of ~{FULL_TOKENS / FULL_ROWS:.0f})")
    stages, floors = {}, {}
    for stage in fig_a:
        if stage in fig_b:
            full, a, b = point(fig_a[stage], fig_b[stage], stage == "nvidia_eval")
            stages[stage] = full
            fa, fb = fig_a[stage].get("floor"), fig_b[stage].get("floor")
            if fa and fb:  # the floor fitted the same way (it has no recipe)
                floors[stage] = point(*({"cpu": f["cpu"], "rows": g["rows"], "tokens": g.get("tokens") or g["rows"],
                                         "nnls_cpu": 0.0, "recipe_cpu": 0.0}
                                        for f, g in ((fa, fig_a[stage]), (fb, fig_b[stage]))),
                                      stage == "nvidia_eval")[0]
            if stage != "nvidia_eval":
                print(f"  {stage:<22} a = {a * 1e6:6.3f} us a row, b = {b * 1e9:6.3f} ns a token: {full / 3600:.3f} "
                      "core-hours")
    out = {}
    for target in names():
        if target == "samsung-4bins":
            continue
        extra, floor, parts = 0.0, 0.0, []
        for stage in for_target(target, DataParams()):
            key = stage if stage in stages else stage.replace("2048", "4320").replace("_v11", "")
            if key not in stages:
                continue
            extra += stages[key]
            floor = floor + floors[key] if floor is not None and key in floors else None
            parts.append(f"{stage} {stages[key] / 3600:.3f}")
        if parts:
            out[target] = extra / 3600
            print(f"  --target {target:<17} fitted +{extra / 3600:.2f} core-hours ({', '.join(parts)})"
                  + (f"; its floor, fitted alike, +{floor / 3600:.2f}" if floor is not None else ""))
    return out


def real_part(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    d = tmp / "real"
    d.mkdir(parents=True, exist_ok=True)
    part = d / "part-00000-of-00500"
    part.write_text(DocStream(sample_documents()).take(nbytes=int(args.real_mb * 1e6)), encoding="utf-8")
    mb = part.stat().st_size / 1e6
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    bp = str(BIN / "bertpipe")
    (d / "tf").mkdir()
    (d / "h5").mkdir()
    print(f"\n## one real-size part: {mb:.2f} MB of text, one process each")
    figures: dict[str, float] = {"mb": mb}
    # what a CLI step's CPU holds besides its work: the interpreter and the imports (taken off in the projection)
    _, _, figures["cpu start-up"] = timed_child([sys.executable, "-c", STARTUP], env)
    print(f"interpreter start-up and imports of a CLI step: cpu {figures['cpu start-up']:.2f} s")
    steps = [
        ("create-pretraining-data", [bp, "create-pretraining-data", "--input_file", str(part), "--output_file",
                                     str(d / "tf" / part.name), "--vocab_file", str(args.vocab), "--do_lower_case",
                                     "True", "--max_seq_length", "512", "--max_predictions_per_seq", "76",
                                     "--dupe_factor", "10", "--masked_lm_prob", "0.15", "--random_seed", "12345", "-q"],
         d / "tf"),
        ("tfrecord-to-hdf5", [bp, "tfrecord-to-hdf5", "--input", str(d / "tf" / part.name), "--output",
                              str(d / "h5" / f"{part.name}.hdf5"), "-q"], d / "h5"),
        # the DAG's fused call for this part (both stage functions' work: manifests and md5s included), as a
        # `bertpipe run` makes it when part i's TFRecord and HDF5 are both due
        ("tfrecord+hdf5 (fused call)", [sys.executable, "-c", FUSED_CALL, str(part), str(args.vocab), str(d / "fused"),
                                        str(args.group)], d / "fused"),
        # the bins stage's own work (no CLI start-up, inputs checked by stat as in the DAG): 2,048 and 8 shards per
        # bin (the same rows into 4 x 8 files: the data's cost without 8,192 files' fixed cost), 1 and 2 workers
        ("split-4bins (1 worker)", [sys.executable, "-c", SPLIT_CALL, str(d / "h5"), str(d / "bins1"),
                                    str(args.shards), "1"], d / "bins1"),
        ("split-4bins (2 workers)", [sys.executable, "-c", SPLIT_CALL, str(d / "h5"), str(d / "bins2"),
                                     str(args.shards), "2"], d / "bins2"),
        ("split-4bins (8 shards)", [sys.executable, "-c", SPLIT_CALL, str(d / "h5"), str(d / "bins8"), "8", "1"],
         d / "bins8"),
    ]
    for name, cmd, out in steps:
        dt, rss, cpu = timed_child(cmd, env)
        size = du(out) / 1e6
        if (out / "cpu_seconds.txt").is_file():  # the fused call's own CPU, without the interpreter's start-up
            cpu = float((out / "cpu_seconds.txt").read_text())  # per part of its group
            c = json.loads((out / "costs.json").read_text())
            dt, size = c["wall"], (size - args.group * mb) / args.group  # a part's outputs (not its text)
            figures["costs fused"] = c
        secs = out.with_name(out.name + ".seconds.txt")
        if secs.is_file():  # a split call's own wall and CPU, without the interpreter's start-up; its md5s
            dt, cpu, figures[f"md5 s {name}"], figures[f"md5 bytes {name}"] = map(float, secs.read_text().split())
        # the kernel's reclaim for the step (kswapd, beside it: with --memory full, what its writes and arrays cost
        # the kernel besides the step's own system time), per part for the fused call, counted with its CPU
        ksw = KSWAPD["last"] / (args.group if "fused" in name else 1)
        figures[f"kswapd {name}"] = ksw
        cpu += ksw
        figures[name], figures[f"cpu {name}"] = dt, cpu
        # a pool's workers are not the CLI's waited-for children: its CPU figure would be the parent's alone
        cpu_txt = f"cpu {cpu:5.2f} s" if "2 workers" not in name else "cpu   n/a  "
        per = f" a part, {args.group} in one group" if "fused" in name else ""
        print(f"{name:<28}{dt:>7.2f} s ({cpu_txt}) {mb / dt:>6.2f} MB/s {rss:>6.0f} MB peak RSS  -> {size:,.0f} MB{per}")
        costs_file = out / "costs.json" if "fused" in name else out.with_name(out.name + ".costs.json")
        if costs_file.is_file() and "2 workers" not in name:
            c = json.loads(costs_file.read_text())
            if "fused" not in name:
                figures[f"costs {name}"] = c
            print(f"    {breakdown(c)}" + (f"; kswapd beside it {ksw:.2f} s (counted in the cpu figure above)"
                                           if MEMORY["fill"] is not None else ""))
    # the shards' md5s: 128 files a call at 2,048 shards per bin (16 AVX-512 lanes where the CPU has them), as
    # every call at full size, but of ~80 KB each here (read into the lanes' buffers) where the full set's are
    # ~40 MB (mapped: md5_files(written=True) maps files of 1 MiB or more); at 8 shards per bin, a call's 4-8
    # large files, mapped, fewer lanes. The projection counts the 8-shard rows' md5s at the faster of the two.
    for name in ("split-4bins (1 worker)", "split-4bins (8 shards)"):
        s, b = figures[f"md5 s {name}"], figures[f"md5 bytes {name}"]
        print(f"  md5 of the shards in {name}: {b / 1e6:,.0f} MB in {s:.2f} s ({b / 1e6 / max(s, 1e-9):,.0f} MB/s)")
    figures["disk MB/s"] = disk_speed(d)
    per_part = (figures["costs fused"]["md5_bytes"] + figures["costs split-4bins (8 shards)"]["md5_bytes"]) / 1e6
    print(f"  the disk: {figures['disk MB/s']:,.0f} MB/s written and fdatasync'd; a part's files (TFRecord, HDF5 and "
          f"its rows in the bins: {per_part:,.0f} MB) take {per_part / figures['disk MB/s']:.2f} s of it, which a "
          "call's fsyncs wait for where its CPU work is shorter")
    same = _same_files(d / "bins1", d / "bins2")
    print(f"split-4bins 2 workers vs 1: {figures['split-4bins (1 worker)'] / figures['split-4bins (2 workers)']:.2f}x, "
          f"bytes {'identical' if same else 'DIFFER'}")
    figures.update(dag_real(args, tmp))
    return figures


def real_part_hdf5(args: argparse.Namespace, tmp: Path, short_seq_prob: float | None = None) -> Path:
    """The real-size part's padded HDF5 alone (create-pretraining-data, tfrecord-to-hdf5): its folder."""
    if short_seq_prob is None:
        short_seq_prob = args.target_short_seq_prob
    d = tmp / "real"
    (d / "tf").mkdir(parents=True, exist_ok=True)
    (d / "h5").mkdir(exist_ok=True)
    part = d / "part-00000-of-00500"
    part.write_text(DocStream(sample_documents()).take(nbytes=int(args.real_mb * 1e6)), encoding="utf-8")
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    bp = str(BIN / "bertpipe")
    timed_child([bp, "create-pretraining-data", "--input_file", str(part), "--output_file", str(d / "tf" / part.name),
                 "--vocab_file", str(args.vocab), "--do_lower_case", "True", "--max_seq_length", "512",
                 "--max_predictions_per_seq", "76", "--dupe_factor", "10", "--masked_lm_prob", "0.15",
                 "--short_seq_prob", str(short_seq_prob), "--random_seed", "12345", "-q"], env)
    timed_child([bp, "tfrecord-to-hdf5", "--input", str(d / "tf" / part.name), "--output",
                 str(d / "h5" / f"{part.name}.hdf5"), "-q"], env)
    return d / "h5"


def dag_real(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    """The real-size part through the data DAG (one worker, 8 shards per bin: the rows' own cost): each stage's
    work as the DAG does it (manifests, md5s, input checks included)."""
    corpus, work = tmp / "real-corpus", tmp / "real-work"
    corpus.mkdir(parents=True, exist_ok=True)
    for i in range(args.group):  # the DAG's worker runs the parts' fused calls in one group, as at full size
        shutil.copy(tmp / "real" / "part-00000-of-00500", corpus / f"part-{i:05d}-of-00500")
    ev = SHARED / "mlperf_sample" / "eval.txt"
    (corpus / "eval.txt").write_text(ev.read_text(encoding="utf-8") if ev.is_file() else
                                     DocStream(sample_documents()).take(nbytes=400_000), encoding="utf-8")
    # BERTPIPE_BATCH_MIN=4: the 4 parts are one batch, their 8 files hashed as one group, as the DAG's batches
    # hold whole groups at full size (a small run is otherwise a task a part, each part's 2 files hashed alone)
    env = dict(os.environ, PREFECT_HOME=str(tmp / "prefect-home-real"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW="ignore", DS_ACCELERATOR="cpu",
               BERTPIPE_BATCH_MIN=str(args.group))
    env.pop("PREFECT_API_URL", None)
    cmd = [str(BIN / "bertpipe"), "run", "--text-dir", str(corpus), "--vocab", str(args.vocab), "--work-dir", str(work),
           "--n-output-shards", "8", "--workers", "1", "-q"]
    k0 = kswapd_cpu()
    wall, rc, watch = run_watched(cmd, env, tmp / "real-run.log")
    ksw = kswapd_cpu() - k0
    if rc != 0:
        raise SystemExit(f"bertpipe run of the real part failed ({rc}):\n" + (tmp / "real-run.log").read_text()[-3000:])
    stages = json.loads((work / "last_run.json").read_text())["stages"]
    out = {f"dag {n}": stages[n]["seconds"] / args.group for n in ("tfrecord", "hdf5", "bins")}
    # kswapd's reclaim during the run ran beside the calls (on the other core): their seconds do not hold it. It is
    # added to the stages' seconds in proportion to them (a part's share of the run's reclaim).
    total = sum(out.values())
    for n in ("tfrecord", "hdf5", "bins"):
        out[f"dag {n}"] += ksw / args.group * out[f"dag {n}"] / max(total, 1e-9)
    out["dag kswapd"] = ksw / args.group
    print(f"the same part {args.group} times (copies) through `bertpipe run --n-output-shards 8 --workers 1` "
          f"({wall:.1f} s): stage work a part: tfrecord+hdf5 {out['dag tfrecord'] + out['dag hdf5']:.2f} s (fused "
          f"calls, {args.group} in a group), bins {out['dag bins']:.2f} s"
          + f"; peak RSS {max(mb for mb, _ in watch.report()):.0f} MB; kswapd beside the calls {ksw / args.group:.2f} "
          "s a part (added to the stages' seconds below)")
    # where the DAG's stage seconds went (last_run.json: core.costs.spent per call): CPU, waits for a core (other
    # jobs on the machine), and the rest, blocked (the disk: fsyncs, writes held back while the page cache is full
    # of dirty pages; locks)
    for label, names in (("tfrecord+hdf5", ("tfrecord", "hdf5")), ("bins", ("bins",))):
        secs = sum(stages[n]["seconds"] for n in names) / args.group
        cpu_s = sum(stages[n].get("cpu_seconds", 0.0) for n in names) / args.group
        wait = sum(stages[n].get("run_wait_seconds", 0.0) for n in names) / args.group
        out[f"dag cpu {label}"], out[f"dag run_wait {label}"] = cpu_s, wait
        print(f"    {label} a part: {secs:.2f} s = CPU {cpu_s:.2f} + waiting for a core {wait:.2f} + blocked "
              f"{max(0.0, secs - cpu_s - wait):.2f} (the disk, locks)")
    if not args.no_target_stages:
        rows = json.loads((work / "last_run.json").read_text())["stages"]["bins"]["rows"]
        out["dag targets"] = dag_targets(args, cmd, env, work, tmp, rows)
    return out


#: Target stage -> the target whose run builds it in the DAG's target pass (the chops into v1.1's 2,048 and 4,320
#: shards are the 4,320 chop's work in other files: nvidia_4320 stands for them, as in the projection).
DAG_TARGET_OF = {"nvidia_4320": "nvidia-varlength", "nvidia_4320_shuffled": "nvidia-4320",
                 "nvidia_2048_shuffled": "nvidia-2048", "nvidia_eval": "nvidia-varlength",
                 "nvidia_packed": "nvidia-packed", "habana_packed": "habana-packed",
                 "habana_packed_raw": "habana-packed-raw", "habana_packed_narrow": "habana-packed-narrow"}
#: The packers' log line of their recipe (its wall: once a run, whatever the rows), per stage.
RECIPE_LOG = {"nvidia_packed": re.compile(r"pack-nvidia: .*recipe: \d+ NNLS round\(s\) in ([\d.]+) s"),
              "habana_packed": re.compile(r"pack-habana \(--compression gzip\): .*recipe: \d+ NNLS round\(s\) in "
                                          r"([\d.]+) s"),
              "habana_packed_raw": re.compile(r"pack-habana \(--compression none\): .*recipe: \d+ NNLS round\(s\) "
                                              r"in ([\d.]+) s"),
              "habana_packed_narrow": re.compile(r"pack-habana \(--compression none --dtypes narrow\): .*recipe: \d+ "
                                                 r"NNLS round\(s\) in ([\d.]+) s")}


def dag_targets(args: argparse.Namespace, base_cmd: list[str], env: dict[str, str], work: Path, tmp: Path,
                rows: int) -> dict[str, dict[str, float]]:
    """The other targets' stages through the DAG: the same ``bertpipe run`` again in the same work dir with every
    other target added (its finished stages are taken from their manifests: only the target stages run), their
    NVIDIA sets cut into these parts' share of the full set's 4,320 shards (``--nvidia-shards``: shards of about the
    full set's rows, not 4,320 files of a few dozen rows). Per stage, a part's seconds as the DAG took them (its
    calls' wall: md5s, manifests, input checks, fsync waits; kswapd's reclaim beside them added in proportion), of
    them CPU and waits for a core, the packers' recipe (from their log: once a run) apart."""
    wanted = [s for s in DAG_TARGET_OF if not args.only_stages or s in args.only_stages.split(",")]
    targets = list(dict.fromkeys(["samsung-4bins"] + [DAG_TARGET_OF[s] for s in wanted]))
    shards = max(1, round(4320 * rows / FULL_ROWS))
    cmd = [c for c in base_cmd if c != "-q"]
    for t in targets:
        cmd += ["--target", t]
    cmd += ["--nvidia-shards", str(shards)]
    log = tmp / "real-run-targets.log"
    k0 = kswapd_cpu()
    wall, rc, watch = run_watched(cmd, env, log)
    ksw = kswapd_cpu() - k0
    text = log.read_text(errors="replace")
    if rc != 0:
        raise SystemExit(f"bertpipe run of the real part with the targets failed ({rc}):\n{text[-3000:]}")
    stages = json.loads((work / "last_run.json").read_text())["stages"]
    out: dict[str, dict[str, float]] = {}
    for s in wanted:
        st = stages.get(s)
        if not st or st.get("cached") == st.get("calls"):
            continue
        m = RECIPE_LOG.get(s) and RECIPE_LOG[s].search(text)
        recipe = float(m.group(1)) if m else 0.0
        out[s] = {"seconds": st["seconds"], "cpu": st.get("cpu_seconds", 0.0), "wait": st.get("run_wait_seconds", 0.0),
                  "recipe": recipe, "bytes": st["bytes"], "files": st["files"]}
    total = sum(f["seconds"] for f in out.values())
    n = args.group
    print(f"\nthe same {n} parts through `bertpipe run` again with --target {' --target '.join(targets[1:])} "
          f"--nvidia-shards {shards} ({wall:.1f} s; {rows:,} rows: their share of the full set's 4,320 shards); "
          f"kswapd beside the calls {ksw:.2f} s (added to the stages' seconds in proportion)")
    for s, f in out.items():
        f["kswapd"] = ksw * f["seconds"] / max(total, 1e-9)
        once = f["recipe"] if s != "nvidia_eval" else f["seconds"] + f["kswapd"]  # the eval pick: once a run
        f["per_part"] = (f["seconds"] + f["kswapd"] - once) / n if s != "nvidia_eval" else 0.0
        f["once"] = once
        blocked = max(0.0, f["seconds"] - f["cpu"] - f["wait"])
        print(f"  {s:<22} {f['seconds']:7.2f} s = CPU {f['cpu']:.2f} + waiting for a core {f['wait']:.2f} + blocked "
              f"{blocked:.2f}" + (f"; the recipe {f['recipe']:.1f} s (once)" if f["recipe"] else "")
              + (f"; a part: {f['per_part']:.2f} s" if s != "nvidia_eval" else "; once a run")
              + f" -> {f['files']} files, {f['bytes'] / 1e6:,.0f} MB")
    return out


def _same_files(a: Path, b: Path, data_only: bool = False) -> bool:
    """Whether two folders hold the same files, byte for byte (``data_only``: not the manifests and records, whose
    timings differ)."""
    def keep(p: Path) -> bool:
        return p.is_file() and not (data_only and p.name.startswith(("_", ".")))

    fa = sorted(p.relative_to(a) for p in a.rglob("*") if keep(p))
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if keep(p))
    return fa == fb and all((a / p).read_bytes() == (b / p).read_bytes() for p in fa)


def projection(fig: dict[str, float]) -> float:
    """The full set from one real part's figures (per-part work scales with the part's MB), twice: from CPU time
    (user + system of the one-process steps: core-seconds proper) and from the DAG's stage seconds (the wall of its
    calls, which also counts waits for the disk and, on a shared machine, for other jobs' cores)."""
    scale = FULL_PART_MB / fig["mb"]
    print(f"\n## projection to the full set ({FULL_PARTS} x {FULL_PART_MB} MB)")
    # one part's rows into the bins: the 8-shard split's CPU, its md5s counted at the speed they run at full size:
    # the faster of the 2,048-shard split's (many files a call, side by side, but small: read) and the 8-shard
    # one's (large files, mapped, as the full set's ~40 MB shards are, but fewer lanes)
    md5_rate = min(fig[f"md5 s {n}"] / max(fig[f"md5 bytes {n}"], 1)  # s per byte
                   for n in ("split-4bins (1 worker)", "split-4bins (8 shards)"))
    rows = (fig["cpu split-4bins (8 shards)"] - fig["md5 s split-4bins (8 shards)"]
            + fig["md5 bytes split-4bins (8 shards)"] * md5_rate)
    cpu = _project(
        tf_h5=fig["cpu tfrecord+hdf5 (fused call)"] * scale,  # the DAG's fused call: manifests and md5s included
        bins_rows=rows * scale,
        bins_files=max(0.0, fig["cpu split-4bins (1 worker)"] - rows),  # 8,192 files once
        # eval.txt (~3.7 MB of text in MLPerf's set): cpd + hdf5 of ~36 k instances, one chain
        eval_chain=max(0.0, fig["cpu create-pretraining-data"] + fig["cpu tfrecord-to-hdf5"] - 2 * fig["cpu start-up"])
        * 3.7 / fig["mb"],
        label="from CPU time")
    _project(tf_h5=(fig["dag tfrecord"] + fig["dag hdf5"]) * scale, bins_rows=fig["dag bins"] * scale,
             bins_files=max(0.0, fig["split-4bins (1 worker)"] - fig["split-4bins (8 shards)"]),
             eval_chain=(fig["create-pretraining-data"] + fig["tfrecord-to-hdf5"]) * 3.7 / fig["mb"],
             label="from the DAG's stage seconds (wall)")
    tf_h5, bins, eval_chain = cpu
    for c in CORES:
        wall = max(eval_chain, tf_h5 * FULL_PARTS / c) + bins / c
        print(f"  {c:>3} cores: wall ~{wall / 60:.1f} min (from CPU time: tfrecord+hdf5 per part side by side, then "
              f"the bins' counts and shard groups side by side; no stage serial)")
    return (tf_h5 * FULL_PARTS + bins + eval_chain) / 3600, bins / 3600


def _project(*, tf_h5: float, bins_rows: float, bins_files: float, eval_chain: float,
             label: str) -> tuple[float, float, float]:
    bins = bins_rows * FULL_PARTS + bins_files
    total = tf_h5 * FULL_PARTS + bins + eval_chain
    print(f"{label}: per part tfrecord+hdf5 {tf_h5:.1f} + bins {bins_rows:.1f} core-s, plus {bins_files:.1f} s for the "
          f"8,192 bin files once; eval chain {eval_chain:.1f} s")
    print(f"  work {total / 3600:.2f} core-hours (goal <= 1, aim <= 0.5): tfrecord+hdf5 "
          f"{tf_h5 * FULL_PARTS / 3600:.2f}, bins {bins / 3600:.2f}, eval chain {eval_chain / 3600:.3f}")
    return tf_h5, bins, eval_chain


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", type=int, default=500)
    ap.add_argument("--part-lines", type=int, default=60, help="lines per part (default 60; --part-mb wins)")
    ap.add_argument("--part-mb", type=float, default=0.0, help="MB of text per part (real MLPerf: 27)")
    ap.add_argument("--eval-mb", type=float, default=3.7, help="MB of eval.txt text (default 3.7: > 10,000 instances)")
    ap.add_argument("--shards", type=int, default=2048, help="--n-output-shards (default 2048)")
    ap.add_argument("--workers", type=int, default=0, help="--workers of the run (default: one per CPU)")
    ap.add_argument("--vocab", type=Path, default=SHARED / "vocab.txt")
    ap.add_argument("--real-mb", type=float, default=FULL_PART_MB, help="size of the one real part (default 27.15)")
    ap.add_argument("--real-part-only", action="store_true", help="skip the 500-part run")
    ap.add_argument("--group", type=int, default=4, help="parts a worker's fused calls hash together (the DAG's "
                    "tasks.calls.GROUP_PARTS, default 4): the real part's fused call and DAG run use that many copies")
    ap.add_argument("--no-real-part", action="store_true", help="skip the real-size part")
    ap.add_argument("--keep-work", type=Path, help="build and keep everything under this folder")
    ap.add_argument("--no-target-stages", action="store_true", help="skip the other targets' stages (step 5)")
    ap.add_argument("--target-workers", type=int, default=1, help="also run each target stage on this many workers "
                    "and print its speed-up over 1 (wall, the packers' serial recipe taken off; bytes compared)")
    ap.add_argument("--steady", action="store_true",
                    help="time each target stage's 1-worker run as the second run of the stage in its process (the "
                    "first, untimed, makes the buffers a worker keeps from call to call: a full-size worker pays that "
                    "once for hundreds of parts; every buffer it made is made again before the timed run and kept, "
                    "each step's, none freed); the first run's CPU and peak RSS are printed beside it (and the "
                    "baseline tree's runs are timed alike)")
    ap.add_argument("--marginal-parts", type=int, default=0,
                    help="with --targets-only: run the target stages again on this many parts (more than "
                    "--target-parts) and project each target also from what its CPU grows by (a part's own cost, "
                    "without the once-a-process cost a full-size worker pays once for hundreds of parts)")
    ap.add_argument("--only-stages", default="", help="comma-separated target stages to run (default: all of "
                    + ", ".join(TARGET_STAGES) + ")")
    ap.add_argument("--target-parts", type=int, default=1, help="the target stages read the part's HDF5 under this "
                    "many names (hard links): more shards to split over workers; figures are for all of them")
    ap.add_argument("--targets-only", action="store_true", help="only the real part's HDF5 and the other targets' "
                    "stages (step 5), projected without today's figure")
    ap.add_argument("--target-short-seq-prob", type=float, default=0.1,
                    help="with --targets-only: create_pretraining_data's --short_seq_prob for the part the target "
                    "stages read (default 0.1, MLPerf's). The sample text's rows average ~400 tokens, the full set's "
                    "~256: at 1.0 this part's rows average about the full set's, so its projections by rows and by "
                    "tokens nearly agree (the same code and data format; only the lengths differ)")
    ap.add_argument("--fit-lengths", action="store_true",
                    help="with --targets-only: run the target stages on two parts, one made with "
                    "--target-short-seq-prob (default 0.1: rows of ~400 tokens) and one with 1.0 (~170), fit each "
                    "stage's CPU as a x rows + b x tokens and project that to the full set's rows and tokens "
                    "(~256 a row): a point estimate between the bounds")
    ap.add_argument("--memory", choices=("full", "free"), default="full",
                    help="the memory state the steps are timed in: 'full' (default) fills the free memory with clean "
                    "page cache before each step, as a full-size run's earlier outputs do (the kernel reclaims cache "
                    "for a step's writes; kswapd's CPU is counted with the step's), 'free' times them as the machine "
                    "is (on a VM whose host takes back free memory, first touches then cost up to 6x the system time: "
                    "bench/memory_state.py)")
    ap.add_argument("--leave-mb", type=int, default=1024, help="with --memory full: MB of memory left free "
                    "(default 1024)")
    ap.add_argument("--repeat", type=int, default=1, help="run each target stage (1 worker) this many times, the "
                    "stages in turn, and report and project the run of median CPU (every run's CPU printed, "
                    "their bytes compared); the machine's speed moves single runs by a third")
    ap.add_argument("--scratch", choices=("full-size", "auto"), default="full-size",
                    help="the shuffles' scratch: 'full-size' (default) as a full-size run has it (past the page "
                    "cache where the full set's exceeds half the memory), 'auto' as this part's own size decides "
                    "(through the page cache)")
    ap.add_argument("--base", type=Path, help="a baseline tree (e.g. `git worktree add DIR <commit>`, its C "
                    "extensions built: `python setup.py build_ext --inplace`): each target stage also runs with its "
                    "code just after this tree's, and prints its CPU against it and whether every output file is "
                    "the same, byte for byte")
    args = ap.parse_args(argv)
    if not args.vocab.is_file():
        raise SystemExit(f"--vocab {args.vocab} not found: pass the MLPerf vocab.txt")
    tmp = args.keep_work or Path(tempfile.mkdtemp(prefix="bench-scale-"))
    tmp.mkdir(parents=True, exist_ok=True)
    DISK["device"] = block_device(tmp)
    # 20 GB of disk kept free beside the fill: the DAG's run of the real part writes ~8 GB (4 parts' TFRecords,
    # HDF5s and bins) after the fill's last top-up; 8 GB spare ran it out of disk (15:52, 34 GB free at the start)
    fill = FullPageCache(tmp / "memory-fill", leave_mb=args.leave_mb, disk_spare_mb=20480) \
        if args.memory == "full" else None
    try:
        print(f"machine: {os.cpu_count()} CPUs, {cpu_model()}, load average {os.getloadavg()[0]:.1f} at start")
        rep = balloon_reporting()
        print(f"memory: {meminfo('MemTotal'):,} MB, {meminfo('MemFree'):,} MB free; free page reporting to the host "
              f"{'on' if rep else 'off' if rep is False else 'n/a (no balloon device)'}; timed "
              + ("with the free memory filled with clean page cache before each step, down to "
                 f"{args.leave_mb:,} MB free (--memory full: a full-size run's state after its first parts)"
                 if fill is not None else "as the machine is (--memory free)"))
        if fill is not None:
            fill.__enter__()
            MEMORY["fill"] = fill
        if not args.real_part_only and not args.targets_only:
            t0 = time.perf_counter()
            sizes = build_corpus(tmp / "corpus", args.parts, args.part_lines, args.part_mb, args.eval_mb)
            print(f"corpus: {args.parts} parts, {sizes['parts_mb']:.2f} MB + eval.txt {sizes['eval_mb']:.2f} MB "
                  f"(built in {time.perf_counter() - t0:.1f} s)")
            dag_run(args, tmp / "corpus", tmp / "work", sizes)
        if args.targets_only and args.fit_lengths:
            figs = []
            for i, ssp in enumerate((args.target_short_seq_prob, 1.0)):
                sub = tmp / f"lengths-{i}"
                print(f"\n# part {i + 1} of 2: create_pretraining_data --short_seq_prob {ssp}")
                figs.append(target_stages(args, real_part_hdf5(args, sub, ssp), sub))
                target_projection(figs[-1], None)
            fit_projection(*figs)
        elif args.targets_only:
            h5 = real_part_hdf5(args, tmp)
            fig = target_stages(args, h5, tmp)
            target_projection(fig, None)
            if args.steady:
                once = {w: f["once_process"] for w, f in fig.items() if "once_process" in f}
                print("  (--steady: each stage's CPU from its second run in its process; a full-size run adds each "
                      "stage's once-a-process cost once a worker: " + ", ".join(f"{w} {c:+.2f} CPU-s" for w, c in
                                                                                  once.items()) + ")")
            if args.marginal_parts:
                more = argparse.Namespace(**{**vars(args), "target_parts": args.marginal_parts, "target_workers": 1})
                print(f"\n## the same stages on {args.marginal_parts} parts: each part's cost past the first "
                      f"{args.target_parts} (--marginal-parts)")
                marginal_projection(fig, target_stages(more, h5, tmp))
        elif not args.no_real_part:
            fig = real_part(args, tmp)
            today, bins = projection(fig)
            if not args.no_target_stages:
                target_projection(target_stages(args, tmp / "real" / "h5", tmp), today, bins,
                                  fig.get("dag targets"))
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        if fill is not None:
            print(f"memory fill: {fill.written_mb:,} MB of clean page cache written in all (removed)")
            MEMORY["fill"] = None
            fill.__exit__(None, None, None)
        if not args.keep_work:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
