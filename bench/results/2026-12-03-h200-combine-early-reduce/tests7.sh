#!/usr/bin/env bash
# Device, carrying .carry (scripts/gpu-stage.sh at the final rule: 7 chunks at DeepSeek-V3's H): the layer tests whose
# combines reduce in chunks (DeepSeek-V3 EP2 / EP8: 7 chunks; H=1024: 2), at 2 and 8 ranks on one GPU.
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
TESTS=gpu_layer_test GTEST_FILTER='LayerDeepSeekV3.*:LayerTest.ChunkedCombines*:LayerTest.SmallChunkedBackward*:LayerTest.TrainingStepOnTwoSmsPerRank*' \
  bash scripts/gpu-run.sh tests > $OUT/run7.txt 2>&1
echo "exit $? at ${SECONDS}s" >> $OUT/run7.txt
grep -E "DeepSeek|PASSED|FAILED|exit" $OUT/run7.txt
tar czf /tmp/tests7.tgz -C $OUT . && find $OUT -maxdepth 1 -type f -delete && mv /tmp/tests7.tgz $OUT/
