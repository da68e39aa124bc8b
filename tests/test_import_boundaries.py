"""Layering: the plain libraries never import Prefect (or other heavy frameworks at import time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ["preprocessing", "pretrain"]


def _modules_after_import(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_libraries_do_not_import_prefect():
    import pkgutil

    names = []
    for pkg in PLAIN:  # the project's own folders (tests/preprocessing is a different thing)
        names += [f"{pkg}.{m.name}" for m in pkgutil.iter_modules([str(ROOT / pkg)]) if not m.name.startswith("_")]
    assert len(names) > 20, names
    code = "\n".join(f"import {n}" for n in names if n not in ("pretrain.train",))
    mods = _modules_after_import(code)
    assert not any(m == "prefect" or m.startswith("prefect.") for m in mods)


def test_cli_start_up_imports_nothing_heavy():
    mods = _modules_after_import("import bertpipe.cli")
    for heavy in ("prefect", "torch", "tensorflow", "deepspeed", "numpy", "h5py"):
        assert heavy not in mods, heavy


def test_command_parsers_import_nothing_heavy():
    """`bertpipe import-tf --help` and friends: the parsers are built without torch or TensorFlow."""
    mods = _modules_after_import("from bertpipe.cli import build_parser\n"
                                 "for c in ('import-tf', 'export-hf', 'train'): build_parser(c)")
    for heavy in ("torch", "tensorflow", "transformers", "safetensors", "deepspeed", "numpy"):
        assert heavy not in mods, heavy
