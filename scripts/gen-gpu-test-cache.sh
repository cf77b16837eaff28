#!/usr/bin/env bash
# Generates every sm_90a kernel the GPU tests (gpu_kernels_test, gpu_comm_test, gpu_dispatch_test, gpu_layer_test,
# tests/python/gpu, examples/; tests/python/gpu's DeepSeek-V3 overhead case uses scripts/gen-bench-cache.sh's) load into the
# cache directory $1, at 2 and at 8 ranks, so that a machine without a compiler can run them (gpu_layer_test's
# LayerTestCache.GpuTestCacheListsEveryLayerKernel checks that the layer kernels below cover its layers):
# MEGAMOE_CACHE_DIR=$1 build/tests/gpu/gpu_kernels_test.
# Usage: scripts/gen-gpu-test-cache.sh DIR   (MEGAMOE_CACHE_TOOL overrides build/bin/megamoe-cache)
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 CACHE_DIR" >&2
  exit 2
fi
cd "$(dirname "$0")/.."
tool=${MEGAMOE_CACHE_TOOL:-build/bin/megamoe-cache}
dir=$1
mkdir -p "$dir"

# kernel and --spec, one per line ("-" for a kernel without constants). DeepSeek-V3: H=7168, I=2048.
kernels=(
  "swiglu_fwd I=2048,clamp_milli=0"
  "swiglu_fwd I=2048,clamp_milli=7000"
  "gemm_nt N=256,K=128"
  "gemm_nt N=4096,K=7168"   # L1: [M, H] x [2I, H]^T
  "gemm_nt N=7168,K=2048"   # L2: [M, I] x [H, I]^T
  "gemm_nt_fp8 N=256,K=128"    # FP8 e4m3 with 128 x 128 block scales
  "gemm_nt_fp8 N=4096,K=7168"  # L1 in FP8
  "quantize_tokens_fp8 H=128,device_rows=0"   # per-token FP8 quantisation
  "quantize_tokens_fp8 H=7168,device_rows=0"
  "quantize_tokens_fp8 H=2048,device_rows=0"  # tests/python/gpu: quantize_fp8
  "quantize_tokens_fp8 H=2048,device_rows=1"  # the row count from the device (the FP8 layer's act)
  "quantize_tokens_fp8 H=7168,device_rows=1"
  "grouped_gemm_nt_fp8 E=8,N=256,K=512"      # FP8 grouped GEMM on ragged groups
  "grouped_gemm_nt_fp8 E=8,N=384,K=256"      # an odd n-tile count, K of two blocks
  "grouped_gemm_nt_fp8 E=32,N=4096,K=7168"   # DeepSeek-V3 L1 at EP8 in FP8
  "grouped_gemm_nt_fp8 E=32,N=7168,K=2048"   # L2
  "grouped_gemm_nt_tma E=8,N=512,K=256,pairs=0"   # the TMA variants on ragged groups
  "grouped_gemm_nn_tma E=8,N=512,K=256,pairs=0"
  "grouped_gemm_nt_tma E=8,N=512,K=1024,pairs=0"  # a split-K tail after whole rounds
  "grouped_gemm_nt_tma E=8,N=512,K=192,pairs=1"   # three K steps a tile: K loops starting at every ring slot
  "grouped_gemm_nn_tma E=8,N=512,K=192,pairs=0"
  "grouped_gemm_nt_tma E=8,N=512,K=256,pairs=1"   # cluster pairs drawing tickets per pair
  "grouped_gemm_nn_tma E=8,N=512,K=256,pairs=1"
  "grouped_gemm_nt_tma E=8,N=2048,K=256,pairs=1"
  "grouped_gemm_nt_tma E=8,N=768,K=256,pairs=1"     # pairs with an odd n-tile count (no lone tiles)
  "grouped_gemm_nt_tma E=8,N=384,K=256,pairs=0"     # 128-wide tiles: half tiles of 64 columns a warpgroup
  "grouped_gemm_nn_tma E=8,N=384,K=256,pairs=0"
  "grouped_gemm_nt_tma E=6,N=12288,K=128,pairs=1"   # pairs in wide bands
  "grouped_gemm_nt_tma E=6,N=12288,K=128,pairs=0"   # the banded tile order (N / 256 >= 48)
  "grouped_gemm_nn_tma E=6,N=7168,K=128,pairs=0"    # NN bands from 28 n-tiles
  "grouped_gemm_tn_tma E=8,N=512,M=256,pairs=0"
  "grouped_gemm_tn_tma E=4,N=640,M=512,pairs=0"   # TN's 128-wide tiles
  "epoch_advance -"
  "ping_pong rounds=64"
  "ping_pong rounds=2"      # the CUDA-graph replay test
  "a2a_rows H=7168"
  "peer_store -"
  "topk_idx_narrow -"       # gpu_kernels_test; the layer with int64 topk_idx, before its prologue
  "dispatch_prologue E=16,topk=4,ranks=2"    # gpu_dispatch_test, gpu_layer_test
  "dispatch_prologue E=256,topk=8,ranks=2"   # DeepSeek-V3 routing
  "dispatch_prologue E=16,topk=4,ranks=8"    # the same at 8 ranks
  "dispatch_prologue E=256,topk=8,ranks=8"
  # gpu_layer_test: H=512 I=256 E=16 topk=4 over two ranks, forward and backward, without and with a clamp
  "grouped_gemm_combine E=16,ranks=2,topk=4,H=512,I=256,layout=0"
  "grouped_gemm_combine E=16,ranks=2,topk=4,H=512,I=256,layout=1"
  "stage_begin E=16,ranks=2"
  "grouped_gemm_tn_tma E=8,N=256,M=512,pairs=0"   # the layer's dW2
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=0,layout=2,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=0,dedup=1"   # token dedup
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=1,dedup=1"
  "swiglu_bwd I=256,clamp_milli=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=7000,layout=0,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=7000,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=7000,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=256,clamp_milli=7000,layout=2,save_h=0,dedup=0"
  "swiglu_bwd I=256,clamp_milli=7000"
  # gpu_layer_test at 8 ranks (2 experts per rank): the same layers
  "grouped_gemm_combine E=16,ranks=8,topk=4,H=512,I=256,layout=0"
  "grouped_gemm_combine E=16,ranks=8,topk=4,H=512,I=256,layout=1"
  "stage_begin E=16,ranks=8"
  "grouped_gemm_tn_tma E=2,N=256,M=512,pairs=0"   # dW2 over 2 local experts
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=0,layout=2,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=0,dedup=1"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=0,layout=0,save_h=1,dedup=1"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=7000,layout=0,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=7000,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=7000,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=256,clamp_milli=7000,layout=2,save_h=0,dedup=0"
  # gpu_layer_test at H=1024 (the combines reduce in 2 column chunks), training, at 2 and at 8 ranks
  "grouped_gemm_combine E=16,ranks=2,topk=4,H=1024,I=256,layout=0"
  "grouped_gemm_combine E=16,ranks=2,topk=4,H=1024,I=256,layout=1"
  "grouped_gemm_tn_tma E=8,N=256,M=1024,pairs=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=1024,I=256,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=1024,I=256,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=1024,I=256,clamp_milli=0,layout=2,save_h=0,dedup=0"
  "grouped_gemm_combine E=16,ranks=8,topk=4,H=1024,I=256,layout=0"
  "grouped_gemm_combine E=16,ranks=8,topk=4,H=1024,I=256,layout=1"
  "grouped_gemm_tn_tma E=2,N=256,M=1024,pairs=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=1024,I=256,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=1024,I=256,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=1024,I=256,clamp_milli=0,layout=2,save_h=0,dedup=0"
  # gpu_layer_test at I=640 (an odd number of 128-column halves), training, at 2 and at 8 ranks
  "swiglu_bwd I=640,clamp_milli=0"
  "grouped_gemm_combine E=16,ranks=2,topk=4,H=512,I=640,layout=0"
  "grouped_gemm_combine E=16,ranks=2,topk=4,H=512,I=640,layout=1"
  "grouped_gemm_tn_tma E=8,N=640,M=512,pairs=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=640,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=640,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=2,topk=4,H=512,I=640,clamp_milli=0,layout=2,save_h=0,dedup=0"
  "grouped_gemm_combine E=16,ranks=8,topk=4,H=512,I=640,layout=0"
  "grouped_gemm_combine E=16,ranks=8,topk=4,H=512,I=640,layout=1"
  "grouped_gemm_tn_tma E=2,N=640,M=512,pairs=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=640,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=640,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=16,ranks=8,topk=4,H=512,I=640,clamp_milli=0,layout=2,save_h=0,dedup=0"
  # gpu_layer_test LayerDeepSeekV3: H=7168 I=2048 E=256 topk=8, training, at EP2 (128 experts per rank) and EP8 (32)
  "swiglu_bwd I=2048,clamp_milli=0"
  "grouped_gemm_combine E=256,ranks=2,topk=8,H=7168,I=2048,layout=0"
  "grouped_gemm_combine E=256,ranks=2,topk=8,H=7168,I=2048,layout=1"
  "stage_begin E=256,ranks=2"
  "grouped_gemm_tn_tma E=128,N=2048,M=7168,pairs=0"
  "dispatch_grouped_gemm E=256,ranks=2,topk=8,H=7168,I=2048,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=256,ranks=2,topk=8,H=7168,I=2048,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=256,ranks=2,topk=8,H=7168,I=2048,clamp_milli=0,layout=2,save_h=0,dedup=0"
  "grouped_gemm_combine E=256,ranks=8,topk=8,H=7168,I=2048,layout=0"
  "grouped_gemm_combine E=256,ranks=8,topk=8,H=7168,I=2048,layout=1"
  "stage_begin E=256,ranks=8"
  "grouped_gemm_tn_tma E=32,N=2048,M=7168,pairs=0"
  "dispatch_grouped_gemm E=256,ranks=8,topk=8,H=7168,I=2048,clamp_milli=0,layout=0,save_h=1,dedup=0"
  "dispatch_grouped_gemm E=256,ranks=8,topk=8,H=7168,I=2048,clamp_milli=0,layout=1,save_h=0,dedup=0"
  "dispatch_grouped_gemm E=256,ranks=8,topk=8,H=7168,I=2048,clamp_milli=0,layout=2,save_h=0,dedup=0"
  # tests/python/gpu: grouped_mm_nt's input gradient (NN over [E, N, K] weights read as [E, K', N'])
  "grouped_gemm_nn_tma E=8,N=256,K=512,pairs=1"
)
for entry in "${kernels[@]}"; do
  read -r kernel spec <<<"$entry"
  args=(generate --kernel "$kernel" --targets sm_90a --cache-dir "$dir" --quiet)
  if [ "$spec" != "-" ]; then args+=(--spec "$spec"); fi
  # The tool's exit status says whether the kernel compiled and passed its static checks.
  if ! out=$("$tool" "${args[@]}" 2>&1); then
    echo "$out" >&2
    echo "failed: $tool ${args[*]}" >&2
    exit 1
  fi
  grep -E "^$kernel" <<<"$out" || true
