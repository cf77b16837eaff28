#!/usr/bin/env bash
# Third lease (after the --clocks phases of the GEMM legs only and of balanced routing): the layer bench's forward
# with --clocks 3, twice.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee "$OUT/machine.txt"; date -u | tee -a "$OUT/machine.txt"
for i in 1 2; do
  timeout 250 python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --experts 128 \
    --routings uniform --graph-replays 2 --clocks 3 --json "$OUT/layer-$i.json" 2>&1 | tee "$OUT/layer-$i.txt"
done
