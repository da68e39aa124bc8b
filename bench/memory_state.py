"""The machine's memory state, which moves a step's system time by up to 6x on a VM whose free memory the host takes
back, and how bench_scale puts a step into the state a full-size run is in.

On this project's 2-core VMs the virtio balloon reports free pages to the hypervisor (``VIRTIO_BALLOON_F_REPORTING``,
bit 5 of ``/sys/bus/virtio/drivers/virtio_balloon/virtio*/features``): a block of guest memory that stays free for a
second or two is handed back, and the next page the kernel hands out from it faults in the host first. Writing a
file allocates page-cache pages, a NumPy array anonymous ones, so the same write costs very different system time:

* pages freed moments ago (still backed): the copy alone;
* free pages the host has taken back (after ~2 s idle, or on a fresh machine): a host fault under every page;
* memory full of page cache (a full-size run after its first ~20 GB of output): the kernel reclaims clean cache
  pages and reuses them, never handing them back.

``python bench/memory_state.py`` measures the three (``write 1 GiB``: a file written to the page cache, not synced;
``touch 1 GiB``: a fresh array's first touch). The full set writes ~935 GB (1.87 GB a part) on machines of 24-128 GB,
so all but the first ~2-10 % of its parts run in the third state. ``bench_scale.py --memory full`` (its default)
fills the free memory with a clean file's page cache before each timed step (:class:`FullPageCache`) and counts
the kernel's background reclaim (kswapd's CPU during the step, :func:`kswapd_cpu`) with the step's own CPU;
``--memory free`` times the steps in whatever state the machine is in, as before.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FILL_PREFIX = ".memory-fill-"


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MB (``ru_maxrss``)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextmanager
def temp_folder(prefix: str, under: Path | None = None) -> Iterator[Path]:
    """A new temporary folder (under ``under``, default the system's temp), removed with everything in it at the
    end: a bench's scratch."""
    work = Path(tempfile.mkdtemp(prefix=prefix, dir=under))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)
BLOCK = 16 << 20  # bytes a write of the fill file


BALLOON = Path("/sys/bus/virtio/drivers/virtio_balloon")


def balloon_reporting(driver: Path = BALLOON) -> bool | None:
    """Whether a virtio balloon device here reports free pages to the host (None: no balloon device found)."""
    found = None
    for feat in Path(driver).glob("virtio*/features"):
        try:
            bits = feat.read_text().strip()
        except OSError:
            continue
        found = bool(found) or (len(bits) > 5 and bits[5] == "1")  # VIRTIO_BALLOON_F_REPORTING = 5
    return found


def kswapd_cpu() -> float:
    """CPU seconds the kernel's reclaim threads (kswapd*) have used so far (0.0 where /proc does not show them)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        if name.startswith("kswapd"):
            fields = text[text.rfind(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """Core-seconds every CPU of the machine has been busy so far (/proc/stat: user, nice, system, irq, softirq and
    steal; not idle or iowait): a step's own CPU plus what the kernel's threads (writeback, reclaim, interrupts) and
    other processes did beside it. 0.0 where /proc/stat is absent."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def block_device(path: Path | str) -> str | None:
    """The /proc/diskstats name of the block device holding ``path`` (None: not a block device, e.g. tmpfs)."""
    st = os.stat(path)
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/uevent")
    try:
        for line in dev.read_text().splitlines():
            if line.startswith("DEVNAME="):
                return line.split("=", 1)[1]
    except OSError:
        return None
    return None


def disk_io(device: str | None) -> tuple[float, float, float]:
    """(bytes read, bytes written, seconds with I/O in flight) of ``device`` so far (/proc/diskstats: sectors of
    512 bytes, io_ticks); zeros where it is unknown."""
    if device is None:
        return 0.0, 0.0, 0.0
    try:
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return 0.0, 0.0, 0.0
    for line in lines:
        f = line.split()
        if len(f) > 12 and f[2] == device:
            return int(f[5]) * 512.0, int(f[9]) * 512.0, int(f[12]) / 1000.0
    return 0.0, 0.0, 0.0


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and the widest vector extension it reports (the same code's figures move by 2x between
    the hosts a VM lands on: a figure is comparable only beside the host it was taken on)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), [])
    fields = {ln.split(":", 1)[0].strip(): ln.split(":", 1)[1].strip() for ln in text.splitlines()[:30] if ":" in ln}
    vec = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return (f"{name or 'unknown CPU'} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')}, "
            f"{vec})")


