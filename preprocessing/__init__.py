"""bertpipe's data stages: a plain library (no Prefect), one module per stage.

Each stage reproduces one MLPerf reference script byte for byte (see ../shared/spec/reference-pipeline.md)
and writes its outputs through :mod:`core.manifest`, so "done" always means "manifest present and
verified".
"""
