# Device run 1 (after prepare.sh): half tiles' correctness - every kernel test, racecheck on the half-tile tests,
# the layer's forward and backward at 2 and 8 ranks - then the standalone GEMMs, base (.carry/old) and branch
# (.carry/cache) alternating, two rounds.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/tests; mkdir -p $t
export NCCL_NVLS_ENABLE=0 MEGAMOE_CACHE_DIR=$PWD/.carry/cache
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
timeout 120 .carry/bin/gpu_kernels_test > $t/kernels.log 2>&1; echo "kernels: exit $?"; grep -E "PASSED|FAILED" $t/kernels.log | tail -3
grep -E "^SUMMARY" $t/kernels.log > $t/kernels-summary.txt
timeout 150 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemm*HalfTiles:GpuKernels.TmaGroupedGemmNtPairsRaggedGroups' > $t/racecheck.txt 2>&1; echo "racecheck: exit $?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $t/racecheck.txt | tail -3
timeout 240 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallForward/*:LayerTest.SmallBackward/*:LayerTest.ForwardRoutingsAndTokenCounts/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $?"; grep -E "^\[  (PASSED|FAILED) |tests ran" $t/layer.log | tail -6
tar czf $OUT/tests.tgz -C $OUT tests && rm -rf $t
export PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
ab=$OUT/gemm; mkdir -p $ab
for r in 1 2; do for v in old cache; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 100 python3 tools/megamoe-bench/megamoe-bench gemm --lib .carry/lib/libmegamoe.so --cases dsv3-ep2-l1,dsv3-ep2-l1-random,dsv3-ep2-l2-random,dsv3-ep2-l1-dgrad,ragged-nt --reps 5 --json $ab/gemm-$v-$r.json > $ab/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E "tma|pairs" $ab/gemm-$v-$r.txt | head -12
done; done
tar czf $OUT/gemm.tgz -C $OUT gemm && rm -rf $ab
