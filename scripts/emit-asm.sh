#!/usr/bin/env bash
# Compiles every kernel the layer (all presets at EP 2 and 8), the GPU tests and the benchmarks use, for sm_90a and
# gfx950, into a scratch cache, and writes each one's PTX / AMDGCN assembly into DIR: a refactor proves that it
# leaves the generated code alone with `diff -r` of two such folders (before / after).
# Usage: scripts/emit-asm.sh DIR   (MEGAMOE_CACHE_TOOL overrides build/bin/megamoe-cache)
set -euo pipefail
dir=${1:?usage: scripts/emit-asm.sh DIR}
cd "$(dirname "$0")/.."
tool=${MEGAMOE_CACHE_TOOL:-build/bin/megamoe-cache}
mkdir -p "$dir"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
common=(--targets sm_90a,gfx950 --force --cache-dir "$scratch" --emit-asm "$dir" --quiet)
# Every model the layer runs (the table's rows whose last column says so; its header and refused rows are skipped),
# in bf16 and in FP8.
for preset in $("$tool" presets | awk 'NR > 1 && $NF == "runs" {print $1}'); do
  for dtype in bf16 fp8; do
    # A build that fails (a static check of one target) is listed, not fatal: the rest still come out to compare.
    "$tool" generate --preset "$preset" --ep 2,8 --dtype "$dtype" "${common[@]}" >"$scratch/out" 2>&1 ||
      { echo "FAILED: $preset $dtype: $(grep -m1 FAIL "$scratch/out")"; echo x >> "$scratch/failed"; }
  done
done
# The single kernels of the GPU tests and the benchmarks: every "kernel spec" line of the two generator scripts.
grep -hoE '^\s*"[a-z_0-9]+ [^"]*"' scripts/gen-gpu-test-cache.sh | tr -d '"' | while read -r kernel spec; do
  args=(generate --kernel "$kernel" "${common[@]}")
  [ "$spec" != "-" ] && args+=(--spec "$spec")
  "$tool" "${args[@]}" >/dev/null 2>"$scratch/err" || { echo "FAILED: $kernel $spec: $(tail -n 1 "$scratch/err")"; echo x >> "$scratch/failed"; }
done
echo "assembly of $(ls "$dir" | wc -l) kernel builds in $dir"
[ ! -s "$scratch/failed" ] || { echo "$(wc -l < "$scratch/failed") kernel(s) failed to build (above)"; exit 1; }
