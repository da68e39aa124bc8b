"""A local stand-in for MLCommons' distribution (Cloudflare R2 behind Cloudflare Access), for the download tests.

HTTPS on 127.0.0.1 with a self-signed certificate made here (the ``cryptography`` package, else the openssl
CLI). It serves the layout MLCommons' R2 downloader reads: ``/metadata/<dataset>.uri`` (the dataset's base
URL), ``/metadata/<dataset>.md5`` (``<md5>  ./relative/path`` lines) and the files under the base URL. Every
request must carry ``cf-access-token: <token>`` (or a service token's ``cf-access-client-id`` and
``cf-access-client-secret``; 403 without them, or a 302 to Cloudflare Access's login page
with ``login_redirect``). Range requests are answered with 206; ``cut`` paths are cut off half-way once.
Nothing here talks to anything but the loopback address.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import ipaddress
import shutil
import ssl
import subprocess
import tarfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

TOKEN = "test-token.eyJleHAiOjF9.sig"


def make_cert(d: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1/localhost: (cert.pem, key.pem)."""
    cert, key = d / "cert.pem", d / "key.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            import pytest

            pytest.skip("neither the cryptography package nor the openssl CLI is there to make a test certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "2", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
        return cert, key
    k = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    c = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(k.public_key())
         .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                     x509.DNSName("localhost")]), critical=False)
         .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
         .sign(k, hashes.SHA256()))
    cert.write_bytes(c.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()))
    return cert, key


@dataclass
class State:
    files: dict[str, bytes] = field(default_factory=dict)
    token: str | None = TOKEN  # None: no access control
    service: tuple[str, str] | None = None  # a service token (client id, secret) also let in
    login_redirect: bool = False  # without a valid token: 302 to Cloudflare Access's login (as the real one)
    cut: set[str] = field(default_factory=set)  # paths whose next transfer stops half-way
    redirects: dict[str, str] = field(default_factory=dict)  # path -> Location answered with a 302 (any token)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def paths(self, since: int = 0) -> list[str]:
        return [p for p, _ in self.requests[since:]]


def send_headers(handler: BaseHTTPRequestHandler, data: bytes, etag: str, honour_range: bool = True) -> bytes | None:
    """Answer a GET for ``data`` as a server with Range support does: 206 from the requested offset, 416 past
    the end (returns None: nothing more to send), else 200. Returns the body still to write."""
    start, rng = 0, handler.headers.get("Range")
    if rng and honour_range:
        start = int(rng.removeprefix("bytes=").rstrip("-"))
        if start >= len(data):
            handler.send_response(416)
            handler.send_header("Content-Range", f"bytes */{len(data)}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return None
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
    else:
        handler.send_response(200)
    body = data[start:]
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("ETag", etag)
    handler.end_headers()
    return body


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's API
        st: State = self.server.state  # type: ignore[attr-defined]
        st.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        if self.path in st.redirects:
            self.send_response(302)
            self.send_header("Location", st.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        service = st.service is not None and (self.headers.get("cf-access-client-id"),
                                              self.headers.get("cf-access-client-secret")) == st.service
        if st.token is not None and self.headers.get("cf-access-token") != st.token and not service:
            if st.login_redirect:
                self.send_response(302)
                self.send_header("Location", "https://mlcommons.cloudflareaccess.com/cdn-cgi/access/login/x")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_error(403, "Forbidden")
            return
        data = st.files.get(self.path)
        if data is None:
            self.send_error(404)
            return
        body = send_headers(self, data, '"' + hashlib.md5(data).hexdigest() + '"')
        if body is None:
            return
        if self.path in st.cut:
            st.cut.discard(self.path)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


class MlcServer:
    """The server, started in a thread: ``url``, ``state``, ``publish()``; ``close()`` stops it."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.state = self.httpd.state = State()  # type: ignore[attr-defined]
        self.url = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        self.metadata = f"{self.url}/metadata"
        self._t = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._t.start()

    def publish(self, dataset: str, base: str, files: dict[str, bytes], *, md5s: dict[str, str] | None = None) -> str:
        """Serve ``files`` (relative path -> bytes) under ``/<base>`` as ``dataset``; ``md5s`` overrides listed
        md5s (a wrong one). Returns the metadata URL."""
        md5s = md5s or {}
        for rel, data in files.items():
            self.state.files[f"/{base}/{rel}"] = data
        self.state.files[f"/metadata/{dataset}.uri"] = f"{self.url}/{base}\n".encode()
        listing = "".join(f"{md5s.get(rel, hashlib.md5(data).hexdigest())}  ./{rel}\n" for rel, data in files.items())
        self.state.files[f"/metadata/{dataset}.md5"] = listing.encode()
        return f"{self.metadata}/{dataset}.uri"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def text_archive(text: dict[str, bytes], top: str = "results4") -> tuple[bytes, bytes]:
    """MLCommons' packing of the text: (results_text.tar.gz bytes, bert_reference_results_text_md5.txt bytes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        d = tarfile.TarInfo(top)
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for name, data in text.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sums = "".join(f"{hashlib.md5(data).hexdigest()}  ./{name}\n" for name, data in text.items())
    return buf.getvalue(), sums.encode()


def publish_bert(srv: MlcServer, text: dict[str, bytes], vocab: bytes) -> None:
    """Both BERT datasets in MLCommons' layout: the wikipedia dataset (text archive + its md5 list + a zip and
    a licence that the text route does not need) and the input files (vocab, config, a checkpoint)."""
    tgz, sums = text_archive(text)
    srv.publish("bert-preprocessed-wikipedia-dataset", "wikipedia_for_bert/processed_dataset",
                {"License.txt": b"licence\n", "results_text.tar.gz": tgz, "bert_reference_results_text_md5.txt": sums,
                 "results_text.zip": b"PK not needed"})
    srv.publish("bert-input-files", "wikipedia_for_bert/input_files",
                {"vocab.txt": vocab, "bert_config.json": b"{}\n", "tf1_ckpt/model.ckpt-28252.index": b"idx",
                 "License.txt": b"licence\n"})
