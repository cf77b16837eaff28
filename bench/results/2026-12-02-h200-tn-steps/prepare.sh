#!/usr/bin/env bash
# CPU machine, on main: .carry/diag = main's bench kernels (scripts/gen-bench-cache.sh) plus the extra cases' kernels
# (cases.py); .carry/lib = main's runtime.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
cmake --build build --target megamoe-cache megamoe >/dev/null
rm -rf .carry && mkdir -p .carry/lib && cp build/lib/libmegamoe.so .carry/lib/
scripts/gen-bench-cache.sh .carry/diag >/dev/null
gen() { build/bin/megamoe-cache generate --targets sm_90a --cache-dir .carry/diag --quiet --kernel "$1" --spec "$2" | grep -E "^$1\[" ; }
for s in E=64,N=4096,M=7168 E=16,N=4096,M=7168; do gen grouped_gemm_tn "$s"; gen grouped_gemm_tn_tma "$s,pairs=0"; done
gen grouped_gemm_nt E=128,N=4096,K=512
for p in 0 1; do gen grouped_gemm_nt_tma "E=128,N=4096,K=512,pairs=$p"; done
du -sh .carry/*
