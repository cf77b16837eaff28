# Device call 1 (after prepare.sh): correctness of the held rows - every kernel test (the new
# GpuKernels.TmaGroupedGemmTnHeldRows included), racecheck on the TN tests, the layer's backward at 2 and 8 ranks on
# one GPU; then the standalone TN GEMMs for main and each variant, alternating, two rounds (~8 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/tests; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 120 .carry/bin/gpu_kernels_test > $t/kernels.log 2>&1; echo "kernels: exit $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/kernels.log | tail -6
MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 150 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemmTn*' > $t/racecheck.txt 2>&1; echo "racecheck: exit $?"; grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) " $t/racecheck.txt | tail -3
MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 200 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallBackward/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/layer.log | tail -6
echo "tests done at ${SECONDS}s"
for r in 1 2; do for v in base-main cache cache-s1 cache-h4; do
  [ $SECONDS -gt 540 ] && break 2
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 60 python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random,ragged-tn --reps 5 --json $t/gemm-$v-$r.json > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? at ${SECONDS}s"; grep -E " tma |correct" $t/gemm-$v-$r.txt | head -6
done; done
tar czf $OUT/tests.tgz -C $OUT tests && rm -rf $t
