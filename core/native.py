"""bertpipe's optional C extensions: the one that ``pip install`` built, or one compiled on first use.

Each extension has its sources in a ``_native/`` folder beside its package and a Python fallback with the same
results. ``pip install`` (setup.py) builds it with a digest of its sources compiled in; when that copy is missing
or was built from other sources, :meth:`NativeModule.load` compiles the sources with the system C compiler into
``$XDG_CACHE_HOME/bertpipe/native/`` (``BERTPIPE_NATIVE_CACHE`` overrides the folder) and loads that. When neither
works, ``load()`` returns None and ``reason`` says why; ``BERTPIPE_NATIVE=0`` disables every extension.

Users: ``preprocessing.mlperf.cpd_fast`` (the create_pretraining_data core), ``core.manifest`` (md5 of many files) and
``preprocessing.pack_fast`` (the packers' gathers, CPython's shuffle, NVIDIA's shard lists).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)


def disabled() -> bool:
    """``BERTPIPE_NATIVE=0`` (or false/no): every C extension is off, the Python paths run."""
    return os.environ.get("BERTPIPE_NATIVE", "1").lower() in ("0", "false", "no")


def sources_digest(src_dir: Path) -> str:
    """md5 (12 hex digits) of the ``*.c``/``*.h`` files of ``src_dir``: what setup.py compiles into the module."""
    h = hashlib.md5()
    for p in sorted(Path(src_dir).glob("*.[ch]")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    base = os.environ.get("BERTPIPE_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "bertpipe", "native")
    return Path(base)


def compile_extension(main_c: Path, target: Path, digest: str) -> None:
    """Build ``main_c`` (which includes its headers) into ``target`` with the C compiler Python was built with
    (or $CC / cc); written to a temporary name and renamed, so concurrent builds never see half a file."""
    import subprocess
    import sysconfig
    import tempfile

    cc = os.environ.get("CC") or (sysconfig.get_config_var("CC") or "cc").split()[0]
    include = sysconfig.get_paths()["include"]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".so.tmp")
    os.close(fd)
    cmd = [cc, "-O3", "-std=c11", "-shared", "-fPIC", f"-I{include}", f'-DBERTPIPE_SOURCES_DIGEST="{digest}"',
           str(main_c), "-o", tmp, "-lm"]
    if sys.platform == "darwin":
        cmd[4:4] = ["-undefined", "dynamic_lookup"]  # symbols resolve against the running interpreter
    try:
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as exc:
            raise OSError(f"{cc} timed out") from exc
        if res.returncode != 0:
            raise OSError(f"{' '.join(cmd)} failed: {res.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_file(name: str, path: Path) -> ModuleType:
    """Load the extension module ``name`` (dotted) from the shared object ``path``."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class NativeModule:
    """One optional C extension: ``name`` (dotted, as setup.py builds it), its sources ``src_dir``, the file
    that includes the rest (``main_c``) and the ``ABI`` constant the Python side expects."""

    def __init__(self, name: str, src_dir: Path, main_c: str, abi: int, what: str) -> None:
        self.name, self.src_dir, self.main_c, self.abi, self.what = name, Path(src_dir), main_c, abi, what
        self.module: ModuleType | None = None
        self.reason = ""

    def is_current(self, mod: ModuleType) -> bool:
        """An installed extension is used when its ABI matches and it was built from the sources beside it."""
        if getattr(mod, "ABI", None) != self.abi:
            return False
        return not any(self.src_dir.glob("*.c")) or getattr(mod, "SOURCES_DIGEST", None) == sources_digest(self.src_dir)

    def load(self, is_current: Callable[[ModuleType], bool] | None = None) -> ModuleType | None:
        """The extension, building it into the cache on first use if needed; None if impossible (``reason``)."""
        if self.module is not None or self.reason:
            return self.module
        if disabled():
            self.reason = "disabled by BERTPIPE_NATIVE=0"
            return None
        try:
            installed = importlib.import_module(self.name)  # built by pip install (setup.py)
        except ImportError:
            installed = None
        if installed is not None and (is_current or self.is_current)(installed):
            self.module = installed
            return installed
        if not self.src_dir.is_dir():
            self.reason = "the extension is not installed and its C sources are absent"
            return None
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
        digest = sources_digest(self.src_dir)
        target = cache_dir() / f"{self.name.rpartition('.')[2]}-{digest}{suffix}"
        try:
            if not target.exists():
                log.info("compiling the %s into %s", self.what, target.parent)
                compile_extension(self.src_dir / self.main_c, target, digest)
            mod = load_file(self.name, target)
            if getattr(mod, "ABI", None) != self.abi:
                raise ImportError(f"{target} has ABI {getattr(mod, 'ABI', None)}, expected {self.abi}")
        except (OSError, ImportError, ValueError) as exc:  # subprocess errors are OSError/ValueError
            self.reason = f"could not build or load the C extension: {exc}"
            log.debug(self.reason)
            return None
        self.module = mod
        return mod
