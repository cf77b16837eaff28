#!/usr/bin/env bash
# Runs every test tier that this machine can run: host, codegen, lit; GPU tests skip with a reason when no GPU
# is present. Then rebuilds the LLVM-free parts under ASan+UBSan and runs their host tests; builds them once more
# with the CUDA toolkit hidden and runs their host tests; and installs that build and the full one, building small
# programs against each installed tree (scripts/test-install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MEGAMOE_BUILD_DIR:-build}
jobs=${MEGAMOE_JOBS:-$(nproc)}
scripts/setup.sh
export MEGAMOE_CACHE_DIR=${MEGAMOE_CACHE_DIR:-$(mktemp -d)/megamoe-cache}
ctest --test-dir "$build" --output-on-failure -j "$jobs"

# Python CPU tier: the package (python/megamoe) imports, checks arguments, and drives the C ABI against the fake HIP
# backend; Debian's python3 with python3-torch and python3-pytest (setup.sh installs them).
if /usr/bin/python3 -c 'import torch, pytest' 2>/dev/null; then
  MEGAMOE_BUILD_DIR=$build /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/python/cpu
else
  echo "test: Python CPU tier skipped: /usr/bin/python3 lacks torch or pytest (apt-get install python3-torch python3-pytest)"
fi

# Sanitizer tier: runtime + cache only (no LLVM/MLIR inside), built separately.
san=${build}-asan
if [ ! -f "$san/build.ninja" ]; then
  cmake -S . -B "$san" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMEGAMOE_WITH_COMPILER=OFF -DMEGAMOE_SANITIZE=ON >/dev/null
fi
cmake --build "$san" -j "$jobs"
ctest --test-dir "$san" --output-on-failure -j "$jobs"

# No-CUDA tier: the LLVM-free parts must build and pass without the CUDA toolkit (MEGAMOE_CUDA_HOME points nowhere;
# the runtime declares the driver API itself). No translation unit may have read a cuda.h from anywhere.
nocuda=${build}-nocuda
if [ ! -f "$nocuda/build.ninja" ]; then
  cmake -S . -B "$nocuda" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_WITH_COMPILER=OFF \
        -DMEGAMOE_CUDA_HOME=/nonexistent >/dev/null
fi
cmake --build "$nocuda" -j "$jobs"
if ninja -C "$nocuda" -t deps | grep -E '/cuda\.h$'; then
  echo "test: the no-CUDA build included cuda.h (above)" >&2
  exit 1
fi
ctest --test-dir "$nocuda" --output-on-failure -j "$jobs"

# Install tier: the LLVM-free build (the C ABI, the C++ runtime) and the full one (the jit component, the tools).
scripts/test-install.sh "$nocuda"
scripts/test-install.sh "$build"
