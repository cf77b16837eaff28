# Device, carrying .carry: why TN's stores cost time - ncu warp-state stall reasons for main's dW1 kernel (diag),
# without its stores (p1), with a bulk copy a row (p16), with the stores into an L2-resident region (p8), and main's
# stall sampling by instruction (SourceCounters).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/stalls; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1 --reps 1"
n="ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1"
for v in diag p1 p16 p8; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 $n --section WarpStateStats --section SchedulerStats $b > $t/ncu-$v.txt 2>&1
  echo "ncu $v: exit $? | $(grep -E 'Stall|Issued|Eligible|Duration' $t/ncu-$v.txt | tr -s ' ' | tr '\n' ';' | cut -c1-600)"
done
MEGAMOE_CACHE_DIR=$PWD/.carry/diag timeout 200 $n --section SourceCounters --section WarpStateStats --import-source no $b > $t/src-diag.txt 2>&1
echo "src diag: exit $?"; grep -iE -A12 'stall|sampl' $t/src-diag.txt | head -60
tar czf $OUT/stalls.tgz -C $OUT stalls && rm -rf $t
