#!/usr/bin/env bash
# Installs what is missing (Debian packages), then configures and builds megamoe into build/.
# Idempotent: a second run installs nothing and only rebuilds what changed.
#   MEGAMOE_BUILD_DIR  build folder (default: build)
#   MEGAMOE_JOBS       parallel compile jobs (default: nproc; each MLIR file needs ~2.4 GB)
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(llvm-22-dev libmlir-22-dev mlir-22-tools llvm-22-tools lld-22 liblld-22-dev libfmt-dev libgtest-dev cmake g++ ninja-build
      python3-torch python3-pytest python3-numpy python3-setuptools python3-pip)  # the Python package's CPU tier
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
[ -x /usr/local/cuda/bin/nvcc ] || echo "setup: note: no CUDA toolkit at /usr/local/cuda; sm_90a cubins need its nvJitLink" >&2

build=${MEGAMOE_BUILD_DIR:-build}
jobs=${MEGAMOE_JOBS:-$(nproc)}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
        -DLLVM_DIR=/usr/lib/llvm-22/lib/cmake/llvm "$@"
fi
cmake --build "$build" -j "$jobs"
echo "setup: built into $build/"
