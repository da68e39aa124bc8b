"""Stage 1, download: a Wikipedia dump, MLCommons' published text or a local file -> one verified local file.

Sources (``run_download(source, ...)``):

* ``enwiki-latest`` (or ``<wiki>-latest`` / ``<wiki>-YYYYMMDD``): the ``pages-articles-multistream.xml.bz2``
  dump on dumps.wikimedia.org, md5 from the dump's published ``<wiki>-<date>-md5sums.txt``. "latest" is
  resolved through ``<wiki>-latest-md5sums.txt`` (it lists dated names) to the dated file, so a new dump
  published half-way through a long download cannot mix two dumps.
* ``mlcommons:<name>`` with name ``part-XXXXX-of-00500``, ``eval.txt``, ``eval.md5`` or ``vocab.txt``: one
  file of a flat mirror of MLCommons' ``results/`` text (``mlcommons_base_url`` or
  ``$BERTPIPE_MLCOMMONS_BASE_URL``), checked against the sizes and md5s published in the MLPerf README
  (spec §1, :data:`MLCOMMONS_PUBLISHED`).
* an ``https://`` URL, a ``file://`` URL, or a local path.

MLCommons' own distribution (:func:`run_mlcommons_dataset`, :func:`run_mlcommons`; the DAG's download stage
for ``source=mlcommons``) follows the protocol of MLCommons' R2 downloader: a dataset's metadata file
``<metadata>/<dataset>.uri`` holds the dataset's base URL; ``<metadata>/<dataset>.md5`` lists its files
(``<md5>  ./relative/path``); each file is fetched from ``<base URL>/<relative path>`` with the header
``cf-access-token: <token>`` (Cloudflare Access; the token comes from ``cloudflared access token
--app=<metadata URL>``) and verified against that list. The BERT text is published as
``results_text.tar.gz`` plus ``bert_reference_results_text_md5.txt`` (md5 of each text file):
:func:`run_mlcommons` unpacks the part files and eval.txt from it, each verified, and removes the archive.
A flat mirror named by ``$BERTPIPE_MLCOMMONS_BASE_URL`` replaces the protocol (the files then come from
``<base>/<name>``).

Other schemes (plain ``http``, ``ftp`` ...) are refused. Tests use a local HTTPS server with a
self-signed certificate, passed in through ``DownloadConfig.ca_bundle`` / ``$BERTPIPE_CA_BUNDLE``.

The md5 is the one given, else the published one (preset table, or a checksum file next to the source:
``<name>.md5``, ``<name>.md5sum``, ``md5sums``, ``md5sums.txt``, ``*md5sums*.txt`` with
``"<md5>  <name>"`` lines). Bytes go to ``<out>/<name>.part`` (kept when a transfer is cut off, resumed with
an HTTP ``Range`` request on the next attempt or call); the file is renamed into place and listed in the
manifest only once its md5 verifies.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import http.client
import json
import logging
import os
import re
import socket
import ssl
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ChecksumError, DiskFullError, InputError
from core.manifest import (
    DROPPED_NAME,
    MANIFEST_NAME,
    STAT_NAME,
    Manifest,
    StageOutput,
    _stat_key,
    md5_file,
    raise_if_disk_full,
    read_stat_records,
    write_stat_records,
)
from core.progress import progress
from core.stage import Stage
from preprocessing.text.textio import check_output_dir

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
WIKIMEDIA_DUMPS = "https://dumps.wikimedia.org"
MLCOMMONS_BASE_URL_ENV = "BERTPIPE_MLCOMMONS_BASE_URL"
# MLCommons' distribution: Cloudflare R2 behind Cloudflare Access (mlcommons/r2-downloader's protocol)
MLCOMMONS_METADATA = "https://training.mlcommons-storage.org/metadata"
MLCOMMONS_METADATA_ENV = "BERTPIPE_MLCOMMONS_METADATA"  # another metadata folder (a mirror, tests)
MLCOMMONS_TOKEN_ENV = "MLCOMMONS_CF_ACCESS_TOKEN"
TOKEN_HEADER = "cf-access-token"
# a Cloudflare Access service token (headless runs, deployments), as mlc-r2-downloader.sh -s reads it
SERVICE_ID_ENV, SERVICE_SECRET_ENV = "CF_ACCESS_CLIENT_ID", "CF_ACCESS_CLIENT_SECRET"
_SECRET_HEADERS = {TOKEN_HEADER, "cf-access-client-id", "cf-access-client-secret"}  # never sent to another host
MLCOMMONS_DATASETS = {"wikipedia": "bert-preprocessed-wikipedia-dataset", "input-files": "bert-input-files"}
TEXT_ARCHIVE = "results_text.tar.gz"  # the wikipedia dataset's text: results4/part-*, eval.txt, eval.md5
TEXT_SUMS = "bert_reference_results_text_md5.txt"  # md5 of each file in the archive
VOCAB_NAME = "vocab.txt"

# name -> (bytes, md5 or the md5 prefix the MLPerf README publishes). Spec §1.
MLCOMMONS_PUBLISHED: dict[str, tuple[int, str]] = {
    "eval.md5": (330_000, "71a58382a68947e93e88aa0d42431b6c"),
    "eval.txt": (32_851_144, "2a220f790517261547b1b45ed3ada07a"),
    "part-00000-of-00500": (27_150_902, "a64a7c31eff5cd38ae6d94f7a6229dab"),
    "part-00001-of-00500": (27_198_569, "549a9ed4"),
    "part-00002-of-00500": (27_395_616, "1a1366dd"),
    "part-00497-of-00500": (24_775_043, "66835aa7"),
    "part-00498-of-00500": (24_575_505, "e6d68a76"),
    "part-00499-of-00500": (21_873_644, "b3b087ad"),
    "vocab.txt": (231_508, "64800d5d8528ce344256daf115d4965e"),
}
_MLCOMMONS_NAME = re.compile(r"^(part-\d{5}-of-00500|eval\.txt|eval\.md5|vocab\.txt)$")
_TEXT_FILE = re.compile(r"^(part-\d{5}-of-\d{5}|eval\.txt|eval\.md5)$")
_WIKI_PRESET = re.compile(r"^(?P<wiki>[a-z][a-z_]*wiki)-(?P<date>latest|\d{8})$")
_MD5 = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True, kw_only=True)
class DownloadConfig:
    retries: int = 5  # attempts after the first one, for network errors and 5xx/429 answers
    backoff_s: float = 2.0  # wait before retry k is backoff_s * 2**k seconds (capped at max_backoff_s)
    max_backoff_s: float = 60.0
    timeout_s: float = 60.0  # socket timeout of one request
    chunk_bytes: int = 1 << 20  # read/write block size
    ca_bundle: str | None = None  # PEM file of trusted CAs (default: $BERTPIPE_CA_BUNDLE, else the system's)
    mlcommons_base_url: str | None = None  # a flat mirror of results/; default $BERTPIPE_MLCOMMONS_BASE_URL
    require_md5: bool = False  # refuse a source without a given or published md5 (default: warn)
    token: str | None = field(default=None, repr=False)  # Cloudflare Access token; default $MLCOMMONS_CF_ACCESS_TOKEN


@dataclass(frozen=True)
class Resolved:
    """What a source string names: where to read it, the local name, and the md5 to check."""

    url: str  # https://... or file://...
    name: str
    md5: str | None  # full md5 or a published prefix
    size: int | None  # published size, when known
    md5_origin: str  # "given", "published table", the checksum file's URL, or "none"


#: One download at a time per folder: a second ``bertpipe download`` (or download stage) into the same folder
#: waits for the first (``flock`` on this file; the kernel frees it when its holder dies), then finds its files
#: there and verified. Two at once would share the ``.part`` files, and one would rename the other's away.
DOWNLOAD_LOCK = ".bertpipe-download.lock"
#: Names a download listing may not name: bertpipe's own bookkeeping in the folder (a listing naming the manifest
#: would have it fetched, then overwritten, and the folder could never verify).
RESERVED_NAMES = frozenset({MANIFEST_NAME, STAT_NAME, DROPPED_NAME, DOWNLOAD_LOCK, ".bertpipe.lock"})


@contextmanager
def download_lock(out_dir: Path, *, note_every_s: float = 30.0) -> Iterator[None]:
    """Hold the download lock of ``out_dir`` (created if missing); waits, saying for whom every ``note_every_s``.

    The lock file exists only while held: the holder removes it before releasing, and a waiter that wins the
    ``flock`` on a file that was meanwhile removed (or replaced) opens the new one and tries again.
    """
    import fcntl

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / DOWNLOAD_LOCK
    noted, t0 = 0.0, time.monotonic()
    while True:
        try:
            f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - held for the block
        except OSError as exc:
            raise InputError(f"cannot create the lock file {path}: {exc.strerror or exc}; remove what is in its "
                             "place or choose another --out") from None
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = time.monotonic() - t0
            if waited >= noted:
                f.seek(0)
                who = f.read(300).strip() or "another process"
                log.warning("waiting for another download into %s to finish (%s; %.0f s so far)", out_dir, who,
                            waited)
                noted = waited + note_every_s
            f.close()
            time.sleep(0.25)
            continue
        try:
            same = os.fstat(f.fileno()).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # the holder before us removed (or replaced) the file: lock the one now at that path
    try:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        yield
    finally:
        try:
            path.unlink(missing_ok=True)  # still holding the lock: nobody can hold this inode now
        finally:
            f.close()  # closing the file releases the flock


def run_download(source: str, out_dir: Path, *, md5: str | None = None, filename: str | None = None,
                 cfg: DownloadConfig = DownloadConfig()) -> Manifest:
    """Fetch ``source`` into ``out_dir`` (resumable, retried, md5-verified) and write the stage manifest.

    Args:
        source: a preset (``enwiki-latest``, ``mlcommons:eval.txt``), an https/file URL or a local path.
        out_dir: the stage directory; the file is ``out_dir / manifest.files[0].name``.
        md5: the expected md5 (overrides any published one).
        filename: local name (default: the last path component of the source).
        cfg: network and verification settings.

    Raises:
        InputError: unknown scheme or preset, missing source, HTTP 4xx, retries exhausted.
        ChecksumError: the downloaded bytes do not match the md5 (the partial file is deleted).
    """
    out_dir = Path(out_dir)
    if md5 is not None and not _MD5.match(md5.lower()):
        raise InputError(f"--md5 {md5!r} is not a 32-digit hex md5")
    opener = _Opener(_ca_bundle(cfg), cfg.timeout_s)
    res = resolve(source, md5=md5, filename=filename, cfg=cfg, opener=opener)
    if reserved_name(res.name):
        raise InputError(f"refusing to save {source} as {res.name}: that name is bertpipe's own bookkeeping in the "
                         "download folder; pass another --filename")
    check_output_dir(out_dir)
    if res.md5 is None:
        msg = (f"no md5 given or published for {source} (looked for .md5/md5sums files next to it); "
               "the file is recorded but not verified. Pass --md5 to verify it")
        if cfg.require_md5:
            raise InputError(msg)
        log.warning(msg)
    params = {"source": source, "url": res.url, "name": res.name, "md5": res.md5}
    with download_lock(out_dir), StageOutput(out_dir, "download", params=params, code_version=STAGE_VERSION) as out:
        final = out.path(res.name)
        part = final.with_name(final.name + ".part")
        if final.is_file() and res.md5 and _matches(md5_file(final), res.md5):
            log.info("%s is already here and verifies; not downloading again", final)
            actual = md5_file(final)
        else:
            actual = _fetch_verified(res, part, cfg, opener, out)
            os.replace(part, final)
        out.add_file(res.name, md5=actual)
        out.manifest.counters.update(bytes=final.stat().st_size, md5_origin=res.md5_origin)
    log.info("download: %s -> %s (%d bytes, md5 %s)", res.url, final, final.stat().st_size, actual)
    return out.manifest


def resolve(source: str, *, md5: str | None = None, filename: str | None = None,
            cfg: DownloadConfig = DownloadConfig(), opener: _Opener | None = None) -> Resolved:
    """Turn a source string into a URL, a local file name and the md5 to check against."""
    opener = opener or _Opener(_ca_bundle(cfg), cfg.timeout_s)
    size: int | None = None
    published: tuple[str | None, str] = (None, "none")
    if m := _WIKI_PRESET.match(source):
        url, published = _resolve_wikimedia(m["wiki"], m["date"], opener)
    elif source.startswith("mlcommons:"):
        name = source.split(":", 1)[1]
        if not _MLCOMMONS_NAME.match(name):
            raise InputError(f"{source}: MLCommons publishes part-XXXXX-of-00500, eval.txt and eval.md5")
        base = mlcommons_base_override(cfg)
        if base is None:
            raise InputError(f"{source} reads a flat mirror of MLCommons' results/ folder: give its URL with "
                             f"--mlcommons-base-url or ${MLCOMMONS_BASE_URL_ENV}; MLCommons' own distribution is "
                             "`bertpipe download mlcommons` (e.g. --text --include eval.txt)")
        url = _check_scheme(base.rstrip("/") + "/" + name)
        if name in MLCOMMONS_PUBLISHED:
            size, digest = MLCOMMONS_PUBLISHED[name]
            published = (digest, "published table")
    else:
        url = _to_url(source)
        if md5 is None:
            published = find_published_md5(url, filename or _basename(url), opener)
    name = filename or _basename(url)
    if not name or "/" in name or name in (".", "..") or name.startswith("_manifest"):
        raise InputError(f"cannot use {name!r} as the local file name of {source}; pass filename=...")
    if md5 is not None:
        return Resolved(url, name, md5.lower(), size, "given")
    return Resolved(url, name, published[0], size, published[1])


def _resolve_wikimedia(wiki: str, date: str, opener: _Opener) -> tuple[str, tuple[str | None, str]]:
    """The dated multistream dump URL of ``wiki`` and its md5 from the dump's published md5sums file."""
    sums_url = f"{WIKIMEDIA_DUMPS}/{wiki}/{date}/{wiki}-{date}-md5sums.txt"
    text = opener.fetch_text(sums_url)
    if text is None:
        raise InputError(f"{sums_url} not found: is {wiki}-{date} a published dump?")
    want = re.compile(rf"^{wiki}-(\d{{8}})-pages-articles-multistream\.xml\.bz2$")
    for digest, name in parse_md5sums(text):
        if (m := want.match(name)) and (date == "latest" or m[1] == date):
            return f"{WIKIMEDIA_DUMPS}/{wiki}/{m[1]}/{name}", (digest, sums_url)
    raise InputError(f"{sums_url} lists no {wiki} pages-articles-multistream.xml.bz2 (dump not finished yet?)")


