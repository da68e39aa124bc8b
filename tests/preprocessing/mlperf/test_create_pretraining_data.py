"""create_pretraining_data: byte-exact to the golden TFRecords (both implementations), parallel
runs independent of the worker count, and clear errors on bad input."""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bertpipe.cli import main
from core.errors import ChecksumError, InputError
from core.manifest import StageOutput, md5_file
from preprocessing.mlperf import cpd_fast
from preprocessing.mlperf.cpd_run import Job, expand_inputs, run_jobs, write_pretraining_data
from preprocessing.mlperf.create_pretraining_data import (
    CreatePretrainingDataConfig,
    create_pretraining_data,
    run_create_pretraining_data,
)
from preprocessing.mlperf.tfrecord import read_examples

# golden file -> (input relative to golden/, max_seq_length, max_predictions_per_seq, dupe_factor)
GOLDEN = {
    "sample.tfrecord": ("text_chain/part-00000-of-00500", 512, 76, 10),
    "sample_128.tfrecord": ("text_chain/part-00000-of-00500", 128, 20, 2),
    "edge.tfrecord": ("edge_input.txt", 512, 76, 10),
    "edge_128.tfrecord": ("edge_input.txt", 128, 20, 2),
}


def _fast_or_skip() -> None:
    """The fast path must really run wherever a C compiler exists: no silent fallback."""
    if not cpd_fast.available():
        cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
        if shutil.which(cc):
            pytest.fail(f"a C compiler ({cc}) exists but the fast path is unavailable: {cpd_fast.unavailable_reason()}")
        pytest.skip(cpd_fast.unavailable_reason())


def cfg(vocab: Path, impl: str = "auto", **kw) -> CreatePretrainingDataConfig:
    return CreatePretrainingDataConfig(vocab_file=str(vocab), impl=impl, **kw)


def run_bytes(inputs, c: CreatePretrainingDataConfig):
    buf = io.BytesIO()
    stats = create_pretraining_data([Path(p) for p in inputs], [buf], c, log_examples=0)
    return buf.getvalue(), stats


@pytest.fixture(scope="module")
def vocab(shared_data) -> Path:
    return shared_data / "vocab.txt"


@pytest.mark.parametrize("impl", ["fast", "plain"])
@pytest.mark.parametrize("name", list(GOLDEN))
def test_md5_equals_golden(golden, vocab, name, impl):
    if impl == "fast":
        _fast_or_skip()
    inp, seq, pred, dupe = GOLDEN[name]
    data, stats = run_bytes([golden / inp], cfg(vocab, impl, max_seq_length=seq, max_predictions_per_seq=pred,
                                               dupe_factor=dupe))
    assert stats.impl == impl
    assert hashlib.md5(data).hexdigest() == md5_file(golden / name)


def _unicode_stress_lines(rng: random.Random, n: int) -> list[str]:
    pieces = ["word", "Alpha", "beta,", "(x)", "ΑΛΕΞΑΝΔΡΟΣ", "ΣΑΣ", "café", "cafe\u0301", "İi", "中文", "字x",
              "\ue000", "\u200b", "\x00", "\ufffd", "ｆｕｌｌ", "naïve", "[MASK]", "a" * 150, "b" * 205, "end.",
              "\u00bfqué?", "x\u2014y", "\u0391\u0301"]
    seps = [" ", " ", " ", "\t", "\u00a0", "\u2028", "\x0b", "\x85", "\r", "\u3000", "\x1c", ""]
    lines = []
    for _ in range(n):
        r = rng.random()
        if r < 0.08:
            lines.append(rng.choice(["", " ", "\x0c", "\u3000 ", "\r", "\x85"]))  # document separators
        else:
            k = rng.randrange(1, 25)
            lines.append("".join(rng.choice(pieces) + rng.choice(seps) for _ in range(k)))
    return lines


