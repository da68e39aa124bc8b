"""The refresh's data-set versions (issue 24): the gate, reuse between versions, and retention.

Layout of ``datasets_dir``::

    versions/<YYYYmmddTHHMMSS>-<md5[:8]>/    a data work dir: one version of the data set
    versions/<...>/REQUEST.json             what the refresh asked for (written first; a failed build with the same
                                            request is resumed by the next refresh)
    versions/<...>/SOURCE.json              written last, after a successful build: the version is complete
    latest -> versions/<...>                moved (atomic symlink replace) only after a build succeeded

**The gate** (:class:`GateDag`, :func:`gate`): the data DAG walked over ``latest`` without running anything. Each
stage's key is computed as a run would compute it (stage code version, parameters, upstream outputs' digests; the
dump's md5 is the download stage's parameter, the vocab's md5 the vocab stage's input) and its outputs in
``latest`` are verified (md5s; unchanged files trusted by their stat records). The refresh is "unchanged" only
when every stage of the data set is done there with the key this refresh would give it; otherwise the first
stage that is not (key changed, files damaged or missing) is the reason to build.

**Reuse** (:func:`link_reusable`): a new version starts with hard links to every verified output of the previous
one; the data DAG then finds those whose keys are unchanged done (a change of ``n_output_shards`` reruns only the
bins). Stages write through temporary names and renames, so a rebuilt file replaces the link and the older
version keeps its bytes. Links the build did not use are removed afterwards (:func:`unlink_unused`).

**Retention** (:func:`prune`): ``keep_versions`` complete versions are kept (``latest`` always, then the newest);
older complete versions and failed or half-built ones are removed, except one a training reads (its read lock,
core/readlock.py), one a data run holds (its work-dir lock) and the version being built.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from core.errors import BertpipeError, InputError
from core.manifest import MANIFEST_NAME, STAT_NAME, atomic_write_text, canonical_json, load_manifest
from flows.dag import DataDag
from preprocessing.params import DataParams

SOURCE_FILE = "SOURCE.json"
REQUEST_FILE = "REQUEST.json"
REUSED_FILE = ".bertpipe-reused.json"
#: DataParams fields that never change the bytes of a data set (how it runs, what this run selects)
RUN_ONLY = ("work_dir", "workers", "runner", "dask_address", "wait_lock_s", "stages", "force", "verify_md5", "keep")

log = logging.getLogger(__name__)


# -- versions ------------------------------------------------------------------------------------------

def versions(root: Path) -> list[Path]:
    """The version dirs under ``root/versions``, oldest first (their names start with the build time)."""
    d = root / "versions"
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")),
                  key=lambda p: p.name)


def complete(version: Path) -> bool:
    return (version / SOURCE_FILE).is_file()


def latest_version(root: Path) -> Path | None:
    """The version ``latest`` points to (a version dir of this ``root``), or None."""
    link = root / "latest"
    if not link.is_symlink():
        return None
    target = link.resolve()
    return target if target.parent == (root / "versions").resolve() and target.is_dir() else None


def request(p: DataParams, md5: str) -> dict[str, Any]:
    """What a build asks for: the dump's md5 and every data parameter that decides the bytes, with its digest."""
    params = {k: v for k, v in sorted(p.to_dict().items()) if k not in RUN_ONLY}
    body = {"md5": md5, "params": params}
    return {**body, "fingerprint": hashlib.md5(canonical_json(body).encode()).hexdigest()}


def resumable(root: Path, fingerprint: str) -> Path | None:
    """The newest half-built version whose build asked for the same (a failed or killed build to resume)."""
    for v in reversed(versions(root)):
        if complete(v):
            continue
        try:
            asked = json.loads((v / REQUEST_FILE).read_text(encoding="utf-8")).get("fingerprint")
        except (OSError, ValueError, AttributeError):
            continue
        if asked == fingerprint:
            return v
    return None


def new_version(root: Path, md5: str) -> Path:
    base = f"{time.strftime('%Y%m%dT%H%M%S')}-{md5[:8]}"
    v, n = root / "versions" / base, 1
    while v.exists():
        n += 1
        v = root / "versions" / f"{base}-{n}"
    return v