def parse_md5sums(text: str) -> list[tuple[str, str]]:
    """``(md5, name)`` pairs of an md5sum-format text (``"<md5>  <name>"`` or ``"<md5> *<name>"``)."""
    pairs = []
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and _MD5.match(parts[0].lower()):
            pairs.append((parts[0].lower(), parts[1].strip().lstrip("*").rsplit("/", 1)[-1]))
    return pairs


def md5_from_checksum_text(text: str, name: str, *, sidecar: bool) -> str | None:
    """The md5 of ``name`` in a checksum file; a sidecar (``<name>.md5``) may hold a bare hash."""
    for digest, listed in parse_md5sums(text):
        if listed == name:
            return digest
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    if sidecar and len(lines) == 1 and len(lines[0]) <= 2 and _MD5.match(lines[0][0].lower()):
        return lines[0][0].lower()  # "<md5>" or "<md5>  <any name>": a sidecar is about one file
    return None


def find_published_md5(url: str, name: str, opener: _Opener) -> tuple[str | None, str]:
    """Look for a checksum file next to ``url``: ``(md5, where)`` or ``(None, "none")``."""
    base = url.rsplit("/", 1)[0]
    remote = _basename(url)
    sidecars = [url + ".md5", url + ".md5sum"]
    lists = [base + "/md5sums", base + "/md5sums.txt", base + "/MD5SUMS"]
    if url.startswith("file://"):
        folder = Path(_file_path(url)).parent
        if folder.is_dir():
            lists += sorted(p.as_uri() for p in folder.iterdir()
                            if re.search(r"md5sums?(\.txt)?$", p.name, re.I) and p.name != remote + ".md5sum")
    for cand in sidecars + lists:
        text = opener.fetch_text(cand)
        if text is not None:
            digest = md5_from_checksum_text(text, remote, sidecar=cand in sidecars)
            if digest is None and name != remote:
                digest = md5_from_checksum_text(text, name, sidecar=False)
            if digest:
                log.info("md5 of %s from %s: %s", remote, cand, digest)
                return digest, cand
    return None, "none"


