#!/usr/bin/env bash
# Generates the sm_90a kernels megamoe-bench gemm needs (tools/megamoe-bench: CASES) into the cache dir $1.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gen-bench-cache.sh CACHE_DIR}
gen() { build/bin/megamoe-cache generate --targets sm_90a --cache-dir "$dir" --quiet --kernel "$1" --spec "$2" >/dev/null; }
gen grouped_gemm_nt E=128,N=4096,K=7168
gen grouped_gemm_nt E=128,N=7168,K=2048
gen grouped_gemm_nt E=32,N=4096,K=7168
gen grouped_gemm_nn E=128,N=2048,K=7168
gen grouped_gemm_nn E=128,N=7168,K=4096
gen grouped_gemm_tn E=128,N=4096,M=7168
gen grouped_gemm_nt E=8,N=256,K=512
gen grouped_gemm_nt E=16,N=512,K=1024
gen grouped_gemm_nn E=16,N=512,K=1024
gen grouped_gemm_tn E=16,N=512,M=1024
gen grouped_gemm_nt E=128,N=3072,K=4096
gen grouped_gemm_nt E=8,N=28672,K=4096
echo "bench kernels in $dir"
