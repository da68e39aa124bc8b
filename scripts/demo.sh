#!/usr/bin/env bash
# Set up ./.venv (if needed) and run bertpipe end to end on its built-in sample into ./work/demo.
#   bash scripts/demo.sh [extra `bertpipe demo` flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PREFECT_SERVER_ANALYTICS_ENABLED=false DS_ACCELERATOR=cpu
exec .venv/bin/bertpipe demo --work-dir work/demo "$@"