def _fetch(res: Resolved, part: Path, cfg: DownloadConfig, opener: _Opener, out: StageOutput) -> str:
    """Bring ``part`` to the full content of ``res.url``; returns its md5."""
    if res.url.startswith("file://"):
        return _copy_local(Path(_file_path(res.url)), part, cfg)
    _download_resumable(res.url, part, opener, retries=cfg.retries, backoff_s=cfg.backoff_s,
                             max_backoff_s=cfg.max_backoff_s, chunk=cfg.chunk_bytes,
                             on_attempt=lambda: out.count("attempts"))
    return md5_file(part)


def _fetch_verified(res: Resolved, part: Path, cfg: DownloadConfig, opener: _Opener, out: StageOutput) -> str:
    """:func:`_fetch` then :func:`_verify`: ``part`` holds the verified file (the caller renames it); its md5."""
    try:
        actual = _fetch(res, part, cfg, opener, out)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            raise DiskFullError(exc.errno, f"no space left while writing {part}; the bytes fetched so "
                                "far are kept: free space and run the download again to resume") from exc
        raise
    _verify(part, res, actual)
    return actual


def _copy_local(src: Path, part: Path, cfg: DownloadConfig) -> str:
    """Copy a local file to ``part`` with a progress bar, hashing on the way."""
    if not src.is_file():
        raise InputError(f"{src} does not exist (or is not a file); check the path or URL")
    h = hashlib.md5()
    total = src.stat().st_size
    with open(src, "rb") as fi, open(part, "wb") as fo, \
            progress(total=total, desc=f"copy {src.name}", unit="B", unit_scale=True) as bar:
        while block := fi.read(cfg.chunk_bytes):
            fo.write(block)
            h.update(block)
            bar.update(len(block))
        fo.flush()
        os.fsync(fo.fileno())  # on disk before the rename and the manifest that records its md5
    return h.hexdigest()


def _verify(part: Path, res: Resolved, actual: str | None = None) -> None:
    """Size (when published) and md5 check of a finished download; a bad file is deleted."""
    size = part.stat().st_size
    shown = part.with_name(res.name)
    if res.size is not None and size != res.size:
        part.unlink(missing_ok=True)
        raise InputError(f"{shown}: downloaded {size} bytes from {res.url}, expected {res.size}; "
                         "the partial file was deleted, run the download again")
    if res.md5 is None:
        return
    actual = actual or md5_file(part)
    if not _matches(actual, res.md5):
        part.unlink(missing_ok=True)
        raise ChecksumError(shown, res.md5, actual,
                            hint=f"The bytes from {res.url} are not the expected file (expected md5: "
                                 f"{res.md5_origin}); the download was deleted, run it again or check the source")


def _matches(actual: str, expected: str) -> bool:
    """Full md5 equality, or prefix equality where only a prefix is published."""
    return actual == expected if len(expected) == 32 else actual.startswith(expected)


def _ca_bundle(cfg: DownloadConfig) -> str | None:
    return cfg.ca_bundle or os.environ.get("BERTPIPE_CA_BUNDLE") or None


def _check_scheme(url: str, where: str = "") -> str:
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("https", "file"):
        named = f" ({where})" if where else ""
        raise InputError(f"refusing {url}{named}: only https:// and file:// URLs (or local paths) are supported, "
                         f"not {scheme + '://' if scheme else 'a URL without a scheme'}; use the https address of the file")
    return url


