# One device call (after prepare.sh, carrying .carry): is TN's idle tensor pipe a cost per tile (8 K steps a tile
# at DeepSeek-V3's 512 tokens an expert) or a cost per step (MN-major operands, 64 x 64 boxes)? The same dW1 shape
# with 16 and 64 K steps a tile, NT with 8 (K = 512) and with 112 (L1): timed TF/s (two rounds), then ncu at base
# clock of our TMA kernel's first launch: time, tensor-pipe activity, shared-memory bank reads / writes (~4 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/steps; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so MEGAMOE_CACHE_DIR=$PWD/.carry/diag
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $t/machine.txt
b="python3 bench/results/2026-12-02-h200-tn-steps/cases.py gemm --lib $MEGAMOE_LIB"
cases=dsv3-ep2-dw1,tn-16steps,tn-64steps,nt-8steps,dsv3-ep2-l1
for r in 1 2; do
  timeout 90 $b --cases $cases --reps 5 --json $t/gemm-$r.json > $t/gemm-$r.txt 2>&1
  echo "gemm run $r: exit $? at ${SECONDS}s"; grep -E "^[a-z0-9-]+ |  tma " $t/gemm-$r.txt
done
m=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,sm__cycles_elapsed.avg.per_second
for c in ${cases//,/ }; do
  k=grouped_gemm_tn_tma; case $c in nt-*|*-l1) k=grouped_gemm_nt_tma;; esac
  timeout 60 ncu --kernel-name $k --launch-skip 0 --launch-count 1 --metrics $m $b --cases $c --reps 1 > $t/ncu-$c.txt 2>&1
  echo "ncu $c ($k): exit $? at ${SECONDS}s"; grep -E "hmma|duration|bank|per_second" $t/ncu-$c.txt
done
tar czf $OUT/steps.tgz -C $OUT steps && rm -rf $t