def move_latest(root: Path, version_dir: Path) -> None:
    """Point ``latest`` at ``version_dir`` atomically (new symlink, then rename over the old one)."""
    tmp = root / f".latest.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(version_dir.relative_to(root))
    os.replace(tmp, root / "latest")


# -- the gate ------------------------------------------------------------------------------------------

class GateDag(DataDag):
    """The data DAG of a refresh, walked over an existing version without running any call (see the module
    docstring): :meth:`check` says whether that version is what a run with these parameters would make."""

    def check(self) -> tuple[bool, str]:
        from tasks.workdir import current_keys

        self.before = current_keys(self.work)
        for name in self.p.force:
            return False, f"data.force names stage {name}"
        try:
            while True:
                ready = self._ready()
                if not ready:
                    break
                for s in ready:
                    chained = [c for c in self.stages if c.chain and c.reads == (s.name,) and c.name in self.targets]
                    for st in (s, *chained):
                        if why := self._check_stage(st):
                            return False, why
        except (BertpipeError, KeyError, OSError, ValueError) as exc:
            return False, f"the version cannot be planned against ({type(exc).__name__}: {str(exc)[:200]})"
        missing = sorted(self.targets - set(self.results))
        if missing:
            return False, f"stage(s) {', '.join(missing)} not reached"
        return True, ""

    def _check_stage(self, s: Any) -> str:
        from tasks.calls import result_dict, why_not_done

        units = self._done_units(s)
        rows = []
        for u in units:
            m, why = why_not_done(u, self.p.verify_md5, root=str(self.work))
            if m is None:
                label = f"{s.name}[{u.shard}]" if u.shard else s.name
                old = self.before.get(s.name)
                if old and old != u.key and not Path(u.out_dir).exists():
                    return (f"{s.name}: its key is now {u.key}, {self.work.name} holds {old} (the stage's code "
                            "version, a parameter or an input changed)")
                return f"{label}: {why}"
            rows.append(result_dict(u, m, cached=True, seconds=0.0))
        self._record(s.name, rows)
        return ""

    def _record(self, name: str, rows: list[dict[str, Any]]) -> None:  # as DataDag's, without artifacts
        from core.stage import Result
        from tasks.calls import manifest_of

        self.results[name] = Result(stage=name, key=self.keys[name], dir=self.work / name / self.keys[name],
                                    manifests={r["shard"]: manifest_of(r) for r in rows},
                                    ran={r["shard"]: False for r in rows},
                                    dropped={r["shard"] for r in rows if r.get("dropped")})
        self.rows[name] = rows


def gate(p: DataParams, version: Path | None) -> tuple[bool, str]:
    """(True, "") when ``version`` holds exactly what a build with ``p`` would make; else (False, why)."""
    if version is None:
        return False, "no version yet (latest is missing)"
    from dataclasses import replace

    return GateDag(replace(p, work_dir=str(version)), log).check()


# -- reuse ---------------------------------------------------------------------------------------------

def _link_unit(src: Path, dst: Path) -> int:
    """Hard-link the files of one stage output ``src`` into ``dst`` (its manifest last); their stat records renewed
    on both sides (a link changes the files' ctime). Returns the files linked; 0 when ``dst`` is done already."""
    if (dst / MANIFEST_NAME).exists():
        return 0
    files = []
    for dirpath, dirnames, filenames in os.walk(src):
        base = Path(dirpath)
        dirnames[:] = [n for n in dirnames if not (base / n).is_symlink()]
        for n in filenames:
            rel = (base / n).relative_to(src)
            if n != STAT_NAME and not (n.startswith(".") and ".tmp-" in n) and not (base / n).is_symlink():
                files.append(rel)
    files.sort(key=lambda r: (r.as_posix() == MANIFEST_NAME, r.as_posix()))
    for rel in files:
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        if (dst / rel).exists():
            (dst / rel).unlink()
        os.link(src / rel, dst / rel)
    m = load_manifest(dst)
    if m is not None:
        from core.manifest import write_stat_records

        md5s = {f.name: f.md5 for f in m.files if (dst / f.name).is_file()}
        write_stat_records(dst, md5s)
        write_stat_records(src, md5s)
    return len(files)


