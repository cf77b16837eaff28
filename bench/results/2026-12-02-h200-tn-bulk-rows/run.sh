# Device, carrying .carry (prepare.sh): TN's staged rows as one bulk copy a row (branch tn-bulk-rows) against main
# (.carry/diag), timed in turns and under ncu; the TN kernel tests on main's and the branch's kernels, and racecheck
# on the branch's.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/bulk; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1"
for r in 1 2 3; do for v in diag bulk; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 $b --reps 5 > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? | $(grep -E '  tma ' $t/gemm-$v-$r.txt | cut -c1-60)"
done; done
m=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed
MEGAMOE_CACHE_DIR=$PWD/.carry/bulk timeout 40 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics $m $b --reps 1 > $t/ncu-bulk.txt 2>&1
echo "ncu bulk: exit $? | $(grep -E '__' $t/ncu-bulk.txt | grep -v PROF | awk '{print $1"="$NF}' | tr '\n' ' ')"
f='--gtest_filter=*TmaGroupedGemmTn*'
MEGAMOE_CACHE_DIR=$PWD/.carry/tc timeout 60 .carry/bin/gpu_kernels_test $f > $t/tests-main.txt 2>&1; echo "TN tests main: exit $? | $(grep -E '^\[  (PASSED|FAILED)' $t/tests-main.txt | tr '\n' ' ')"
MEGAMOE_CACHE_DIR=$PWD/.carry/tcb timeout 60 .carry/bin/gpu_kernels_test $f > $t/tests-bulk.txt 2>&1; echo "TN tests bulk: exit $? | $(grep -E '^\[  (PASSED|FAILED)' $t/tests-bulk.txt | tr '\n' ' ')"
MEGAMOE_CACHE_DIR=$PWD/.carry/tcb timeout 120 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test '--gtest_filter=*TmaGroupedGemmTnFewBlocks*:*TmaGroupedGemmTnRagged*' > $t/racecheck-bulk.txt 2>&1; echo "racecheck bulk: exit $? | $(grep -E 'RACECHECK SUMMARY|PASSED|FAILED' $t/racecheck-bulk.txt | tr '\n' ' ')"
tar czf $OUT/bulk.tgz -C $OUT bulk && rm -rf $t
