#!/usr/bin/env bash
# CPU machine, on main (built): .carry/main = main's bench kernels, .carry/lib = main's runtime.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
cmake --build build --target megamoe-cache megamoe >/dev/null
rm -rf .carry && mkdir -p .carry/lib && cp build/lib/libmegamoe.so .carry/lib/
scripts/gen-bench-cache.sh .carry/main >/dev/null
du -sh .carry/*
