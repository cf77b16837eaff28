#!/usr/bin/env bash
# CPU machine, on branch tn-tma-store (built), after bench/results/2026-12-02-h200-tn-steps/prepare.sh ran on main
# (.carry/diag: main's bench kernels, .carry/lib: main's runtime): stages the branch's runtime (.carry/libtms), its
# bench and GPU-test kernels (.carry/tms), the GPU tests (.carry/bin) and main's bench script (.carry/main-bench:
# the branch's passes TN's map_c, which main's kernels do not declare).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
[ -d .carry/diag ] && [ -f .carry/lib/libmegamoe.so ] || { echo "prepare.sh: run 2026-12-02-h200-tn-steps/prepare.sh on main first" >&2; exit 2; }
cmake --build build >/dev/null
mkdir -p .carry/bin .carry/libtms .carry/main-bench
cp build/bin/gpu_*_test .carry/bin/ && cp build/lib/libmegamoe.so .carry/libtms/
git show main:tools/megamoe-bench/megamoe-bench > .carry/main-bench/megamoe-bench
rm -rf .carry/tms && scripts/gen-bench-cache.sh .carry/tms >/dev/null && scripts/gen-gpu-test-cache.sh .carry/tms >/dev/null
du -sh .carry/*
