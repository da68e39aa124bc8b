#!/usr/bin/env bash
# Set up ./.venv (if needed) and run the default test suite (slow/gpu/hpu/network tests are off).
#   bash scripts/test.sh                 # default run
#   bash scripts/test.sh -m slow         # extra pytest arguments are passed through
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false DS_ACCELERATOR=cpu
exec .venv/bin/python -m pytest "$@"
