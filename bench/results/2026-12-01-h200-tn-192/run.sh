#!/usr/bin/env bash
# Same-run A/B of TN's 192 x 192 tiles against the 128 x 256 ones (run on the GPU machine from the repository root,
# after scripts/gpu-stage.sh staged .carry/ with the change and the base caches went into .carry/ab/: base-tn from
# `megamoe-cache generate --kernel grouped_gemm_tn[_tma]` and base-layer from `megamoe-cache generate --hidden 7168
# --intermediate 2048 --experts 128 --topk 8 --ep 1`, both by the build before the change).
set -uo pipefail
OUT=${OUT:-/tmp/megamoe-out}; ab=$OUT/ab; mkdir -p "$ab"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
bench=tools/megamoe-bench/megamoe-bench
nvidia-smi -L > "$ab/machine.txt"; date -u >> "$ab/machine.txt"
TESTS=gpu_kernels_test OUT=$ab bash scripts/gpu-run.sh tests > /dev/null 2>&1
grep -E "tests ran|PASSED|FAILED|SUMMARY grouped_gemm_tn" "$ab/gpu_kernels_test.log" | tail -8
if [ -n "${RACECHECK:-}" ]; then
  MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 200 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test \
    --gtest_filter="$RACECHECK" > "$ab/racecheck.txt" 2>&1
  echo "racecheck: exit $?"; grep -E "RACECHECK SUMMARY|hazard|PASSED|FAILED" "$ab/racecheck.txt" | tail -4
fi
if [ -n "${LAYERTESTS:-}" ]; then
  MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout ${LAYERTESTS_TIMEOUT:-300} .carry/bin/gpu_layer_test --gtest_filter="$LAYERTESTS" \
    > "$ab/gpu_layer_test.log" 2>&1
  echo "layer tests: exit $?"; grep -E "tests ran|PASSED|FAILED" "$ab/gpu_layer_test.log" | tail -5
fi
declare -A gemmcache=([base]=.carry/ab/base-tn [new]=.carry/cache)
for r in $(seq 1 ${GEMM_RUNS:-2}); do
  for v in ${GEMM_VARIANTS:-base new}; do
    MEGAMOE_CACHE_DIR=$PWD/${gemmcache[$v]} timeout 200 python3 $bench gemm --lib .carry/lib/libmegamoe.so \
      --cases ${GEMM_CASES:-dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random} --reps 5 \
      --json "$ab/gemm-$v-$r.json" > "$ab/gemm-$v-$r.txt" 2>&1
    echo "gemm $v run $r: exit $?"; grep -E "tma " "$ab/gemm-$v-$r.txt" | head -12
  done
done
declare -A layercache=([base]=.carry/ab/base-layer [new]=.carry/cache)
for v in ${LAYER_VARIANTS:-base new}; do
  MEGAMOE_CACHE_DIR=$PWD/${layercache[$v]} timeout 300 python3 $bench layer --lib .carry/lib/libmegamoe.so --nproc 1 \
    --experts 128 --backward --routings uniform --reps 5 --graph-replays 5 --json "$ab/layer-$v.json" \
    > "$ab/layer-$v.txt" 2>&1
  echo "layer $v: exit $?"; grep -E "layer |wgrad|checks" "$ab/layer-$v.txt" | head -10
done
tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$ab"
