set -uo pipefail
OUT=${OUT:-/tmp/o}; ab=$OUT/ab; mkdir -p $ab
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
bench=tools/megamoe-bench/megamoe-bench
MEGAMOE_CACHE_DIR=$PWD/.carry/new timeout 60 .carry/bin/gpu_kernels_test > $ab/kernels-new.log 2>&1; echo "kernels new: exit $?"; grep -E "PASSED|FAILED" $ab/kernels-new.log | tail -3
MEGAMOE_CACHE_DIR=$PWD/.carry/new timeout 90 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemmTn*' > $ab/racecheck-new.txt 2>&1; echo "racecheck: exit $?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $ab/racecheck-new.txt | tail -3
MEGAMOE_CACHE_DIR=$PWD/.carry/new timeout 150 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/Ranks2:LayerDeepSeekV3.*/Ranks2' > $ab/layer-tests-new.log 2>&1; echo "layer tests new: exit $?"; grep -E "PASSED|FAILED" $ab/layer-tests-new.log | tail -4
for r in 1 2; do for v in cache new; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 100 python3 $bench gemm --lib .carry/lib/libmegamoe.so --cases dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random --reps 5 --json $ab/gemm-$v-$r.json > $ab/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E "tma " $ab/gemm-$v-$r.txt
done; done
for v in cache new; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 120 python3 $bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --experts 128 --backward --routings uniform --reps 5 --graph-replays 5 --json $ab/layer-$v.json > $ab/layer-$v.txt 2>&1
  echo "layer $v: exit $?"; grep -E "layer |wgrad|checks" $ab/layer-$v.txt | head -8
done
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $ab
