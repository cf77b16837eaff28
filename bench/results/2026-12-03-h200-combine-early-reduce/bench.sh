#!/usr/bin/env bash
# Device, carrying .carry (scripts/gpu-stage.sh, plus .carry/c1 and .carry/c7: the cache with the two one-process
# combine kernels regenerated at MEGAMOE_PROBE_CHUNKS=1 and 7): the layer's training step, timeline per stage, with
# the combines reducing in 1 chunk (after the GEMM, as main), the default and 7 chunks; rounds interleaved.
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
for round in 1 2; do
  for v in c1 cache c7; do
    MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB \
      --nproc 1 --experts 128 --backward --routings uniform,balanced --timeline --reps 5 --graph-replays 0 \
      --json $OUT/$v-$round.json > $OUT/$v-$round.txt 2>&1
    echo "$v round $round: exit $? at ${SECONDS}s"
    grep -E "combine|forward|backward|ratio" $OUT/$v-$round.txt | head -20
  done
done
tar czf $OUT/bench.tgz -C $OUT --exclude "*.tgz" . && find $OUT -maxdepth 1 -type f ! -name "*.tgz" -delete
