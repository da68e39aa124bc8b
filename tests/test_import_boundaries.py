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
    for pkg in PLAIN:  # the project's own folders (tests/preprocessing is a different thing), families included
        names += [m.name for m in pkgutil.walk_packages([str(ROOT / pkg)], prefix=f"{pkg}.")
                  if not m.name.rsplit(".", 1)[-1].startswith("_") and ".sample." not in m.name]
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


# -- preprocessing/ by family (issue 32 item 1) ----------------------------------------------------------------------
#: family -> the families its modules may import. The vendors' folders build on mlperf/ (its padded HDF5), never
#: the reverse, nor on each other (what both packers share lives at the top: preprocessing/packing.py, pack_fast.py);
#: the text chain checks its vocabulary with mlperf/'s tokenizer loader.
FAMILIES = {"text": {"mlperf"}, "mlperf": set(), "nvidia": {"mlperf"}, "habana": {"mlperf"}}


def _family_imports(source: str) -> list[tuple[int, str]]:
    """(line, family) of every import of ``preprocessing.<family>`` (any form, lazy ones included)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        mods: list[str] = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            mods = [node.module] if node.module != "preprocessing" else [f"preprocessing.{a.name}" for a in node.names]
        for m in mods:
            parts = m.split(".")
            if len(parts) > 1 and parts[0] == "preprocessing" and parts[1] in FAMILIES:
                out.append((node.lineno, parts[1]))
    return out


def _family_violations(family: str, source: str, name: str = "<source>") -> list[str]:
    return [f"{name}:{line} imports preprocessing.{other}" for line, other in _family_imports(source)
            if other != family and other not in FAMILIES[family]]


def test_preprocessing_is_one_folder_per_family_each_with_its_docstring() -> None:
    for family in FAMILIES:
        init = ROOT / "preprocessing" / family / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), family
        assert "Equals" in ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), family
    top = sorted(p.stem for p in (ROOT / "preprocessing").glob("*.py"))
    assert top == ["__init__", "hdf5_check", "hdf5_io", "pack_fast", "packing", "params", "pyrandom", "registry",
                   "scratch", "targets"], top


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_families_import_one_way(family: str) -> None:
    files = sorted((ROOT / "preprocessing" / family).rglob("*.py"))
    assert files, family
    bad = []
    for f in files:
        bad += _family_violations(family, f.read_text(encoding="utf-8"), str(f.relative_to(ROOT)))
    assert not bad, "imports against the families' direction:\n" + "\n".join(bad)


def test_the_family_check_can_fail() -> None:
    for source in ("from preprocessing.nvidia.pack import x", "from preprocessing import habana",
                   "def f():\n    import preprocessing.nvidia.chop as c\n"):
        assert _family_violations("mlperf", source)
    assert _family_violations("habana", "from preprocessing.nvidia.pack import take_runs")
    assert not _family_violations("nvidia", "from preprocessing.mlperf.split_4bins import count_pieces")


def test_the_registry_does_not_import_the_parameters() -> None:
    """No circle between params and registry: the parameters ask the registry, never the other way."""
    src = (ROOT / "preprocessing" / "registry.py").read_text(encoding="utf-8")
    mods = {n.module for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Import) for a in n.names}
    assert "preprocessing.params" not in mods and not any(m and m.endswith(".params") for m in mods)