def link_reusable(previous: Path | None, version: Path, skip: set[str] = frozenset()) -> dict[str, int]:
    """Hard links to every verified current output of ``previous`` (its ``last_run.json``) in ``version``, except
    the stages in ``skip``: {stage: outputs linked}. Recorded in ``version/.bertpipe-reused.json``."""
    from tasks.workdir import check_dir, expected

    if previous is None:
        return {}
    linked: dict[str, int] = {}
    done: list[str] = []
    for stage, key, shard in expected(previous):
        if stage in skip:
            continue
        rel = Path(stage, key, shard) if shard else Path(stage, key)
        state = check_dir(previous / rel, check_md5=True, trust_stat=True, stage=stage)[0]
        if state not in ("done", "dropped"):
            continue
        try:
            _link_unit(previous / rel, version / rel)
        except OSError as exc:  # another file system (EXDEV), no hard links: build without reuse
            log.warning("cannot hard-link %s into %s (%s): building it anew", previous / rel, version, exc)
            return linked
        linked[stage] = linked.get(stage, 0) + 1
        done.append(rel.as_posix())
    atomic_write_text(version / REUSED_FILE, json.dumps({"from": previous.name, "units": done}, indent=1) + "\n")
    return linked


def unlink_unused(version: Path) -> list[str]:
    """After a build: remove the linked stage/key folders its last run did not use (another key now)."""
    from tasks.workdir import current_keys

    try:
        units = json.loads((version / REUSED_FILE).read_text(encoding="utf-8")).get("units", [])
    except (OSError, ValueError, AttributeError):
        return []
    keys = current_keys(version)
    removed = []
    for key_dir in sorted({"/".join(u.split("/")[:2]) for u in units if isinstance(u, str)}):
        stage, _, key = key_dir.partition("/")
        d = version / key_dir
        if keys.get(stage) != key and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d)
            removed.append(key_dir)
    return removed


# -- retention ------------------------------------------------------------------------------------------

def _unique_bytes(d: Path) -> int:
    """Bytes freed by removing ``d``: its files not linked from elsewhere."""
    total = 0
    for dirpath, _, filenames in os.walk(d):
        for n in filenames:
            if n.startswith(".bertpipe"):  # the locks (their holders' notes)
                continue
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if st.st_nlink == 1:
                total += st.st_size
    return total


def prune(root: Path, keep: int, building: Path | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Remove versions beyond ``keep`` complete ones and half-built ones (see the module docstring):
    (kept, removed), each a list of {"version", "why"} (removed: and "bytes" freed)."""
    import fcntl

    from core.lock import LOCK_NAME
    from core.readlock import removing

    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise InputError(f"keep_versions must be an integer >= 1 (latest is always kept), got {keep!r}")
    latest = latest_version(root)
    newest: list[Path] = [latest] if latest is not None else []
    for v in reversed(versions(root)):  # latest, then the newest complete versions, up to ``keep``
        if len(newest) >= keep:
            break
        if complete(v) and v.resolve() not in newest:
            newest.append(v.resolve())
    kept, removed = [], []
    for v in reversed(versions(root)):  # newest first
        r = v.resolve()
        why_keep = ("latest" if r == latest else f"one of the {keep} newest complete versions" if r in newest
                    else "being built" if building is not None and r == building.resolve() else "")
        if why_keep:
            kept.append({"version": v.name, "why": why_keep})
            continue
        why = "older than the kept versions" if complete(v) else "failed or half-built (no SOURCE.json)"
        with removing(v) as free:
            if not free:
                kept.append({"version": v.name, "why": "a training reads it (its read lock is held)"})
                continue
            with open(v / LOCK_NAME, "a+", encoding="utf-8") as lock:  # a data run's work-dir lock (any process)
                try:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    kept.append({"version": v.name, "why": "a data run holds it (its work-dir lock)"})
                    continue
                freed = _unique_bytes(v)
                gone = v.parent / f".removing-{v.name}"
                os.replace(v, gone)  # atomic: a kill from here on leaves a name the next prune sweeps
        shutil.rmtree(gone, ignore_errors=True)
        removed.append({"version": v.name, "why": why, "bytes": freed})
    for debris in (root / "versions").glob(".removing-*") if (root / "versions").is_dir() else []:
        shutil.rmtree(debris, ignore_errors=True)  # a prune killed before its rmtree finished
    return kept, removed
