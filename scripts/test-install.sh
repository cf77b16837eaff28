#!/usr/bin/env bash
# Installs a build into a temporary prefix and builds two programs against that prefix only: a CMake project
# (find_package(megamoe), tests/install/CMakeLists.txt) and a C file compiled with `cc $(pkg-config --cflags --libs
# megamoe)`; runs both, and the installed tools' --version where the compiler was built. Fails on the first error.
#   scripts/test-install.sh [BUILD_DIR]   default: build-rt, configured LLVM-free here if it does not exist
#   MEGAMOE_JOBS                          parallel compile jobs (default: nproc)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${MEGAMOE_JOBS:-$(nproc)}
fail() { echo "test-install: FAILED: $*" >&2; exit 1; }
say() { echo "test-install: $*"; }

build=${1:-build-rt}
if [ ! -f "$build/build.ninja" ]; then
  [ $# -eq 0 ] || fail "$build is not a configured build folder"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMEGAMOE_WITH_COMPILER=OFF >/dev/null
fi
cmake --build "$build" -j "$jobs" >/dev/null || fail "building $build"
build=$(cd "$build" && pwd)
version=$(sed -n 's/^project(megamoe VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[ -n "$version" ] || fail "no project version in CMakeLists.txt"
with_compiler=OFF
grep -q '^MEGAMOE_WITH_COMPILER:BOOL=ON' "$build/CMakeCache.txt" && with_compiler=ON
fake_hip=$build/lib/libamdhip64_fake.so
[ -f "$fake_hip" ] || fail "$fake_hip is missing (the consumer runs on the fake HIP library: MEGAMOE_TESTS=ON)"

work=$(mktemp -d "${TMPDIR:-/tmp}/megamoe-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
say "installing $build into $prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" || { cat "$work/install.log" >&2; fail "cmake --install"; }

libdir=$(dirname "$(find "$prefix" -name libmegamoe.so -print -quit)")
[ -d "$libdir" ] || fail "no libmegamoe.so under $prefix"
major=${version%%.*}
[ "$(readlink "$libdir/libmegamoe.so")" = "libmegamoe.so.$major" ] || fail "libmegamoe.so is not a link to libmegamoe.so.$major"
[ "$(readlink "$libdir/libmegamoe.so.$major")" = "libmegamoe.so.$version" ] || fail "libmegamoe.so.$major is not a link to libmegamoe.so.$version"
soname=$(objdump -p "$libdir/libmegamoe.so.$version" | awk '$1 == "SONAME" {print $2}')
[ "$soname" = "libmegamoe.so.$major" ] || fail "SONAME is '$soname', expected libmegamoe.so.$major"
for lib in megamoe_runtime megamoe_abi megamoe_cache; do
  [ -f "$libdir/lib$lib.a" ] || fail "lib$lib.a is not installed"
done

# The CMake consumer sees the prefix and nothing else of ours (no package registry, no source tree).
say "building tests/install against the prefix (jit component: $with_compiler)"
cmake -S tests/install -B "$work/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCONSUMER_EXPECTED_VERSION="$version" -DCONSUMER_JIT="$with_compiler" \
      >"$work/consumer.log" 2>&1 || { cat "$work/consumer.log" >&2; fail "configuring tests/install"; }
grep -q "consumer: megamoe $version from $prefix/" "$work/consumer.log" || { cat "$work/consumer.log" >&2; fail "find_package(megamoe) did not find the prefix's package"; }
cmake --build "$work/consumer" -j "$jobs" >"$work/consumer-build.log" 2>&1 || { cat "$work/consumer-build.log" >&2; fail "building tests/install"; }
out=$(LD_LIBRARY_PATH="$libdir" "$work/consumer/consumer" "$fake_hip") || { echo "$out" >&2; fail "the CMake consumer"; }
echo "$out"
echo "$out" | grep -q "^libmegamoe: $libdir/libmegamoe.so.$major" || fail "the consumer did not load the installed libmegamoe"
if [ "$with_compiler" = ON ]; then
  LD_LIBRARY_PATH="$libdir" "$work/consumer/jit_consumer" || fail "the jit component's consumer"
fi

say "building tests/install/consumer.c with pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion megamoe)" = "$version" ] || fail "pkg-config --modversion megamoe is not $version"
# shellcheck disable=SC2046  # pkg-config's output is a list of flags
cc -std=c99 -Wall -Wextra -pedantic -Werror tests/install/consumer.c $(pkg-config --cflags --libs megamoe) \
   -o "$work/consumer-c" || fail "cc consumer.c \$(pkg-config --cflags --libs megamoe)"
LD_LIBRARY_PATH="$libdir" "$work/consumer-c" "$version" || fail "the C consumer"

if [ "$with_compiler" = ON ]; then
  for tool in megamoe-cache megamoe-opt; do
    [ -x "$prefix/bin/$tool" ] || fail "$tool is not installed"
    line=$("$prefix/bin/$tool" --version | head -1) || fail "$tool --version"
    [[ "$line" =~ ^$tool\ $version\ \(LLVM\ [0-9]+\.[0-9.]+\)$ ]] || fail "$tool --version printed '$line'"
    echo "$line"
  done
fi
say "passed ($build, megamoe $version)"
