"""bench/memory_state.py: the balloon's free page reporting bit, kswapd's CPU, and the page-cache fill that
bench_scale.py's ``--memory full`` times its steps in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import memory_state as ms  # noqa: E402


def _device(root: Path, name: str, bits: str) -> None:
    d = root / name
    d.mkdir(parents=True)
    (d / "features").write_text(bits + "\n")


def test_balloon_reporting_reads_feature_bit_5(tmp_path: Path) -> None:
    assert ms.balloon_reporting(tmp_path / "none") is None
    on = tmp_path / "on"
    _device(on, "virtio0", "0110010100000000")  # STATS_VQ, DEFLATE_ON_OOM, REPORTING, bit 7
    assert ms.balloon_reporting(on) is True
    off = tmp_path / "off"
    _device(off, "virtio0", "0110000100000000")  # no bit 5
    assert ms.balloon_reporting(off) is False
    _device(off, "virtio1", "0000010000000000")  # a second device that reports
    assert ms.balloon_reporting(off) is True


def test_cpu_model_names_the_host_and_its_widest_vector_extension(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
                    "flags\t\t: fpu sse2 avx2 avx512f\n\nprocessor\t: 1\nmodel name\t: AMD EPYC\n")
    assert ms.cpu_model(info) == "AMD EPYC (family 26 model 2, AVX-512)"
    info.write_text("model name\t: Intel(R) Xeon(R)\nflags\t\t: sse2 avx2\n")
    assert ms.cpu_model(info) == "Intel(R) Xeon(R) (family ? model ?, AVX2)"
    assert ms.cpu_model(tmp_path / "none") == "unknown CPU"
    assert ms.cpu_model() != "unknown CPU"  # this machine's /proc/cpuinfo


def test_meminfo_and_kswapd_cpu_read_proc() -> None:
    if not Path("/proc/meminfo").is_file():
        pytest.skip("no /proc")
    assert ms.meminfo("MemTotal") > ms.meminfo("MemFree") > 0
    with pytest.raises(KeyError):
        ms.meminfo("NoSuchField")
    a = ms.kswapd_cpu()
    assert a >= 0.0 and ms.kswapd_cpu() >= a  # a counter: never goes back


def test_machine_busy_counts_this_processs_cpu_work() -> None:
    """/proc/stat's busy core-seconds grow at least by the CPU seconds a loop here spends (the rest of the
    machine only adds to them), and do not count the time asleep."""
    import time

    b0, c0 = ms.machine_busy(), time.process_time()
    while time.process_time() - c0 < 0.5:
        pass
    spent = time.process_time() - c0
    b1 = ms.machine_busy()
    assert b1 - b0 >= spent - 0.05  # clock ticks: 10 ms each
    b2 = ms.machine_busy()
    time.sleep(0.3)
    assert ms.machine_busy() - b2 < 0.3 * 2  # asleep: at most what the other core did


def test_machine_scaling_bench_runs_each_kind_and_prints_its_ratio() -> None:
    """bench/bench_machine_scaling.py on tiny sizes: every kind in 1 and 2 processes, a ratio a kind."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_machine_scaling.py"), "--mb", "8", "--pairs",
                          "1", "--seconds", "0.05"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "2 processes:" in ln]
    assert [ln.split(" 2 processes")[0].strip() for ln in lines] == \
        ["compute", "stream", "gather", "gather (mapped file)", "page cache write"]
    assert all("x the throughput of 1" in ln for ln in lines)
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_machine_scaling.py"), "--kinds", "nope",
                          "--mb", "8"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "unknown kind 'nope'" in bad.stderr


