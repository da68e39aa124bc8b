"""Stage 1, download: a Wikipedia dump, MLCommons' published text or a local file -> one verified local file.

Sources (``run_download(source, ...)``):

* ``enwiki-latest`` (or ``<wiki>-latest`` / ``<wiki>-YYYYMMDD``): the ``pages-articles-multistream.xml.bz2``
  dump on dumps.wikimedia.org, md5 from the dump's published ``<wiki>-<date>-md5sums.txt``. "latest" is
  resolved through ``<wiki>-latest-md5sums.txt`` (it lists dated names) to the dated file, so a new dump
  published half-way through a long download cannot mix two dumps.
* ``mlcommons:<name>`` with name ``part-XXXXX-of-00500``, ``eval.txt`` or ``eval.md5``: MLCommons'
  already-cleaned ``results/`` text, checked against the sizes and md5s published in the MLPerf README
  (spec §1, :data:`MLCOMMONS_PUBLISHED`). The bucket moves; give its URL with ``mlcommons_base_url``
  or ``$BERTPIPE_MLCOMMONS_BASE_URL`` (required: the built-in default is only a placeholder).
* an ``https://`` URL, a ``file://`` URL, or a local path.

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
import hashlib
import http.client
import json
import logging
import os
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ChecksumError, DiskFullError, InputError
from core.manifest import Manifest, StageOutput, md5_file
from core.progress import progress
from core.stage import Stage
from preprocessing.textio import check_output_dir

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
WIKIMEDIA_DUMPS = "https://dumps.wikimedia.org"
MLCOMMONS_BASE_URL_ENV = "BERTPIPE_MLCOMMONS_BASE_URL"
# Placeholder: MLCommons hands the results/ folder out through a bucket / Drive link that changes.
MLCOMMONS_PLACEHOLDER_URL = "https://mlcommons-bert-results.invalid/results"

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
}
_MLCOMMONS_NAME = re.compile(r"^(part-\d{5}-of-00500|eval\.txt|eval\.md5)$")
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
    mlcommons_base_url: str | None = None  # for mlcommons:* sources; default $BERTPIPE_MLCOMMONS_BASE_URL
    require_md5: bool = False  # refuse a source without a given or published md5 (default: warn)


@dataclass(frozen=True)
class Resolved:
    """What a source string names: where to read it, the local name, and the md5 to check."""

    url: str  # https://... or file://...
    name: str
    md5: str | None  # full md5 or a published prefix
    size: int | None  # published size, when known
    md5_origin: str  # "given", "published table", the checksum file's URL, or "none"


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
    check_output_dir(out_dir)
    if res.md5 is None:
        msg = (f"no md5 given or published for {source} (looked for .md5/md5sums files next to it); "
               "the file is recorded but not verified. Pass --md5 to verify it")
        if cfg.require_md5:
            raise InputError(msg)
        log.warning(msg)
    params = {"source": source, "url": res.url, "name": res.name, "md5": res.md5}
    with StageOutput(out_dir, "download", params=params, code_version=STAGE_VERSION) as out:
        final = out.path(res.name)
        part = final.with_name(final.name + ".part")
        if final.is_file() and res.md5 and _matches(md5_file(final), res.md5):
            log.info("%s is already here and verifies; not downloading again", final)
            actual = md5_file(final)
        else:
            try:
                actual = _fetch(res, part, cfg, opener, out)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                    raise DiskFullError(exc.errno, f"no space left while writing {part}; the bytes fetched so "
                                        "far are kept: free space and run the download again to resume") from exc
                raise
            _verify(part, res)
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
        base = cfg.mlcommons_base_url or os.environ.get(MLCOMMONS_BASE_URL_ENV) or MLCOMMONS_PLACEHOLDER_URL
        if base == MLCOMMONS_PLACEHOLDER_URL:
            raise InputError(f"{source}: tell bertpipe where MLCommons' results/ folder is (the bucket or mirror "
                             f"URL MLCommons gives out): --mlcommons-base-url or ${MLCOMMONS_BASE_URL_ENV}")
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
    return h.hexdigest()


def _verify(part: Path, res: Resolved) -> None:
    """Size (when published) and md5 check of a finished download; a bad file is deleted."""
    size = part.stat().st_size
    shown = part.with_name(res.name)
    if res.size is not None and size != res.size:
        part.unlink(missing_ok=True)
        raise InputError(f"{shown}: downloaded {size} bytes from {res.url}, expected {res.size}; "
                         "the partial file was deleted, run the download again")
    if res.md5 is None:
        return
    actual = md5_file(part)
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


def _check_scheme(url: str) -> str:
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme not in ("https", "file"):
        raise InputError(f"refusing {url}: only https:// and file:// URLs (or local paths) are supported, "
                         f"not {scheme}://; use the https address of the file")
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



# -- HTTPS -------------------------------------------------------------------------------------
class _HttpsOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects, but never from https down to plain http (or any other scheme)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: ANN001 - urllib's signature
        _check_scheme(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class _Opener:
    """urllib opener for https and file URLs, with an optional CA bundle and a socket timeout."""

    def __init__(self, ca_bundle: str | None, timeout_s: float) -> None:
        if ca_bundle and not Path(ca_bundle).is_file():
            raise InputError(f"CA bundle {ca_bundle} does not exist; fix --ca-bundle / $BERTPIPE_CA_BUNDLE")
        ctx = ssl.create_default_context(cafile=ca_bundle) if ca_bundle else ssl.create_default_context()
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx),
                                                   _HttpsOnlyRedirects())
        self.timeout_s = timeout_s

    def open(self, url: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
        req = urllib.request.Request(_check_scheme(url), headers={"User-Agent": "bertpipe", **(headers or {})})
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


DAG_STAGES = (Stage(name="download", title="the dump, md5-verified against its published checksum", reads=(),
                    run=run_download, version=STAGE_VERSION, configure=lambda p: None, plan=_plan_download,
                    key_extra=_download_key, check=_check_source, when=lambda p: p.source_kind == "dump", pass_upstream=False,
                    retries=2),)
