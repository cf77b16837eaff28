# One device call (after staging, see README): correctness of TN's tail slices (every kernel test,
# racecheck on the TN tests, the layer's forward and backward at 2 and 8 ranks), then the standalone TN GEMMs and
# the DeepSeek-V3 layer (with --timeline: the TN kernel's own time in the step) for each variant in .carry:
# base-main (main's kernels) and cache (the branch: TN's last K step in 16-wide slices), alternating.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/ts; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 120 .carry/bin/gpu_kernels_test > $t/kernels.log 2>&1; echo "kernels: exit $?"; grep -E "^\[  (PASSED|FAILED) " $t/kernels.log | tail -4
MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 150 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemmTn*' > $t/racecheck.txt 2>&1; echo "racecheck: exit $?"; grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) " $t/racecheck.txt | tail -3
MEGAMOE_CACHE_DIR=$PWD/.carry/cache timeout 200 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallBackward/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $?"; grep -E "^\[  (PASSED|FAILED) " $t/layer.log | tail -4
for r in 1 2; do for v in base-main cache; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 60 python3 tools/megamoe-bench/megamoe-bench gemm --lib .carry/lib/libmegamoe.so --cases dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random,ragged-tn --reps 5 --json $t/gemm-$v-$r.json > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E " tma " $t/gemm-$v-$r.txt | head -4
done; done
for r in 1 2; do for v in base-main cache; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --experts 128 --backward --routings uniform,balanced --timeline --reps 5 --graph-replays 5 --json $t/dsv3-$v-$r.json > $t/dsv3-$v-$r.txt 2>&1
  echo "dsv3 $v: exit $?"; grep -E "fwd\+bwd layer|random / whole|correctness" $t/dsv3-$v-$r.txt; grep "in order" $t/dsv3-$v-$r.txt | sed -n '2p;4p'
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); [print('  ', r['routing'] if 'routing' in r else '', 'tn_tma ms', round(r['backward']['timeline']['by_kernel']['grouped_gemm_tn_tma']['ms'],3), 'step', round(r['backward']['timeline']['span_ms'],3)) for r in j['runs'][0]['routings']]" $t/dsv3-$v-$r.json 2>&1 | head -3
done; done
tar czf $OUT/ts.tgz -C $OUT ts && rm -rf $t
