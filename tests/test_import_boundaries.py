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


def _imports(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, top-level module) of every import in Python source, function-level ones included, and of
    ``importlib.import_module("x.y")`` / ``__import__("x")`` calls (f-strings by their literal head)."""
    out = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
        elif isinstance(node, ast.Call) and node.args and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))):
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                arg = arg.values[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.append((node.lineno, arg.value.split(".")[0]))
    return out


def _violations(layer: str, source: str, name: str = "<source>") -> list[str]:
    bad = []
    for line, mod in _imports(source, name):
        if mod in ALLOWED and mod != layer and mod not in ALLOWED[layer]:
            bad.append(f"{name}:{line} imports {mod}")
        if mod in FORBIDDEN_THIRD_PARTY.get(layer, ()):
            bad.append(f"{name}:{line} imports {mod}")
    return bad


#: the layers, top first: a layer imports only the layers below it
ORDER = [("bertpipe",), ("flows",), ("tasks",), ("preprocessing", "pretrain"), ("core",)]


def test_the_allowed_table_is_the_one_way_order() -> None:
    """ALLOWED is exactly "everything below, nothing beside or above", so every direction is checked."""
    assert sorted(ALLOWED) == sorted(x for level in ORDER for x in level)
    for i, level in enumerate(ORDER):
        below = {x for lower in ORDER[i + 1:] for x in lower}
        for layer in level:
            assert ALLOWED[layer] == below, layer


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_the_check_finds_every_upward_or_sideways_import(layer: str) -> None:
    """The check below can fail: each way of importing a layer that is not below is found."""
    others = sorted(set(ALLOWED) - ALLOWED[layer] - {layer})
    assert others or layer == "bertpipe"
    for other in others:
        for source in (f"import {other}.x", f"from {other}.x import y", f"def f():\n    from {other} import y\n",
                       f"import importlib\nimportlib.import_module('{other}.x')",
                       f"import importlib\nm = 'x'\nimportlib.import_module(f'{other}.{{m}}')"):
            assert _violations(layer, source), (layer, source)
    for below in ALLOWED[layer]:
        assert not _violations(layer, f"from {below}.x import y")


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_flow_one_way(layer: str) -> None:
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, layer
    bad = []
    for f in files:
        bad += _violations(layer, f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))
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
