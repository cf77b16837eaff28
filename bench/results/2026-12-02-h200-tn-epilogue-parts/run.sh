# One device call, carrying .carry (prepared as README says): TN dW1 (DeepSeek-V3 EP2, equal groups, 8 K steps a
# tile) with parts of its default epilogue dropped at generation (MEGAMOE_TN_PROBE bits on branch
# tn-epilogue-probe; results wrong by design): diag = main, p1 no global stores, p2 no staging round trip (zeros
# stored), p3 neither, p4 no turns between the warpgroups, p7 nothing after the K loop's drain. Timed TF/s (two
# rounds), then ncu at base clock: time and tensor-pipe activity of the TMA kernel's first launch (~4 min).
# As run (run 1): bit 2 then dropped the staging write too and lost the MMAs; with today's change.diff
# (prepare.sh) p2 / p3 are run2.sh's, and p7 is staged only with PROBES="... 7".
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/parts; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1"
for r in 1 2; do for v in diag p1 p2 p3 p4 p7; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 $b --reps 5 > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? at ${SECONDS}s | $(grep -E '  tma ' $t/gemm-$v-$r.txt | cut -c1-60)"
done; done
for v in diag p1 p2 p3 p4 p7; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 40 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active $b --reps 1 > $t/ncu-$v.txt 2>&1
  echo "ncu $v: exit $? | $(grep -E 'duration|hmma' $t/ncu-$v.txt | awk '{print $NF}' | tr '\n' ' ')"
done
tar czf $OUT/parts.tgz -C $OUT parts && rm -rf $t
