# Device, carrying .carry (as run.sh): the branch's dW1 kernel under ncu - stall sampling by SASS instruction (as
# 2026-12-02-h200-tn-bulk-rows/run3.sh for main): do the leading warpgroup's waits for ring slots shrink with 8 stages?
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/k32s; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib-k32/libmegamoe.so MEGAMOE_CACHE_DIR=$PWD/.carry/k32
timeout 200 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --section SourceCounters --page source --print-source sass --csv python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1 --reps 1 > $t/sass-k32.csv 2>&1
echo "sass k32: exit $? lines $(wc -l < $t/sass-k32.csv)"
tar czf $OUT/k32s.tgz -C $OUT k32s && rm -rf $t