def test_fast_equals_plain_on_unicode_stress(tmp_path, vocab):
    """Lines mixing the tricky characters, split over two files: both implementations agree."""
    _fast_or_skip()
    rng = random.Random(3)
    files = []
    for i in range(2):
        p = tmp_path / f"in{i}.txt"
        p.write_bytes("\n".join(_unicode_stress_lines(rng, 400)).encode("utf-8"))
        files.append(p)
    for kw in ({"max_seq_length": 64, "max_predictions_per_seq": 10, "dupe_factor": 3},
               {"max_seq_length": 5, "max_predictions_per_seq": 1, "dupe_factor": 1, "do_lower_case": False}):
        fast, s1 = run_bytes(files, cfg(vocab, "fast", **kw))
        plain, s2 = run_bytes(files, cfg(vocab, "plain", **kw))
        assert (s1.impl, s2.impl) == ("fast", "plain")
        assert s1.instances == s2.instances > 100
        assert hashlib.md5(fast).hexdigest() == hashlib.md5(plain).hexdigest()


def test_masking_invariants(golden, vocab, tmp_path):
    out = tmp_path / "e.tfrecord"
    write_pretraining_data([golden / "edge_input.txt"], [out], cfg(vocab, max_seq_length=128,
                                                                      max_predictions_per_seq=20, dupe_factor=2))
    n = 0
    for ex in read_examples(out):
        length = sum(ex["input_mask"])
        k = int(sum(ex["masked_lm_weights"]))
        pos = ex["masked_lm_positions"][:k]
        assert 1 <= k <= 20 and pos == sorted(set(pos))
        first_sep = ex["segment_ids"][:length].count(0) - 1
        specials = {0, first_sep, length - 1}  # [CLS] A [SEP] B [SEP]: never masked, never changed
        assert [ex["input_ids"][i] for i in sorted(specials)] == [101, 102, 102]
        assert not specials & set(pos)
        assert k == min(20, max(1, round(length * 0.15)))
        n += 1
    assert n == 157


def _split_documents(src: Path, parts: int, tmp: Path) -> list[Path]:
    docs = src.read_text(encoding="utf-8").split("\n\n")
    files = []
    for i in range(parts):
        p = tmp / f"part-{i:05d}-of-{parts:05d}"
        p.write_text("\n\n".join(docs[i::parts]) + "\n", encoding="utf-8")
        files.append(p)
    return files


