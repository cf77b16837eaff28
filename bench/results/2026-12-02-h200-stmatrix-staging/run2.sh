# Device, carrying .carry: the branch's dW1 kernel under ncu - tensor pipe and time at base clock, and stall
# sampling by SASS instruction (as 2026-12-02-h200-tn-bulk-rows/run3.sh for main).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/sm2; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so MEGAMOE_CACHE_DIR=$PWD/.carry/smc
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1 --reps 1"
n="ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1"
timeout 100 $n --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active $b > $t/ncu-smc.txt 2>&1
echo "ncu smc: exit $? | $(grep -E '__' $t/ncu-smc.txt | grep -v PROF | awk '{print $1"="$NF}' | tr '\n' ' ')"
timeout 200 $n --section SourceCounters --page source --print-source sass --csv $b > $t/sass-smc.csv 2>&1
echo "sass smc: exit $? lines $(wc -l < $t/sass-smc.csv)"
tar czf $OUT/sm2.tgz -C $OUT sm2 && rm -rf $t
