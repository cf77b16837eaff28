#!/usr/bin/env bash
# On the GPU machine from the repository root over scripts/gpu-stage.sh's .carry: telemetry.py, then the layer bench
# (DeepSeek-V3 EP2's per-GPU work on one rank, uniform against balanced routing, forward + backward) with its
# dense anchor timed back to back (tools/megamoe-bench/megamoe-bench dense_rate).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee "$OUT/machine.txt"; date -u | tee -a "$OUT/machine.txt"
timeout 200 python3 bench/results/2026-12-03-h200-clock-reasons/telemetry.py .carry/lib/libmegamoe.so 3 2>&1 | tee "$OUT/telemetry.txt"
timeout 380 python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --experts 128 \
  --backward --routings uniform,balanced --graph-replays 100 --json "$OUT/layer.json" 2>&1 | tee "$OUT/layer.txt"
