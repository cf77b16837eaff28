#!/usr/bin/env bash
# Device, carrying .carry (main's kernels): ncu time (base clock) of the layer bench's dispatch_grouped_gemm
# launches at MEGAMOE_PUSH_BLOCKS = each of PUSH (the blocks that push the rows before taking GEMM tiles), DeepSeek-V3
# EP2 work on one GPU, uniform: launches 0-10 the fused training forward, 11-14 its comm-only leg, 15-18 its
# GEMM-only leg, 19-30 the training step's forward / dgrad / dW1 dispatches. Then LayerTest.OddHalvesBackward.
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache
for p in ${PUSH:-32 16 64 132}; do
  MEGAMOE_PUSH_BLOCKS=$p timeout 100 ncu --kernel-name regex:dispatch_grouped_gemm --launch-count 31 \
    --metrics gpu__time_duration.sum --csv python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB \
    --nproc 1 --experts 128 --backward --routings uniform --reps 1 --graph-replays 0 > $OUT/push-$p.csv 2> $OUT/push-$p.err
  echo "push $p: exit $? at ${SECONDS}s"
  grep gpu__time_duration $OUT/push-$p.csv | awk -F'","' '{print $NF}' | tr -d '",' | awk '{printf "%.3f ", $1 / 1e6}'; echo
done
TESTS=gpu_layer_test GTEST_FILTER='LayerTest.OddHalves*' bash scripts/gpu-run.sh tests > $OUT/odd.txt 2>&1
echo "odd halves: exit $? at ${SECONDS}s"; grep -E "SUMMARY|PASSED|FAILED" $OUT/odd.txt
tar czf /tmp/push.tgz -C $OUT . && find $OUT -maxdepth 1 -type f -delete && mv /tmp/push.tgz $OUT/
