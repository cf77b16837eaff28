#!/usr/bin/env bash
# Second lease (after 21e1d94: the layer's and the pipeline's times after a 300 ms lead): the layer bench with
# --clocks as in run.sh, and the refusal of more ranks than GPUs.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L | tee "$OUT/machine.txt"; date -u | tee -a "$OUT/machine.txt"
timeout 360 python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --experts 128 \
  --backward --routings uniform,balanced --graph-replays 10 --clocks 3 --json "$OUT/layer.json" 2>&1 | tee "$OUT/layer.txt"
python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 2 > "$OUT/nproc2.txt" 2>&1
echo "exit $?" >> "$OUT/nproc2.txt"; cat "$OUT/nproc2.txt"
