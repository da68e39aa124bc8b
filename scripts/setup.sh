#!/usr/bin/env bash
# Create ./.venv with everything bertpipe needs on a CPU machine (idempotent; ~2 min the first time).
#
#   bash scripts/setup.sh            # core + prefect + tensorflow-cpu + torch(CPU) + deepspeed + mlperf-logging + dev tools
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
# MLCommons' mlperf-logging comes from PyPI with the `train` extra (in .[all]): training writes mllog.txt.
stamp="$VENV/.bertpipe-setup-$(cat pyproject.toml setup.py scripts/setup.sh | md5sum | cut -c1-12)"
if [ -f "$stamp" ]; then
  exit 0
fi
"${PIP[@]}" --upgrade pip setuptools wheel
"${PIP[@]}" "$TORCH_SPEC"
"${PIP[@]}" --no-build-isolation "deepspeed==0.19.8"
"${PIP[@]}" -e ".[all]"
touch "$stamp"
echo "bertpipe environment ready in $VENV"
