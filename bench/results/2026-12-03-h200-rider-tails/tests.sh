# Device run 1 (after prepare.sh): correctness of rider tails - every kernel test, racecheck on their
# tests, the layer's forward and backward at 2 and 8 ranks (~7 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/tests; mkdir -p $t
export NCCL_NVLS_ENABLE=0 MEGAMOE_CACHE_DIR=$PWD/.carry/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
timeout 120 .carry/bin/gpu_kernels_test > $t/kernels.log 2>&1; echo "kernels: exit $?"; grep -E "PASSED|FAILED" $t/kernels.log | tail -3
grep -E "^SUMMARY" $t/kernels.log > $t/kernels-summary.txt
timeout 150 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemmNtRiderTails:GpuKernels.TmaGroupedGemm*HalfTiles:GpuKernels.TmaGroupedGemmNtRaggedGroups' > $t/racecheck.txt 2>&1; echo "racecheck: exit $?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $t/racecheck.txt | tail -3
timeout 240 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallForward/*:LayerTest.SmallBackward/*:LayerTest.ForwardRoutingsAndTokenCounts/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $?"; grep -E "^\[  (PASSED|FAILED) |tests ran" $t/layer.log | tail -6
tar czf $OUT/tests.tgz -C $OUT tests && rm -rf $t
