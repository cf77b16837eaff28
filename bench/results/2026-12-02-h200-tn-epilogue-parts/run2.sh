# Second device call: bit 2 redefined to drop only the staging tile's read-back (in the first call it dropped the
# staging write too, and the compiler then removed the unused MMAs: p2 / p3 / p7 there ran no MMAs): diag = main,
# p1 no global stores, p2 no read-back (zeros stored), p3 neither read-back nor stores (~2 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/parts2; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1"
for r in 1 2; do for v in diag p1 p2 p3; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 $b --reps 5 > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? at ${SECONDS}s | $(grep -E '  tma ' $t/gemm-$v-$r.txt | cut -c1-60)"
done; done
for v in diag p1 p2 p3; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active $b --reps 1 > $t/ncu-$v.txt 2>&1
  echo "ncu $v: exit $? | $(grep -E 'duration|hmma' $t/ncu-$v.txt | awk '{print $NF}' | tr '\n' ' ')"
done
tar czf $OUT/parts2.tgz -C $OUT parts2 && rm -rf $t
