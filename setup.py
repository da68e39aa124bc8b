"""Build hook for the optional C accelerator of create_pretraining_data.

Everything else is declared in pyproject.toml. The extension is optional: when no C compiler is
available the build carries on without it and bertpipe uses the plain-Python implementation
(same bytes, slower). `python -c "import preprocessing.cpd_fast as f; print(f.available())"` tells.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
SOURCES = sorted(str(p.relative_to(HERE)) for p in (HERE / "preprocessing" / "_native").glob("*.c"))
HEADERS = sorted(str(p.relative_to(HERE)) for p in (HERE / "preprocessing" / "_native").glob("*.h"))


def sources_digest() -> str:
    """md5 of the C sources, compiled into the module: preprocessing.cpd_fast uses an installed
    extension only when it was built from the sources beside it (else it rebuilds into a cache)."""
    h = hashlib.md5()
    for p in sorted((HERE / "preprocessing" / "_native").glob("*.[ch]")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


class OptionalBuildExt(build_ext):
    """Build C extensions, but never fail the install because of them."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler failure falls back to Python
            print(f"WARNING: bertpipe's C accelerator was not built ({exc}); the Python path will be used.")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"WARNING: could not build {ext.name} ({exc}); the Python path will be used.")


ext_modules = []
if SOURCES:
    ext_modules.append(
        Extension(
            "preprocessing._cpd_native",
            sources=SOURCES,
            depends=HEADERS,  # rebuild when a header changes
            define_macros=[("BERTPIPE_SOURCES_DIGEST", f'"{sources_digest()}"')],
            extra_compile_args=["-O3", "-std=c11"],
        )
    )

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
