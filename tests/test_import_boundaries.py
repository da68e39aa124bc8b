"""Layering: imports flow one way, bertpipe (cli) -> flows -> tasks -> (preprocessing | pretrain) -> core;
the plain libraries never import Prefect (or other heavy frameworks at import time)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ["preprocessing", "pretrain"]
#: top-level folder -> the project packages its modules may import (besides themselves). Nothing may
#: import upward, and the two libraries do not import each other: what both need lives in core/.
ALLOWED = {
    "core": set(),
    "preprocessing": {"core"},
    "pretrain": {"core"},
    "tasks": {"core", "preprocessing", "pretrain"},
    "flows": {"core", "tasks", "preprocessing", "pretrain"},
    "bertpipe": {"core", "flows", "tasks", "preprocessing", "pretrain"},
}
#: what must never be imported by these folders, even lazily inside a function
FORBIDDEN_THIRD_PARTY = {"core": {"prefect", "torch", "tensorflow", "deepspeed", "numpy", "h5py"},
                         "preprocessing": {"prefect"}, "pretrain": {"prefect"}}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every import statement in a file, function-level ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_flow_one_way(layer: str) -> None:
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, layer
    bad = []
    for f in files:
        for line, mod in _imports(f):
            if mod in ALLOWED and mod != layer and mod not in ALLOWED[layer]:
                bad.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
            if mod in FORBIDDEN_THIRD_PARTY.get(layer, ()):
                bad.append(f"{f.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_design_folders_are_there() -> None:
    for folder in ("flows", "tasks", "pretrain", "preprocessing", "deployments", "tests", "core"):
        assert (ROOT / folder).is_dir(), folder


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