def meminfo(key: str) -> int:
    """A /proc/meminfo figure in MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) // 1024
    raise KeyError(key)


class FullPageCache:
    """Keeps the machine's free memory down to about ``leave_mb`` with the clean page cache of fill files in
    ``folder`` (written once, fdatasync'd, never read), as a full-size run's earlier outputs fill it: the kernel
    then reclaims cache pages for a step's writes and arrays instead of taking free pages from the host.
    :meth:`top_up` before each timed step; the files go on exit. At most ``max_mb`` of fill, and never closer than
    ``disk_spare_mb`` to a full disk."""

    def __init__(self, folder: Path, leave_mb: int = 1024, max_mb: int = 1 << 20, disk_spare_mb: int = 8192,
                 min_mb: int = 256) -> None:
        self.folder, self.leave_mb, self.max_mb, self.disk_spare_mb = Path(folder), leave_mb, max_mb, disk_spare_mb
        self.min_mb = min_mb  # less to write than this: left as it is
        self.files: list[Path] = []
        self.written_mb = 0

    def __enter__(self) -> FullPageCache:
        self.folder.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.files:
            p.unlink(missing_ok=True)
        self.files.clear()

    def top_up(self) -> int:
        """Write fill until free memory is about ``leave_mb``; returns the MB written (0: it was already)."""
        want = meminfo("MemFree") - self.leave_mb
        st = os.statvfs(self.folder)
        disk = st.f_bavail * st.f_frsize // (1 << 20) - self.disk_spare_mb
        mb = min(want, disk, self.max_mb - self.written_mb)
        if mb < self.min_mb:
            return 0
        p = self.folder / f"{FILL_PREFIX}{len(self.files):03d}"
        self.files.append(p)
        block = b"\0" * BLOCK
        with open(p, "wb") as f:
            left = mb << 20
            while left > 0:
                f.write(block[:min(left, BLOCK)])
                left -= BLOCK
            f.flush()
            os.fdatasync(f.fileno())  # clean pages: reclaimable without a write-back
        self.written_mb += mb
        return mb


def write_probe(folder: Path, mb: int = 1024) -> float:
    """System seconds of writing ``mb`` MB to a new file (page cache only; the file is removed)."""
    p = folder / ".memory-probe"
    block = b"\1" * (1 << 20)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for _ in range(mb):
            os.write(fd, block)
    finally:
        os.close(fd)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    p.unlink()
    return r1.ru_stime - r0.ru_stime


def touch_probe(mb: int = 1024) -> float:
    """System seconds of the first touch of a fresh ``mb`` MB array (a child process: its memory is new)."""
    code = ("import numpy as np, resource, sys; n = int(sys.argv[1]) << 20; r = resource.getrusage(0); "
            "a = np.empty(n, np.uint8); a[::4096] = 1; print(resource.getrusage(0).ru_stime - r.ru_stime)")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code, str(mb)], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="System time of the same write and first touch in three memory states: "
                                 "free pages handed back to the host, pages freed moments ago, memory full of page "
                                 "cache (a full-size run's state).")
    ap.add_argument("--dir", type=Path, default=Path.cwd(), help="folder on the disk to test (default: here)")
    ap.add_argument("--mb", type=int, default=1024, help="MB a probe writes and touches (default 1024)")
    ap.add_argument("--idle", type=float, default=15.0, help="seconds idle before a cold probe (default 15)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    rep = balloon_reporting()
    print(f"free page reporting to the host: {'on' if rep else 'off' if rep is False else 'no balloon device'}; "
          f"MemFree {meminfo('MemFree'):,} MB; {args.mb} MB a probe, {args.idle:.0f} s idle before a cold one")
    rows: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        time.sleep(args.idle)
        rows.setdefault("write, after idle (free pages back with the host)", []).append(write_probe(args.dir, args.mb))
        rows.setdefault("write, again (pages freed moments ago)", []).append(write_probe(args.dir, args.mb))
        time.sleep(args.idle)
        rows.setdefault("touch, after idle", []).append(touch_probe(args.mb))
        rows.setdefault("touch, again", []).append(touch_probe(args.mb))
        with FullPageCache(args.dir, leave_mb=args.mb // 2) as fill:
            fill.top_up()
            time.sleep(args.idle)
            k0 = kswapd_cpu()
            rows.setdefault("write, memory full of page cache, after idle", []).append(write_probe(args.dir, args.mb))
            rows.setdefault("  kswapd during it (beside the writer)", []).append(kswapd_cpu() - k0)
            fill.top_up()
            k0 = kswapd_cpu()
            rows.setdefault("touch, memory full of page cache", []).append(touch_probe(args.mb))
            rows.setdefault("  kswapd during it", []).append(kswapd_cpu() - k0)
    for name, vals in rows.items():
        print(f"  {name:<52} system s: " + ", ".join(f"{v:.3f}" for v in vals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
