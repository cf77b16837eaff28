// The kernels of one MoE layer (LayerKernels.h), each from its typed spec (KernelAbi.h), so the constants' names
// and order are the declarations'.
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
  auto add = [&](LayerKernel role, const auto& kernel) {
    list.index[size_t(role)] = int(list.specs.size());
    list.specs.push_back({std::string(kernel.kName), kernel.constants()});
  };
  auto dispatch = [&](LayerKernel role, int64_t layout, bool saveH, bool dedup) {
    DispatchGroupedGemm d;
    d.E = E; d.ranks = R; d.topk = k; d.H = H; d.I = I; d.clamp_milli = s.clampMilli;
    d.layout = layout; d.save_h = saveH; d.dedup = dedup;
    add(role, d);
  };
  auto combine = [&](LayerKernel role, int64_t layout) {
    GroupedGemmCombine c;
    c.E = E; c.ranks = R; c.topk = k; c.H = H; c.I = I; c.layout = layout;
    add(role, c);
  };
  auto quantize = [&](LayerKernel role, int64_t channels, bool deviceRows) {
    QuantizeTokensFp8 q;
    q.H = channels; q.device_rows = deviceRows;
    add(role, q);
  };
  DispatchPrologue prologue;
  prologue.E = E; prologue.topk = k; prologue.ranks = R;
  add(LayerKernel::kPrologue, prologue);
  if (s.fp8) {  // the forward in FP8 (kernels/Kernels.h DispatchGemmSpec::fp8, GemmCombineSpec::fp8)
    quantize(LayerKernel::kQuantizeX, H, false);
    DispatchGroupedGemmFp8 d;
    d.E = E; d.ranks = R; d.topk = k; d.H = H; d.I = I; d.clamp_milli = s.clampMilli;
    add(LayerKernel::kDispatchNT, d);
    quantize(LayerKernel::kQuantizeAct, I, true);
    GroupedGemmCombineFp8 c;
    c.E = E; c.ranks = R; c.topk = k; c.H = H; c.I = I;
    add(LayerKernel::kCombineNT, c);
  } else {
    dispatch(LayerKernel::kDispatchNT, kLayoutNT, /*saveH=*/s.training, s.dedup);
    combine(LayerKernel::kCombineNT, kLayoutNT);
  }
  add(LayerKernel::kEpochAdvance, EpochAdvance{});
  StageBegin stage;
  stage.E = E; stage.ranks = R;
  add(LayerKernel::kStageBegin, stage);
  if (s.training) {
    dispatch(LayerKernel::kDispatchNN, kLayoutNN, false, false);  // dy re-dispatched: g = dy . w2[e]
    SwigluBwd swiglu;
    swiglu.I = I; swiglu.clamp_milli = s.clampMilli;
    add(LayerKernel::kSwigluBwd, swiglu);
    // dW2[e] [H, I] = dy_e^T . (w act)_e on the warp-specialised engine (sm_90a; gfx950 builds the single-role
    // kernel and ignores the map arguments)
    GroupedGemmTnTma wgrad;
    wgrad.E = E / R; wgrad.N = I; wgrad.M = H; wgrad.pairs = 0;
    add(LayerKernel::kWgradTN, wgrad);
    dispatch(LayerKernel::kDispatchTN, kLayoutTN, false, false);  // x re-dispatched: dW1[e] = dh_e^T x_e
    combine(LayerKernel::kCombineNN, kLayoutNN);                   // dx rows dh . w1[e], summed at home
  }
  if (s.topkIdxInt64) add(LayerKernel::kTopkIdxNarrow, TopkIdxNarrow{});
  return list;
}

}  // namespace megamoe::abi
