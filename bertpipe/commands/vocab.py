"""Learn an uncased WordPiece vocab.txt from training part files (the vocab stage, without Prefect).

  bertpipe vocab --input 'results/part-*' --out work/vocab --vocab-size 30522
  bertpipe vocab --input results/part-00000-of-00500 --out /tmp/v --vocab-size 8000

Writes OUT/vocab.txt ([PAD] 0, [unused0-98], [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, then the
learned tokens) and OUT/_manifest.json. Deterministic: the same files give the same bytes.
"""

from __future__ import annotations

import argparse
import glob
from pathlib import Path

from bertpipe.commands._common import bool_flag, flag, number, overwrite_flag, positive_int
from core.paths import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", "--input_file", dest="input", action="append", required=True,
                   help="part file(s) or glob(s), repeatable or comma-separated (training text only, not eval.txt)")
    p.add_argument("--out", "--output_dir", dest="out", type=path_arg, required=True, help="output folder")
    flag(p, "vocab_size", type=number(int, 105, 1 << 24), default=30522, help="entries incl. the 104 reserved ones (default: 30522)")
    flag(p, "min_frequency", type=positive_int(), default=2, help="minimum count of a merged pair (default: 2)")
    bool_flag(p, "do_lower_case", True, "uncased vocab (lower-case, strip accents)")
    overwrite_flag(p, "an existing OUT/vocab.txt that a previous `bertpipe vocab` did not write, or another data set")


def run(args: argparse.Namespace) -> int:
    from core.errors import InputError
    from core.paths import MANIFEST_NAME, PathCheck
    from preprocessing.text.vocab import VOCAB_NAME, VocabConfig, run_vocab

    pc = PathCheck(overwrite=args.overwrite)
    files: list[Path] = []
    for spec in args.input:
        for item in filter(None, spec.split(",")):
            if not glob.has_magic(item):
                files.append(pc.input_file("--input", item, "part file"))
                continue
            hits = sorted(h for h in glob.glob(item) if not Path(h).is_dir())
            if not hits:
                raise InputError(f"--input {item} matches no file")
            files += pc.input_files("--input", hits, "part file")
    if not files:
        raise InputError("--input names no file; give part file(s) or a glob such as 'results/part-*'")
    pc.output_dir("--out", args.out, [VOCAB_NAME, MANIFEST_NAME], stage="vocab", guarded=[VOCAB_NAME])
    cfg = VocabConfig(vocab_size=args.vocab_size, min_frequency=args.min_frequency, lowercase=args.do_lower_case)
    m = run_vocab(files, args.out, cfg)
    print(f"{args.out / VOCAB_NAME}: {m.counters['tokens']} tokens from {len(files)} file(s), md5 {m.files[0].md5}")
    return 0
