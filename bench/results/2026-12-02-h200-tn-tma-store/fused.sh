#!/usr/bin/env bash
# Device, carrying .carry: the fused weight-gradient dispatch (dispatch_grouped_gemm layout 2, dW1) storing dW1 as
# tensor-map boxes too (branch tn-tma-store-fused: .carry/fused, .carry/libf) against main with the standalone TN
# stores (.carry/tms, .carry/libtms): the layer's tests at 2 and 8 ranks on one GPU, racecheck on the small backward,
# then the layer's forward + backward at DeepSeek-V3 EP2 on one GPU, main then branch, twice.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/fused; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
c=$PWD/.carry/fused L=$PWD/.carry/libf/libmegamoe.so
export MEGAMOE_LIB=$L
MEGAMOE_CACHE_DIR=$c timeout 200 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallBackward/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $? at ${SECONDS}s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/layer.log | tail -6
MEGAMOE_CACHE_DIR=$c timeout 100 compute-sanitizer --tool racecheck .carry/bin/gpu_layer_test --gtest_filter='LayerTest.SmallBackward/Ranks2' > $t/racecheck.txt 2>&1; echo "racecheck: exit $? at ${SECONDS}s"; grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) " $t/racecheck.txt | tail -3
lay="layer --nproc 1 --experts 128 --backward --routings uniform,balanced --reps 5"
for r in 1 2; do
  [ $SECONDS -gt 420 ] && break
  MEGAMOE_CACHE_DIR=$PWD/.carry/tms timeout 100 python3 tools/megamoe-bench/megamoe-bench $lay --lib $PWD/.carry/libtms/libmegamoe.so --json $t/layer-main-$r.json > $t/layer-main-$r.txt 2>&1; echo "layer main $r: exit $? at ${SECONDS}s"; grep -E "fwd\+bwd layer|wgrad-w1-disp  *fused" $t/layer-main-$r.txt | cut -c1-90
  MEGAMOE_CACHE_DIR=$c timeout 100 python3 tools/megamoe-bench/megamoe-bench $lay --lib $L --json $t/layer-fused-$r.json > $t/layer-fused-$r.txt 2>&1; echo "layer fused $r: exit $? at ${SECONDS}s"; grep -E "fwd\+bwd layer|wgrad-w1-disp  *fused" $t/layer-fused-$r.txt | cut -c1-90
done
tar czf $OUT/fused.tgz -C $OUT fused && rm -rf $t
