#!/usr/bin/env bash
# Device, carrying .carry (main's kernels): ncu (base clock) of the layer bench's first 19 dispatch_grouped_gemm
# launches (the fused training forward, its comm-only and its GEMM-only legs) at TOKENS tokens, DeepSeek-V3 EP2 work
# on one GPU, uniform: does the fused kernel's extra DRAM traffic per pushed row shrink once x fits in L2?
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache
for t in ${TOKENS:-2048 4096 8192}; do
  timeout 100 ncu --kernel-name regex:dispatch_grouped_gemm --launch-count 19 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv python3 \
    tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB --nproc 1 --experts 128 --backward --tokens $t \
    --routings uniform --reps 1 --graph-replays 0 > $OUT/tokens-$t.csv 2> $OUT/tokens-$t.err
  echo "tokens $t: exit $? at ${SECONDS}s"
  for m in gpu__time_duration dram__bytes_read dram__bytes_write; do
    echo -n "$m: "; grep "$m" $OUT/tokens-$t.csv | awk -F'","' '{print $NF}' | tr -d '",' | awk '{printf "%.3f ", $1 / 1e6}'; echo
  done
done
tar czf /tmp/tokens.tgz -C $OUT . && find $OUT -maxdepth 1 -type f -delete && mv /tmp/tokens.tgz $OUT/
