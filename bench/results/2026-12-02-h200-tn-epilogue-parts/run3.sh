# Third device call: is TN at the L2's limit? ncu at base clock, L2 and DRAM throughput (percent of peak) and
# bytes for main's dW1 (diag), the same without global stores (p1), dW1's shape at 64 K steps a tile and NT L1
# (cases.py of 2026-12-02-h200-tn-steps) (~1.5 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/parts3; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
m=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum,l1tex__m_l1tex2xbar_write_bytes.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
b="python3 bench/results/2026-12-02-h200-tn-steps/cases.py gemm --lib $MEGAMOE_LIB --reps 1"
for vc in diag:dsv3-ep2-dw1:tn p1:dsv3-ep2-dw1:tn diag:tn-64steps:tn diag:dsv3-ep2-l1:nt; do IFS=: read -r v c l <<<"$vc"
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 ncu --kernel-name grouped_gemm_${l}_tma --launch-skip 0 --launch-count 1 --metrics $m $b --cases $c > $t/ncu-$v-$c.txt 2>&1
  echo "== $v $c: exit $?"; grep -E "__" $t/ncu-$v-$c.txt | grep -v "==PROF==" | awk '{print "  ", $1, $(NF-1), $NF}'
done
tar czf $OUT/parts3.tgz -C $OUT parts3 && rm -rf $t
