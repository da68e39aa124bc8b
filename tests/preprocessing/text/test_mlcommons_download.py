"""MLCommons' distribution: metadata .uri -> md5 list -> files, with the Cloudflare Access token header, against
a local HTTPS server that serves the same layout (tests/mlcommons_server.py): every file or a selection,
resumed after a cut-off transfer, verified, skipped on a re-run; the text unpacked from results_text.tar.gz;
missing/refused tokens and wrong md5s as one-line errors; the flat mirror override; the CLI."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from mlcommons_server import TOKEN, MlcServer, make_cert, publish_bert, text_archive

from core.errors import ChecksumError, InputError
from core.manifest import MANIFEST_NAME, verify_manifest
from preprocessing.text import download as dl
from preprocessing.text.download import DownloadConfig, run_mlcommons, run_mlcommons_dataset

WIKI = "bert-preprocessed-wikipedia-dataset"
BIG = bytes(range(256)) * 3000  # 768 KB: several read chunks, so a cut-off leaves a real partial file
TEXT = {"part-00000-of-00500": b"doc one line.\n\ndoc two.\n", "part-00001-of-00500": BIG,
        "eval.txt": b"eval doc.\n", "eval.md5": b"0" * 32 + b"\n"}
FILES = {f"results4/{n}": d for n, d in TEXT.items()} | {"License.txt": b"licence\n",
                                                        "extra/notes.txt": b"notes\n"}


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def srv(cert, monkeypatch):
    s = MlcServer(*cert)
    for var in (dl.MLCOMMONS_TOKEN_ENV, dl.MLCOMMONS_BASE_URL_ENV, "BERTPIPE_CA_BUNDLE", dl.SERVICE_ID_ENV,
                dl.SERVICE_SECRET_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(dl.MLCOMMONS_METADATA_ENV, s.metadata)
    yield s
    s.close()


def cfg(cert, **kw) -> DownloadConfig:
    return DownloadConfig(ca_bundle=str(cert[0]), backoff_s=0, **{"token": TOKEN, **kw})


# -- the protocol -----------------------------------------------------------------------------------------
def test_every_file_of_a_dataset_with_the_token_header(srv, cert, tmp_path):
    meta = srv.publish(WIKI, "wiki/processed", FILES)
    out = tmp_path / "out"
    m = run_mlcommons_dataset(out, cfg=cfg(cert))
    assert srv.state.paths()[:2] == [f"/metadata/{WIKI}.uri", f"/metadata/{WIKI}.md5"]  # metadata, then the list
    assert sorted(srv.state.paths()[2:]) == sorted(f"/wiki/processed/{rel}" for rel in FILES)
    assert all(h.get("cf-access-token") == TOKEN for _, h in srv.state.requests)
    for rel, data in FILES.items():  # relative paths kept, as MLCommons' downloader does
        assert (out / rel).read_bytes() == data
    assert {f.name: f.md5 for f in m.files}.items() >= {rel: md5(d) for rel, d in FILES.items()}.items()
    assert (out / f"{WIKI}.md5").read_text() == srv.state.files[f"/metadata/{WIKI}.md5"].decode()  # md5sum -c
    assert m.params["dataset"] == meta and m.counters["files"] == len(FILES)
    verify_manifest(out)
    assert not list(out.rglob("*.part"))


def test_include_selects_by_path_or_name(srv, cert, tmp_path):
    srv.publish(WIKI, "wiki/processed", FILES)
    m = run_mlcommons_dataset(tmp_path / "out", include=["results4/part-0000[0]*", "eval.txt"], cfg=cfg(cert))
    assert sorted(f.name for f in m.files) == [f"{WIKI}.md5", "results4/eval.txt", "results4/part-00000-of-00500"]
    assert sorted(srv.state.paths()[2:]) == ["/wiki/processed/results4/eval.txt",
                                             "/wiki/processed/results4/part-00000-of-00500"]
    with pytest.raises(InputError, match="no file of .* matches; it lists"):
        run_mlcommons_dataset(tmp_path / "o2", include=["nope*"], cfg=cfg(cert))


def test_a_transfer_cut_off_half_way_is_resumed_and_verified(srv, cert, tmp_path):
    srv.publish(WIKI, "wiki/processed", FILES)
    path = "/wiki/processed/results4/part-00001-of-00500"
    srv.state.cut.add(path)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="run the download again to resume"):  # the process gives up half-way
        run_mlcommons_dataset(out, cfg=cfg(cert, retries=0))
    part = out / "results4" / "part-00001-of-00500.part"
    assert part.stat().st_size == len(BIG) // 2 and not (out / "results4" / "part-00001-of-00500").exists()
    assert not (out / MANIFEST_NAME).exists()
    n = len(srv.state.requests)
    done_before = [p for p in srv.state.paths() if p.startswith("/wiki/") and p != path]
    assert done_before  # files listed before the cut one were fetched and renamed into place
    run_mlcommons_dataset(out, cfg=cfg(cert))  # the next call resumes it (HTTP Range) and skips what verifies
    gets = [(p, h) for p, h in srv.state.requests[n:] if p.startswith("/wiki/")]
    assert gets[0][0] == path and not set(done_before) & {p for p, _ in gets}  # verified files: not again
    assert gets[0][1]["range"] == f"bytes={len(BIG) // 2}-" and gets[0][1]["cf-access-token"] == TOKEN
    assert (out / "results4" / "part-00001-of-00500").read_bytes() == BIG and not part.exists()
    verify_manifest(out)


def test_cut_off_within_one_call_is_retried_from_where_it_stopped(srv, cert, tmp_path):
    srv.publish(WIKI, "wiki/processed", FILES)
    path = "/wiki/processed/results4/part-00001-of-00500"
    srv.state.cut.add(path)
    m = run_mlcommons_dataset(tmp_path / "out", include=["part-00001-of-00500"], cfg=cfg(cert))
    gets = [h for p, h in srv.state.requests if p == path]
    assert len(gets) == 2 and "range" not in gets[0] and gets[1]["range"] == f"bytes={len(BIG) // 2}-"
    assert m.counters["attempts"] == 2 and (tmp_path / "out/results4/part-00001-of-00500").read_bytes() == BIG


def test_a_rerun_downloads_nothing_already_verified(srv, cert, tmp_path):
    srv.publish(WIKI, "wiki/processed", FILES)
    run_mlcommons_dataset(tmp_path / "out", cfg=cfg(cert))
    n = len(srv.state.requests)
    m = run_mlcommons_dataset(tmp_path / "out", cfg=cfg(cert))
    assert srv.state.paths(n) == [f"/metadata/{WIKI}.uri", f"/metadata/{WIKI}.md5"]
    assert m.counters["skipped"] == len(FILES)


def test_wrong_md5_is_one_line_naming_the_file_and_nothing_is_renamed(srv, cert, tmp_path):
    srv.publish(WIKI, "wiki/processed", FILES, md5s={"results4/eval.txt": "e" * 32})
    out = tmp_path / "out"
    with pytest.raises(ChecksumError) as e:
        run_mlcommons_dataset(out, include=["eval.txt"], cfg=cfg(cert))
    msg = str(e.value)
    assert "\n" not in msg and str(out / "results4" / "eval.txt") in msg and "e" * 32 in msg
    assert md5(TEXT["eval.txt"]) in msg
    assert not (out / "results4" / "eval.txt").exists() and not (out / "results4" / "eval.txt.part").exists()
    assert not (out / MANIFEST_NAME).exists()


@pytest.mark.parametrize("token", [None, "expired-token"])
def test_missing_or_refused_token_says_how_to_get_one(srv, cert, tmp_path, token):
    meta = srv.publish(WIKI, "wiki/processed", FILES)
    with pytest.raises(InputError) as e:
        run_mlcommons_dataset(tmp_path / "out", cfg=cfg(cert, token=token))
    msg = str(e.value)
    assert "\n" not in msg and "HTTP 403" in msg and f"cloudflared access token --app={meta}" in msg
    assert "--token" in msg and dl.MLCOMMONS_TOKEN_ENV in msg
    assert ("refused" in msg) == (token is not None)
    assert srv.state.paths() == [f"/metadata/{WIKI}.uri"] and not (tmp_path / "out").exists()


def test_token_from_the_environment_and_a_login_redirect(srv, cert, tmp_path, monkeypatch):
    meta = srv.publish(WIKI, "wiki/processed", FILES)
    srv.state.login_redirect = True  # Cloudflare Access answers 302 to its login page, never follows it
    with pytest.raises(InputError, match=f"Cloudflare Access's login; .*cloudflared access token --app={meta}"):
        run_mlcommons_dataset(tmp_path / "a", cfg=cfg(cert, token=None))
    assert [p for p, _ in srv.state.requests] == [f"/metadata/{WIKI}.uri"]
    monkeypatch.setenv(dl.MLCOMMONS_TOKEN_ENV, TOKEN)
    m = run_mlcommons_dataset(tmp_path / "b", include=["eval.txt"], cfg=cfg(cert, token=None))
    assert [f.name for f in m.files if f.name.endswith("eval.txt")] == ["results4/eval.txt"]


def test_service_token_from_the_environment(srv, cert, tmp_path, monkeypatch):
    srv.publish(WIKI, "wiki/processed", FILES)
    srv.state.service = ("client.access", "s3cret")
    monkeypatch.setenv(dl.SERVICE_ID_ENV, "client.access")
    with pytest.raises(InputError, match=f"needs both .*{dl.SERVICE_SECRET_ENV}"):
        run_mlcommons_dataset(tmp_path / "a", cfg=cfg(cert, token=None))
    monkeypatch.setenv(dl.SERVICE_SECRET_ENV, "wrong")
    with pytest.raises(InputError, match="service token .* was refused") as e:
        run_mlcommons_dataset(tmp_path / "a", cfg=cfg(cert, token=None))
    assert "s3cret" not in str(e.value) and "wrong" not in str(e.value)
    monkeypatch.setenv(dl.SERVICE_SECRET_ENV, "s3cret")
    m = run_mlcommons_dataset(tmp_path / "b", include=["eval.txt"], cfg=cfg(cert, token=None))
    assert "results4/eval.txt" in [f.name for f in m.files]
    last = srv.state.requests[-1][1]
    assert (last["cf-access-client-id"], last["cf-access-client-secret"]) == srv.state.service
    assert "cf-access-token" not in last


def test_redirect_to_another_host_drops_the_token():
    import urllib.request

    h = dl._HttpsOnlyRedirects("get a token")
    req = urllib.request.Request("https://a.example/x", headers={dl.TOKEN_HEADER: "secret"})
    same = h.redirect_request(req, None, 302, "Found", {}, "https://a.example/y")
    other = h.redirect_request(req, None, 302, "Found", {}, "https://b.example/y")
    assert any(k.lower() == dl.TOKEN_HEADER for k in same.headers)
    assert not any(k.lower() == dl.TOKEN_HEADER for k in other.headers)
    svc = urllib.request.Request("https://a.example/x", headers={"CF-Access-Client-Id": "i",
                                                                 "CF-Access-Client-Secret": "s", "X-Other": "1"})
    moved = h.redirect_request(svc, None, 302, "Found", {}, "https://b.example/y")
    assert [k.lower() for k in moved.headers] == ["x-other"]
    with pytest.raises(InputError, match="refusing http://b.example"):
        h.redirect_request(req, None, 302, "Found", {}, "http://b.example/y")


# -- the text for the DAG: unpacked from results_text.tar.gz, and the vocab -------------------------------------
def test_text_unpacked_from_the_archive_with_the_vocab(srv, cert, tmp_path):
    vocab = b"[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n"
    publish_bert(srv, TEXT, vocab)
    out = tmp_path / "dl"
    m = run_mlcommons(out, cfg=cfg(cert))
    for name, data in TEXT.items():
        assert (out / name).read_bytes() == data
    assert (out / "vocab.txt").read_bytes() == vocab
    assert not (out / "results_text.tar.gz").exists() and not list(out.glob("*.part"))  # transport only
    assert sorted(f.name for f in m.files) == sorted([*TEXT, "vocab.txt", "bert_reference_results_text_md5.txt"])
    fetched = [p for p in srv.state.paths() if not p.startswith("/metadata/")]
    assert sorted(fetched) == ["/wikipedia_for_bert/input_files/vocab.txt",  # not the zip, config, checkpoint
                               "/wikipedia_for_bert/processed_dataset/bert_reference_results_text_md5.txt",
                               "/wikipedia_for_bert/processed_dataset/results_text.tar.gz"]
    assert m.params["text"].endswith(f"/metadata/{WIKI}.uri") and m.params["vocab"].endswith("bert-input-files.uri")
    verify_manifest(out)
    n = len(srv.state.requests)
    run_mlcommons(out, cfg=cfg(cert))  # a re-run: every text file verifies, the archive is not fetched again
    assert "/wikipedia_for_bert/processed_dataset/results_text.tar.gz" not in srv.state.paths(n)
    m2 = run_mlcommons(tmp_path / "sel", vocab=False, include=["part-00000*", "eval.txt"], cfg=cfg(cert))
    assert sorted(f.name for f in m2.files) == ["bert_reference_results_text_md5.txt", "eval.txt",
                                                "part-00000-of-00500"]


def test_an_archive_member_with_the_wrong_md5_is_not_renamed_into_place(srv, cert, tmp_path):
    tgz, sums = text_archive(TEXT)
    bad = sums.decode().replace(md5(TEXT["eval.txt"]), "a" * 32).encode()
    srv.publish(WIKI, "w", {"results_text.tar.gz": tgz, "bert_reference_results_text_md5.txt": bad})
    out = tmp_path / "dl"
    with pytest.raises(ChecksumError) as e:
        run_mlcommons(out, vocab=False, cfg=cfg(cert))
    assert "\n" not in str(e.value) and "results4/eval.txt" in str(e.value) and "a" * 32 in str(e.value)
    assert not (out / "eval.txt").exists() and not list(out.glob(".*tmp*")) and not (out / MANIFEST_NAME).exists()


def test_flat_mirror_override_keeps_the_old_layout(srv, cert, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name, data in TEXT.items():
        (mirror / name).write_bytes(data)
    (mirror / "bert_reference_results_text_md5.txt").write_text(
        "".join(f"{md5(d)}  ./{n}\n" for n, d in TEXT.items()))
    monkeypatch.setenv(dl.MLCOMMONS_BASE_URL_ENV, mirror.as_uri())
    m = run_mlcommons(tmp_path / "dl", vocab=False, cfg=cfg(cert, token=None))
    assert {f.name: f.md5 for f in m.files} == {n: md5(d) for n, d in TEXT.items()}
    assert srv.state.requests == [] and m.params["text"] == mirror.as_uri()
    m = run_mlcommons_dataset(tmp_path / "ds", include=["eval.txt"], cfg=cfg(cert, token=None))
    assert [f.name for f in m.files] == ["eval.txt"] and srv.state.requests == []
    (mirror / "eval.txt").write_bytes(b"changed\n")  # the mirror's checksum list still catches it
    with pytest.raises(ChecksumError, match="eval.txt"):
        run_mlcommons(tmp_path / "dl2", vocab=False, include=["eval.txt"], cfg=cfg(cert, token=None))


def test_offline_mirror_of_the_protocol_layout_over_file_urls(tmp_path, monkeypatch):
    """A copy of the bucket on disk: file:// metadata, base URL and files; no token, no network."""
    for var in (dl.MLCOMMONS_TOKEN_ENV, dl.MLCOMMONS_BASE_URL_ENV, dl.MLCOMMONS_METADATA_ENV):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "bucket"
    for rel, data in FILES.items():
        (root / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "data" / rel).write_bytes(data)
    (root / "metadata").mkdir()
    (root / "metadata" / f"{WIKI}.uri").write_text((root / "data").as_uri() + "\n")
    (root / "metadata" / f"{WIKI}.md5").write_text("".join(f"{md5(d)}  ./{rel}\n" for rel, d in FILES.items()))
    monkeypatch.setenv(dl.MLCOMMONS_METADATA_ENV, (root / "metadata").as_uri())
    m = run_mlcommons(tmp_path / "dl", vocab=False, include=["part-*"], cfg=DownloadConfig())
    assert {f.name: f.md5 for f in m.files} == {n: md5(d) for n, d in TEXT.items() if n.startswith("part-")}
    (root / "data" / "results4" / "eval.txt").write_bytes(b"tampered\n")
    with pytest.raises(ChecksumError, match="eval.txt"):
        run_mlcommons_dataset(tmp_path / "ds", dataset=(root / "metadata" / f"{WIKI}.uri").as_uri(),
                              include=["eval.txt"])
    assert not (tmp_path / "ds" / "results4" / "eval.txt").exists()


