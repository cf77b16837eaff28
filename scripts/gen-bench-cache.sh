#!/usr/bin/env bash
# Generates the sm_90a kernels megamoe-bench gemm needs (python/megamoe/bench/cases.py: CASES) into the cache dir $1.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gen-bench-cache.sh CACHE_DIR}
gen() {
  build/bin/megamoe-cache generate --targets sm_90a --cache-dir "$dir" --quiet --kernel "$1" ${2:+--spec "$2"} >/dev/null
  # NT / NN cases also run their TMA variant and its cluster-pair build (pairs=1).
  case $1 in
    grouped_gemm_nt|grouped_gemm_nn)
      for pairs in 0 1; do
        build/bin/megamoe-cache generate --targets sm_90a --cache-dir "$dir" --quiet --kernel "$1_tma" --spec "$2,pairs=$pairs" >/dev/null
      done ;;
    grouped_gemm_tn)  # TN cases also run their TMA variant (no pairs)
      build/bin/megamoe-cache generate --targets sm_90a --cache-dir "$dir" --quiet --kernel "$1_tma" --spec "$2,pairs=0" >/dev/null ;;
  esac
}
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
# megamoe-bench gemm --dtype fp8 (FP8_CASES): the FP8 grouped GEMM at the NT cases' shapes; their bf16 anchors above.
for s in E=128,N=4096,K=7168 E=128,N=7168,K=2048 E=32,N=4096,K=7168 E=128,N=3072,K=4096 E=8,N=28672,K=4096 \
         E=8,N=256,K=512 E=16,N=512,K=1024; do
  gen grouped_gemm_nt_fp8 "$s"
done
# megamoe-bench layer [--backward]: the DeepSeek-V3 EP2 layer's forward and backward kernels.
gen dispatch_prologue E=256,topk=8,ranks=2
# layout,save_h,dedup (megamoe-bench layer --dedup runs the forward both ways)
for lsd in 0,0,0 0,1,0 1,0,0 2,0,0 0,0,1 0,1,1; do
  IFS=, read -r layout save dedup <<<"$lsd"
  gen dispatch_grouped_gemm E=256,ranks=2,topk=8,H=7168,I=2048,clamp_milli=0,layout=$layout,save_h=$save,dedup=$dedup
done
gen grouped_gemm_combine E=256,ranks=2,topk=8,H=7168,I=2048,layout=0
gen grouped_gemm_combine E=256,ranks=2,topk=8,H=7168,I=2048,layout=1
gen swiglu_bwd I=2048,clamp_milli=0
gen stage_begin E=256,ranks=2
gen grouped_gemm_tn E=128,N=2048,M=7168
gen epoch_advance
gen topk_idx_narrow  # the layer with int64 topk_idx (torch.topk, DeepEP): narrowed before the prologue
# megamoe-bench layer --nproc 1 --experts 128: one GPU with EP2's per-GPU work (every kernel of that layer).
build/bin/megamoe-cache generate --hidden 7168 --intermediate 2048 --experts 128 --topk 8 --ep 1 --targets sm_90a \
  --cache-dir "$dir" --quiet >/dev/null
# megamoe-bench layer-fp8: the same one-GPU layer in FP8 (its bf16 anchor is the layer above).
build/bin/megamoe-cache generate --hidden 7168 --intermediate 2048 --experts 128 --topk 8 --ep 1 --dtype fp8 \
  --targets sm_90a --cache-dir "$dir" --quiet >/dev/null
# megamoe-bench layer-fp8 at decode sizes (issue 50's shapes, one GPU): DeepSeek-V3 EP8's per-GPU work (32 experts)
# and Qwen3-30B-A3B, bf16 and FP8.
for shape in "7168 2048 32" "2048 768 128"; do
  read -r H I E <<<"$shape"
  for dtype in bf16 fp8; do
    build/bin/megamoe-cache generate --hidden "$H" --intermediate "$I" --experts "$E" --topk 8 --ep 1 --dtype $dtype \
      --targets sm_90a --cache-dir "$dir" --quiet >/dev/null
  done
done
echo "bench kernels in $dir"
