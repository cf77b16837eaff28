#!/usr/bin/env bash
# Device, carrying .carry (prepare.sh): ncu's shared-memory bank counters on each GEMM kernel of one DeepSeek-V3 EP2
# training step on one GPU (main's kernels), to place every stage against the banks' 32 accesses a clock an SM.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/banks; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
ms=gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_reads.sum,l1tex__data_bank_writes.sum
MEGAMOE_CACHE_DIR=$PWD/.carry/main timeout 300 ncu --kernel-name regex:'dispatch_grouped_gemm|grouped_gemm_combine|grouped_gemm_tn_tma' \
  --launch-skip 0 --launch-count 12 --metrics $ms --csv python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB \
  --nproc 1 --experts 128 --backward --routings uniform --reps 1 --graph-replays 0 > $t/ncu.csv 2> $t/ncu.err
echo "ncu: exit $? at ${SECONDS}s"
python3 bench/results/2026-12-02-h200-layer-banks/banks.py $t/ncu.csv | tee $t/banks.txt
tar czf $OUT/banks.tgz -C $OUT banks && rm -rf $t
