"""A stage that runs out of disk (EFBIG under RLIMIT_FSIZE) fails clearly, leaves no manifest, and
completes identically once space returns."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import textwrap

WRITER = textwrap.dedent(
    """
    import signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    from core.manifest import StageOutput
    from core.errors import DiskFullError
    out = sys.argv[1]
    try:
        with StageOutput(out, "bigwrite", params={"n": 3}) as st:
            for i in range(3):
                with st.open(f"shard{i}.bin") as f:
                    for j in range(64):
                        f.write(bytes([i, j]) * 4096)
    except DiskFullError as e:
        print("DISKFULL", e)
        sys.exit(3)
    """
)


def _run(out, limit: int | None) -> subprocess.CompletedProcess:
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-c", WRITER, str(out)], capture_output=True, text=True,
                          preexec_fn=pre, timeout=60)


def test_efbig_fails_clearly_without_manifest_then_rerun_completes(tmp_path):
    out = tmp_path / "stage"
    r = _run(out, limit=300_000)  # each shard is 512 KiB: the first one already hits the limit
    assert r.returncode == 3, r.stderr
    assert "the file-size limit was reached while writing" in r.stdout and "shard0.bin" in r.stdout
    assert "re-run" in r.stdout
    assert not (out / "_manifest.json").exists()
    assert not any(p.name.startswith(".") for p in out.iterdir())  # no temp debris left behind

    r = _run(out, limit=None)
    assert r.returncode == 0, r.stderr
    from core.manifest import verify_manifest

    m = verify_manifest(out)
    assert [f.name for f in m.files] == ["shard0.bin", "shard1.bin", "shard2.bin"]
    assert all(f.bytes == 64 * 8192 for f in m.files)
