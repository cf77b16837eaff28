#!/usr/bin/env bash
# Device, carrying .carry (scripts/gpu-stage.sh at the working tree: its swiglu_bwd in .carry/cache): the backward
# layer tests at 2 and 8 ranks on one GPU (DeepSeek-V3's I=2048: one batch of 4 vectors a thread; I=640: a partial
# batch; I=256: one vector), compute-sanitizer on two of them, and the layer bench's own checks at DeepSeek-V3.
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
TESTS=gpu_layer_test GTEST_FILTER='LayerTest.Backward*:LayerTest.SmallBackward*:LayerTest.RowGroups*:LayerTest.TrainingStep*:LayerDeepSeekV3.*' \
  bash scripts/gpu-run.sh tests > $OUT/tests.txt 2>&1
echo "tests: exit $? at ${SECONDS}s"; grep -E "^\[ +(OK|FAILED) |PASSED|FAILED" $OUT/tests.txt | grep -v " OK " | tail -8
LAYER_ARGS="--nproc 1 --experts 128 --backward --routings uniform --reps 3 --graph-replays 0" bash scripts/gpu-run.sh layer > $OUT/layer-run.txt 2>&1
echo "layer: exit $? at ${SECONDS}s"; grep -E "err|swiglu|fwd\+bwd layer|checks" $OUT/layer-run.txt | head -20
SANITIZE_FILTER='LayerTest.SmallBackward/*:LayerTest.RowGroupsBackward/*' bash scripts/gpu-run.sh sanitize > $OUT/sanitize.txt 2>&1
echo "sanitize: exit $? at ${SECONDS}s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" $OUT/sanitize.txt
tar czf /tmp/tests.tgz -C $OUT . && find $OUT -maxdepth 1 -type f -delete && mv /tmp/tests.tgz $OUT/
