# Device, carrying .carry: TN's stall reasons as raw metrics (per issued instruction, every warp of the kernel) for
# main (diag), without stores (p1) and with a bulk copy a row (p16); main's stall samples by SASS instruction.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/stalls3; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1 --reps 1"
n="ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1"
for v in diag p1 p16; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 $n --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' $b > $t/stall-$v.txt 2>&1
  echo "stall $v: exit $? | $(grep -E 'stalled_' $t/stall-$v.txt | awk '$NF+0 > 0.05 {sub("smsp__average_warps_issue_stalled_","",$1); sub("_per_issue_active.ratio","",$1); print $1"="$NF}' | tr '\n' ' ')"
done
MEGAMOE_CACHE_DIR=$PWD/.carry/diag timeout 200 $n --section SourceCounters --page source --print-source sass --csv $b > $t/sass-diag.csv 2>&1
echo "sass diag: exit $? lines $(wc -l < $t/sass-diag.csv)"
tar czf $OUT/stalls3.tgz -C $OUT stalls3 && rm -rf $t
