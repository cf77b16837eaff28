# Second device call: why ping-pong did not pay. (1) SM clock and board power while each variant's dW1 runs
# (nvidia-smi every 50 ms); (2) ncu at base clock on one launch of the standalone TN kernel per variant: duration,
# tensor-pipe activity, L2 and DRAM bytes.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/diag; mkdir -p $t
export PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
bench="python3 tools/megamoe-bench/megamoe-bench gemm --lib .carry/lib/libmegamoe.so --cases dsv3-ep2-dw1"
for v in base-main cache base-pp1; do
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 50 > $t/smi-$v.csv &
  smi=$!
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 60 $bench --reps 30 > $t/gemm-$v.txt 2>&1; echo "gemm $v: exit $?"; grep " tma " $t/gemm-$v.txt
  kill $smi
  python3 - $t/smi-$v.csv <<'PY'
import sys, statistics
rows = [l.split(",") for l in open(sys.argv[1]) if l.count(",") == 2]
clk = [float(r[1].split()[0]) for r in rows]; pw = [float(r[2].split()[0]) for r in rows]
hot = [(c, p) for c, p in zip(clk, pw) if p > 400]
if hot: print("   samples %d over 400 W: median clock %.0f MHz, median power %.0f W" % (len(hot), statistics.median(c for c, _ in hot), statistics.median(p for _, p in hot)))
PY
done
for v in base-main cache base-pp1; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 120 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 3 --launch-count 1 --csv \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
    $bench --reps 1 > $t/ncu-$v.csv 2>&1; echo "ncu $v: exit $?"; grep -E '"(gpu__time|sm__pipe|lts__t|dram__|sm__through|l1tex)' $t/ncu-$v.csv | awk -F'","' '{print "   " $(NF-2) " " $(NF-1) " " $NF}'
done
tar czf $OUT/diag.tgz -C $OUT diag && rm -rf $t
