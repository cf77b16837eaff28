#!/usr/bin/env bash
# Same-run A/B of the TN tail step (run on the GPU machine from the repository root, after scripts/gpu-stage.sh
# staged .carry/ with the change and the A/B caches were generated into .carry/ab/ as README.md says).
set -uo pipefail
OUT=${OUT:-/tmp/megamoe-out}; ab=$OUT/ab; mkdir -p "$ab"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
bench=tools/megamoe-bench/megamoe-bench
nvidia-smi -L > "$ab/machine.txt"; date -u >> "$ab/machine.txt"
TESTS=gpu_kernels_test GTEST_FILTER="${KFILTER:-*}" OUT=$ab bash scripts/gpu-run.sh tests > /dev/null 2>&1
grep -E "tests ran|PASSED|FAILED" "$ab/gpu_kernels_test.log" | tail -5
if [ -n "${LAYERTESTS:-}" ]; then
  MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout ${LAYERTESTS_TIMEOUT:-300} .carry/bin/gpu_layer_test --gtest_filter="$LAYERTESTS" \
    > "$ab/gpu_layer_test.log" 2>&1
  echo "layer tests: exit $?"; grep -E "tests ran|PASSED|FAILED" "$ab/gpu_layer_test.log" | tail -5
fi
if [ -n "${RACECHECK_LAYER:-}" ]; then
  MEGAMOE_WAIT_TIMEOUT_MS=30000 MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 270 compute-sanitizer --tool racecheck \
    .carry/bin/gpu_layer_test --gtest_filter="$RACECHECK_LAYER" > "$ab/racecheck-layer.txt" 2>&1
  echo "racecheck layer: exit $?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" "$ab/racecheck-layer.txt" | tail -4
fi
if [ -n "${RACECHECK:-}" ]; then
  MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 200 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test \
    --gtest_filter="$RACECHECK" > "$ab/racecheck.txt" 2>&1
  echo "racecheck: exit $?"; grep -E "RACECHECK SUMMARY|hazard|PASSED|FAILED" "$ab/racecheck.txt" | tail -4
fi
declare -A gemmcache=([base]=.carry/ab/base-tn [v1]=.carry/ab/v1-tn [v3]=.carry/ab/v3-tn [new]=.carry/cache [probe]=.carry/ab/probe-tn)
for r in $(seq 1 ${GEMM_RUNS:-2}); do
  for v in ${GEMM_VARIANTS:-base new probe}; do
    MEGAMOE_CACHE_DIR=$PWD/${gemmcache[$v]} timeout 200 python3 $bench gemm --lib .carry/lib/libmegamoe.so \
      --cases ${GEMM_CASES:-dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random} --reps 5 \
      --json "$ab/gemm-$v-$r.json" > "$ab/gemm-$v-$r.txt" 2>&1
    echo "gemm $v run $r: exit $?"; grep -E "TF/s|err" "$ab/gemm-$v-$r.txt" | head -12
  done
done
declare -A layercache=([base]=.carry/ab/base-layer [v1]=.carry/ab/v1-layer [new]=.carry/cache)
for v in ${LAYER_VARIANTS:-base new}; do
  MEGAMOE_CACHE_DIR=$PWD/${layercache[$v]} timeout 300 python3 $bench layer --lib .carry/lib/libmegamoe.so --nproc 1 \
    --experts 128 --backward --routings uniform --reps 5 --graph-replays 5 --json "$ab/layer-$v.json" \
    > "$ab/layer-$v.txt" 2>&1
  echo "layer $v: exit $?"; grep -E "layer |wgrad|dgrad|dispatch |combine |checks" "$ab/layer-$v.txt" | head -14
done
tar czf "$OUT/ab.tgz" -C "$OUT" ab && rm -rf "$ab"
