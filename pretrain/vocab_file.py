"""The vocab.txt a run trained on: its size (the model's vocab_size) and its record (path, md5, entries).

``bertpipe train --vocab FILE`` records ``{"path", "md5", "entries"}`` as "vocab" in OUTPUT_DIR/config.json,
summary.json and every checkpoint's run config; ``bertpipe export-hf`` writes the tokenizer from it after
checking the file still has that md5.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any


def _read(path: str | Path) -> bytes:
    from core.errors import InputError

    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"--vocab {path}: cannot read it ({exc.strerror or exc}); pass the vocab.txt the "
                         "training data was made with") from exc


def count_entries(data: bytes) -> int:
    """Lines of a vocab.txt (a last line without newline counts; BERT's loader reads it the same way)."""
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def vocab_entries(path: str | Path) -> int:
    """Entries of the vocab.txt at ``path`` (InputError naming it when it cannot be read)."""
    return count_entries(_read(path))


def vocab_record(path: str | Path | None) -> dict[str, Any] | None:
    """``{"path": absolute path, "md5": hex, "entries": n}`` of a vocab.txt, or None when none is given."""
    if not path:
        return None
    data = _read(path)
    return {"path": str(Path(path).resolve()), "md5": hashlib.md5(data).hexdigest(), "entries": count_entries(data)}


def out_hf_needs_vocab(out_hf: str | Path) -> str:
    """import-tf's refusal of --out-hf without --vocab (one line)."""
    return (f"--out-hf {out_hf} needs --vocab FILE, the vocab.txt the checkpoint was trained with (MLPerf's vocab.txt "
            "beside model.ckpt-28252): without it transformers builds a 5-token tokenizer and fill-mask returns empty "
            "strings")