def _to_url(source: str) -> str:
    """An https/file URL for a URL or a local path (relative paths are made absolute)."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", source):
        return _check_scheme(source)
    p = Path(source).expanduser()
    if not p.is_file():
        raise InputError(f"{source} is not a preset (enwiki-latest, mlcommons:eval.txt ...), "
                         "a URL, or an existing file")
    return p.resolve().as_uri()


def _file_path(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path)


def _basename(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1])


# -- MLCommons' distribution ------------------------------------------------------------------------
@dataclass(frozen=True)
class Listing:
    """What a dataset publishes: where its files are and each file's relative path and md5."""

    source: str  # the metadata .uri URL, or the flat mirror's base URL
    base_url: str
    sums_url: str  # where the md5s come from ("published table" for a flat mirror without a checksum list)
    entries: tuple[tuple[str, str | None], ...]  # (relative path, md5)

    def url(self, rel: str) -> str:
        return self.base_url.rstrip("/") + "/" + urllib.parse.quote(rel)


def mlcommons_base_override(cfg: DownloadConfig = DownloadConfig()) -> str | None:
    """The flat mirror of results/ (``--mlcommons-base-url`` / ``$BERTPIPE_MLCOMMONS_BASE_URL``), or None."""
    base = cfg.mlcommons_base_url or os.environ.get(MLCOMMONS_BASE_URL_ENV) or None
    return _check_scheme(base, f"${MLCOMMONS_BASE_URL_ENV}") if base else None


def metadata_url(dataset: str = "wikipedia") -> str:
    """The metadata (.uri) URL of ``wikipedia``, ``input-files`` (in ``$BERTPIPE_MLCOMMONS_METADATA``, default
    MLCommons' training metadata folder) or of a given https/file URL ending in .uri."""
    if dataset in MLCOMMONS_DATASETS:
        folder = os.environ.get(MLCOMMONS_METADATA_ENV) or MLCOMMONS_METADATA
        return _check_scheme(folder.rstrip("/") + "/" + MLCOMMONS_DATASETS[dataset] + ".uri",
                             f"${MLCOMMONS_METADATA_ENV}")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", dataset):
        url = _check_scheme(dataset, "--dataset")
        if not urllib.parse.urlsplit(url).path.endswith(".uri"):
            raise InputError(f"--dataset {dataset}: a metadata URL ends in .uri (e.g. {MLCOMMONS_METADATA}/"
                             f"{MLCOMMONS_DATASETS['wikipedia']}.uri)")
        return url
    raise InputError(f"--dataset {dataset!r}: choose {', '.join(MLCOMMONS_DATASETS)} or a metadata URL ending "
                     "in .uri")


def mlcommons_token(cfg: DownloadConfig = DownloadConfig()) -> str | None:
    return cfg.token or os.environ.get(MLCOMMONS_TOKEN_ENV) or None


def auth_message(meta_url: str, token: str | None, service: bool = False) -> str:
    """The one line that says how to get (another) Cloudflare Access token for ``meta_url``."""
    how = (f"get one with `cloudflared access login {meta_url}` then `cloudflared access token --app={meta_url}` "
           f"and put it in ${MLCOMMONS_TOKEN_ENV} (or `bertpipe download mlcommons --token`)")
    if service:
        return (f"the Cloudflare Access service token (${SERVICE_ID_ENV}, ${SERVICE_SECRET_ENV}) was refused; "
                f"check it with MLCommons, or {how}")
    if token:
        return f"the Cloudflare Access token was refused (expired or for another app?): {how}"
    return f"MLCommons' files need a Cloudflare Access token: {how}"


def mlcommons_opener(meta_url: str, cfg: DownloadConfig) -> _Opener:
    """An opener that sends the access token (or else a service token from the environment) with each request."""
    token = mlcommons_token(cfg)
    cid, secret = os.environ.get(SERVICE_ID_ENV), os.environ.get(SERVICE_SECRET_ENV)
    if token:
        headers = {TOKEN_HEADER: token}
    elif cid or secret:
        if not (cid and secret):
            raise InputError(f"a Cloudflare Access service token needs both ${SERVICE_ID_ENV} and "
                             f"${SERVICE_SECRET_ENV}; set the missing one (or unset both)")
        headers = {"CF-Access-Client-Id": cid, "CF-Access-Client-Secret": secret}
    else:
        headers = {}
    for name, value in headers.items():
        if not re.fullmatch(r"[\x21-\x7e]+", value):
            raise InputError(f"the Cloudflare Access credential {name} (--token / ${MLCOMMONS_TOKEN_ENV} / "
                             f"${SERVICE_ID_ENV} / ${SERVICE_SECRET_ENV}) holds spaces or control characters; "
                             "paste the single line it was given as")
    return _Opener(_ca_bundle(cfg), cfg.timeout_s, headers=headers,
                   auth_message=auth_message(meta_url, token, service=bool(headers) and not token),
                   secret_origin=origin(meta_url))


def _get_small(url: str, opener: _Opener, cfg: DownloadConfig, what: str) -> str:
    """A metadata or checksum file (retried like a download); access refusals say how to get a token."""
    attempt = 0
    while True:
        try:
            with opener.open(url) as r:
                return r.read(64 << 20).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403) and opener.auth_message:
                raise InputError(f"{url}: HTTP {exc.code} {exc.reason}; {opener.auth_message}") from None
            if not (exc.code == 429 or exc.code >= 500):
                raise InputError(f"{url}: HTTP {exc.code} {exc.reason}; check the {what} URL") from None
            why = f"HTTP {exc.code} {exc.reason}"
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ssl.SSLCertVerificationError):
                raise InputError(f"{url}: TLS certificate not trusted ({exc.reason.verify_message}); "
                                 "pass the CA with --ca-bundle / $BERTPIPE_CA_BUNDLE") from None
            if url.startswith("file://"):
                raise InputError(f"{url}: no such file ({what})") from None
            why = str(exc.reason)
        except (OSError, http.client.HTTPException) as exc:
            why = f"{type(exc).__name__}: {exc}"
        attempt += 1
        if attempt > cfg.retries:
            raise InputError(f"{url}: giving up after {attempt} attempts ({why}); check the network and run "
                             "again") from None
        time.sleep(min(cfg.max_backoff_s, cfg.backoff_s * 2 ** (attempt - 1)))


def reserved_name(name: str) -> bool:
    """bertpipe's own files in a download folder: manifests, stat records, locks, temporary and partial files."""
    return (name in RESERVED_NAMES or name.endswith(".manifest.json") or name.endswith(".part")
            or (name.startswith(".") and ".tmp-" in name))


