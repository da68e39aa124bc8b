#!/usr/bin/env bash
# Create ./.venv with everything bertpipe needs on a CPU machine (idempotent; ~2 min the first time).
#
#   bash scripts/setup.sh            # core + prefect + tensorflow-cpu + torch(CPU) + deepspeed + dev tools
#
# Order matters: the CPU build of torch goes in first, so that nothing later pulls the multi-GB CUDA
# build, and DeepSpeed is built against it without build isolation (its setup.py imports torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${BERTPIPE_VENV:-.venv}
TORCH_SPEC=${BERTPIPE_TORCH:-torch==2.13.0}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# MLCommons' mlperf_logging (the `mlperf` extra) is not on PyPI: a vendored wheel in ../shared/vendor (CI has
# ../shared) is installed when present; without it training runs and writes no mllog.txt.
MLPERF_WHEEL=../shared/vendor/mlperf_logging-4.1.59-py3-none-any.whl
[ -f "$MLPERF_WHEEL" ] || MLPERF_WHEEL=""
stamp="$VENV/.bertpipe-setup-$( (cat pyproject.toml setup.py scripts/setup.sh; echo "$MLPERF_WHEEL") | md5sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi
"${PIP[@]}" --upgrade pip setuptools wheel
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" --no-build-isolation "deepspeed==0.19.8"
"${PIP[@]}" -e ".[all]"
if [ -n "$MLPERF_WHEEL" ]; then
  "${PIP[@]}" "$MLPERF_WHEEL"   # == pip install "bertpipe[mlperf]" without access to GitHub
else
  echo "note: no ../shared/vendor/mlperf_logging wheel: mlperf_logging not installed (no mllog.txt; see README)"
fi
touch "$stamp"
echo "bertpipe environment ready in $VENV"
