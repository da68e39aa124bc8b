"""text_import: take MLCommons' published text (``results/``: part-XXXXX-of-00500, eval.txt, eval.md5) as
the ``text`` stage's output, so the DAG can start from it instead of a dump: a folder given as ``text_dir``,
or (``source=mlcommons``) what the download stage fetched from MLCommons, with its vocab.txt.

The files are copied into the stage directory (md5 computed while copying), or hard-linked with
``link=True`` (no second 13.5 GB; but then the work dir's text *is* the source's inode: never edit it in
place); their md5s go into the manifest like any stage's. A file whose name and size match
MLCommons' published table (spec §1) must also match its published md5.

    run_import_text(Path("results"), Path("work/text/<key>"))
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from core.errors import ChecksumError, InputError
from core.manifest import Manifest, StageOutput
from core.stage import Stage
from preprocessing.params import spell
from preprocessing.text.vocab import STAGE_VERSION as VOCAB_VERSION
from preprocessing.text.vocab import VOCAB_NAME as VOCAB_FILE
from preprocessing.text.vocab import run_import_vocab

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
PART = re.compile(r"^part-\d{5}-of-\d{5}$")
EVAL_FILES = ("eval.txt", "eval.md5")


@dataclass(frozen=True, kw_only=True)
class TextImportConfig:
    link: bool = False  # hard-link instead of copying when the file system allows it (same bytes either way)
    require_eval: bool = True  # eval.txt must be present (the eval branch of the DAG needs it)


def list_text_files(text_dir: Path, *, require_eval: bool = True) -> list[Path]:
    """The part files (sorted) and eval files of an MLPerf text folder.

    Raises:
        InputError: the folder is missing, holds no part files, or lacks eval.txt when required.
    """
    text_dir = Path(text_dir)
    if not text_dir.is_dir():
        raise InputError(f"{spell('text_dir')} {text_dir} is not a folder; expected MLCommons' results/ folder "
                         "(part-XXXXX-of-00500 files and eval.txt)")
    parts = sorted(p for p in text_dir.iterdir() if PART.match(p.name) and p.is_file())
    if not parts:
        raise InputError(f"{text_dir} holds no part-XXXXX-of-00500 files; is it the text stage's output folder?")
    evals = [text_dir / n for n in EVAL_FILES if (text_dir / n).is_file()]
    if require_eval and not (text_dir / "eval.txt").is_file():
        raise InputError(f"{text_dir} has no eval.txt (the withheld eval articles); pass a complete results/ "
                         "folder")
    return parts + evals


def source_stats(files: Sequence[Path]) -> dict[str, list[int]]:
    """name -> [bytes, mtime_ns]: recorded so a changed source is noticed without re-hashing it."""
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files}


def _published_check(name: str, size: int, md5: str) -> None:
    from preprocessing.text.download import MLCOMMONS_PUBLISHED

    pub = MLCOMMONS_PUBLISHED.get(name)
    if pub is None or pub[0] != size:
        return  # not MLCommons' file (or not in the table): nothing published to compare with
    if not md5.startswith(pub[1]):
        raise ChecksumError(name, pub[1], md5, hint="the file has MLCommons' published size but not its md5; "
                            "re-download it")


def _place(src: Path, out: StageOutput, link: bool) -> None:
    dst = out.path(src.name)
    dst.unlink(missing_ok=True)
    if link:
        try:
            os.link(src, dst)
            out.add_file(src.name)
            return
        except OSError:
            pass  # another file system, or not allowed (protected_hardlinks): copy
    with out.open(src.name) as f, open(src, "rb") as s:
        shutil.copyfileobj(s, f, 1 << 20)


def run_import_text(text_dir: Path, out_dir: Path, cfg: TextImportConfig = TextImportConfig()) -> Manifest:
    """Stage function: link/copy the text files of ``text_dir`` into ``out_dir``; counters parts, bytes."""
    files = list_text_files(Path(text_dir), require_eval=cfg.require_eval)
    params = {"names": [p.name for p in files]}
    with StageOutput(out_dir, "text", params=params, code_version=STAGE_VERSION) as out:
        for p in files:
            _place(p, out, cfg.link)
            e = out._entries[p.name]
            _published_check(p.name, e.bytes, e.md5)
        out.count("parts", sum(1 for p in files if PART.match(p.name)))
        out.count("bytes", sum(e.bytes for e in out._entries.values()))
        out.manifest.counters["source_stats"] = source_stats(files)
        out.manifest.counters["source_dir"] = str(Path(text_dir).resolve())
    log.info("text: %d files from %s -> %s", len(files), text_dir, out_dir)
    return out.manifest


__all__ = ["TextImportConfig", "list_text_files", "run_import_text", "source_stats"]


# -- the DAG's declaration of this stage (core/stage.py) -----------------------------------------------
def _import_key(p: Any) -> dict[str, Any]:
    src = Path(p.text_dir).resolve()
    return {"text_dir": str(src), "names": [f.name for f in list_text_files(src)]}


def _plan_import(plan: Any) -> list[Any]:
    src = Path(plan.params.text_dir).resolve()
    unit = plan.unit(str(src), cfg=plan.cfg)
    return [replace(unit, fresh={"source_stats": source_stats(list_text_files(src))})]


def _plan_downloaded(plan: Any) -> list[Any]:
    return [plan.unit(str(plan.result("download").dir), cfg=plan.cfg)]


def _plan_downloaded_vocab(plan: Any) -> list[Any]:
    from preprocessing.text.download import VOCAB_NAME

    return [plan.unit(str(plan.result("download").path(VOCAB_NAME)))]


def _is_mlcommons(p: Any) -> bool:
    return p.source_kind == "mlcommons"


# source=mlcommons: the download stage fetches MLCommons' text and vocab.txt (preprocessing/text/download.py); the
# text stage hard-links them in (copies across file systems), the vocab stage takes its vocab.txt unless a
# vocab is given. Their keys follow the download's content (upstream digest).
DAG_STAGES = (Stage(name="text", title="MLCommons' text (part files + eval.txt), copied or hard-linked in",
                    reads=(), run=run_import_text, version=STAGE_VERSION, config=TextImportConfig,
                    configure=lambda p: TextImportConfig(link=p.link_text), key_extra=_import_key, check=_import_key,
                    plan=_plan_import,
                    when=lambda p: p.source_kind == "text", pass_upstream=False, outputs={"text_dir": ""}),
              Stage(name="text", title="MLCommons' text from the download stage, hard-linked in",
                    reads=("download",), run=run_import_text, version=STAGE_VERSION, config=TextImportConfig,
                    configure=lambda p: TextImportConfig(link=True), plan=_plan_downloaded, when=_is_mlcommons,
                    pass_upstream=False, outputs={"text_dir": ""}),
              Stage(name="vocab", title="MLCommons' vocab.txt from the download stage", reads=("download",),
                    run=run_import_vocab, version=VOCAB_VERSION, configure=lambda p: None,
                    plan=_plan_downloaded_vocab, when=lambda p: _is_mlcommons(p) and p.vocab is None,
                    pass_upstream=False, outputs={"vocab": VOCAB_FILE}))
