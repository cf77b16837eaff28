#!/usr/bin/env bash
# Device, carrying .carry (prepare.sh): TN's epilogue as tensor-map stores (branch tn-tma-store). Correctness first
# (every kernel test, racecheck on the TN tests, the layer at 2 and 8 ranks on one GPU), then main (diag, its lib
# and bench script) and the branch (tms) in turns on TN, two rounds; ncu's bank counters on the branch's dW1.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/tms; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
c=$PWD/.carry/tms L=$PWD/.carry/libtms/libmegamoe.so
export MEGAMOE_LIB=$L
MEGAMOE_CACHE_DIR=$c timeout 120 .carry/bin/gpu_kernels_test > $t/kernels.log 2>&1; echo "kernels: exit $? at ${SECONDS}s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/kernels.log | tail -6
MEGAMOE_CACHE_DIR=$c timeout 150 compute-sanitizer --tool racecheck .carry/bin/gpu_kernels_test --gtest_filter='GpuKernels.TmaGroupedGemmTn*' > $t/racecheck.txt 2>&1; echo "racecheck: exit $? at ${SECONDS}s"; grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) " $t/racecheck.txt | tail -3
MEGAMOE_CACHE_DIR=$c timeout 200 .carry/bin/gpu_layer_test --gtest_filter='LayerTest.BackwardMatchesReference/*:LayerDeepSeekV3.*:LayerTest.SmallBackward/*:LayerTest.CudaGraphReplay/*' > $t/layer.log 2>&1; echo "layer: exit $? at ${SECONDS}s"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" $t/layer.log | tail -6
cases=dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random
for r in 1 2; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/diag timeout 80 python3 .carry/main-bench/megamoe-bench gemm --lib $PWD/.carry/lib/libmegamoe.so --cases $cases --reps 5 --json $t/gemm-main-$r.json > $t/gemm-main-$r.txt 2>&1
  echo "gemm main run $r: exit $? at ${SECONDS}s | $(awk '/^dsv3/{c=$1} / tma /{printf "%s %s; ", c, $2}' $t/gemm-main-$r.txt)"
  MEGAMOE_CACHE_DIR=$c timeout 80 python3 tools/megamoe-bench/megamoe-bench gemm --lib $L --cases $cases --reps 5 --json $t/gemm-tms-$r.json > $t/gemm-tms-$r.txt 2>&1
  echo "gemm tms run $r: exit $? at ${SECONDS}s | $(awk '/^dsv3/{c=$1} / tma /{printf "%s %s; ", c, $2}' $t/gemm-tms-$r.txt)"
done
ms=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_reads.sum,l1tex__data_bank_writes.sum
MEGAMOE_CACHE_DIR=$c timeout 90 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics $ms python3 tools/megamoe-bench/megamoe-bench gemm --lib $L --cases dsv3-ep2-dw1 --reps 1 > $t/ncu-tms.txt 2>&1
echo "ncu tms: exit $? | $(grep -E '__' $t/ncu-tms.txt | grep -v PROF | awk '{print $1"="$NF}' | tr '\n' ' ')"
tar czf $OUT/tms.tgz -C $OUT tms && rm -rf $t
