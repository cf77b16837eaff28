#!/usr/bin/env bash
# Runs every test tier that this machine can run: host, codegen, lit; GPU tests skip with a reason when no GPU
# is present. Then rebuilds the LLVM-free parts under ASan+UBSan and runs their host tests.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MEGAMOE_BUILD_DIR:-build}
jobs=${MEGAMOE_JOBS:-$(nproc)}
scripts/setup.sh
export MEGAMOE_CACHE_DIR=${MEGAMOE_CACHE_DIR:-$(mktemp -d)/megamoe-cache}
ctest --test-dir "$build" --output-on-failure -j "$jobs"

# Sanitizer tier: runtime + cache only (no LLVM/MLIR inside), built separately.
san=${build}-asan
if [ ! -f "$san/build.ninja" ]; then
  cmake -S . -B "$san" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMEGAMOE_WITH_COMPILER=OFF -DMEGAMOE_SANITIZE=ON >/dev/null
fi
cmake --build "$san" -j "$jobs"
ctest --test-dir "$san" --output-on-failure -j "$jobs"