def test_refusals_of_urls_and_listings(srv, monkeypatch):
    with pytest.raises(InputError, match="only https:// and file://"):
        dl.metadata_url("http://example.org/metadata/x.uri")
    with pytest.raises(InputError, match="ends in .uri"):
        dl.metadata_url("https://example.org/metadata/x.md5")
    with pytest.raises(InputError, match="choose wikipedia, input-files"):
        dl.metadata_url("squad")
    monkeypatch.setenv(dl.MLCOMMONS_METADATA_ENV, "http://127.0.0.1:1/metadata")
    with pytest.raises(InputError, match=dl.MLCOMMONS_METADATA_ENV):
        dl.metadata_url("wikipedia")
    for line in ("0123456789abcdef0123456789abcdef  ./../escape", f"{'0' * 32}  /etc/passwd", "not a line"):
        with pytest.raises(InputError, match="x.md5 line 1"):
            dl.parse_listing(line + "\n", "x.md5")
    assert dl.parse_listing(f"{'A' * 32}  ./a/b c\n\n{'1' * 32} *./d\n", "x") == (("a/b c", "a" * 32), ("d", "1" * 32))


def test_bad_base_url_in_the_metadata_file(srv, cert, tmp_path):
    srv.state.files[f"/metadata/{WIKI}.uri"] = b"http://insecure.example/data\n"
    with pytest.raises(InputError, match=f"the base URL in .*{WIKI}.uri"):
        run_mlcommons_dataset(tmp_path / "o", cfg=cfg(cert))


