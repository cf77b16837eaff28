# Device, carrying .carry: TN with TMA at 32-wide K steps and 8 ring stages (branch tn-k32; its own runtime, since
# the declared boxes change) against main: the TN kernel tests, then dW1 / random dW1 / random dW2 in turns (two
# rounds), then ncu of the branch's dW1 (time, tensor pipe at base clock).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/k32; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
MEGAMOE_CACHE_DIR=$PWD/.carry/k32t timeout 60 .carry/bin/gpu_kernels_test.k32 '--gtest_filter=*TmaGroupedGemmTn*' > $t/tests.txt 2>&1; echo "TN tests k32: exit $? | $(grep -E '^\[  (PASSED|FAILED)' $t/tests.txt | tr '\n' ' ')"
cases=dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random
for r in 1 2; do for v in main k32; do
  lib=$PWD/.carry/lib/libmegamoe.so; cache=$PWD/.carry/diag
  [ $v = k32 ] && lib=$PWD/.carry/lib-k32/libmegamoe.so && cache=$PWD/.carry/k32
  MEGAMOE_LIB=$lib MEGAMOE_CACHE_DIR=$cache timeout 80 python3 tools/megamoe-bench/megamoe-bench gemm --lib $lib --cases $cases --reps 5 > $t/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $? at ${SECONDS}s | $(awk '/^dsv3/{c=$1} / tma /{printf "%s %s %s; ", c, $2, $NF}' $t/gemm-$v-$r.txt)"
done; done
lib=$PWD/.carry/lib-k32/libmegamoe.so
MEGAMOE_LIB=$lib MEGAMOE_CACHE_DIR=$PWD/.carry/k32 timeout 60 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active python3 tools/megamoe-bench/megamoe-bench gemm --lib $lib --cases dsv3-ep2-dw1 --reps 1 > $t/ncu-k32.txt 2>&1
echo "ncu k32: exit $? | $(grep -E '__' $t/ncu-k32.txt | grep -v PROF | awk '{print $1"="$NF}' | tr '\n' ' ')"
tar czf $OUT/k32.tgz -C $OUT k32 && rm -rf $t
