#!/usr/bin/env bash
# One device call (repository root, scripts/gpu-stage.sh's .carry): where random group sizes add L2 traffic to the
# NT pairs kernel (grouped_gemm_nt_tma pairs=1, max_split 0: the 5th and 6th _tma launches of a gemm bench case),
# equal against random groups at DeepSeek-V3 EP2's L1 and L2 shapes: ncu at base clock, L2 traffic by source
# (SMs / the partition fabric), hit rate, DRAM bytes; then the same cases timed (gemm bench, power-capped clock).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/profile; mkdir -p $t
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_CACHE_DIR=$PWD/.carry/cache LIB=$PWD/.carry/lib/libmegamoe.so
base=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__m_xbar2l1tex_read_bytes.sum,lts__t_bytes.sum,dram__bytes_read.sum,dram__bytes_write.sum
extra=lts__t_sectors_srcunit_tex.sum,lts__t_sectors_srcunit_ltcfabric.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_lookup_hit.sum,lts__t_sectors_srcunit_tex_lookup_miss.sum
ncu --query-metrics > $t/query.txt 2>&1
metrics=$base
for m in ${extra//,/ }; do
  b=${m%.*}; b=${b%_lookup_hit}; b=${b%_lookup_miss}; b=${b%_op_read}; b=${b%_op_write}
  grep -q "^${b%%.*} \|^${b} " $t/query.txt && metrics=$metrics,$m || echo "not offered: $m"
done
echo "metrics: $metrics"
for c in ${CASES:-dsv3-ep2-l1 dsv3-ep2-l1-random dsv3-ep2-l2 dsv3-ep2-l2-random}; do
  timeout 170 ncu --kernel-name regex:"_tma" --launch-skip 4 --launch-count 2 --csv --metrics $metrics \
    python3 tools/megamoe-bench/megamoe-bench gemm --lib $LIB --cases $c --reps 1 > $t/ncu-$c.csv 2>&1
  rc=$?
  if [ $rc != 0 ] && [ "$metrics" != "$base" ]; then  # a metric ncu refused: the base set again
    echo "$c: exit $rc with the extra metrics; again with the base set"; tail -3 $t/ncu-$c.csv
    timeout 170 ncu --kernel-name regex:"_tma" --launch-skip 4 --launch-count 2 --csv --metrics $base \
      python3 tools/megamoe-bench/megamoe-bench gemm --lib $LIB --cases $c --reps 1 > $t/ncu-$c.csv 2>&1; rc=$?
  fi
  echo "$c: exit $rc"
  python3 - $t/ncu-$c.csv <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10 and r[0].isdigit()]
seen = {}
for r in rows:
    seen.setdefault((r[0], r[4][:40], r[8]), []).append("%s=%s%s" % (r[-3], r[-1], r[-2] and " " + r[-2]))
for (i, name, grid), ms in seen.items(): print("  ", i, name, "grid", grid, "|", " | ".join(ms))
PY
done 2>&1 | tee $OUT/ncu.txt
timeout 200 python3 tools/megamoe-bench/megamoe-bench gemm --lib $LIB --cases dsv3-ep2-l1,dsv3-ep2-l1-random,dsv3-ep2-l2,dsv3-ep2-l2-random \
  --json $OUT/gemm.json 2>&1 | tee $OUT/gemm.txt
tar czf $OUT/profile.tgz -C $OUT profile && rm -rf $t
