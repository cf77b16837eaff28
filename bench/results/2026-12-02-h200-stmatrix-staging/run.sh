# Device, carrying .carry (prepare.sh): the branch's kernels (staging with stmatrix) - every kernel test, racecheck
# on TN and half-tile tests, the layer at 2 and 8 ranks on one GPU; then main (diag) and the branch (smc) in turns on
# TN (equal, random), random NT L1 / L2 and NN dgrad, two rounds.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/sm; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
c=$PWD/.carry/smc
MEGAMOE_CACHE_DIR=$c timeout 120 .carry/bin/gpu_kernels_test > $t/kernels.log 2>&1; echo "kernels: exit $? at ${SECONDS}s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/kernels.log | tail -6
MEGAMOE_CACHE_DIR=$c timeout 150 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemmTn*:GpuKernels.TmaGroupedGemmNtHalfTiles:GpuKernels.TmaGroupedGemmNnPairsHalfTiles' > $t/racecheck.txt 2>&1; echo "racecheck: exit $? at ${SECONDS}s"; grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) " $t/racecheck.txt | tail -3
MEGAMOE_CACHE_DIR=$c timeout 200 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallBackward/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $? at ${SECONDS}s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/layer.log | tail -6
for r in 1 2; do for v in diag smc; do
  [ $SECONDS -gt 480 ] && break 2
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 80 python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-l1-random,dsv3-ep2-l2-random,dsv3-ep2-l2-dgrad --reps 5 --json $t/gemm-$v-$r.json > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? at ${SECONDS}s"; grep -E " tma " $t/gemm-$v-$r.txt | cut -c1-62 | tr '\n' ' '; echo
done; done
tar czf $OUT/sm.tgz -C $OUT sm && rm -rf $t
