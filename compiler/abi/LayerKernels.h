// The kernels one MoE layer launches, listed once: for a layer's shape fields, each kernel's name and
// specialisation constants in the order the runtime loads them, and where each role sits in that list. The runtime
// loads exactly this list (MoeLayer::kernelSpecs); the compiler's preset path (kernels::layerKernels, megamoe-cache
// --preset) generates the union of it over the layer options. Plain C++, no LLVM: runtime/ includes it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/abi/KernelAbi.h"

namespace megamoe::abi {

// A kernel name plus its specialisation (as kernels::KernelSpec, without the compiler).
struct KernelSpec {
  std::string kernel;
  SpecConstants constants;
};

// The "layout" constant of the fused operators and the grouped GEMMs (kernels/Kernels.h GroupedGemmSpec::Layout).
inline constexpr int64_t kLayoutNT = 0, kLayoutNN = 1, kLayoutTN = 2;

// What decides a layer's kernels: the layer's shape at `ranks` expert-parallel ranks and its options.
struct LayerShape {
  int64_t hidden = 0, intermediate = 0, experts = 0, topk = 0, ranks = 0;
  int64_t clampMilli = 0;     // SwiGLU clamp in thousandths (0 = none)
  bool training = false;      // the forward keeps h; the backward's kernels are listed
  bool dedup = false;         // the forward dispatch sends a token once per owner rank
  bool topkIdxInt64 = false;  // topk_idx_narrow runs before each call's prologue
  bool fp8 = false;           // e4m3 block-scaled weights, e4m3 rows pushed (inference: no training kernels)
};

// The roles the runtime launches a listed kernel in.
enum class LayerKernel : uint8_t {
  kPrologue,      // dispatch_prologue
  kDispatchNT,    // the forward dispatch + L1 GEMM + SwiGLU
  kCombineNT,     // the forward L2 GEMM + combine
  kEpochAdvance,  // last in every call
  kStageBegin,    // profiling: before the combine; every backward stage
  kDispatchNN,    // training: dy re-dispatched, L2 dgrad
  kSwigluBwd,     // training
  kWgradTN,       // training: dW2
  kDispatchTN,    // training: x re-dispatched, dW1
  kCombineNN,     // training: L1 dgrad + combine (dx)
  kTopkIdxNarrow,  // int64 topk_idx only
  kQuantizeX,     // FP8: bf16 x to e4m3 rows and their scales (a call given bf16 x)
  kQuantizeAct,   // FP8: act to e4m3 between the dispatch and the combine (rows counted on the device)
  kCount,
};

struct LayerKernelList {
  std::vector<KernelSpec> specs;                         // in load order
  std::array<int, size_t(LayerKernel::kCount)> index{};  // role -> position in specs; -1 where the layer has none

  bool has(LayerKernel role) const { return index[size_t(role)] >= 0; }
  // The position of `role` in specs (std::out_of_range where the layer has none).
  size_t at(LayerKernel role) const;
};

// The kernels of a layer of this shape (the shape is not validated here: MoeLayer::validate and
// kernels::validateShape do that).
LayerKernelList layerKernels(const LayerShape& shape);

}  // namespace megamoe::abi
