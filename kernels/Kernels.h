// The operators, written once in the DSL, and the registry that names them for the cache and the tools.
// Each kernel keeps its compile-time constants in one spec; a spec's constants are the cache key's specialisation.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace megamoe::kernels {

// A kernel name plus its specialisation constants, in the kernel's declared order.
struct KernelSpec {
  std::string kernel;
  std::vector<std::pair<std::string, int64_t>> constants;
  int64_t get(std::string_view name) const;  // throws std::out_of_range naming the missing constant
  std::string describe() const;              // "gemm_nt[N=4096,K=7168]"
};

struct KernelInfo {
  std::string name;
  std::string summary;
  std::vector<std::string> constantNames;
  // "" when the spec is valid; otherwise a message naming the violated constraint.
  std::function<std::string(const KernelSpec&)> validate;
  std::function<mlir::OwningOpRef<mlir::ModuleOp>(mlir::MLIRContext&, const KernelSpec&)> build;
};

const std::vector<KernelInfo>& registry();
const KernelInfo* find(std::string_view name);

// ---- specs of the kernels in this folder ----

// SwiGLU forward: out[m, i] = silu(h[m, i]) * h[m, I + i] over h [M, 2I] (gate | up) in bf16, optional clamp
// (gate <= limit, |up| <= limit; limit given in thousandths, 0 = off). One 16-byte vector per thread.
struct SwigluSpec {
  static constexpr const char* kName = "swiglu_fwd";
  static constexpr int64_t kBlockThreads = 256, kVector = 8;
  int64_t intermediate;
  int64_t clampMilli = 0;
  KernelSpec spec() const { return {kName, {{"I", intermediate}, {"clamp_milli", clampMilli}}}; }
};

// One-expert bf16 GEMM, NT: C [M, N] = A [M, K] * B [N, K]^T, fp32 accumulation, bf16 out. A 64 x 128 tile per block
// over 64-wide K stages through swizzled shared memory and the target's MMA atom. M is a run-time argument.
struct GemmNtSpec {
  static constexpr const char* kName = "gemm_nt";
  static constexpr int64_t kBlockThreads = 128, kBlockM = 64, kBlockN = 128, kBlockK = 64;
  int64_t n, k;
  KernelSpec spec() const { return {kName, {{"N", n}, {"K", k}}}; }
};

// ---- model shapes ----

struct ModelShape {
  std::string name;
  int64_t hidden, intermediate, experts, topk;
};
const std::vector<ModelShape>& presets();
const ModelShape* findPreset(std::string_view name);
// "" when the shape can be served at `ranks` expert-parallel ranks; else the violated constraint.
std::string validateShape(const ModelShape& shape, int64_t ranks);
// The kernels one MoE layer of this shape needs at `ranks` ranks (deduplicated, stable order).
std::vector<KernelSpec> layerKernels(const ModelShape& shape, int64_t ranks);

}  // namespace megamoe::kernels
