#!/usr/bin/env bash
# On the GPU machine from the repository root over .carry (scripts/gpu-stage.sh, then the bench before 98c4867:
# `git show 259cd25:tools/megamoe-bench/megamoe-bench > .carry/bench-before`): the layer bench's stage legs with and
# without the steady lead, at 5 and 10 reps, DeepSeek-V3 EP2's per-GPU work on one rank, uniform routing.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
chmod -R go-w "$MEGAMOE_CACHE_DIR"  # the runtime refuses a cache others could write to
nvidia-smi -L | tee "$OUT/machine.txt"; date -u | tee -a "$OUT/machine.txt"
for bench in .carry/bench-before tools/megamoe-bench/megamoe-bench; do
  for reps in 5 10; do
    name=$( [ "$bench" = .carry/bench-before ] && echo before || echo lead )-reps$reps
    timeout 280 python3 "$bench" layer --lib .carry/lib/libmegamoe.so --nproc 1 --experts 128 --backward \
      --routings uniform --graph-replays 2 --reps $reps --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1
    echo "== $name exit $?"; grep -E 'fused|dense-equivalent|checks' "$OUT/$name.txt"
  done
done 2>&1 | tee "$OUT/summary.txt"
