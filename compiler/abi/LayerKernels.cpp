// The kernels of one MoE layer (LayerKernels.h). Constant names and orders are the declarations' (KernelAbi.cpp);
// KernelContractTest checks every list against them.
#include "compiler/abi/LayerKernels.h"

#include <stdexcept>

namespace megamoe::abi {

size_t LayerKernelList::at(LayerKernel role) const {
  if (!has(role)) throw std::out_of_range("the layer launches no kernel in role " + std::to_string(int(role)));
  return size_t(index[size_t(role)]);
}

LayerKernelList layerKernels(const LayerShape& s) {
  const int64_t R = s.ranks, E = s.experts, k = s.topk, H = s.hidden, I = s.intermediate;
  LayerKernelList list;
  list.index.fill(-1);
  auto add = [&](LayerKernel role, std::string kernel, SpecConstants constants) {
    list.index[size_t(role)] = int(list.specs.size());
    list.specs.push_back({std::move(kernel), std::move(constants)});
  };
  auto dispatch = [&](LayerKernel role, int64_t layout, bool saveH, bool dedup) {
    add(role, "dispatch_grouped_gemm",
        {{"E", E}, {"ranks", R}, {"topk", k}, {"H", H}, {"I", I}, {"clamp_milli", s.clampMilli}, {"layout", layout},
         {"save_h", saveH ? 1 : 0}, {"dedup", dedup ? 1 : 0}});
  };
  auto combine = [&](LayerKernel role, int64_t layout) {
    add(role, "grouped_gemm_combine", {{"E", E}, {"ranks", R}, {"topk", k}, {"H", H}, {"I", I}, {"layout", layout}});
  };
  add(LayerKernel::kPrologue, "dispatch_prologue", {{"E", E}, {"topk", k}, {"ranks", R}});
  if (s.fp8) {  // the forward in FP8 (kernels/Kernels.h DispatchGemmSpec::fp8, GemmCombineSpec::fp8)
    add(LayerKernel::kQuantizeX, "quantize_tokens_fp8", {{"H", H}, {"device_rows", 0}});
    add(LayerKernel::kDispatchNT, "dispatch_grouped_gemm_fp8",
        {{"E", E}, {"ranks", R}, {"topk", k}, {"H", H}, {"I", I}, {"clamp_milli", s.clampMilli}});
    add(LayerKernel::kQuantizeAct, "quantize_tokens_fp8", {{"H", I}, {"device_rows", 1}});
    add(LayerKernel::kCombineNT, "grouped_gemm_combine_fp8", {{"E", E}, {"ranks", R}, {"topk", k}, {"H", H}, {"I", I}});
  } else {
    dispatch(LayerKernel::kDispatchNT, kLayoutNT, /*saveH=*/s.training, s.dedup);
    combine(LayerKernel::kCombineNT, kLayoutNT);
  }
  add(LayerKernel::kEpochAdvance, "epoch_advance", {});
  add(LayerKernel::kStageBegin, "stage_begin", {{"E", E}, {"ranks", R}});
  if (s.training) {
    dispatch(LayerKernel::kDispatchNN, kLayoutNN, false, false);  // dy re-dispatched: g = dy . w2[e]
    add(LayerKernel::kSwigluBwd, "swiglu_bwd", {{"I", I}, {"clamp_milli", s.clampMilli}});
    // dW2[e] [H, I] = dy_e^T . (w act)_e on the warp-specialised engine (sm_90a; gfx950 builds the single-role
    // kernel and ignores the map arguments)
    add(LayerKernel::kWgradTN, "grouped_gemm_tn_tma", {{"E", E / R}, {"N", I}, {"M", H}, {"pairs", 0}});
    dispatch(LayerKernel::kDispatchTN, kLayoutTN, false, false);  // x re-dispatched: dW1[e] = dh_e^T x_e
    combine(LayerKernel::kCombineNN, kLayoutNN);                   // dx rows dh . w1[e], summed at home
  }
  if (s.topkIdxInt64) add(LayerKernel::kTopkIdxNarrow, "topk_idx_narrow", {});
  return list;
}

}  // namespace megamoe::abi
