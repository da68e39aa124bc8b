"""bertpipe's data stages: a plain library (no Prefect), one module per stage.

Each stage reproduces one MLPerf reference script byte for byte (see ../shared/spec/reference-pipeline.md)
and writes its outputs through :mod:`core.manifest`, so "done" always means "manifest present and
verified".
"""

# core first: it keeps OpenBLAS to one thread, which must be set before numpy is imported (a stage module imports
# numpy before core; a library user imports a stage module directly)
import core as _core  # noqa: E402,F401
