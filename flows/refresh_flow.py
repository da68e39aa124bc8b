"""The refresh flow: rebuild the data set when the source dump's published checksum changed.

    prefect deployment run 'bertpipe-refresh/refresh'                     # also on its cron schedule
    python -c "from flows.refresh_flow import refresh_flow; refresh_flow(source='https://mirror/enwiki-latest-pages-articles.xml.bz2', datasets_dir='datasets', vocab='vocab.txt')"

Layout of ``datasets_dir``::

    versions/<YYYYmmddTHHMMSS>-<md5[:8]>/    one work dir per source checksum (never modified afterwards)
    versions/<...>/SOURCE.json              source, its md5, when it was built, the outputs
    latest -> versions/<...>                moved (atomic symlink replace) only after a build succeeded

The published checksum is read next to the dump (``<name>.md5``, ``md5sums``…; the wikimedia presets
use the dump's md5sums file). Unchanged checksum: nothing is rebuilt. A failed build leaves ``latest``
where it was; its half-built version dir is resumed by the next refresh with the same checksum.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from core.errors import InputError
from core.lock import WorkDirLock
from core.manifest import atomic_write_text
from flows.data_flow import run_data
from preprocessing.params import DataParams, surface

SOURCE_FILE = "SOURCE.json"


def published_md5(source: str) -> str:
    """The md5 the source's publisher gives for it (InputError when there is none: nothing to compare).

    ``sample`` (the packaged dump) has its md5 in the package: a refresh of it builds once, then never again.
    """
    from preprocessing.download import resolve
    from preprocessing.params import SAMPLE

    if source == SAMPLE:
        from preprocessing.sample import SAMPLE_MD5

        return SAMPLE_MD5

    res = resolve(source)
    if not res.md5:
        raise InputError(f"no published checksum found for {source} (looked for <name>.md5 and md5sums next to "
                         "it); a refresh compares checksums, so publish one next to the dump")
    return res.md5


def current_version(datasets_dir: Path) -> dict[str, Any] | None:
    """SOURCE.json of the version ``latest`` points to, or None."""
    try:
        return json.loads((datasets_dir / "latest" / SOURCE_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def _find_version(datasets_dir: Path, md5: str) -> Path | None:
    """A version dir already started for this checksum (a failed or killed build to resume)."""
    hits = sorted((datasets_dir / "versions").glob(f"*-{md5[:8]}"))
    return hits[-1] if hits else None


def move_latest(datasets_dir: Path, version_dir: Path) -> None:
    """Point ``latest`` at ``version_dir`` atomically (new symlink, then rename over the old one)."""
    tmp = datasets_dir / f".latest.tmp-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(version_dir.relative_to(datasets_dir))
    os.replace(tmp, datasets_dir / "latest")


@flow(name="bertpipe-refresh", description="Rebuild the data set into a new version when the dump's checksum changed")
def refresh_flow(source: str = "enwiki-latest", datasets_dir: str = "datasets", vocab: str | None = None,
                 data: dict[str, Any] | None = None) -> dict[str, Any]:
    """``data``: further data-flow parameters (flags, shards, workers); work_dir/source are set here.

    Errors about those parameters name them as ``data.<name>`` (the deployment's parameter).
    """
    with surface("data."):
        return _refresh(source, datasets_dir, vocab, data or {})


def _refresh(source: str, datasets_dir: str, vocab: str | None, data: dict[str, Any]) -> dict[str, Any]:
    logger = get_run_logger()
    root = Path(datasets_dir).resolve()
    root.mkdir(parents=True, exist_ok=True)
    with WorkDirLock(root):  # one refresh at a time, even beside the deployment's concurrency limit
        md5 = published_md5(source)
        cur = current_version(root)
        if cur and cur.get("md5") == md5:
            logger.info("source %s unchanged (md5 %s): keeping version %s", source, md5, cur["version"])
            return {"rebuilt": False, "version": cur["version"], "md5": md5}
        vdir = _find_version(root, md5) or root / "versions" / f"{time.strftime('%Y%m%dT%H%M%S')}-{md5[:8]}"
        logger.info("source %s has md5 %s (was %s): building %s", source, md5, cur and cur.get("md5"), vdir)
        params = DataParams(**{**data, "work_dir": str(vdir), "source": source, "source_md5": md5,
                               "vocab": vocab, "text_dir": None})
        summary = run_data(params)
        info = {"version": vdir.name, "source": source, "md5": md5, "built": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "outputs": summary["outputs"]}
        atomic_write_text(vdir / SOURCE_FILE, json.dumps(info, indent=1, sort_keys=True) + "\n")
        move_latest(root, vdir)
        logger.info("latest -> %s", vdir)
        return {"rebuilt": True, "version": vdir.name, "md5": md5, "previous": cur and cur.get("version")}