# -- the command -----------------------------------------------------------------------------------------------
def test_cli_download_mlcommons(srv, cert, tmp_path, capsys, monkeypatch):
    from bertpipe.cli import main

    srv.publish(WIKI, "wiki/processed", FILES)
    out = tmp_path / "out"
    args = ["download", "mlcommons", "--out", str(out), "--ca-bundle", str(cert[0]), "--include", "eval.txt"]
    assert main([*args, "--token", TOKEN, "-q"]) == 0
    printed = capsys.readouterr().out
    assert f"{out / 'results4' / 'eval.txt'}\t{len(TEXT['eval.txt'])} bytes\tmd5 {md5(TEXT['eval.txt'])}" in printed
    assert main([*args, "-q"]) == 2  # no token: one line saying how to get one
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cloudflared access token --app=" in err[0] and "--token" in err[0]
    srv.publish("bert-input-files", "inputs", {"vocab.txt": b"v\n", "tf1_ckpt/x.index": b"i"})
    monkeypatch.setenv(dl.MLCOMMONS_TOKEN_ENV, TOKEN)
    assert main(["download", "mlcommons", "--dataset", "input-files", "--out", str(tmp_path / "in"),
                 "--ca-bundle", str(cert[0]), "--include", "vocab.txt", "-q"]) == 0
    assert (tmp_path / "in" / "vocab.txt").read_bytes() == b"v\n"
    assert main(["download", "mlcommons", "--text", "--out", str(tmp_path / "t1"), "--ca-bundle", str(cert[0]),
                 "--include", "eval.txt", "-q"]) == 0  # a dataset listing the text files: fetched flat
    assert (tmp_path / "t1" / "eval.txt").read_bytes() == TEXT["eval.txt"]
    publish_bert(srv, TEXT, b"[PAD]\n")
    assert main(["download", "mlcommons", "--text", "--out", str(tmp_path / "t"), "--ca-bundle", str(cert[0]),
                 "-q"]) == 0
    assert sorted(p.name for p in (tmp_path / "t").iterdir() if not p.name.startswith(("_", "."))) == sorted(
        [*TEXT, "bert_reference_results_text_md5.txt"])
    assert json.loads((tmp_path / "t" / MANIFEST_NAME).read_text())["stage"] == "download"


