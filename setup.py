"""Build hook for the optional C accelerators (create_pretraining_data; md5 of many files; the packers' loops).

Everything else is declared in pyproject.toml. The extension is optional: when no C compiler is
available the build carries on without it and bertpipe uses the plain-Python implementation
(same bytes, slower). `python -c "import preprocessing.mlperf.cpd_fast as f; print(f.available())"` tells.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).parent
#: (module, its sources folder, the file that includes the rest): bertpipe's optional C extensions
NATIVE = [("preprocessing._cpd_native", HERE / "preprocessing" / "_native", "cpd.c"),
          ("core._md5_native", HERE / "core" / "_native", "md5.c"),
          ("preprocessing._pack_native", HERE / "preprocessing" / "_pack_native", "pack.c")]


def sources_digest(src: Path) -> str:
    """md5 of an extension's C sources, compiled into the module: core.native uses an installed extension
    only when it was built from the sources beside it (else it rebuilds into a cache)."""
    h = hashlib.md5()
    for p in sorted(src.glob("*.[ch]")):
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


ext_modules = [
    Extension(
        name,
        sources=[str((src / main).relative_to(HERE))],  # the main file includes the others
        depends=sorted(str(p.relative_to(HERE)) for p in src.glob("*.[ch]")),  # rebuild when any changes
        define_macros=[("BERTPIPE_SOURCES_DIGEST", f'"{sources_digest(src)}"')],
        extra_compile_args=["-O3", "-std=c11"],
    )
    for name, src, main in NATIVE
    if (src / main).is_file()
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": OptionalBuildExt})
