# Device call 2 (after tests.sh, whose standalone rounds came out level): three more alternating rounds of the
# standalone TN GEMMs at reps 10 (main, the branch, the 4-held variant), then ncu's tensor-pipe activity and time
# of the dW1 kernel at random sizes for each (base clock under ncu) (~6 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/diag; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
for r in 3 4 5; do for v in base-main cache cache-h4; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 60 python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random --reps 10 --json $t/gemm-$v-$r.json > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? at ${SECONDS}s"; grep -E " tma " $t/gemm-$v-$r.txt | head -3
done; done
for v in base-main cache cache-h4; do
  [ $SECONDS -gt 480 ] && break
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 80 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,dram__bytes_write.sum python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1-random --reps 1 > $t/ncu-$v.txt 2>&1
  echo "ncu $v: exit $? at ${SECONDS}s"; grep -E "hmma|duration|dram" $t/ncu-$v.txt | head -4
done
tar czf $OUT/diag.tgz -C $OUT diag && rm -rf $t
