# Device run 3 (after ab.sh): why a rider tile costs ~1.6 whole tiles. ncu (base clock) on one launch of the
# standalone NT TMA kernel, main's and the branch's, single blocks (the `tma` variant's first launch, max_split 0)
# and pairs (the `pairs` variant's first), at rows520 (every expert a rider) and equal groups (none): duration,
# tensor-pipe activity, shared-memory bank reads / writes, L2 -> SM bytes, L2 and DRAM bytes.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/profile; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib-main/libmegamoe.so
want="gpu__time_duration.sum sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed l1tex__m_xbar2l1tex_read_bytes.sum lts__t_bytes.sum dram__bytes_read.sum sm__throughput.avg.pct_of_peak_sustained_elapsed"
ncu --query-metrics --chip gh100 > $t/metrics.txt 2>&1
metrics=""; for m in $want; do base=${m%%.*}; grep -q "^$base " $t/metrics.txt && metrics="$metrics,$m" || echo "no metric $base"; done
metrics=${metrics#,}; [ -z "$metrics" ] && metrics=gpu__time_duration.sum,lts__t_bytes.sum,dram__bytes_read.sum; echo "metrics: $metrics"
for c in dsv3-l1-rows520 dsv3-ep2-l1; do for skip in 0 4; do for v in base-main cache; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 ncu --kernel-name grouped_gemm_nt_tma --launch-skip $skip --launch-count 1 --csv \
    --metrics $metrics python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases $c --reps 1 > $t/ncu-$c-$skip-$v.csv 2>&1
  echo "$c skip $skip ($([ $skip = 0 ] && echo tma || echo pairs)) $v: exit $?"
  grep -E '^"[0-9]' $t/ncu-$c-$skip-$v.csv | awk -F'","' '{print "   " $(NF-2) " " $(NF-1) " " $NF}'
done; done; done
tar czf $OUT/profile.tgz -C $OUT profile && rm -rf $t