def parse_listing(text: str, where: str) -> tuple[tuple[str, str], ...]:
    """``(relative path, md5)`` of a dataset's md5 list (``<md5>  ./dir/name``); refuses unsafe paths."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.strip().split(None, 1)
        if len(parts) != 2 or not _MD5.match(parts[0].lower()):
            raise InputError(f"{where} line {i}: expected '<md5>  <path>', got {line.strip()[:80]!r}")
        rel = parts[1].strip().lstrip("*")
        while rel.startswith("./"):
            rel = rel[2:]
        pieces = rel.split("/")
        if not rel or rel.startswith("/") or any(q in ("", ".", "..") for q in pieces) or "\\" in rel:
            raise InputError(f"{where} line {i}: refusing the path {parts[1].strip()!r} (must stay inside the "
                             "download folder)")
        if reserved_name(pieces[-1]):
            raise InputError(f"{where} line {i}: refusing the path {parts[1].strip()!r}: {pieces[-1]} is a name "
                             "bertpipe keeps for its own bookkeeping in the download folder (a listing may not name it)")
        out.append((rel, parts[0].lower()))
    if not out:
        raise InputError(f"{where} lists no files; is it a dataset's .md5 list?")
    return tuple(out)


def read_listing(meta_url: str, opener: _Opener, cfg: DownloadConfig) -> Listing:
    """Metadata file -> base URL; ``<dataset>.md5`` beside it -> the files and their md5s."""
    text = _get_small(meta_url, opener, cfg, "metadata")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise InputError(f"{meta_url} is empty; expected the dataset's base URL in it")
    base = _check_scheme(lines[0], f"the base URL in {meta_url}")
    if base.lower().startswith("file:") and not meta_url.lower().startswith("file:"):
        # file:// only where the user typed it: a metadata file a server sent names https bases only
        raise InputError(f"refusing the base URL {lines[0][:200]} in {meta_url}: a remote metadata file may only "
                         "name https:// bases (a local mirror needs local metadata: $" + MLCOMMONS_METADATA_ENV + ")")
    folder, _, name = meta_url.rpartition("/")
    sums_url = f"{folder}/{name.removesuffix('.uri')}.md5"
    entries = parse_listing(_get_small(sums_url, opener, cfg, "md5 list"), sums_url)
    log.info("%s: %d files under %s (md5s from %s)", meta_url, len(entries), base, sums_url)
    return Listing(meta_url, base, sums_url, entries)


def flat_listing(base: str, opener: _Opener) -> Listing:
    """A flat mirror of results/: the names and md5s of a checksum list there, else MLPerf's 500 part
    files, eval.txt and eval.md5 with the published table's md5s (None where nothing is published)."""
    for name in (TEXT_SUMS, "md5sums", "md5sums.txt"):
        text = opener.fetch_text(base.rstrip("/") + "/" + name)
        pairs = parse_md5sums(text) if text else []
        if pairs:
            entries = [(n, m) for m, n in pairs if _TEXT_FILE.match(n)]
            sums = base.rstrip("/") + "/" + name
            break
    else:
        names = [f"part-{i:05d}-of-00500" for i in range(500)] + ["eval.txt", "eval.md5"]
        entries, sums = [(n, MLCOMMONS_PUBLISHED.get(n, (0, None))[1]) for n in names], "published table"
    return Listing(base, base, sums, tuple(entries))


def _selected(rel: str, include: tuple[str, ...] | list[str]) -> bool:
    """No patterns: everything; else a pattern matches the relative path, or (without '/') its file name."""
    if not include:
        return True
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(rel, pat) or ("/" not in pat and fnmatch.fnmatchcase(name, pat))
               for pat in include)


def _select(listing: Listing, include: tuple[str, ...] | list[str]) -> list[tuple[str, str | None]]:
    chosen = [(rel, md5) for rel, md5 in listing.entries if _selected(rel, include)]
    if not chosen:
        names = ", ".join(rel for rel, _ in listing.entries[:8]) + (" ..." if len(listing.entries) > 8 else "")
        raise InputError(f"--include {' '.join(include)}: no file of {listing.sums_url} matches; it lists {names}")
    return chosen


def _is_verified(path: Path, name: str, md5: str, records: dict[str, list]) -> bool:
    """``path`` exists with ``md5``: by its stat record when unchanged since verified, else by hashing it."""
    if not path.is_file():
        return False
    rec = records.get(name)
    if isinstance(rec, list) and len(rec) == 5 and rec[:4] == _stat_key(path) and _matches(rec[4], md5):
        return True
    return _matches(md5_file(path), md5)


def _fetch_one(out: StageOutput, name: str, url: str, md5: str | None, origin: str, opener: _Opener,
               cfg: DownloadConfig, records: dict[str, list]) -> str:
    """``out/name`` from ``url``: skipped when already there and verified, else fetched to ``name.part``
    (resumed from what an earlier call left), verified, then renamed into place. Returns its md5."""
    final = out.path(name)
    final.parent.mkdir(parents=True, exist_ok=True)
    if md5 and _is_verified(final, name, md5, records):
        log.info("%s is already here and verifies; not downloading again", final)
        out.count("skipped")
        return md5 if len(md5) == 32 else md5_file(final)
    size = MLCOMMONS_PUBLISHED[final.name][0] if origin == "published table" and final.name in MLCOMMONS_PUBLISHED else None
    res = Resolved(url, final.name, md5, size, origin)
    part = final.with_name(final.name + ".part")
    actual = _fetch_verified(res, part, cfg, opener, out)
    os.replace(part, final)
    out.count("fetched")
    return actual


def _fetch_all(out: StageOutput, jobs: list[tuple[str, str, str | None]], origin: str, opener: _Opener,
               cfg: DownloadConfig) -> None:
    """Each ``(local name, url, md5)`` fetched (or found verified) and recorded in the manifest."""
    records = read_stat_records(out.dir)
    for name, url, md5 in jobs:
        actual = _fetch_one(out, name, url, md5, origin, opener, cfg, records)
        out.add_file(name, md5=actual)


