"""download stage: local/file/https sources, md5 from every published form, resume, retries, refusals.

HTTPS tests run a local server on 127.0.0.1 with a self-signed certificate made here by the openssl CLI
and passed to the stage as its CA bundle (plain http is refused, loopback included).
"""

from __future__ import annotations

import hashlib
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from mlcommons_server import send_headers

from core.errors import ChecksumError, InputError
from core.manifest import MANIFEST_NAME, verify_manifest
from preprocessing.text import download as dl
from preprocessing.text.download import DownloadConfig, resolve, run_download

DATA = bytes(range(256)) * 4000 + b"tail"  # 1 MB + a bit: several read chunks
DATA_MD5 = hashlib.md5(DATA).hexdigest()


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


class State:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.fail_503 = 0  # answer 503 to this many requests
        self.cut_after: int | None = None  # send only this many body bytes once, then drop the connection
        self.ignore_range = False


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's API
        st: State = self.server.state  # type: ignore[attr-defined]
        st.requests.append((self.path, dict(self.headers)))
        if st.fail_503 > 0:
            st.fail_503 -= 1
            self.send_error(503)
            return
        data = st.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        body = send_headers(self, data, '"v1"', honour_range=not st.ignore_range)
        if body is None:
            return
        if st.cut_after is not None:
            self.wfile.write(body[: st.cut_after])
            st.cut_after = None
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server(tls):
    cert, key = tls
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    httpd.state = State()  # type: ignore[attr-defined]
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield httpd, f"https://127.0.0.1:{httpd.server_address[1]}", DownloadConfig(ca_bundle=str(cert), backoff_s=0)
    httpd.shutdown()
    httpd.server_close()


def _no_manifest(out: Path) -> bool:
    return not (out / MANIFEST_NAME).exists()


# -- local files --------------------------------------------------------------------------------------
def test_local_file_md5_from_sidecar(tmp_path):
    src = tmp_path / "src" / "dump.xml.bz2"
    src.parent.mkdir()
    src.write_bytes(DATA)
    (src.parent / "dump.xml.bz2.md5").write_text(f"{DATA_MD5}  dump.xml.bz2\n")
    m = run_download(str(src), tmp_path / "out")
    assert m.files[0].name == "dump.xml.bz2" and m.files[0].md5 == DATA_MD5
    assert m.counters["md5_origin"].endswith("dump.xml.bz2.md5")
    assert (tmp_path / "out" / "dump.xml.bz2").read_bytes() == DATA
    verify_manifest(tmp_path / "out")


