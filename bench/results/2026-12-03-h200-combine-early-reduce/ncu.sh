#!/usr/bin/env bash
# Device, carrying .carry as for bench.sh: ncu's time (clocks locked at base, kernels serialised) of every
# grouped_gemm_combine launch of the layer bench's first steps, for the 1-chunk, default and 7-chunk combines,
# interleaved over two rounds (SKIP / COUNT / ROUNDS: the launches and rounds; SKIP=40 COUNT=60 reaches the step's
# dgrad combines).
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
for round in ${ROUNDS:-1 2}; do
  for v in c1 cache c7; do
    MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 120 ncu --kernel-name regex:grouped_gemm_combine --launch-skip ${SKIP:-0} --launch-count ${COUNT:-16} \
      --metrics gpu__time_duration.sum,dram__bytes.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      --csv python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB --nproc 1 --experts 128 --backward \
      --routings uniform --reps 1 --graph-replays 0 > $OUT/ncu${SKIP:+-skip$SKIP}-$v-$round.csv 2> $OUT/ncu${SKIP:+-skip$SKIP}-$v-$round.err
    echo "$v round $round: exit $? at ${SECONDS}s"
    grep gpu__time_duration $OUT/ncu${SKIP:+-skip$SKIP}-$v-$round.csv | awk -F'","' '{print $NF}' | tr -d '"' | tr '\n' ' '; echo
  done
done
tar czf /tmp/ncu${SKIP:+-skip$SKIP}.tgz -C $OUT . && find $OUT -maxdepth 1 -type f -delete && mv /tmp/ncu${SKIP:+-skip$SKIP}.tgz $OUT/