def run_mlcommons_dataset(out_dir: Path, *, dataset: str = "wikipedia", include: tuple[str, ...] | list[str] = (),
                          cfg: DownloadConfig = DownloadConfig()) -> Manifest:
    """``bertpipe download mlcommons``: every file of a dataset (or those ``include`` matches), relative
    paths kept, each resumable and verified against the dataset's md5 list, which is saved beside them as
    ``<dataset>.md5``. With a flat mirror (``$BERTPIPE_MLCOMMONS_BASE_URL``), the wikipedia dataset is read
    from it instead (the old flat layout: ``<base>/<name>``).

    Raises:
        InputError: bad dataset/URL, no token or a refused one (the message says how to get one), HTTP errors.
        ChecksumError: a file's md5 differs from the list (nothing is renamed into place).
    """
    out_dir = Path(out_dir)
    flat = mlcommons_base_override(cfg) if dataset == "wikipedia" else None
    if flat:
        opener = _Opener(_ca_bundle(cfg), cfg.timeout_s)
        listing = flat_listing(flat, opener)
        sums_name = None
    else:
        meta = metadata_url(dataset)
        opener = mlcommons_opener(meta, cfg)
        listing = read_listing(meta, opener, cfg)
        sums_name = listing.sums_url.rsplit("/", 1)[-1]
    chosen = _select(listing, include)
    check_output_dir(out_dir)
    params = {"source": "mlcommons", "dataset": listing.source, "include": list(include)}
    with download_lock(out_dir), StageOutput(out_dir, "download", params=params, code_version=STAGE_VERSION) as out:
        if sums_name and not any(rel == sums_name for rel, _ in listing.entries):
            with out.open_text(sums_name) as f:
                f.write("".join(f"{md5}  ./{rel}\n" for rel, md5 in listing.entries))
        _fetch_all(out, [(rel, listing.url(rel), md5) for rel, md5 in chosen], listing.sums_url, opener, cfg)
        write_stat_records(out.dir, {f.name: f.md5 for f in out._entries.values()})
        out.manifest.counters.update(files=len(chosen), md5_origin=listing.sums_url,
                                     bytes=sum(e.bytes for e in out._entries.values()))
    log.info("download: %d files of %s -> %s", len(chosen), listing.source, out_dir)
    return out.manifest


def mlcommons_sources(vocab: bool = True, cfg: DownloadConfig = DownloadConfig()) -> dict[str, str | None]:
    """Where ``source=mlcommons`` reads the text and the vocab (what the download stage's key depends on)."""
    flat = mlcommons_base_override(cfg)
    text = flat or metadata_url("wikipedia")
    return {"text": text, "vocab": None if not vocab else (flat.rstrip("/") + "/" + VOCAB_NAME if flat
                                                            else metadata_url("input-files"))}


def run_mlcommons(out_dir: Path, *, vocab: bool = True, include: tuple[str, ...] | list[str] = (),
                  cfg: DownloadConfig = DownloadConfig()) -> Manifest:
    """The download stage of ``source=mlcommons`` (and ``bertpipe download mlcommons --text``): MLPerf's text
    (part files, eval.txt, eval.md5) flat in ``out_dir`` and, with ``vocab``, the input-files' vocab.txt.

    The wikipedia dataset publishes the text as ``results_text.tar.gz`` plus ``bert_reference_results_text_md5.txt``:
    the archive is fetched (resumable, md5-verified), the wanted files are unpacked under temporary names and
    renamed once each matches its md5 in that list, then the archive is deleted. A dataset (or flat mirror)
    that lists the text files themselves has them fetched one by one. ``include`` selects text files by
    name (``part-0000*``, ``eval.txt``). A re-run skips every file already here and verified.
    """
    out_dir = Path(out_dir)
    flat = mlcommons_base_override(cfg)
    plain = _Opener(_ca_bundle(cfg), cfg.timeout_s) if flat else None
    if flat:
        listing, opener = flat_listing(flat, plain), plain
    else:
        meta = metadata_url("wikipedia")
        opener = mlcommons_opener(meta, cfg)
        listing = read_listing(meta, opener, cfg)
    by_name: dict[str, tuple[str, str | None]] = {}
    for rel, md5 in listing.entries:
        name = rel.rsplit("/", 1)[-1]
        if _TEXT_FILE.match(name) and _selected(name, include):
            if name in by_name:
                raise InputError(f"{listing.sums_url} lists {name} twice ({by_name[name][0]} and {rel}); "
                                 "cannot flatten the text into one folder")
            by_name[name] = (rel, md5)
    archive = next(((rel, md5) for rel, md5 in listing.entries if rel.rsplit("/", 1)[-1] == TEXT_ARCHIVE), None)
    sums = next(((rel, md5) for rel, md5 in listing.entries if rel.rsplit("/", 1)[-1] == TEXT_SUMS), None)
    if not by_name and not (archive and sums):
        raise InputError(f"{listing.sums_url} lists no MLPerf text (part-XXXXX-of-00500 files and eval.txt, or "
                         f"{TEXT_ARCHIVE} with {TEXT_SUMS})" + (f" matching --include {' '.join(include)}"
                                                                  if include else ""))
    voc = None
    if vocab:
        if flat:
            voc = (listing, plain, (VOCAB_NAME, MLCOMMONS_PUBLISHED[VOCAB_NAME][1]), "published table")
        else:
            vmeta = metadata_url("input-files")
            vopener = mlcommons_opener(vmeta, cfg)
            vlisting = read_listing(vmeta, vopener, cfg)
            hits = [(rel, md5) for rel, md5 in vlisting.entries if rel == VOCAB_NAME] or \
                   [(rel, md5) for rel, md5 in vlisting.entries if rel.rsplit("/", 1)[-1] == VOCAB_NAME]
            if not hits:
                raise InputError(f"{vlisting.sums_url} lists no {VOCAB_NAME}; pass a vocab file (--vocab)")
            voc = (vlisting, vopener, hits[0], vlisting.sums_url)
    check_output_dir(out_dir)
    params = {"source": "mlcommons", **mlcommons_sources(vocab, cfg), "include": list(include)}
    with download_lock(out_dir), StageOutput(out_dir, "download", params=params, code_version=STAGE_VERSION) as out:
        records = read_stat_records(out.dir)
        if by_name:
            _fetch_all(out, [(n, listing.url(rel), md5) for n, (rel, md5) in sorted(by_name.items())],
                       listing.sums_url, opener, cfg)
        else:
            _text_from_archive(out, listing, archive, sums, include, opener, cfg, records)
        if voc is not None:
            vlisting, vopener, (rel, md5), origin = voc
            _fetch_all(out, [(VOCAB_NAME, vlisting.url(rel), md5)], origin, vopener, cfg)
        write_stat_records(out.dir, {f.name: f.md5 for f in out._entries.values()})
        out.manifest.counters.update(files=len(out._entries), md5_origin=listing.sums_url,
                                     bytes=sum(e.bytes for e in out._entries.values()))
    log.info("download: MLCommons' text%s -> %s (%d files)", " and vocab" if vocab else "", out_dir,
             len(out.manifest.files))
    return out.manifest


