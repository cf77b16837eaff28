#!/usr/bin/env bash
# Device, carrying .carry (after prepare.sh): how busy are the shared-memory banks? The K loop's operand reads
# (each MMA warpgroup reads B's whole 32 KB a step) plus the ring's fills come to ~125 B/clk an SM at full pipe
# rate, against shared memory's 128: if the banks are near their peak in the K loop, the epilogue's staging
# traffic (64 KB written, 64 KB read a tile) costs TN's tiles directly. ncu on main's dW1 (TN), random dW2 (TN),
# L1 (NT) and the 3-stage dW1, same metrics each.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/banks; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
b="python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB"
ncu --query-metrics > $t/query.txt 2>&1 || ncu --query-metrics --chip gh100 > $t/query.txt 2>&1
want="gpu__time_duration.sum sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
for m in l1tex__data_bank_reads l1tex__data_bank_writes l1tex__data_pipe_lsu_wavefronts_mem_shared l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st l1tex__throughput smsp__inst_executed_pipe_lsu l1tex__m_xbar2l1tex_read_bytes l1tex__m_l1tex2xbar_write_bytes; do
  grep -q "^$m " $t/query.txt && want="$want $m.avg.pct_of_peak_sustained_elapsed $m.sum"
done
echo "metrics: $want"
ms=$(echo $want | tr ' ' ',')
run() {  # name cache kernel case
  MEGAMOE_CACHE_DIR=$PWD/.carry/$2 timeout 120 ncu --kernel-name $3 --launch-skip 0 --launch-count 1 --metrics $ms $b --cases $4 --reps 1 > $t/ncu-$1.txt 2>&1
  echo "ncu $1: exit $? | $(grep -E '__' $t/ncu-$1.txt | grep -v PROF | awk '{print $1"="$NF}' | tr '\n' ' ')"
}
run dw1-main diag grouped_gemm_tn_tma dsv3-ep2-dw1
run dw1-s3 s3 grouped_gemm_tn_tma dsv3-ep2-dw1
run dw2r-main diag grouped_gemm_tn_tma dsv3-ep2-dw2-random
run l1-main diag grouped_gemm_nt_tma dsv3-ep2-l1
tar czf $OUT/banks.tgz -C $OUT banks && rm -rf $t
