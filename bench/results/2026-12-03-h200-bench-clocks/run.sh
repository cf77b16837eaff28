#!/usr/bin/env bash
# On the GPU machine from the repository root over .carry (scripts/gpu-stage.sh's, test binaries and library from
# this commit): the receive-capacity drop test as edited in fc29229 (2 and 8 ranks on one GPU), then megamoe-bench
# layer --clocks at DeepSeek-V3 EP2's per-GPU work on one rank, and a short two-rank run of --clocks.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee "$OUT/machine.txt"; date -u | tee -a "$OUT/machine.txt"
timeout 200 .carry/bin/gpu_layer_test --gtest_filter='*ReceiveCapacity*' > "$OUT/drop-test.log" 2>&1; echo "drop test exit $?" | tee -a "$OUT/drop-test.log"
grep -E '^\[  (FAILED|PASSED|SKIPPED)|OK \]' "$OUT/drop-test.log"
timeout 330 python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --experts 128 \
  --backward --routings uniform,balanced --graph-replays 10 --clocks 3 --json "$OUT/layer.json" 2>&1 | tee "$OUT/layer.txt"
timeout 150 python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 2 --tokens 1024 \
  --routings uniform --graph-replays 2 --clocks 1 --json "$OUT/layer-2ranks.json" 2>&1 | tee "$OUT/layer-2ranks.txt"