def _text_from_archive(out: StageOutput, listing: Listing, archive: tuple[str, str | None],
                       sums: tuple[str, str | None], include: tuple[str, ...] | list[str], opener: _Opener,
                       cfg: DownloadConfig, records: dict[str, list]) -> None:
    """The text files out of ``results_text.tar.gz``, each checked against ``bert_reference_results_text_md5.txt``."""
    _fetch_all(out, [(TEXT_SUMS, listing.url(sums[0]), sums[1])], listing.sums_url, opener, cfg)
    ref = {n: m for m, n in parse_md5sums(out.path(TEXT_SUMS).read_text(encoding="utf-8", errors="replace"))}
    wanted = {n: m for n, m in ref.items() if _TEXT_FILE.match(n) and _selected(n, include)}
    if not wanted:
        raise InputError(f"{out.path(TEXT_SUMS)} lists no text file" + (f" matching --include {' '.join(include)}"
                                                                        if include else ""))
    todo = {n: m for n, m in wanted.items() if not _is_verified(out.path(n), n, m, records)}
    if todo:
        tar = out.path(TEXT_ARCHIVE)
        _fetch_one(out, TEXT_ARCHIVE, listing.url(archive[0]), archive[1], listing.sums_url, opener, cfg, records)
        _extract_verified(tar, todo, out.dir, ref_name=TEXT_SUMS)
        tar.unlink()  # only the transport: the unpacked, verified files are the output
        out.manifest.counters["archive"] = {"name": archive[0], "md5": archive[1]}
    for n in sorted(wanted):
        out.add_file(n, md5=wanted[n])
    out.add_file(TEXT_SUMS)


def _extract_verified(archive: Path, wanted: dict[str, str], out_dir: Path, *, ref_name: str) -> None:
    """Unpack the members named (by file name) in ``wanted`` into ``out_dir``: each to a temporary name,
    renamed into place only when its md5 is the expected one. Other members are skipped."""
    found: set[str] = set()
    try:
        with tarfile.open(archive, "r|*") as tar:
            for m in tar:
                name = m.name.rsplit("/", 1)[-1]
                if not m.isfile() or name not in wanted or name in found:
                    continue
                src = tar.extractfile(m)
                final = out_dir / name
                tmp = out_dir / f".{name}.tmp-{os.getpid()}"
                h = hashlib.md5()
                try:
                    with open(tmp, "wb") as f, progress(total=m.size, desc=f"unpack {name}", unit="B",
                                                        unit_scale=True) as bar:
                        while block := src.read(1 << 20):
                            f.write(block)
                            h.update(block)
                            bar.update(len(block))
                        f.flush()
                        os.fsync(f.fileno())  # on disk before the rename and the manifest
                    if h.hexdigest() != wanted[name]:
                        raise ChecksumError(f"{archive.name}:{m.name}", wanted[name], h.hexdigest(),
                                            hint=f"the archive's file is not the one {ref_name} lists; nothing "
                                                 "was renamed into place, check the source")
                    os.replace(tmp, final)
                except OSError as exc:
                    raise_if_disk_full(exc, final)  # the archive stays: free space and run again
                    raise
                finally:
                    tmp.unlink(missing_ok=True)
                found.add(name)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise InputError(f"{archive}: not a readable tar archive ({type(exc).__name__}: {exc}); delete it and "
                         "run again") from None
    missing = sorted(set(wanted) - found)
    if missing:
        raise InputError(f"{archive} lacks {len(missing)} file(s) that {ref_name} lists ({', '.join(missing[:4])}"
                         f"{' ...' if len(missing) > 4 else ''}); check the source")



