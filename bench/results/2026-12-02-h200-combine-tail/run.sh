#!/usr/bin/env bash
# Device, carrying .carry (scripts/gpu-stage.sh, then .carry/p1 and .carry/p2: the cache with the combine kernels of
# change.diff, MEGAMOE_PROBE_COMBINE=1 / 2): the layer's step with main's combine, without its reduce phase (p1),
# and without its reduce and its cross-block done barrier (p2). p1 / p2 are wrong by design: their y and dx fail.
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
for round in 1 2; do
  for v in cache p1 p2; do
    MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 200 python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB \
      --nproc 1 --experts 128 --backward --routings uniform,balanced --timeline --reps 5 --graph-replays 0 \
      --json $OUT/$v-$round.json > $OUT/$v-$round.txt 2>&1
    echo "$v round $round: exit $? at ${SECONDS}s"
  done
done
tar czf $OUT/combine-tail.tgz -C $OUT --exclude "*.tgz" . && find $OUT -maxdepth 1 -type f ! -name "*.tgz" -delete
