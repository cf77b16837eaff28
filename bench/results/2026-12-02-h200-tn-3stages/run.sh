# Device, carrying .carry: does TN's time follow the ring's bytes? main's dW1 / random dW2 (4 stages of 48 KB)
# against the same kernels with 3 (branch tn-3stages, change.diff; .carry/s3 = .carry/diag with them regenerated),
# in turns, two rounds; ncu time and tensor pipe of the 3-stage dW1.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/s3; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB"
for r in 1 2; do for v in diag s3; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 60 $b --cases dsv3-ep2-dw1,dsv3-ep2-dw2-random --reps 5 > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? at ${SECONDS}s | $(awk '/^dsv3/{c=$1} / tma /{printf "%s %s; ", c, $2}' $t/gemm-$v-$r.txt)"
done; done
MEGAMOE_CACHE_DIR=$PWD/.carry/s3 timeout 60 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active $b --cases dsv3-ep2-dw1 --reps 1 > $t/ncu-s3.txt 2>&1
echo "ncu s3: exit $? | $(grep -E '__' $t/ncu-s3.txt | grep -v PROF | awk '{print $1"="$NF}' | tr '\n' ' ')"
tar czf $OUT/s3.tgz -C $OUT s3 && rm -rf $t
