#!/usr/bin/env bash
# CPU machine, clean tree on branch half-tiles or narrow-tails: stages .carry/ for tests.sh and layer.sh - the
# branch's binaries and kernels (.carry/cache: GPU tests, benchmarks, the qwen3 and deepseek-v2-lite layers at EP1)
# and each base revision's kernels (.carry/base-REV: benchmarks and the same two layers; BASES, default main), so
# that one libmegamoe.so runs them all (block threads come from each cache entry's metadata).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
bases=${BASES:-main}
branch=$(git rev-parse --abbrev-ref HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "prepare.sh: commit or stash first" >&2; exit 2; }
presets() {  # the two other presets' EP1 layers (half their experts), as 2026-12-01-h200-balanced-routing ran them
  build/bin/megamoe-cache generate --hidden 4096 --intermediate 1536 --experts 64 --topk 8 --ep 1 --targets sm_90a --cache-dir "$1" --quiet >/dev/null
  build/bin/megamoe-cache generate --hidden 2048 --intermediate 1408 --experts 32 --topk 6 --ep 1 --targets sm_90a --cache-dir "$1" --quiet >/dev/null
}
staged=$(mktemp -d)
for base in $bases; do
  git checkout -q "$base"
  cmake --build build --target megamoe-cache >/dev/null
  scripts/gen-bench-cache.sh "$staged/base-$base" >/dev/null
  presets "$staged/base-$base"
done
git checkout -q "$branch"
cmake --build build >/dev/null
scripts/gpu-stage.sh
presets .carry/cache
mv "$staged"/base-* .carry/
du -sh .carry/*