def test_file_url_md5_from_md5sums_list(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(DATA)
    (src / "b.bin").write_bytes(b"other")
    (src / "md5sums.txt").write_text(f"{hashlib.md5(b'other').hexdigest()}  b.bin\n{DATA_MD5} *a.bin\n")
    (src / "eval.md5").write_text("d41d8cd98f00b204e9800998ecf8427e\n")  # a data file, not a checksum of a.bin
    m = run_download((src / "a.bin").as_uri(), tmp_path / "out")
    assert m.files[0].md5 == DATA_MD5 and m.counters["md5_origin"].endswith("md5sums.txt")


def test_local_md5_mismatch_is_a_checksum_error_and_leaves_nothing(tmp_path):
    src = tmp_path / "x.txt"
    src.write_bytes(DATA)
    out = tmp_path / "out"
    with pytest.raises(ChecksumError) as e:
        run_download(str(src), out, md5="0" * 32)
    assert e.value.expected == "0" * 32 and e.value.actual == DATA_MD5 and "x.txt" in str(e.value)
    assert _no_manifest(out) and sorted(p.name for p in out.iterdir()) == []


def test_missing_local_file_and_bad_md5_flag(tmp_path):
    with pytest.raises(InputError, match="nope.bz2"):
        run_download(str(tmp_path / "nope.bz2"), tmp_path / "out")
    with pytest.raises(InputError, match="32-digit"):
        run_download(str(tmp_path / "nope.bz2"), tmp_path / "out", md5="abc")


@pytest.mark.parametrize("url", ["http://127.0.0.1:1/x.bz2", "ftp://example.org/x.bz2", "gopher://h/x"])
def test_other_schemes_are_refused(tmp_path, url):
    with pytest.raises(InputError, match="only https:// and file://"):
        run_download(url, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# -- https --------------------------------------------------------------------------------------------
def test_https_with_md5sums_next_to_it(server, tmp_path):
    httpd, base, cfg = server
    httpd.state.files = {"/d/data.bin": DATA, "/d/md5sums": f"{'1' * 32}  other.bin\n{DATA_MD5}  data.bin\n".encode()}
    m = run_download(f"{base}/d/data.bin", tmp_path / "out", cfg=cfg)
    assert (tmp_path / "out" / "data.bin").read_bytes() == DATA
    assert m.files[0].md5 == DATA_MD5 and m.counters["md5_origin"] == f"{base}/d/md5sums"
    # a second call finds the verified file and does not download it again
    n = len(httpd.state.requests)
    run_download(f"{base}/d/data.bin", tmp_path / "out", cfg=cfg)
    assert [p for p, _ in httpd.state.requests[n:]] == ["/d/data.bin.md5", "/d/data.bin.md5sum", "/d/md5sums"]


def test_https_md5_mismatch_after_download(server, tmp_path):
    httpd, base, cfg = server
    httpd.state.files = {"/data.bin": DATA, "/data.bin.md5": b"f" * 32 + b"\n"}
    out = tmp_path / "out"
    with pytest.raises(ChecksumError) as e:
        run_download(f"{base}/data.bin", out, cfg=cfg)
    assert str(out / "data.bin") in str(e.value) and "f" * 32 in str(e.value) and DATA_MD5 in str(e.value)
    assert _no_manifest(out) and not (out / "data.bin").exists() and not (out / "data.bin.part").exists()


def test_cut_off_download_resumes_with_range_and_gives_identical_bytes(server, tmp_path):
    httpd, base, cfg = server
    httpd.state.files = {"/dump.bz2": DATA}
    out = tmp_path / "out"
    half = len(DATA) // 2
    httpd.state.cut_after = half
    no_retry = DownloadConfig(ca_bundle=cfg.ca_bundle, retries=0)
    with pytest.raises(InputError, match="resume"):  # the "crash": the process gives up half-way
        run_download(f"{base}/dump.bz2", out, md5=DATA_MD5, cfg=no_retry)
    assert _no_manifest(out) and not (out / "dump.bz2").exists()
    assert (out / "dump.bz2.part").stat().st_size == half
    m = run_download(f"{base}/dump.bz2", out, md5=DATA_MD5, cfg=cfg)  # the next call resumes
    last = httpd.state.requests[-1][1]
    assert last["Range"] == f"bytes={half}-" and last["If-Range"] == '"v1"'
    assert (out / "dump.bz2").read_bytes() == DATA and m.files[0].md5 == DATA_MD5
    assert not (out / "dump.bz2.part").exists() and not (out / "dump.bz2.part.json").exists()


def test_connection_drop_is_retried_within_one_call(server, tmp_path):
    httpd, base, cfg = server
    httpd.state.files = {"/dump.bz2": DATA}
    httpd.state.cut_after = 12345
    m = run_download(f"{base}/dump.bz2", tmp_path / "out", md5=DATA_MD5, cfg=cfg)
    assert m.counters["attempts"] == 2 and (tmp_path / "out" / "dump.bz2").read_bytes() == DATA


def test_server_without_range_support_restarts_from_zero(server, tmp_path):
    httpd, base, cfg = server
    httpd.state.files = {"/dump.bz2": DATA}
    httpd.state.cut_after, httpd.state.ignore_range = 1000, True
    run_download(f"{base}/dump.bz2", tmp_path / "out", md5=DATA_MD5, cfg=cfg)
    assert (tmp_path / "out" / "dump.bz2").read_bytes() == DATA


def test_5xx_is_retried_then_succeeds_and_4xx_is_not(server, tmp_path):
    httpd, base, cfg = server
    httpd.state.files = {"/dump.bz2": DATA}
    httpd.state.fail_503 = 2
    m = run_download(f"{base}/dump.bz2", tmp_path / "a", md5=DATA_MD5, cfg=cfg)
    assert m.counters["attempts"] == 3
    httpd.state.fail_503 = 10
    with pytest.raises(InputError, match="giving up after 3 attempts"):
        run_download(f"{base}/dump.bz2", tmp_path / "b", md5=DATA_MD5,
                     cfg=DownloadConfig(ca_bundle=cfg.ca_bundle, backoff_s=0, retries=2))
    httpd.state.fail_503 = 0
    n = len(httpd.state.requests)
    with pytest.raises(InputError, match="HTTP 404"):
        run_download(f"{base}/missing.bz2", tmp_path / "c", md5=DATA_MD5, cfg=cfg)
    assert len(httpd.state.requests) == n + 1 and _no_manifest(tmp_path / "c")


def test_untrusted_certificate_is_a_clear_error(server, tmp_path, monkeypatch):
    httpd, base, _ = server
    httpd.state.files = {"/dump.bz2": DATA}
    monkeypatch.delenv("BERTPIPE_CA_BUNDLE", raising=False)
    with pytest.raises(InputError, match="ca-bundle"):
        run_download(f"{base}/dump.bz2", tmp_path / "out", md5=DATA_MD5)


# -- presets ------------------------------------------------------------------------------------------
def test_enwiki_latest_resolves_to_the_dated_dump_and_its_published_md5(server, tmp_path, monkeypatch):
    httpd, base, cfg = server
    monkeypatch.setattr(dl, "WIKIMEDIA_DUMPS", base)
    name = "enwiki-20260101-pages-articles-multistream.xml.bz2"
    httpd.state.files = {
        "/enwiki/latest/enwiki-latest-md5sums.txt":
            f"{'a' * 32}  enwiki-20260101-pages-articles.xml.bz2\n{DATA_MD5}  {name}\n".encode(),
        f"/enwiki/20260101/{name}": DATA,
    }
    res = resolve("enwiki-latest", cfg=cfg)
    assert res.url == f"{base}/enwiki/20260101/{name}" and res.md5 == DATA_MD5
    m = run_download("enwiki-latest", tmp_path / "out", cfg=cfg)
    assert m.files[0].name == name and m.files[0].md5 == DATA_MD5
    with pytest.raises(InputError, match="not found"):
        resolve("enwiki-20250101", cfg=cfg)


def test_mlcommons_results_use_the_published_table(server, tmp_path, monkeypatch):
    httpd, base, cfg = server
    monkeypatch.delenv(dl.MLCOMMONS_BASE_URL_ENV, raising=False)
    mc = DownloadConfig(ca_bundle=cfg.ca_bundle, backoff_s=0, mlcommons_base_url=f"{base}/results/")
    res = resolve("mlcommons:eval.txt", cfg=mc)
    assert res.url == f"{base}/results/eval.txt"
    assert (res.size, res.md5) == (32_851_144, "2a220f790517261547b1b45ed3ada07a")
    assert resolve("mlcommons:part-00001-of-00500", cfg=mc).md5 == "549a9ed4"  # only a prefix is published
    assert resolve("mlcommons:part-00042-of-00500", cfg=mc).md5 is None
    with pytest.raises(InputError, match="MLCommons publishes"):
        resolve("mlcommons:part-1", cfg=mc)
    with pytest.raises(InputError, match="mlcommons-base-url.*`bertpipe download mlcommons`"):  # no mirror:
        resolve("mlcommons:eval.txt", cfg=DownloadConfig())  # fail at once, pointing at MLCommons' distribution
    assert resolve("mlcommons:vocab.txt", cfg=mc).md5 == "64800d5d8528ce344256daf115d4965e"
    httpd.state.files = {"/results/eval.md5": b"not the published file\n"}
    with pytest.raises(InputError, match="expected 330000"):  # size is checked before the md5
        run_download("mlcommons:eval.md5", tmp_path / "out", cfg=mc)
    assert _no_manifest(tmp_path / "out") and not list((tmp_path / "out").iterdir())
    assert dl._matches("549a9ed4" + "0" * 24, "549a9ed4") and not dl._matches("549a9ed5" + "0" * 24, "549a9ed4")


def test_parse_md5sums_forms():
    text = f"{DATA_MD5}  a b.bin\n{'B' * 32} *dir/c.bin\nnot a line\n"
    assert dl.parse_md5sums(text) == [(DATA_MD5, "a b.bin"), ("b" * 32, "c.bin")]
    assert dl.md5_from_checksum_text(f"{DATA_MD5}\n", "x", sidecar=True) == DATA_MD5
    assert dl.md5_from_checksum_text(f"{DATA_MD5}\n{DATA_MD5}\n", "x", sidecar=True) is None
    assert dl.md5_from_checksum_text(f"{DATA_MD5}\n", "x", sidecar=False) is None


def test_unusable_output_folder_is_a_clear_error(tmp_path):
    (tmp_path / "afile").write_bytes(DATA)
    with pytest.raises(InputError, match="afile"):
        run_download(str(tmp_path / "afile"), tmp_path / "afile" / "out")
