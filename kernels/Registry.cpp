// The kernel registry, model presets and the kernels one MoE layer needs.
#include <algorithm>
#include <stdexcept>

#include "kernels/Kernels.h"

namespace megamoe::kernels {

mlir::OwningOpRef<mlir::ModuleOp> buildSwiglu(mlir::MLIRContext& ctx, const SwigluSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildGemmNt(mlir::MLIRContext& ctx, const GemmNtSpec& s);

int64_t KernelSpec::get(std::string_view name) const {
  for (const auto& [k, v] : constants)
    if (k == name) return v;
  throw std::out_of_range(kernel + " has no constant '" + std::string(name) + "'");
}

std::string KernelSpec::describe() const {
  std::string s = kernel + "[";
  for (size_t i = 0; i < constants.size(); ++i)
    s += (i ? "," : "") + constants[i].first + "=" + std::to_string(constants[i].second);
  return s + "]";
}

namespace {
std::string positiveMultiple(const char* what, int64_t value, int64_t of, const char* why) {
  if (value <= 0 || value % of != 0)
    return std::string(what) + "=" + std::to_string(value) + " must be a positive multiple of " + std::to_string(of) +
           " (" + why + ")";
  return "";
}
}  // namespace

const std::vector<KernelInfo>& registry() {
  static const std::vector<KernelInfo> kernels = {
      {SwigluSpec::kName,
       "SwiGLU forward over [M, 2I] gate|up rows, bf16, optional clamp",
       {"I", "clamp_milli"},
       [](const KernelSpec& s) {
         std::string e = positiveMultiple("I", s.get("I"), SwigluSpec::kVector, "16-byte bf16 vectors");
         if (e.empty() && s.get("clamp_milli") < 0) e = "clamp_milli must be >= 0 (0 disables the clamp)";
         return e;
       },
       [](mlir::MLIRContext& ctx, const KernelSpec& s) {
         return buildSwiglu(ctx, SwigluSpec{s.get("I"), s.get("clamp_milli")});
       }},
      {GemmNtSpec::kName,
       "one-expert bf16 GEMM C = A B^T through the MMA atom (64x128 tiles)",
       {"N", "K"},
       [](const KernelSpec& s) {
         std::string e = positiveMultiple("N", s.get("N"), GemmNtSpec::kBlockN, "BLOCK_N");
         if (e.empty()) e = positiveMultiple("K", s.get("K"), GemmNtSpec::kBlockK, "BLOCK_K, one swizzled 128-byte row");
         return e;
       },
       [](mlir::MLIRContext& ctx, const KernelSpec& s) { return buildGemmNt(ctx, GemmNtSpec{s.get("N"), s.get("K")}); }},
  };
  return kernels;
}

const KernelInfo* find(std::string_view name) {
  for (const auto& k : registry())
    if (k.name == name) return &k;
  return nullptr;
}

const std::vector<ModelShape>& presets() {
  static const std::vector<ModelShape> shapes = {
      {"deepseek-v3", 7168, 2048, 256, 8},
      {"qwen3-235b-a22b", 4096, 1536, 128, 8},
      {"mixtral-8x7b", 4096, 14336, 8, 2},
      {"deepseek-v2-lite", 2048, 1408, 64, 6},
  };
  return shapes;
}

const ModelShape* findPreset(std::string_view name) {
  for (const auto& p : presets())
    if (p.name == name) return &p;
  return nullptr;
}

std::string validateShape(const ModelShape& s, int64_t ranks) {
  if (ranks < 1 || ranks > 8) return "ranks=" + std::to_string(ranks) + " must be 1..8 (one node)";
  if (s.experts <= 0 || s.experts % ranks != 0)
    return "experts=" + std::to_string(s.experts) + " must be a positive multiple of ranks=" + std::to_string(ranks);
  if (s.topk < 1 || s.topk > s.experts)
    return "topk=" + std::to_string(s.topk) + " must be 1..experts (" + std::to_string(s.experts) + ")";
  if (auto e = positiveMultiple("hidden", s.hidden, GemmNtSpec::kBlockN, "BLOCK_N of the L2 GEMM"); !e.empty()) return e;
  if (auto e = positiveMultiple("intermediate", s.intermediate, GemmNtSpec::kBlockK, "BLOCK_K of the L2 GEMM");
      !e.empty())
    return e;
  return "";
}

std::vector<KernelSpec> layerKernels(const ModelShape& s, int64_t ranks) {
  if (std::string e = validateShape(s, ranks); !e.empty()) throw std::invalid_argument(s.name + ": " + e);
  std::vector<KernelSpec> out = {
      SwigluSpec{s.intermediate}.spec(),
      GemmNtSpec{2 * s.intermediate, s.hidden}.spec(),  // L1: [tokens, H] x [2I, H]^T
      GemmNtSpec{s.hidden, s.intermediate}.spec(),      // L2: [tokens, I] x [H, I]^T
  };
  return out;
}

}  // namespace megamoe::kernels
