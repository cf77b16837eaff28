#!/usr/bin/env bash
# Device, carrying .carry (scripts/gpu-stage.sh): the GPU layer and kernel tests at 2 and 8 ranks on one GPU, then
# memcheck and racecheck on the small cases (the chunked combines' SmallChunkedBackward among them).
set -uo pipefail
OUT=${OUT:-/tmp/o}; mkdir -p $OUT
TESTS="gpu_layer_test gpu_kernels_test" TEST_TIMEOUT=330 bash scripts/gpu-run.sh tests sanitize > $OUT/run.txt 2>&1
echo "exit $? at ${SECONDS}s" >> $OUT/run.txt
tail -40 $OUT/run.txt
tar czf $OUT/tests.tgz -C $OUT --exclude "*.tgz" . && find $OUT -maxdepth 1 -type f ! -name "*.tgz" -delete
