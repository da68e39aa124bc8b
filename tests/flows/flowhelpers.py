"""Helpers of the flow tests: run the CLI in-process, read a run's summary, compare outputs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from core.manifest import MANIFEST_NAME, md5_file  # noqa: F401

#: Quick flags for the three-part text (512/76 as MLPerf, one duplicate, 2 shards per bin), serial.
FAST = ["--dupe-factor", "1", "--n-output-shards", "2", "--num-examples-to-pick", "50", "--workers", "1"]


def split_docs(text: str, n: int) -> list[str]:
    """``text`` (documents separated by blank lines) cut into ``n`` parts at document boundaries."""
    docs = [d for d in text.split("\n\n") if d.strip()]
    k = -(-len(docs) // n)
    return ["\n\n".join(docs[i * k:(i + 1) * k]) + "\n" for i in range(n)]


def run_cli(*args: str) -> int:
    from bertpipe.cli import main

    return main(["run", *map(str, args), "-q"])


def last_run(work: Path) -> dict:
    return json.loads((work / "last_run.json").read_text(encoding="utf-8"))


def output_md5s(work: Path) -> dict[str, str]:
    """stage/key/.../file -> md5 of every stage output (bookkeeping - _manifest.json, _dropped.json, dot files -
    and Prefect records excluded)."""
    return {p.relative_to(work).as_posix(): md5_file(p) for p in sorted(work.rglob("*"))
            if p.is_file() and not p.name.startswith((".", "_"))
            and p.parent != work and not p.relative_to(work).parts[0].startswith(".")}


def manifest_mtimes(work: Path) -> dict[str, int]:
    return {p.relative_to(work).as_posix(): p.stat().st_mtime_ns for p in work.rglob(MANIFEST_NAME)}


def assert_h5_equal(a: Path, b: Path) -> None:
    """Same dataset names, dtypes, shapes and values (bytes also depend on the HDF5 library version)."""
    import h5py
    import numpy as np

    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert sorted(fa.keys()) == sorted(fb.keys()), (a, b)
        for k in fa:
            assert fa[k].dtype == fb[k].dtype and fa[k].shape == fb[k].shape, (a, k)
            assert np.array_equal(fa[k][()], fb[k][()]), (a, k)


def last_flow_run_task_states(settle_s: float = 60.0) -> dict[str, str]:
    """task run name -> state name of the most recent flow run (Prefect's own view: Cached or Completed).

    Prefect 3 records task-run states from events, in the server's task-run recorder, after the flow has returned;
    under load its SQLite write can meet "database is locked" and be retried a moment later (CI saw a task still
    "Running" that way). So the states are read again until every one is final, for up to ``settle_s`` seconds; a
    state still not final then is returned as it is, and the caller's assertion names it."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    deadline = time.monotonic() + settle_s
    with get_client(sync_client=True) as client:
        fr = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=1)[0]
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fr.id])))
            if all(t.state is not None and t.state.is_final() for t in runs) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
    return {t.name: (t.state.name if t.state is not None else "None") for t in runs}


#: data files above this size are hard links in a copied work dir (bookkeeping is copied)
BIG = 64 << 10


def link_tree(src: Path, dst: Path) -> None:
    """``cp -a`` in effect, but data files are hard links (fast: every write in bertpipe replaces a file, never
    edits one)."""
    for dirpath, _dirs, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(exist_ok=True)
        for n in filenames:
            p = Path(dirpath) / n
            if p.stat().st_size > BIG:
                os.link(p, dst / rel / n)
            else:
                shutil.copy2(p, dst / rel / n)


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a link's target, "dir", or a file's md5 and inode (a file replaced by an
    identical copy shows)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            rel = str(p.relative_to(root))
            out[rel] = ("link:" + os.readlink(p) if p.is_symlink() else "dir" if p.is_dir()
                        else hashlib.md5(p.read_bytes()).hexdigest() + f":{p.stat().st_ino}")
    return out