# -- the DAG's declarations for source=mlcommons ---------------------------------------------------------------
def test_source_mlcommons_stages_and_key(monkeypatch, tmp_path):
    from preprocessing.params import DataParams
    from preprocessing.registry import active

    monkeypatch.delenv(dl.MLCOMMONS_BASE_URL_ENV, raising=False)
    monkeypatch.delenv(dl.MLCOMMONS_METADATA_ENV, raising=False)
    p = DataParams(source="mlcommons", work_dir=str(tmp_path / "w"))
    stages = {s.name: s for s in active(p)}
    assert list(stages)[:3] == ["download", "text", "vocab"]
    assert stages["text"].reads == ("download",) and stages["vocab"].reads == ("download",)
    assert stages["download"].run is run_mlcommons
    key = stages["download"].key_extra(p)
    assert key["text"] == f"{dl.MLCOMMONS_METADATA}/{WIKI}.uri" and key["vocab"].endswith("/bert-input-files.uri")
    monkeypatch.setenv(dl.MLCOMMONS_TOKEN_ENV, TOKEN)
    assert stages["download"].key_extra(p) == key and TOKEN not in json.dumps(key)  # the token is not an input
    given = DataParams(source="mlcommons", vocab=str(tmp_path / "v.txt"))
    g = {s.name: s for s in active(given)}
    assert g["vocab"].reads == () and g["download"].key_extra(given)["vocab"] is None  # only the text
    monkeypatch.setenv(dl.MLCOMMONS_METADATA_ENV, "http://mirror.example/metadata")
    with pytest.raises(InputError, match=dl.MLCOMMONS_METADATA_ENV):
        p.preflight()  # before anything runs