def test_full_page_cache_writes_clean_fill_within_its_cap_and_removes_it(tmp_path: Path) -> None:
    # leave_mb 0: it would fill all free memory; max_mb caps it at 3 MB here
    with ms.FullPageCache(tmp_path / "fill", leave_mb=0, max_mb=3, min_mb=1) as fill:
        assert fill.top_up() == 3
        files = list((tmp_path / "fill").iterdir())
        assert [p.stat().st_size for p in files] == [3 << 20]
        assert fill.top_up() == 0  # the cap is reached: nothing more
    assert not list((tmp_path / "fill").iterdir())
    # a disk closer to full than disk_spare_mb: nothing written
    with ms.FullPageCache(tmp_path / "fill2", leave_mb=0, max_mb=3, min_mb=1, disk_spare_mb=1 << 40) as fill:
        assert fill.top_up() == 0
    # free memory already below leave_mb: nothing written
    with ms.FullPageCache(tmp_path / "fill3", leave_mb=1 << 40, min_mb=1) as fill:
        assert fill.top_up() == 0


def test_write_probe_removes_its_file(tmp_path: Path) -> None:
    assert ms.write_probe(tmp_path, mb=2) >= 0.0
    assert not list(tmp_path.iterdir())


def test_bench_scale_help_names_the_memory_states_and_the_parts_lengths() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--help"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    assert "--memory {full,free}" in out and "--leave-mb" in out and "--target-short-seq-prob" in out


def test_disk_io_counts_a_direct_write_on_this_folders_device(tmp_path: Path) -> None:
    """block_device names the device under a folder as /proc/diskstats does (None on a file system without one,
    e.g. tmpfs), and disk_io's written bytes grow by at least a synced write's size; unknown devices read zeros."""
    assert ms.disk_io(None) == (0.0, 0.0, 0.0)
    assert ms.disk_io("no-such-device") == (0.0, 0.0, 0.0)
    dev = ms.block_device(tmp_path)
    if dev is None or not Path("/proc/diskstats").exists():
        pytest.skip("this folder is on no block device /proc/diskstats lists")
    r0, w0, b0 = ms.disk_io(dev)
    p = tmp_path / "x"
    with open(p, "wb") as f:
        f.write(b"\x01" * (8 << 20))
        f.flush()
        import os

        os.fsync(f.fileno())
    r1, w1, b1 = ms.disk_io(dev)
    assert w1 - w0 >= 8 << 20 and r1 >= r0 and b1 >= b0


def test_read_slices_bench_runs_and_compares_the_reads() -> None:
    """bench/bench_read_slices.py on tiny sizes: both thread counts, their ratio, every slice compared."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_read_slices.py"), "--parts", "12",
                          "--mb-each", "0.02", "--rounds", "2"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "1 at once:" in out.stdout and "4 at once against 1:" in out.stdout and "the same values read" in out.stdout


def test_group_gather_bench_runs_and_compares_the_rows() -> None:
    """bench/bench_group_gather.py on tiny sizes: both kinds of group, the projection, the rows compared."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_group_gather.py"), "--inputs", "20",
                          "--rows-per-input", "100", "--rows-per-file", "50", "--files", "16", "--groups", "2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "before: 8 files a group" in out.stdout and "now: 16 files a group, the maps kept" in out.stdout
    assert "the full set:" in out.stdout and "the same rows through kept maps" in out.stdout


def test_shuffle_buckets_bench_runs_both_layouts(tmp_path) -> None:
    """bench/bench_shuffle_buckets.py on a small padded part: the part-sized and the full-size bucket counts, the
    ratio and the full set's projection."""
    import numpy as np

    from tests.preprocessing.nvidia.test_pack_nvidia import made_up_rows, write_padded

    rng = np.random.default_rng(2)
    part = write_padded(tmp_path / "part-00000-of-00500.hdf5", made_up_rows(rng.integers(20, 513, 3000).tolist(), rng))
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_shuffle_buckets.py"), "--part", str(part),
                          "--copies", "2", "--repeat", "1", "--dir", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    import re

    full = re.search(r"full-size: (\d+) buckets", out.stdout)
    assert "part-sized: 1 buckets" in out.stdout and full and int(full.group(1)) > 250, out.stdout  # ~299
    assert "full-size against part-sized:" in out.stdout and "core-hours" in out.stdout
