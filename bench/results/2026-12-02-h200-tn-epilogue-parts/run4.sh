# Fourth device call: where do the dW stores cost? p8 keeps every store but sends them into a 1 MB region of
# dW[0] that stays in L2 (no DRAM writes); against main (diag) and no stores (p1): timed (two rounds) and ncu
# (time, tensor pipe, DRAM and L2 throughput); p16 sends the staged rows as one bulk copy per row (correct
# results: the bench checks them), p32 stores half the bytes (~3 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/parts4; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1"
for r in 1 2; do for v in diag p1 p8 p16 p32; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 $b --reps 5 > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? | $(grep -E '  tma ' $t/gemm-$v-$r.txt | cut -c1-60)"
done; done
m=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_write.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
for v in diag p1 p8 p16 p32; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics $m $b --reps 1 > $t/ncu-$v.txt 2>&1
  echo "ncu $v: exit $? | $(grep -E '__' $t/ncu-$v.txt | grep -v PROF | awk '{print $1"="$NF}' | tr '\n' ' ')"
done
tar czf $OUT/parts4.tgz -C $OUT parts4 && rm -rf $t