done
# tests/python/gpu and examples/: the whole H=512 I=256 E=16 topk=4 layer at one rank and at two (inference and
# training, int32 and int64 topk_idx); most EP2 entries are already there from the list above.
if ! out=$("$tool" generate --hidden 512 --intermediate 256 --experts 16 --topk 4 --ep 1,2 --targets sm_90a \
           --cache-dir "$dir" --quiet 2>&1); then
  echo "$out" >&2
  echo "failed: $tool generate --hidden 512 --intermediate 256 --experts 16 --topk 4 --ep 1,2" >&2
  exit 1
fi
# gpu_layer_fp8_test and tests/python/gpu's FP8 layer: the FP8 layer's kernels (and FP8 grouped GEMMs) of each
# shape, "H I E topk EPs": the small layer, Qwen3-30B-A3B, DeepSeek-V3, Kimi-K2.
for fp8 in "512 256 16 4 1,2,8" "2048 768 128 8 2,8" "7168 2048 256 8 2,8" "7168 2048 384 8 8"; do
  read -r H I E k eps <<<"$fp8"
  if ! out=$("$tool" generate --hidden "$H" --intermediate "$I" --experts "$E" --topk "$k" --ep "$eps" --dtype fp8 \
             --targets sm_90a --cache-dir "$dir" --quiet 2>&1); then
    echo "$out" >&2
    echo "failed: $tool generate --hidden $H --intermediate $I --experts $E --topk $k --ep $eps --dtype fp8" >&2
    exit 1
  fi
done
echo "GPU test kernels are in $dir"
