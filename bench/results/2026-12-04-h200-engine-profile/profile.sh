# One device call: ncu (base clock) of our TMA kernels' first launches (max_split 0, single blocks; a regex meant
# for torch._grouped_mm's kernel too caught none of it: README), NT / NN / TN at DeepSeek-V3 EP2 (equal and random):
# duration, tensor-pipe activity, shared-memory bank reads / writes, L2 -> SM, L2 and DRAM bytes.
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/profile; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib-main/libmegamoe.so MEGAMOE_CACHE_DIR=$PWD/.carry/base-main
metrics=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum
for c in dsv3-ep2-l1 dsv3-ep2-l1-random dsv3-ep2-l1-dgrad dsv3-ep2-l2-dgrad dsv3-ep2-dw1 dsv3-ep2-dw1-random; do
  timeout 150 ncu --kernel-name regex:"cutlass|_tma|Grouped|grouped_mm" --launch-count 3 --csv \
    --metrics $metrics python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases $c --reps 1 > $t/ncu-$c.csv 2>&1
  echo "$c: exit $?"
  python3 - $t/ncu-$c.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and r[0].isdigit()]
seen = {}
for r in rows:
    seen.setdefault((r[0], r[4][:60]), []).append("%s=%s" % (r[-3].split("__")[1].split(".")[0][:28], r[-1]))
for (i, name), ms in seen.items(): print("  ", i, name, "|", " ".join(ms))
PY
done
tar czf $OUT/profile.tgz -C $OUT profile && rm -rf $t