def test_two_workers_same_bytes_as_one(golden, vocab, tmp_path):
    files = _split_documents(golden / "text_chain/part-00000-of-00500", 3, tmp_path)
    c = cfg(vocab, max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
    outs = {}
    for workers in (1, 2):
        d = tmp_path / f"w{workers}"
        jobs = [Job((p,), (d / f"{p.name}.tfrecord",)) for p in files]
        stats = run_jobs(jobs, c, workers=workers, log_examples=0)
        assert sum(s.documents for s in stats) == 86 and all(s.documents > 20 for s in stats)
        outs[workers] = [md5_file(j.outputs[0]) for j in jobs]
    assert outs[1] == outs[2]
    assert len(set(outs[1])) == 3


def test_round_robin_outputs(golden, vocab, tmp_path):
    c = cfg(vocab, max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
    outs = [tmp_path / "a.tfrecord", tmp_path / "b.tfrecord"]
    write_pretraining_data([golden / "edge_input.txt"], outs, c)
    single = list(read_examples(golden / "edge_128.tfrecord"))
    assert list(read_examples(outs[0])) == single[0::2]
    assert list(read_examples(outs[1])) == single[1::2]


@pytest.mark.parametrize("spelling", ["underscore", "dash"])
def test_cli_reference_flags(golden, vocab, tmp_path, spelling, caplog, monkeypatch):
    out = tmp_path / "edge_128.tfrecord"
    if spelling == "underscore":
        argv = [f"--input_file={golden / 'edge_input.txt'}", f"--output_file={out}", f"--vocab_file={vocab}",
                "--do_lower_case=True", "--max_seq_length=128", "--max_predictions_per_seq=20",
                "--masked_lm_prob=0.15", "--random_seed=12345", "--dupe_factor=2"]
    else:
        argv = ["--input-file", str(golden / "edge_input.txt"), "--output-file", str(out), "--vocab-file", str(vocab),
                "--max-seq-length", "128", "--dupe-factor", "2", "--impl", "plain"]  # other flags: defaults
    import logging

    verbose = ["-v"] if spelling == "underscore" else []  # the reference's example dumps only with -v
    monkeypatch.setenv("BERTPIPE_LOG_EXAMPLES", "0")
    try:
        with caplog.at_level("INFO"):
            assert main(["create-pretraining-data", *argv, *verbose]) == 0
    finally:
        logging.getLogger("preprocessing.mlperf.create_pretraining_data.examples").setLevel(logging.WARNING)
    assert md5_file(out) == md5_file(golden / "edge_128.tfrecord")
    text = caplog.text
    assert text.count("*** Example ***") == (20 if verbose else 0) and "Wrote 157 total instances" in text
    assert "37 documents, 157 instances" in text and "MB/s" in text


def test_cli_output_dir(golden, vocab, tmp_path):
    files = _split_documents(golden / "edge_input.txt", 2, tmp_path)
    rc = main(["create-pretraining-data", f"--input_file={tmp_path}/part-*", f"--output-dir={tmp_path / 'out'}",
               f"--vocab_file={vocab}", "--workers=2", "--dupe_factor=1", "-q"])
    assert rc == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"{f.name}.tfrecord" for f in files]


def test_stage_writes_manifest_and_verifies_upstream(golden, vocab, tmp_path):
    up_dir = tmp_path / "text"
    with StageOutput(up_dir, "text") as up:
        with up.open("part-00000-of-00500") as f:
            f.write((golden / "edge_input.txt").read_bytes())
    c = cfg(vocab, max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
    part = up_dir / "part-00000-of-00500"
    m = run_create_pretraining_data([part], tmp_path / "cpd", c, output_name="part-00000.tfrecord",
                                    upstream=[up.manifest])
    assert m.file("part-00000.tfrecord").md5 == md5_file(golden / "edge_128.tfrecord")
    assert m.counters["documents"] == 37 and m.counters["instances"] == 157
    assert (tmp_path / "cpd" / "_manifest.json").is_file()
    part.write_bytes(part.read_bytes().replace(b"the", b"THE", 1))  # same size, other md5
    with pytest.raises(ChecksumError):
        run_create_pretraining_data([part], tmp_path / "cpd2", c, output_name="x.tfrecord", upstream=[up.manifest])


# -- bad input ----------------------------------------------------------------------------------
def test_vocab_missing_special_tokens(tmp_path, golden):
    v = tmp_path / "vocab.txt"
    v.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    for impl in ("plain", "auto"):
        with pytest.raises(InputError, match=r"no \[MASK\] entry"):
            run_bytes([golden / "edge_input.txt"], cfg(v, impl))


@pytest.mark.parametrize("content", [b"", b"\n \n\t\r\n\x0c\n\xc2\xa0\n"])
@pytest.mark.parametrize("impl", ["plain", "auto"])
def test_empty_or_blank_input(tmp_path, vocab, content, impl):
    p = tmp_path / "in.txt"
    p.write_bytes(content)
    with pytest.raises(InputError, match="empty or blank"):
        run_bytes([p], cfg(vocab, impl))


def test_missing_input_glob(tmp_path, vocab):
    with pytest.raises(InputError, match="matches no file"):
        expand_inputs(f"{tmp_path}/nothing-*.txt")
    with pytest.raises(InputError, match="matches no file"):
        expand_inputs(str(tmp_path / "absent.txt"))
    rc = main(["create-pretraining-data", f"--input_file={tmp_path}/none-*", f"--output_file={tmp_path}/o",
               f"--vocab_file={vocab}"])
    assert rc == 2 and not (tmp_path / "o").exists()


@pytest.mark.parametrize("kw", [{"max_seq_length": 4}, {"max_seq_length": 0}, {"masked_lm_prob": 0.0},
                                {"masked_lm_prob": 1.0}, {"masked_lm_prob": -0.1}, {"masked_lm_prob": 1.5}])
def test_bad_flags(vocab, golden, kw):
    with pytest.raises(InputError, match="max_seq_length|masked_lm_prob"):
        run_bytes([golden / "edge_input.txt"], cfg(vocab, **kw))


BAD = b"first line ok\n\nsecond doc\rok\nbad \r\xff byte here\nafter\n"


@pytest.mark.parametrize("impl", ["plain", "fast"])
def test_invalid_utf8_names_file_line_and_offset(tmp_path, vocab, impl):
    if impl == "fast":
        _fast_or_skip()
    p = tmp_path / "bad.txt"
    p.write_bytes(BAD)
    offset = BAD.index(b"\xff")
    with pytest.raises(InputError, match=rf"{p}: line 4 is not valid UTF-8 \(byte 0xff at byte offset {offset}"):
        run_bytes([p], cfg(vocab, impl))
    skipped, stats = run_bytes([p], cfg(vocab, impl, skip_invalid_utf8=True))
    assert stats.skipped_lines == 1 and stats.impl == impl
    clean = tmp_path / "clean.txt"
    clean.write_bytes(BAD.replace(b"bad \r\xff byte here\n", b""))
    assert skipped == run_bytes([clean], cfg(vocab, impl))[0]


def test_failed_run_leaves_no_output(tmp_path, vocab):
    p = tmp_path / "bad.txt"
    p.write_bytes(BAD)
    out = tmp_path / "out.tfrecord"
    with pytest.raises(InputError):
        write_pretraining_data([p], [out], cfg(vocab))
    assert list(tmp_path.iterdir()) == [p]


def test_fast_equals_plain_on_real_non_ascii_lines(golden, data_tier, request, vocab, tmp_path):
    """Every non-ASCII line of real Wikipedia text (Greek capitals, CJK, accents, ...), both paths: the golden text
    chain's training part and eval file (every tier), and where ../shared has it the real MLPerf sample's part."""
    _fast_or_skip()
    sources = {"golden text chain": [golden / "text_chain" / "part-00000-of-00500", golden / "text_chain" / "eval.txt"]}
    if data_tier == "shared":
        sources["MLPerf sample"] = [request.getfixturevalue("mlperf_sample") / "part-00000-of-00500"]
    kw = {"max_seq_length": 128, "max_predictions_per_seq": 20, "dupe_factor": 1}
    for k, (what, files) in enumerate(sources.items()):
        lines = b"\n\n".join(f.read_bytes() for f in files).split(b"\n")
        text = tmp_path / f"non_ascii_{k}.txt"
        text.write_bytes(b"\n".join(x if not x.isascii() or not x.strip() else b"" for x in lines))
        fast, s1 = run_bytes([text], cfg(vocab, "fast", **kw))
        plain, s2 = run_bytes([text], cfg(vocab, "plain", **kw))
        assert s1.documents == s2.documents > 50 and s1.instances == s2.instances > 1000, what
        assert fast == plain, what


@pytest.mark.slow
@pytest.mark.needs_shared("data/mlperf_sample")
def test_fast_equals_plain_on_mlperf_sample(mlperf_sample, vocab):
    """The whole real MLPerf sample part with the MLPerf flags (plain takes ~30 s)."""
    _fast_or_skip()
    part = mlperf_sample / "part-00000-of-00500"
    kw = {"max_seq_length": 512, "max_predictions_per_seq": 76, "dupe_factor": 10}
    fast, s1 = run_bytes([part], cfg(vocab, "fast", **kw))
    plain, s2 = run_bytes([part], cfg(vocab, "plain", **kw))
    assert (s1.documents, s1.instances) == (s2.documents, s2.instances) == (132, 25865)
    assert hashlib.md5(fast).hexdigest() == hashlib.md5(plain).hexdigest()


def test_extension_compiles_on_first_use(tmp_path):
    """Where no up-to-date extension is installed, the C compiler builds one into the cache dir."""
    _fast_or_skip()
    code = ("from preprocessing.mlperf import cpd_fast\n"
            "cpd_fast._is_current = lambda mod: False  # as if the installed copy were missing or stale\n"
            "m = cpd_fast.load()\n"
            "print(m.__file__ if m else 'NONE ' + cpd_fast.unavailable_reason())\n")
    env = dict(os.environ, BERTPIPE_NATIVE_CACHE=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3]).stdout.strip()
    assert out.startswith(str(tmp_path / "cache")) and Path(out).is_file(), out


def test_fast_equals_plain_for_every_unicode_space(tmp_path, vocab):
    """The C splitter's whitespace table is Python's str.isspace() (and Cc/Cf joiners are handled)."""
    _fast_or_skip()
    spaces = [chr(c) for c in range(0x80, 0x110000) if chr(c).isspace()]
    others = ["\u180e", "\u200b", "\ufeff", "\u2060", "\x00", "\x0b", "\x0c", "\x1c", "\x1f", "\x7f", "\t", "\r"]
    lines = []
    for c in spaces + others:  # each character inside words, and alone on a line (a separator if it is space)
        lines += [f"Word{c}ΣΟΦΙΑ{c}x.{c}ΑΣ y", f"more text {c}é", c, f"ΑΣ{c}b", f" {c}\t", "last one"]
    p = tmp_path / "spaces.txt"
    p.write_text("\n".join(lines), encoding="utf-8")
    kw = {"max_seq_length": 16, "max_predictions_per_seq": 3, "dupe_factor": 2}
    fast, s1 = run_bytes([p], cfg(vocab, "fast", **kw))
    plain, s2 = run_bytes([p], cfg(vocab, "plain", **kw))
    assert len(spaces) >= 17 and s1.instances == s2.instances > 20
    assert fast == plain


@pytest.mark.parametrize("bad", [b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82", b"\x80"])
def test_every_kind_of_invalid_utf8_is_caught_by_both(tmp_path, vocab, bad):
    """Overlong, surrogate, above U+10FFFF, truncated, stray continuation: the C reader never lets one through."""
    p = tmp_path / "bad.txt"
    p.write_bytes(b"caf\xc3\xa9 ok\n\nline " + bad + b" x\nend\n")
    for impl in ("plain", "auto"):
        with pytest.raises(InputError, match=r"line 3 is not valid UTF-8 .* at byte offset 15"):
            run_bytes([p], cfg(vocab, impl))
        assert run_bytes([p], cfg(vocab, impl, skip_invalid_utf8=True))[1].skipped_lines == 1


def test_impl_fast_without_extension_is_a_clear_error(monkeypatch, golden, vocab, tmp_path, caplog):
    monkeypatch.setattr(cpd_fast._NATIVE, "module", None)
    monkeypatch.setattr(cpd_fast._NATIVE, "reason", "disabled for this test")
    args = ["create-pretraining-data", f"--input_file={golden / 'edge_input.txt'}", f"--vocab_file={vocab}",
            "--dupe_factor=1"]
    assert main([*args, f"--output_file={tmp_path / 'a'}", "--impl=fast"]) == 2
    assert not (tmp_path / "a").exists()
    with caplog.at_level("WARNING"):  # auto falls back to plain, says so, same bytes
        assert main([*args, f"--output_file={tmp_path / 'b'}", "--impl=auto", "-q"]) == 0
    assert "plain Python implementation" in caplog.text and "disabled for this test" in caplog.text


def test_output_dir_needs_distinct_input_names(tmp_path, vocab):
    for d in ("x", "y"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "part").write_text("a b c\nd e f\n")
    rc = main(["create-pretraining-data", f"--input_file={tmp_path}/x/part,{tmp_path}/y/part",
               f"--output-dir={tmp_path / 'out'}", f"--vocab_file={vocab}"])
    assert rc == 2 and not (tmp_path / "out").exists()
