"""Fuzzing the text stages (clean, segment, split_eval, gather, and the whole `bertpipe text` pass over a
folder) with seeded corruptions of real extractor text: bit flips, truncations, insertions of random bytes
or of markup the stages act on (<doc>, </doc>, \\r, NUL, [[...]], <ref>, a BOM, invalid UTF-8...), deletions
and duplications; for the folder pass also a file that is empty, a directory or a dangling link.

Every case must end in success or a project error (BertpipeError) whose message names the corrupted file;
never another exception and never a hang (each case runs under a 10 s SIGALRM timer; the whole test must
finish in 60 s). Cases run in-process on temp files (tmpfs when there is one), 1000 per stage, seeded.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from core.errors import BertpipeError
from preprocessing.text.clean import CleanConfig, clean_text, run_clean
from preprocessing.text.gather import GatherConfig, run_gather
from preprocessing.text.pipeline import TextConfig, run_text_stages
from preprocessing.text.segment import SegmentConfig, run_segment, segment_text
from preprocessing.text.split_eval import SplitEvalConfig, run_split_eval, split_text

CASES = 1000
SEED = 7_2025
TOKENS = (b'<doc id="9" url="https://en.wikipedia.org/wiki?curid=9" title="X">\n', b"</doc>\n", b"</doc>", b"\r",
          b"\r\n", b"\n", b"\n\n", b"\n\n\n", b"\x00", b"[[", b"]]", b"[[a|b]]", b"[[File:x.png|y]]", b"|", b"[",
          b"<ref name=x>", b"</ref>", b"<ref>", b"<math>", b"alt=", b"\xef\xbb\xbf", b"\xc3", b"\xff\xfe", b"\xe2\x80",
          b"\xf0\x9f\x98\x80", b"Mr. ", b"e.g. ", b"...", b"?!", b" " * 50, b"a" * 5000, b"\t", b"\x0b\x0c",
          b"\xe2\x80\xa8", b"\xc2\x85")


class Hang(Exception):
    pass


def _alarm(signum, frame):  # noqa: ANN001
    raise Hang("case interrupted by the 10 s timer")


@pytest.fixture(scope="module")
def bases(golden: Path) -> dict[str, bytes]:
    """Small real inputs of each stage: six articles of golden wiki_00 (title and the start of their first
    paragraphs) and what clean, segment and split_eval make of them."""
    raw = (golden / "text_chain" / "text" / "AA" / "wiki_00").read_text(encoding="utf-8")
    docs = []
    for doc in raw.split("</doc>\n")[:6]:
        lines = doc.split("\n")
        header, title, body = lines[0], lines[1], [ln for ln in lines[2:] if ln][:3]
        docs.append("\n".join([header, title, "", *(ln[:400] for ln in body), ""]) + "</doc>\n")
    raw_small = "".join(docs)
    two = clean_text(raw_small)[1]
    three = segment_text(two)
    four = split_text(three, 0, 1, 1)[0]
    return {"raw": raw_small.encode(), ".2": two.encode(), ".3": three.encode(), ".4": four.encode()}


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        kind = rng.choice(("flip", "truncate", "insert_bytes", "insert_token", "insert_token", "delete", "dup"))
        at = rng.randrange(len(b) + 1)
        if kind == "flip" and b:
            i = min(at, len(b) - 1)
            b[i] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del b[at:]
        elif kind == "insert_bytes":
            b[at:at] = rng.randbytes(rng.randint(1, 16))
        elif kind == "insert_token":
            b[at:at] = rng.choice(TOKENS)
        elif kind == "delete":
            del b[at:at + rng.randint(1, 200)]
        elif kind == "dup" and b:
            a = rng.randrange(len(b))
            b[at:at] = b[a:a + rng.randint(1, 300)]
    return bytes(b)


@pytest.fixture
def scratch() -> Iterator[Path]:
    d = tempfile.mkdtemp(prefix="bertpipe-fuzz-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_cases(prepare: Callable[[random.Random, Path], tuple[Callable[[], object], str]], scratch: Path,
              name: str) -> dict[str, int]:
    """1000 seeded cases; returns outcome counts, fails listing every case that broke the contract."""
    problems, outcome = [], {"ok": 0, "project error": 0}
    old = signal.signal(signal.SIGALRM, _alarm)
    t0 = time.perf_counter()
    try:
        for i in range(CASES):
            case = scratch / f"c{i % 2}"  # alternate two dirs; each case starts from an empty one
            shutil.rmtree(case, ignore_errors=True)
            case.mkdir()
            rng = random.Random(f"{SEED}-{name}-{i}")
            run, must_name = prepare(rng, case)
            signal.setitimer(signal.ITIMER_REAL, 10)
            try:
                run()
                outcome["ok"] += 1
            except BertpipeError as exc:
                outcome["project error"] += 1
                if must_name not in str(exc):
                    problems.append(f"case {i}: {type(exc).__name__} does not name {must_name}: {exc}")
            except Exception as exc:  # noqa: BLE001 - the contract: nothing but project errors
                problems.append(f"case {i}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-4)}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, old)
    elapsed = time.perf_counter() - t0
    assert not problems, f"{name}: {len(problems)} of {CASES} cases broke the contract:\n" + "\n".join(problems[:8])
    assert elapsed < 60, f"{name}: {CASES} cases took {elapsed:.1f} s"
    print(f"{name}: {outcome} in {elapsed:.1f} s")
    return outcome


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_fuzz_clean(bases, scratch: Path) -> None:
    def prepare(rng: random.Random, case: Path):
        _write(case / "in" / "AA" / "wiki_00", mutate(bases["raw"], rng))
        return lambda: run_clean(case / "in", case / "out", CleanConfig(workers=1)), "wiki_00"

    out = run_cases(prepare, scratch, "clean")
    assert out["ok"] > 500 and out["project error"] > 50, out  # invalid UTF-8 is refused, markup is cleaned


def test_fuzz_segment(bases, scratch: Path) -> None:
    def prepare(rng: random.Random, case: Path):
        _write(case / "in" / "AA" / "wiki_00.2", mutate(bases[".2"], rng))
        return lambda: run_segment(case / "in", case / "out", SegmentConfig(workers=1)), "wiki_00.2"

    out = run_cases(prepare, scratch, "segment")
    assert out["ok"] > 500 and out["project error"] > 50, out


def test_fuzz_split_eval(bases, scratch: Path) -> None:
    def prepare(rng: random.Random, case: Path):
        _write(case / "in" / "AA" / "wiki_00.3", mutate(bases[".3"], rng))
        _write(case / "in" / "AA" / "wiki_01.3", bases[".3"])
        cfg = SplitEvalConfig(num_test_articles=rng.randint(0, 12), seed=rng.randrange(1000), workers=1)
        return lambda: run_split_eval(case / "in", case / "out", cfg), "wiki_00.3"

    out = run_cases(prepare, scratch, "split_eval")
    assert out["ok"] > 500 and out["project error"] > 50, out  # more tests due than a file's articles: refused


def test_fuzz_gather(bases, scratch: Path) -> None:
    def prepare(rng: random.Random, case: Path):
        _write(case / "in" / "AA" / "wiki_00.4", mutate(bases[".4"], rng))
        _write(case / "in" / "AA" / "wiki_01.4", bases[".4"])
        for name in ("wiki_00", "wiki_01"):  # the raw extractor files, whose sizes cut the parts
            _write(case / "in" / "AA" / name, bases["raw"][: rng.randrange(len(bases["raw"]))])
        cfg = GatherConfig(block_size_mb=rng.choice((0.001, 0.005, 26.92)))
        return lambda: run_gather(case / "in", case / "out", cfg), "wiki_00.4"

    out = run_cases(prepare, scratch, "gather")
    assert out["ok"] > 500 and out["project error"] > 20, out


def test_fuzz_text_over_a_folder(bases, scratch: Path) -> None:
    """`bertpipe text --extracted DIR` (run_text_stages): the four stages in one pass over a damaged folder."""

    def prepare(rng: random.Random, case: Path):
        aa = case / "in" / "AA"
        _write(aa / "wiki_01", bases["raw"])
        target = aa / "wiki_00"
        shape = rng.choices(("bytes", "empty", "directory", "dangling link"), weights=(94, 2, 2, 2))[0]
        if shape == "bytes":
            _write(target, mutate(bases["raw"], rng))
        elif shape == "empty":
            _write(target, b"")
        elif shape == "directory":
            target.mkdir(parents=True)
        else:
            target.symlink_to(case / "nowhere")
        cfg = TextConfig(num_test_articles=rng.randint(0, 8), block_size_mb=rng.choice((0.002, 26.92)), workers=1)
        return lambda: run_text_stages(case / "in", case / "out", cfg), "wiki_00"

    out = run_cases(prepare, scratch, "text")
    assert out["ok"] > 500 and out["project error"] > 50, out


@pytest.mark.parametrize("shape", ["dangling link", "directory"])
def test_a_non_file_named_like_an_extractor_file_is_refused_by_name(bases, tmp_path: Path, shape: str) -> None:
    """Regression (found by the folder fuzz): a broken link named AA/wiki_00 escaped as FileNotFoundError."""
    aa = tmp_path / "in" / "AA"
    _write(aa / "wiki_01", bases["raw"])
    if shape == "directory":
        (aa / "wiki_00").mkdir()
    else:
        (aa / "wiki_00").symlink_to(tmp_path / "nowhere")
    why = "a symbolic link to nothing" if shape == "dangling link" else "not a file"
    with pytest.raises(BertpipeError, match=f"{aa / 'wiki_00'} is {why}"):
        run_text_stages(tmp_path / "in", tmp_path / "out", TextConfig(num_test_articles=1, workers=1))
    with pytest.raises(BertpipeError, match=f"{aa / 'wiki_00'} is {why}"):
        run_clean(tmp_path / "in", tmp_path / "clean", CleanConfig(workers=1))
    assert not (tmp_path / "out" / "_manifest.json").exists()