# -- HTTPS -------------------------------------------------------------------------------------
class _HttpsOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never from https down to plain http (or any other scheme); the access token
    never goes to another host, and a redirect to Cloudflare Access's login page is a missing/refused token."""

    def __init__(self, auth_message: str | None = None) -> None:
        super().__init__()
        self.auth_message = auth_message

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        new = urllib.parse.urlsplit(newurl)
        if new.scheme.lower() != "https":  # never down to http, never to a local file:// (a server cannot
            raise InputError(f"refusing {newurl} (a redirect from {req.full_url}): a server may only redirect to "
                             "https:// addresses; check the URL or the mirror")  # make bertpipe read local files)
        if self.auth_message and ("cloudflareaccess.com" in (new.hostname or "") or "/cdn-cgi/access/" in new.path):
            raise InputError(f"{req.full_url}: redirected to Cloudflare Access's login; {self.auth_message}")
        out = super().redirect_request(req, fp, code, msg, headers, newurl)
        if out is not None and origin(newurl) != origin(req.full_url):
            for k in [k for k in out.headers if k.lower() in _SECRET_HEADERS]:  # the secret stays with its origin
                del out.headers[k]
            for k in [k for k in out.unredirected_hdrs if k.lower() in _SECRET_HEADERS]:
                del out.unredirected_hdrs[k]
        return out


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port made explicit (https -> 443): what a secret header is bound to.

    A redirect to another scheme, host or port is another origin, and never gets the access token."""
    u = urllib.parse.urlsplit(url)
    scheme = u.scheme.lower()
    try:
        port = u.port
    except ValueError:  # a malformed port: no origin equals it
        port = -1
    if port is None:
        port = {"https": 443, "http": 80}.get(scheme)
    return scheme, (u.hostname or "").lower(), port


class _Opener:
    """urllib opener for https and file URLs, with an optional CA bundle, a socket timeout, headers sent
    with every request (MLCommons' ``cf-access-token``) and what to say when the server refuses access."""

    def __init__(self, ca_bundle: str | None, timeout_s: float, *, headers: dict[str, str] | None = None,
                 auth_message: str | None = None, secret_origin: tuple[str, str, int | None] | None = None) -> None:
        if ca_bundle and not Path(ca_bundle).is_file():
            raise InputError(f"CA bundle {ca_bundle} does not exist; fix --ca-bundle / $BERTPIPE_CA_BUNDLE")
        ctx = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx),
                                                   _HttpsOnlyRedirects(auth_message))
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.auth_message = auth_message  # None: a 401/403 is an ordinary HTTP error
        # the origin (scheme, host, port) the secret headers were given for: they go to no other, whatever a
        # metadata file or a listing names (None: the URL of the first request is that origin)
        self.secret_origin = secret_origin
        self._warned: set[tuple[str, str, int | None]] = set()

    def open(self, url: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        sent = self.headers
        if any(k.lower() in _SECRET_HEADERS for k in sent):
            if self.secret_origin is None:
                self.secret_origin = origin(url)
            if (o := origin(url)) != self.secret_origin:
                sent = {k: v for k, v in sent.items() if k.lower() not in _SECRET_HEADERS}
                if o not in self._warned:
                    self._warned.add(o)
                    log.warning("%s is on another origin (%s://%s:%s) than the one the access token was given for "
                                "(%s://%s:%s): it is sent without the token", url, *o, *self.secret_origin)
        req = urllib.request.Request(_check_scheme(url), headers={"User-Agent": "bertpipe", **sent,
                                                                  **(headers or {})})
        return self._opener.open(req, timeout=self.timeout_s)

    def fetch_text(self, url: str, limit: int = 64 << 20) -> str | None:
        """A small text file (checksum list), or None when it does not exist (HTTP 403/404/410, no file)."""
        try:
            with self.open(url) as r:
                return r.read(limit).decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            if exc.code in (403, 404, 410):
                return None
            raise InputError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            if url.startswith("file://"):
                return None
            raise InputError(f"{url}: {exc.reason}; check the address and the network") from None


class _Retry(Exception):
    """A transient failure: wait and try again (resuming from the bytes already on disk)."""


def _download_resumable(url: str, part: Path, opener: _Opener, *, retries: int, backoff_s: float,
                        max_backoff_s: float, chunk: int, on_attempt=lambda: None) -> None:
    """Download ``url`` into ``part``, resuming from its current size; retry transient errors with backoff."""
    attempt = 0
    while True:
        on_attempt()
        try:
            _transfer(url, part, opener, chunk)
            part.with_name(part.name + ".json").unlink(missing_ok=True)
            return
        except _Retry as exc:
            attempt += 1
            if attempt > retries:
                raise InputError(f"{url}: giving up after {attempt} attempts ({exc}); the {part.stat().st_size if part.exists() else 0} "
                                 f"bytes already fetched are kept in {part}: run the download again to resume") from None
            wait = min(max_backoff_s, backoff_s * 2 ** (attempt - 1))
            log.warning("%s: %s; retry %d/%d in %.0fs (resuming)", url, exc, attempt, retries, wait)
            time.sleep(wait)


def _transfer(url: str, part: Path, opener: _Opener, chunk: int) -> None:
    """One HTTP request: append to ``part`` from its size on (Range), or restart when the server says so."""
    meta = part.with_name(part.name + ".json")
    offset = part.stat().st_size if part.exists() else 0
    headers = {}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        validator = json.loads(meta.read_text()).get("validator") if meta.exists() else None
        if validator:  # the server answers 200 (whole file) instead of 206 if the file changed meanwhile
            headers["If-Range"] = validator
    try:
        r = opener.open(url, headers)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:
            total = (exc.headers.get("Content-Range") or "").rpartition("/")[2]
            if total.isdigit() and int(total) == offset:
                return  # the previous call had fetched everything
            part.unlink()
            raise _Retry(f"HTTP 416 for bytes {offset}- (remote size {total or '?'}), restarting") from None
        if exc.code == 429 or exc.code >= 500:
            raise _Retry(f"HTTP {exc.code} {exc.reason}") from None
        if exc.code in (401, 403) and opener.auth_message:
            raise InputError(f"{url}: HTTP {exc.code} {exc.reason}; {opener.auth_message}") from None
        raise InputError(f"{url}: HTTP {exc.code} {exc.reason}; check the address") from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            raise InputError(f"{url}: TLS certificate not trusted ({exc.reason.verify_message}); "
                             "pass the CA with --ca-bundle / $BERTPIPE_CA_BUNDLE") from None
        raise _Retry(str(exc.reason)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _Retry(f"{type(exc).__name__}: {exc}") from None
    with r:
        _append_body(r, url, part, meta, offset, chunk)


def _append_body(r: http.client.HTTPResponse, url: str, part: Path, meta: Path, offset: int, chunk: int) -> None:
    if offset and r.status == 206:
        start = re.match(r"bytes (\d+)-", r.headers.get("Content-Range") or "")
        if not start or int(start[1]) != offset:
            part.unlink()
            raise _Retry(f"server answered range {r.headers.get('Content-Range')!r} for bytes {offset}-; restarting")
    elif offset:
        log.info("%s: the server sent the whole file (no range support, or it changed); restarting", url)
        offset = 0
    length = r.headers.get("Content-Length")
    total = offset + int(length) if length and length.isdigit() else None
    validator = r.headers.get("ETag") or r.headers.get("Last-Modified")
    meta.write_text(json.dumps({"url": url, "validator": validator, "total": total}))
    done = offset
    with open(part, "ab" if offset else "wb") as f, \
            progress(total=total, initial=offset, desc=part.name[:-5], unit="B", unit_scale=True) as bar:
        while True:
            try:
                block = r.read(chunk)
            except (OSError, http.client.HTTPException) as exc:  # a network error, not a local one
                raise _Retry(f"connection lost after {done} bytes: {type(exc).__name__}") from None
            if not block:
                break
            f.write(block)  # local errors (disk full) propagate as they are
            done += len(block)
            bar.update(len(block))
        f.flush()
        os.fsync(f.fileno())  # on disk before the rename and the manifest that records its md5
    if total is not None and done < total:
        raise _Retry(f"connection closed after {done} of {total} bytes")


# -- the DAG's declaration of this stage (core/stage.py) -----------------------------------------------
def _dump(p: Any) -> tuple[str, str | None]:
    """(source, md5) of a dump run: the packaged sample, or the source and md5 given."""
    if p.is_sample:
        from preprocessing.sample import SAMPLE_MD5, sample_dump_path

        return str(sample_dump_path()), SAMPLE_MD5
    return p.source, p.source_md5


def _plan_download(plan: Any) -> list[Any]:
    source, md5 = _dump(plan.params)
    return [plan.unit(source, md5=md5)]


def _check_source(p: Any) -> None:
    """A local dump (a path or file:// URL) must exist before the run starts; URLs are checked when fetched."""
    source, _ = _dump(p)
    if _WIKI_PRESET.match(source) or source.startswith("mlcommons:"):
        return
    url = _to_url(source)
    if url.startswith("file://") and not Path(_file_path(url)).is_file():
        raise InputError(f"{source}: no such file; give an existing dump, an https URL or a preset (enwiki-latest)")


def _download_key(p: Any) -> dict[str, Any]:
    source, md5 = _dump(p)
    return {"source": source, "md5": md5}


def _plan_mlcommons(plan: Any) -> list[Any]:
    return [plan.unit(vocab=plan.params.vocab is None)]


def _mlcommons_key(p: Any) -> dict[str, Any]:
    """Where the text and vocab come from (the token, read from the environment when the stage runs, is not
    part of anything recorded)."""
    return {"source": "mlcommons", **mlcommons_sources(vocab=p.vocab is None)}


DAG_STAGES = (Stage(name="download", title="the dump, md5-verified against its published checksum", reads=(),
                    run=run_download, version=STAGE_VERSION, configure=lambda p: None, plan=_plan_download,
                    key_extra=_download_key, check=_check_source, when=lambda p: p.source_kind == "dump", pass_upstream=False,
                    retries=2),
              # retries: the stage retries network errors itself; a refused token is not worth retrying
              Stage(name="download", title="MLCommons' text and vocab.txt (their R2 distribution, md5-verified)",
                    reads=(), run=run_mlcommons, version=STAGE_VERSION, configure=lambda p: None,
                    plan=_plan_mlcommons, key_extra=_mlcommons_key, check=_mlcommons_key,
                    when=lambda p: p.source_kind == "mlcommons", pass_upstream=False),)
