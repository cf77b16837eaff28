#!/usr/bin/env bash
# Device, carrying .carry (scripts/gpu-stage.sh): ncu (clocks locked at base, kernels serialised) of the layer
# bench's dispatch_grouped_gemm and swiglu_bwd launches, DeepSeek-V3 EP2 work on one GPU, uniform routing: what
# the forward dispatch's kept h costs (save_h 1, the training forward, against the inference forward's save_h 0),
# and how close swiglu_bwd runs to HBM's bandwidth; first swiglu_bwd alone with each cache of VARIANTS (.carry/cache: main's; others: variant.sh's).
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
for v in ${VARIANTS:-}; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 ncu --kernel-name regex:swiglu_bwd --launch-count 4 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv python3 \
    tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB --nproc 1 --experts 128 --backward --routings uniform \
    --reps 1 --graph-replays 0 > $OUT/ncu-$v.csv 2> $OUT/ncu-$v.err
  echo "$v: exit $? at ${SECONDS}s"
  grep -E "gpu__time|dram__bytes" $OUT/ncu-$v.csv | awk -F'","' '{print $(NF-2), $NF}' | tr -d '"' | tr '\n' ' '; echo
done
MEGAMOE_CACHE_DIR=$PWD/.carry/${BIG_CACHE:-cache} timeout ${BIG_TIMEOUT:-280} ncu --kernel-name 'regex:dispatch_grouped_gemm|swiglu_bwd' \
  --launch-count ${COUNT:-40} \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
  --csv python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB --nproc 1 --experts 128 --backward \
  --routings uniform --reps 1 --graph-replays 0 > $OUT/ncu.csv 2> $OUT/ncu.err
echo "exit $? at ${SECONDS}s"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, mi, vi, ii = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value"), hdr.index("ID")
by = collections.OrderedDict()
for r in rows: by.setdefault(r[ii], [r[ki][:22]]).append((r[mi], r[vi]))
for i, v in by.items(): print(i, v[0], " ".join(f"{m.split('__')[1][:24]}={x}" for m, x in v[1:]))
PY
tar czf /tmp/ncu.tgz -C $OUT . && find $OUT -maxdepth 1 -type f -delete && mv /tmp/ncu.tgz $OUT/
