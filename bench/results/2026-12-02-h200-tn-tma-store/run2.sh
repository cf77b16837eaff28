#!/usr/bin/env bash
# Device, carrying .carry (prepare.sh), after every MMA thread arrives on the staged barrier: the kernel tests,
# racecheck on TN, the layer's tests at 2 and 8 ranks on one GPU, TN main / branch in turns (two rounds), and the
# layer's forward + backward at DeepSeek-V3 EP2 on one GPU, main then branch.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/tms2; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
c=$PWD/.carry/tms L=$PWD/.carry/libtms/libmegamoe.so ML=$PWD/.carry/lib/libmegamoe.so
export MEGAMOE_LIB=$L
MEGAMOE_CACHE_DIR=$c timeout 120 .carry/bin/gpu_kernels_test > $t/kernels.log 2>&1; echo "kernels: exit $? at ${SECONDS}s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/kernels.log | tail -6
MEGAMOE_CACHE_DIR=$c timeout 150 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemmTn*' > $t/racecheck.txt 2>&1; echo "racecheck: exit $? at ${SECONDS}s"; grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) " $t/racecheck.txt | tail -3
MEGAMOE_CACHE_DIR=$c timeout 200 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallBackward/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $? at ${SECONDS}s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/layer.log | tail -6
cases=dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random
for r in 1 2; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/diag timeout 80 python3 .carry/main-bench/megamoe-bench gemm --lib $ML --cases $cases --reps 5 --json $t/gemm-main-$r.json > $t/gemm-main-$r.txt 2>&1
  echo "gemm main run $r: exit $? at ${SECONDS}s | $(awk '/^dsv3/{c=$1} / tma /{printf "%s %s; ", c, $2}' $t/gemm-main-$r.txt)"
  MEGAMOE_CACHE_DIR=$c timeout 80 python3 tools/megamoe-bench/megamoe-bench gemm --lib $L --cases $cases --reps 5 --json $t/gemm-tms-$r.json > $t/gemm-tms-$r.txt 2>&1
  echo "gemm tms run $r: exit $? at ${SECONDS}s | $(awk '/^dsv3/{c=$1} / tma /{printf "%s %s; ", c, $2}' $t/gemm-tms-$r.txt)"
done
lay="layer --nproc 1 --experts 128 --backward --routings uniform,balanced --reps 5"
[ $SECONDS -lt 420 ] && { MEGAMOE_CACHE_DIR=$PWD/.carry/diag timeout 120 python3 .carry/main-bench/megamoe-bench $lay --lib $ML --json $t/layer-main.json > $t/layer-main.txt 2>&1; echo "layer main: exit $? at ${SECONDS}s"; grep -iE "fwd\+bwd|forward \+ backward|wgrad" $t/layer-main.txt | head -8; }
[ $SECONDS -lt 480 ] && { MEGAMOE_CACHE_DIR=$c timeout 110 python3 tools/megamoe-bench/megamoe-bench $lay --lib $L --json $t/layer-tms.json > $t/layer-tms.txt 2>&1; echo "layer tms: exit $? at ${SECONDS}s"; grep -iE "fwd\+bwd|forward \+ backward|wgrad" $t/layer-tms.txt | head -8; }
tar czf $OUT/tms2.tgz -C $OUT tms2 && rm -rf $t
