"""Issue 23.4 and the download items of 23.5/23.6: the access token stays with its origin (scheme, host, port), a
server cannot make bertpipe read local files, listings cannot name bertpipe's bookkeeping files, and concurrent
downloads into one folder take turns. Real HTTPS servers on 127.0.0.1 (tests/mlcommons_server.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from mlcommons_server import TOKEN, MlcServer, make_cert, publish_bert

from core.errors import InputError
from core.manifest import MANIFEST_NAME, STAT_NAME, verify_manifest
from preprocessing.text import download as dl
from preprocessing.text.download import DownloadConfig, run_download, run_mlcommons, run_mlcommons_dataset

ROOT = Path(__file__).resolve().parents[3]
WIKI = "bert-preprocessed-wikipedia-dataset"
TEXT = {"part-00000-of-00500": b"doc one line.\n\ndoc two.\n", "part-00001-of-00500": bytes(range(256)) * 2000,
        "eval.txt": b"eval doc.\n", "eval.md5": b"0" * 32 + b"\n"}


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def servers(cert, monkeypatch):
    a, b = MlcServer(*cert), MlcServer(*cert)  # two ports of the same host
    b.state.token = None  # the other origin lets anyone in, and records what it was sent
    for var in (dl.MLCOMMONS_TOKEN_ENV, dl.MLCOMMONS_BASE_URL_ENV, "BERTPIPE_CA_BUNDLE", dl.SERVICE_ID_ENV,
                dl.SERVICE_SECRET_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(dl.MLCOMMONS_METADATA_ENV, a.metadata)
    yield a, b
    a.close()
    b.close()


def cfg(cert, **kw) -> DownloadConfig:
    return DownloadConfig(ca_bundle=str(cert[0]), backoff_s=0, retries=0, **{"token": TOKEN, **kw})


def _secret_headers(server: MlcServer) -> list[str]:
    return [k for _, h in server.state.requests for k in h if k in dl._SECRET_HEADERS]


# -- origin: scheme, host and port ------------------------------------------------------------------------------
@pytest.mark.parametrize("target,keeps", [
    ("https://a.example/y", True),
    ("https://A.EXAMPLE:443/y", True),  # the same origin spelled otherwise
    ("https://a.example:8443/y", False),  # another port of the same host
    ("https://b.example/y", False),
    ("https://a.example.evil.test/y", False),
])
def test_a_redirect_keeps_the_token_only_within_its_origin(target, keeps):
    h = dl._HttpsOnlyRedirects("get a token")
    for header in ({dl.TOKEN_HEADER: "secret"}, {"CF-Access-Client-Id": "i", "CF-Access-Client-Secret": "s"}):
        req = urllib.request.Request("https://a.example/x", headers=header)
        out = h.redirect_request(req, None, 302, "Found", {}, target)
        kept = [k for k in out.headers if k.lower() in dl._SECRET_HEADERS]
        assert bool(kept) == keeps, (target, kept)


@pytest.mark.parametrize("target", ["http://a.example/y", "file:///etc/passwd", "ftp://a.example/y",
                                    "data:text/plain,x"])
def test_a_redirect_off_https_is_refused(target):
    h = dl._HttpsOnlyRedirects("get a token")
    req = urllib.request.Request("https://a.example/x", headers={dl.TOKEN_HEADER: "secret"})
    with pytest.raises(InputError, match=f"refusing {target.split(':')[0]}:.*only redirect to https://"):
        h.redirect_request(req, None, 302, "Found", {}, target)


def test_a_302_to_another_port_of_the_same_host_gets_no_token(servers, cert, tmp_path):
    """The issue's case: the metadata host answers 302 to another port of 127.0.0.1: that server sees no token,
    and the download still completes there (the file needs no token)."""
    a, b = servers
    data = b"moved file\n"
    b.state.files["/moved/notes.txt"] = data
    meta = a.publish(WIKI, "w", {"notes.txt": b"placeholder\n"},
                     md5s={"notes.txt": hashlib.md5(data).hexdigest()})
    a.state.redirects["/w/notes.txt"] = f"{b.url}/moved/notes.txt"
    m = run_mlcommons_dataset(tmp_path / "out", dataset=meta, cfg=cfg(cert))
    assert (tmp_path / "out" / "notes.txt").read_bytes() == data and m.file("notes.txt").md5 == hashlib.md5(data).hexdigest()
    assert b.state.paths() == ["/moved/notes.txt"]
    assert _secret_headers(b) == []  # the token stayed with its origin
    assert all(h.get(dl.TOKEN_HEADER) == TOKEN for _, h in a.state.requests)


def test_a_metadata_file_naming_its_base_on_another_port_gets_no_token_there(servers, cert, tmp_path, caplog):
    """Issue 33.2: the .uri on port A names its base on port B: the files are fetched from B without the token (a
    warning says so), and A still gets it."""
    import logging

    a, b = servers
    data = b"a file on the other origin\n"
    b.state.files["/w/notes.txt"] = data
    a.state.files[f"/metadata/{WIKI}.uri"] = f"{b.url}/w\n".encode()
    a.state.files[f"/metadata/{WIKI}.md5"] = f"{hashlib.md5(data).hexdigest()}  ./notes.txt\n".encode()
    with caplog.at_level(logging.WARNING, logger="preprocessing.text.download"):
        run_mlcommons_dataset(tmp_path / "out", cfg=cfg(cert))
    assert (tmp_path / "out" / "notes.txt").read_bytes() == data
    assert b.state.paths() == ["/w/notes.txt"] and _secret_headers(b) == []
    assert a.state.requests and all(h.get(dl.TOKEN_HEADER) == TOKEN for _, h in a.state.requests)
    assert any("without the token" in r.getMessage() for r in caplog.records)


def test_a_service_token_stays_with_its_origin_too(servers, cert, tmp_path, monkeypatch):
    a, b = servers
    monkeypatch.setenv(dl.SERVICE_ID_ENV, "id-1")
    monkeypatch.setenv(dl.SERVICE_SECRET_ENV, "secret-1")
    data = b"x\n"
    b.state.files["/w/notes.txt"] = data
    a.state.token = None
    a.state.files[f"/metadata/{WIKI}.uri"] = f"{b.url}/w\n".encode()
    a.state.files[f"/metadata/{WIKI}.md5"] = f"{hashlib.md5(data).hexdigest()}  ./notes.txt\n".encode()
    run_mlcommons_dataset(tmp_path / "out", cfg=cfg(cert, token=None))
    assert _secret_headers(b) == [] and _secret_headers(a)


def test_a_remote_metadata_file_may_name_only_https_bases(servers, cert, tmp_path):
    a, _ = servers
    secret = tmp_path / "local"
    secret.mkdir()
    (secret / "notes.txt").write_bytes(b"a local file\n")
    a.state.files[f"/metadata/{WIKI}.uri"] = (secret.as_uri() + "\n").encode()
    digest = hashlib.md5(b"a local file\n").hexdigest()
    a.state.files[f"/metadata/{WIKI}.md5"] = f"{digest}  ./notes.txt\n".encode()
    with pytest.raises(InputError, match="may only name https:// bases") as e:
        run_mlcommons_dataset(tmp_path / "out", cfg=cfg(cert))
    assert "\n" not in str(e.value)
    assert not (tmp_path / "out" / "notes.txt").exists()


def test_a_redirect_to_a_local_file_is_refused_end_to_end(servers, cert, tmp_path):
    a, _ = servers
    local = tmp_path / "secret.txt"
    local.write_bytes(b"do not read\n")
    meta = a.publish(WIKI, "w", {"notes.txt": b"do not read\n"})
    a.state.redirects["/w/notes.txt"] = local.as_uri()
    with pytest.raises(InputError, match="file:///.*(not allowed|only redirect to https)"):
        run_mlcommons_dataset(tmp_path / "out", dataset=meta, cfg=cfg(cert))
    assert not (tmp_path / "out" / "notes.txt").exists()


# -- reserved names -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [MANIFEST_NAME, STAT_NAME, "_dropped.json", ".bertpipe.lock", dl.DOWNLOAD_LOCK,
                                  "sub/_manifest.json", "x.part", ".eval.txt.tmp-123", "a.manifest.json"])
def test_a_listing_may_not_name_bertpipes_own_files(servers, cert, tmp_path, name):
    a, _ = servers
    meta = a.publish(WIKI, "w", {"eval.txt": b"e\n", name: b'{"stage": "x"}\n'})
    with pytest.raises(InputError, match="bertpipe keeps for its own bookkeeping") as e:
        run_mlcommons_dataset(tmp_path / "out", dataset=meta, cfg=cfg(cert))
    assert "\n" not in str(e.value) and a.state.paths() == [f"/metadata/{WIKI}.uri", f"/metadata/{WIKI}.md5"]


@pytest.mark.parametrize("name", [MANIFEST_NAME, STAT_NAME, "notes.part"])
def test_a_download_may_not_be_saved_under_a_reserved_name(tmp_path, name):
    src = tmp_path / "src" / name
    src.parent.mkdir()
    src.write_text("{}\n")
    with pytest.raises(InputError, match="(bertpipe's own bookkeeping|cannot use '_manifest.json')"):
        run_download(str(src), tmp_path / "out", md5=hashlib.md5(b"{}\n").hexdigest())


# -- concurrent downloads into one folder -----------------------------------------------------------------------
def test_three_concurrent_downloads_into_one_folder_take_turns(servers, cert, tmp_path):
    """Three `bertpipe download mlcommons --text` processes into one --out: all succeed (they take turns on the
    folder's lock; the later ones find the files verified), and the folder verifies."""
    a, _ = servers
    publish_bert(a, TEXT, b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    out = tmp_path / "text"
    env = {**os.environ, dl.MLCOMMONS_METADATA_ENV: a.metadata, "BERTPIPE_CA_BUNDLE": str(cert[0]),
           dl.MLCOMMONS_TOKEN_ENV: TOKEN, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bertpipe", "download", "mlcommons", "--text", "--out", str(out)]
    procs = [subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err
        assert "Traceback" not in err
    m = verify_manifest(out)
    assert {f.name for f in m.files} >= set(TEXT)
    for name, data in TEXT.items():
        assert (out / name).read_bytes() == data
    assert not list(out.glob("*.part")) and not list(out.glob(".*.tmp-*"))


def test_the_download_lock_names_its_holder_while_waiting(tmp_path, caplog):
    import threading
    import time

    held, release = threading.Event(), threading.Event()

    def holder():
        with dl.download_lock(tmp_path):
            held.set()
            release.wait(5)

    t = threading.Thread(target=holder)
    t.start()
    held.wait(5)
    t0 = time.monotonic()
    threading.Timer(0.6, release.set).start()
    with caplog.at_level("WARNING"), dl.download_lock(tmp_path, note_every_s=0.2):
        waited = time.monotonic() - t0
    t.join()
    assert waited >= 0.5
    assert any("waiting for another download into" in r.message and f"pid {os.getpid()}" in r.message
               for r in caplog.records)


def test_run_mlcommons_still_works_with_the_lock_file_in_the_folder(servers, cert, tmp_path):
    a, _ = servers
    publish_bert(a, TEXT, b"[PAD]\n")
    out = tmp_path / "dl"
    run_mlcommons(out, vocab=False, cfg=cfg(cert))
    assert not (out / dl.DOWNLOAD_LOCK).exists()  # the lock file lives only while a download holds it
    m = run_mlcommons(out, vocab=False, cfg=cfg(cert))  # the re-run finds every file verified
    assert dl.DOWNLOAD_LOCK not in {f.name for f in m.files}
    verify_manifest(out)
