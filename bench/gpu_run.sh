#!/usr/bin/env bash
# One lent NVIDIA GPU, about 5 minutes: the CUDA packed-attention tests, the packed attention kernels alone
# (bench/gpu_attention.py), then BERT-Large bf16 padded vs packed (eager and torch.compile, the compiled steps
# profiled) on rows with the full MLPerf set's lengths. Results go to $OUT (default /tmp/bertpipe_gpu): env.txt,
# tests.log, attention.log/.json, bench.log, gpu_bench.json, the profiled runs' *.trace.json.gz.
#
#     bash bench/gpu_run.sh                        # on the GPU machine, in the repository root
#
# Needs only the machine's own python3 with torch (>= 2.9 for varlen_attn), numpy and pytest: no DeepSpeed,
# no flash_attn, no data files.
set -o pipefail
OUT=${OUT:-/tmp/bertpipe_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  $PY -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  $PY -c "import flash_attn" 2>/dev/null && echo "flash_attn importable" || echo "flash_attn absent"
} 2>&1 | tee "$OUT/env.txt"
timeout "${TEST_TIMEOUT:-120}" $PY -m pytest tests/pretrain/test_packing_cuda.py -m gpu -q -s -p no:cacheprovider \
  -W ignore::UserWarning 2>&1 | grep -v "^W[0-9]" | tee "$OUT/tests.log"
timeout "${ATTN_TIMEOUT:-90}" $PY bench/gpu_attention.py --json-out "$OUT/attention.json" 2>&1 | grep -v "^W[0-9]" \
  | tee "$OUT/attention.log"
timeout "${BENCH_TIMEOUT:-300}" $PY bench/bench_train_packed.py --gpu --lengths mlperf --batch-tokens 32768 \
  --budget-s "${BENCH_BUDGET:-200}" --json-out "$OUT/gpu_bench.json" ${BENCH_ARGS:-} 2>&1 \
  | grep -v "^W[0-9]" | tee "$OUT/bench.log"
