"""`bertpipe run --source mlcommons`: one command from MLCommons' distribution to the data set.

A local HTTPS server (tests/mlcommons_server.py) serves MLCommons' layout: the wikipedia dataset (the text as
results_text.tar.gz + bert_reference_results_text_md5.txt) and the input files (vocab.txt ...), behind the
cf-access-token check, and cuts the archive's first transfer off half-way. The download stage resumes it,
unpacks and verifies the text, fetches vocab.txt; the text and vocab stages take them; the data set equals
the one made from the same text with --text-dir. A re-run sends no request at all.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from flowhelpers import FAST, last_run, output_md5s, run_cli
from mlcommons_server import TOKEN, MlcServer, make_cert, publish_bert

ARCHIVE = "/wikipedia_for_bert/processed_dataset/results_text.tar.gz"


@pytest.fixture
def mlc(tmp_path, monkeypatch, three_part_text: Path, shared_data: Path):
    srv = MlcServer(*make_cert(tmp_path))
    text = {p.name: p.read_bytes() for p in sorted(three_part_text.iterdir())}
    publish_bert(srv, text, (shared_data / "vocab.txt").read_bytes())
    for var in ("BERTPIPE_MLCOMMONS_BASE_URL", "CF_ACCESS_CLIENT_ID", "CF_ACCESS_CLIENT_SECRET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("BERTPIPE_MLCOMMONS_METADATA", srv.metadata)
    monkeypatch.setenv("MLCOMMONS_CF_ACCESS_TOKEN", TOKEN)
    monkeypatch.setenv("BERTPIPE_CA_BUNDLE", str(tmp_path / "cert.pem"))
    yield srv
    srv.close()


def _below_key(md5s: dict[str, str], stages: tuple[str, ...]) -> dict[str, str]:
    """stage/<key>/rest -> md5 as stage/rest (the keys of upstream-only stages differ between the routes)."""
    return {re.sub(r"^([^/]+)/[^/]+/", r"\1/", k): v for k, v in md5s.items() if k.split("/")[0] in stages}


def test_source_mlcommons_is_one_command_to_the_data_set(prefect_harness, mlc, serial_run, three_part_text: Path,
                                                         shared_data: Path, tmp_path: Path) -> None:
    mlc.state.cut.add(ARCHIVE)
    w = tmp_path / "w"
    assert run_cli("--source", "mlcommons", "--work-dir", w, *FAST) == 0
    archive_gets = [h for p, h in mlc.state.requests if p == ARCHIVE]
    assert len(archive_gets) == 2 and archive_gets[1]["range"].startswith("bytes=")  # cut off, then resumed
    assert all(h.get("cf-access-token") == TOKEN for _, h in mlc.state.requests)
    assert not [p for p in mlc.state.paths() if p.endswith(("results_text.zip", "bert_config.json", ".index"))]

    summary = last_run(w)
    assert {"download", "text", "vocab", "bins", "eval_hdf5"} <= set(summary["stages"])
    vocab = Path(summary["outputs"]["vocab"])
    assert vocab.read_bytes() == (shared_data / "vocab.txt").read_bytes()
    text_dir = Path(summary["outputs"]["text_dir"])
    assert {p.name: p.read_bytes() for p in text_dir.iterdir() if not p.name.startswith(("_", "."))} == {
        p.name: p.read_bytes() for p in three_part_text.iterdir()}
    dl_dir = Path(summary["stages"]["download"]["dir"])
    assert not (dl_dir / "results_text.tar.gz").exists()  # unpacked, then removed
    assert (text_dir / "part-00000-of-00500").stat().st_ino == (dl_dir / "part-00000-of-00500").stat().st_ino

    # the same data set as from the same text given as --text-dir (and the same vocab)
    ref_work, ref = serial_run
    stages = ("tfrecord", "hdf5", "bins", "eval_tfrecord", "eval_10k", "eval_hdf5")
    ours = _below_key(output_md5s(w), stages)
    assert ours and ours == _below_key(ref, stages)
    assert hashlib.md5(vocab.read_bytes()).hexdigest() == hashlib.md5(
        Path(last_run(ref_work)["outputs"]["vocab"]).read_bytes()).hexdigest()

    assert not [p for p in w.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]  # never recorded

    n = len(mlc.state.requests)
    assert run_cli("--source", "mlcommons", "--work-dir", w, *FAST) == 0  # everything is done: no request at all
    assert mlc.state.requests[n:] == []
    assert all(s["cached"] == s["calls"] for s in last_run(w)["stages"].values())


def test_source_mlcommons_without_a_token_is_one_line(prefect_harness, mlc, tmp_path, monkeypatch, capsys) -> None:
    from bertpipe.cli import main

    monkeypatch.delenv("MLCOMMONS_CF_ACCESS_TOKEN")
    w = tmp_path / "w"
    assert main(["run", "--source", "mlcommons", "--work-dir", str(w), *FAST, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cloudflared access token --app=https://127.0.0.1:" in err[0]
    assert "$MLCOMMONS_CF_ACCESS_TOKEN" in err[0] and "HTTP 403" in err[0]
    assert not list(w.glob("download/*/_manifest.json"))
