#!/usr/bin/env bash
# CPU machine, on branch stmatrix-staging (built): .carry/diag is main's bench cache from
# 2026-12-02-h200-tn-steps/prepare.sh (run it on main first); .carry/smc the branch's bench and GPU-test kernels.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .carry/bin && cp build/bin/gpu_*_test .carry/bin/
rm -rf .carry/smc && scripts/gen-bench-cache.sh .carry/smc && scripts/gen-gpu-test-cache.sh .carry/smc
du -sh .carry
