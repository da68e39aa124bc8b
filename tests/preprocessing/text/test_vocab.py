"""vocab stage: BERT's reserved ids, determinism across processes, a vocab create_pretraining_data accepts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import InputError
from core.manifest import verify_manifest
from preprocessing.text.vocab import SPECIAL, VocabConfig, learn_vocab, run_vocab

ROOT = Path(__file__).resolve().parents[3]
CORPUS = "The quick brown fox jumps over the lazy dog.\nThe dog sleeps; the fox runs.\n\nÉcole, café and naïve words.\n" * 30


def test_reserved_ids_match_the_mlperf_vocab(tmp_path: Path) -> None:
    part = tmp_path / "part-00000-of-00500"
    part.write_text(CORPUS, encoding="utf-8")
    m = run_vocab([part], tmp_path / "out", VocabConfig(vocab_size=200))
    lines = (tmp_path / "out" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert verify_manifest(tmp_path / "out").digest == m.digest
    assert lines[0] == "[PAD]" and lines[1] == "[unused0]" and lines[99] == "[unused98]"
    assert lines[100:104] == ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(lines) == len(set(lines)) <= 200
    assert "ecole" in lines or "##e" in lines  # lower-cased, accents stripped
    assert not any(ch in "".join(lines[104:]) for ch in "ÉQ")
    assert "the" in lines and "fox" in lines  # frequent words become whole tokens


def test_same_bytes_in_another_process(tmp_path: Path) -> None:
    part = tmp_path / "part-00000-of-00500"
    part.write_text(CORPUS * 3 + "Zebra zebras zebroid xylophone.\n", encoding="utf-8")
    here = learn_vocab([part], VocabConfig(vocab_size=150, min_frequency=1))
    code = ("import sys; from pathlib import Path; from preprocessing.text.vocab import learn_vocab, VocabConfig;"
            "print('\\n'.join(learn_vocab([Path(sys.argv[1])], VocabConfig(vocab_size=150, min_frequency=1))))")
    out = subprocess.run([sys.executable, "-c", code, str(part)], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={"PYTHONHASHSEED": "123", "PATH": ""})
    assert out.stdout.splitlines() == here


def test_golden_text_gives_a_usable_vocab(golden: Path, tmp_path: Path) -> None:
    from preprocessing.mlperf.tokenization import FullTokenizer

    part = golden / "text_chain" / "part-00000-of-00500"
    run_vocab([part], tmp_path, VocabConfig(vocab_size=4000))
    lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 4000
    tok = FullTokenizer(str(tmp_path / "vocab.txt"), do_lower_case=True)
    ids = tok.convert_tokens_to_ids(tok.tokenize("The history of the world is long."))
    assert ids and 100 not in ids  # no [UNK] for ordinary words of the corpus


def test_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="must exceed"):
        learn_vocab([tmp_path / "x"], VocabConfig(vocab_size=50))
    with pytest.raises(InputError, match="does not exist"):
        learn_vocab([tmp_path / "missing"])
    (tmp_path / "empty").write_text("\n\n")
    with pytest.raises(InputError, match="empty"):
        learn_vocab([tmp_path / "empty"])
    assert len(SPECIAL) == 104
