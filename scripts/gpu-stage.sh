#!/usr/bin/env bash
# Stages what the GPU machine needs into .carry/ (ignored by git, carried by the device tool): the GPU test
# binaries, libmegamoe.so, and a kernel cache with every kernel the tests and benchmarks load.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MEGAMOE_BUILD_DIR:-build}
rm -rf .carry && mkdir -p .carry/bin .carry/lib
cp "$build"/bin/gpu_*_test .carry/bin/
cp "$build"/lib/libmegamoe.so .carry/lib/
scripts/gen-bench-cache.sh .carry/cache
[ -x scripts/gen-gpu-test-cache.sh ] && scripts/gen-gpu-test-cache.sh .carry/cache
du -sh .carry
