#!/usr/bin/env bash
# Here: .carry/nowait = .carry/cache with the one-process forward dispatch (DeepSeek-V3 E=128, ranks=1, save_h 1)
# built by branch probe-no-wait (its GEMM tiles skip the arrival waits: a timing probe, results wrong by design).
# Device (PROBE_DEVICE=1): ncu time of the first 19 dispatch launches, main / probe / main / probe.
set -uo pipefail
if [ -z "${PROBE_DEVICE:-}" ]; then
  rm -rf .carry/nowait && cp -r .carry/cache .carry/nowait
  spec="E=128,ranks=1,topk=8,H=7168,I=2048,clamp_milli=0,layout=0,save_h=1,dedup=0"
  for m in $(grep -l '"dispatch_grouped_gemm"' .carry/nowait/entries/*/manifest.json); do
    python3 -c "import json,sys; d=json.load(open('$m')); sys.exit(0 if ','.join(f'{a}={b}' for a, b in d['spec']) == '$spec' else 1)" \
      && rm -rf "$(dirname "$m")"
  done
  MEGAMOE_PROBE_NO_WAIT=1 build/bin/megamoe-cache generate --targets sm_90a --cache-dir .carry/nowait \
    --kernel dispatch_grouped_gemm --spec "$spec" | grep dispatch
  exit 0
fi
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
n=0
for v in ${VARIANTS:-cache nowait cache nowait}; do
  n=$((n + 1)); f=$OUT/probe-$n-$v.csv
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 100 ncu --kernel-name regex:dispatch_grouped_gemm --launch-count 19 \
    --metrics gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active --csv \
    python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB --nproc 1 --experts 128 --backward \
    --routings uniform --reps 1 --graph-replays 0 > $f 2>&1
  echo "$v: exit $? at ${SECONDS}s"
  grep gpu__time_duration $f | awk -F'","' '{print $NF}' | tr -d '",' | awk '{printf "%.3f ", $1 / 1e6}'; echo
done
tar czf /tmp/probe.tgz -C $OUT . && find $OUT -maxdepth 1 -type f -delete && mv /tmp/probe.tgz $OUT/
