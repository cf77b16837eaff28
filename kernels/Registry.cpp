// The kernel registry, the model table's shapes as presets, and the kernels one MoE layer needs.
#include <algorithm>
#include <stdexcept>
#include <type_traits>

#include "compiler/abi/KernelAbi.h"
#include "compiler/abi/LayerKernels.h"
#include "compiler/abi/Models.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {

static_assert(GroupedGemmSpec::kNT == abi::kLayoutNT && GroupedGemmSpec::kNN == abi::kLayoutNN &&
                  GroupedGemmSpec::kTN == abi::kLayoutTN,
              "the layer list's layout constants are GroupedGemmSpec::Layout's");

mlir::OwningOpRef<mlir::ModuleOp> buildSwiglu(mlir::MLIRContext& ctx, const SwigluSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildGemmNt(mlir::MLIRContext& ctx, const GemmNtSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildGemmNtFp8(mlir::MLIRContext& ctx, const GemmNtFp8Spec& s, Arch arch);
mlir::OwningOpRef<mlir::ModuleOp> buildQuantizeTokens(mlir::MLIRContext& ctx, const QuantizeTokensSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildDispatchPrologue(mlir::MLIRContext& ctx, const DispatchPrologueSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildTopkIdxNarrow(mlir::MLIRContext& ctx, const TopkIdxNarrowSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildDispatchGemm(mlir::MLIRContext& ctx, const DispatchGemmSpec& s, Arch arch);
mlir::OwningOpRef<mlir::ModuleOp> buildGemmCombine(mlir::MLIRContext& ctx, const GemmCombineSpec& s, Arch arch);
mlir::OwningOpRef<mlir::ModuleOp> buildSwigluBwd(mlir::MLIRContext& ctx, const SwigluBwdSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildStageBegin(mlir::MLIRContext& ctx, const StageBeginSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildEpochAdvance(mlir::MLIRContext& ctx, const EpochAdvanceSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildPingPong(mlir::MLIRContext& ctx, const PingPongSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildAllToAllRows(mlir::MLIRContext& ctx, const AllToAllRowsSpec& s);
mlir::OwningOpRef<mlir::ModuleOp> buildPeerStore(mlir::MLIRContext& ctx, const PeerStoreSpec& s);

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

const abi::KernelDecl& KernelInfo::decl() const {
  const abi::KernelDecl* d = abi::findKernelDecl(name);
  if (!d) throw std::logic_error("kernel " + name + " has no declaration in compiler/abi/Kernels.def");
  return *d;
}

std::vector<std::string> KernelInfo::constantNames() const {
  std::vector<std::string> names;
  for (const abi::ConstDecl& c : decl().constants) names.emplace_back(c.name);
  return names;
}

// The declared ranges carry the tile facts of the kernels that build them (what a constant must be a multiple of).
static_assert(abi::GemmNt::N_range.step == GemmNtSpec::kBlockN && abi::GemmNt::K_range.step == GemmNtSpec::kBlockK);
static_assert(abi::GemmNtFp8::N_range.step == GemmNtFp8Spec::kBlockN &&
              abi::GemmNtFp8::K_range.step == GemmNtFp8Spec::kBlockK);
static_assert(abi::GroupedGemmNt::N_range.step == GroupedGemmSpec::kBlockN &&
              abi::GroupedGemmNt::K_range.step == GroupedGemmSpec::kBlockK &&
              abi::GroupedGemmTn::M_range.step == GroupedGemmSpec::kBlockM);
static_assert(abi::GroupedGemmNtFp8::K_range.step == GroupedGemmSpec::kScaleBlock &&
              abi::GroupedGemmNtFp8::K_range.lo == 2 * GroupedGemmSpec::kScaleBlock);
static_assert(abi::DispatchGroupedGemm::H_range.step == GroupedGemmSpec::kBlockN &&
              abi::DispatchGroupedGemm::I_range.step == GroupedGemmSpec::kBlockN &&
              abi::DispatchGroupedGemmFp8::H_range.lo == 2 * GroupedGemmSpec::kScaleBlock);
static_assert(abi::QuantizeTokensFp8::H_range.step == QuantizeTokensSpec::kGroup);
static_assert(abi::SwigluFwd::I_range.step == SwigluSpec::kVector);

namespace {
std::string positiveMultiple(const char* what, int64_t value, int64_t of, const char* why) {
  if (value <= 0 || value % of != 0)
    return std::string(what) + "=" + std::to_string(value) + " must be a positive multiple of " + std::to_string(of) +
           " (" + why + ")";
  return "";
}

using Module = mlir::OwningOpRef<mlir::ModuleOp>;

// The registry entry of declared kernel `Declared`, built by build(ctx, its typed spec, arch).
template <class Declared, class Build>
KernelInfo entry(Build build) {
  return {std::string(Declared::kName), [build](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) -> Module {
            return build(ctx, Declared::fromConstants(s.constants), arch);
          }};
}

// A grouped bf16 GEMM of `layout`, with tensor maps or without.
template <class Declared>
KernelInfo groupedGemm(GroupedGemmSpec::Layout layout) {
  return entry<Declared>([layout](mlir::MLIRContext& ctx, const Declared& c, Arch arch) {
    int64_t third = 0, pairs = 0;
    if constexpr (std::is_same_v<Declared, abi::GroupedGemmTn> || std::is_same_v<Declared, abi::GroupedGemmTnTma>)
      third = c.M;
    else
      third = c.K;
    constexpr bool kTensorMaps = std::is_same_v<Declared, abi::GroupedGemmNtTma> ||
                                 std::is_same_v<Declared, abi::GroupedGemmNnTma> ||
                                 std::is_same_v<Declared, abi::GroupedGemmTnTma>;
    if constexpr (kTensorMaps) pairs = c.pairs;
    return buildGroupedGemm(ctx, GroupedGemmSpec{layout, c.E, c.N, third}, arch, /*warpSpecialized=*/false,
                            kTensorMaps, pairs == 1);
  });
}

// Row-wise kernels around the GEMMs.
std::vector<KernelInfo> elementwiseKernels() {
  return {entry<abi::SwigluFwd>([](mlir::MLIRContext& ctx, const abi::SwigluFwd& c, Arch) {
            return buildSwiglu(ctx, SwigluSpec{c.I, c.clamp_milli});
          }),
          entry<abi::QuantizeTokensFp8>([](mlir::MLIRContext& ctx, const abi::QuantizeTokensFp8& c, Arch) {
            return buildQuantizeTokens(ctx, QuantizeTokensSpec{c.H, c.device_rows == 1});
          })};
}

// The standalone GEMMs, bf16 and FP8.
std::vector<KernelInfo> gemmKernels() {
  using S = GroupedGemmSpec;
  return {entry<abi::GemmNt>([](mlir::MLIRContext& ctx, const abi::GemmNt& c, Arch) {
            return buildGemmNt(ctx, GemmNtSpec{c.N, c.K});
          }),
          entry<abi::GemmNtFp8>([](mlir::MLIRContext& ctx, const abi::GemmNtFp8& c, Arch arch) {
            return buildGemmNtFp8(ctx, GemmNtFp8Spec{c.N, c.K}, arch);
          }),
          groupedGemm<abi::GroupedGemmNt>(S::kNT),
          groupedGemm<abi::GroupedGemmNn>(S::kNN),
          groupedGemm<abi::GroupedGemmTn>(S::kTN),
          groupedGemm<abi::GroupedGemmNtTma>(S::kNT),
          groupedGemm<abi::GroupedGemmNnTma>(S::kNN),
          groupedGemm<abi::GroupedGemmTnTma>(S::kTN),
          entry<abi::GroupedGemmNtFp8>([](mlir::MLIRContext& ctx, const abi::GroupedGemmNtFp8& c, Arch arch) {
            GroupedGemmSpec g{S::kNT, c.E, c.N, c.K};
            g.fp8 = true;
            return buildGroupedGemmFp8(ctx, g, arch);
          })};
}

// The layer's own kernels: routing, the fused dispatch and combine, the backward's stage kernels.
std::vector<KernelInfo> routingAndFusedKernels() {
  return {
      entry<abi::DispatchPrologue>([](mlir::MLIRContext& ctx, const abi::DispatchPrologue& c, Arch) {
        return buildDispatchPrologue(ctx, DispatchPrologueSpec{c.E, c.topk, c.ranks});
      }),
      entry<abi::TopkIdxNarrow>([](mlir::MLIRContext& ctx, const abi::TopkIdxNarrow&, Arch) {
        return buildTopkIdxNarrow(ctx, TopkIdxNarrowSpec{});
      }),
      entry<abi::DispatchGroupedGemm>([](mlir::MLIRContext& ctx, const abi::DispatchGroupedGemm& c, Arch arch) {
        DispatchGemmSpec d{c.E, c.ranks, c.topk, c.H, c.I, c.clamp_milli, GroupedGemmSpec::Layout(c.layout), c.save_h,
                           c.dedup};
        return buildDispatchGemm(ctx, d, arch);
      }),
      entry<abi::GroupedGemmCombine>([](mlir::MLIRContext& ctx, const abi::GroupedGemmCombine& c, Arch arch) {
        return buildGemmCombine(ctx, GemmCombineSpec{c.E, c.ranks, c.topk, c.H, c.I, GroupedGemmSpec::Layout(c.layout)},
                                arch);
      }),
      entry<abi::DispatchGroupedGemmFp8>([](mlir::MLIRContext& ctx, const abi::DispatchGroupedGemmFp8& c, Arch arch) {
        DispatchGemmSpec d{c.E, c.ranks, c.topk, c.H, c.I, c.clamp_milli};
        d.fp8 = true;
        return buildDispatchGemm(ctx, d, arch);
      }),
      entry<abi::GroupedGemmCombineFp8>([](mlir::MLIRContext& ctx, const abi::GroupedGemmCombineFp8& c, Arch arch) {
        GemmCombineSpec d{c.E, c.ranks, c.topk, c.H, c.I};
        d.fp8 = true;
        return buildGemmCombine(ctx, d, arch);
      }),
      entry<abi::SwigluBwd>([](mlir::MLIRContext& ctx, const abi::SwigluBwd& c, Arch) {
        return buildSwigluBwd(ctx, SwigluBwdSpec{c.I, c.clamp_milli});
      }),
      entry<abi::StageBegin>([](mlir::MLIRContext& ctx, const abi::StageBegin& c, Arch) {
        return buildStageBegin(ctx, StageBeginSpec{c.E, c.ranks});
      }),
      entry<abi::EpochAdvance>([](mlir::MLIRContext& ctx, const abi::EpochAdvance&, Arch) {
        return buildEpochAdvance(ctx, EpochAdvanceSpec{});
      })};
}

// Communication probes (benchmarks and tests of the symmetric heap).
std::vector<KernelInfo> commKernels() {
  return {entry<abi::PingPong>([](mlir::MLIRContext& ctx, const abi::PingPong& c, Arch) {
            return buildPingPong(ctx, PingPongSpec{c.rounds});
          }),
          entry<abi::A2aRows>([](mlir::MLIRContext& ctx, const abi::A2aRows& c, Arch) {
            return buildAllToAllRows(ctx, AllToAllRowsSpec{c.H});
          }),
          entry<abi::PeerStore>([](mlir::MLIRContext& ctx, const abi::PeerStore&, Arch) {
            return buildPeerStore(ctx, PeerStoreSpec{});
          })};
}

}  // namespace

const std::vector<KernelInfo>& registry() {
  static const std::vector<KernelInfo> kernels = [] {
    std::vector<KernelInfo> all;
    for (auto part : {elementwiseKernels, gemmKernels, routingAndFusedKernels, commKernels})
      for (KernelInfo& k : part()) all.push_back(std::move(k));
    return all;
  }();
  return kernels;
}

const KernelInfo* find(std::string_view name) {
  for (const auto& k : registry())
    if (k.name == name) return &k;
  return nullptr;
}

const std::vector<ModelShape>& presets() {
  static const std::vector<ModelShape> shapes = [] {
    std::vector<ModelShape> out;
    for (const abi::Model& m : abi::models()) out.push_back({m.name, m.hidden, m.intermediate, m.experts, m.topk});
    return out;
  }();
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
  if (auto e = positiveMultiple("intermediate", s.intermediate, GemmNtSpec::kBlockN, "BLOCK_N of the L2 dgrad GEMM");
      !e.empty())
    return e;
  if (s.experts / ranks > 1024)
    return "experts per rank = " + std::to_string(s.experts / ranks) + " must be <= 1024 (the grouped GEMM tile table)";
  return "";
}

namespace {
// Appends spec unless `out` holds it already (a union in first-seen order).
void appendOnce(std::vector<KernelSpec>& out, KernelSpec spec) {
  if (std::none_of(out.begin(), out.end(),
                   [&](const KernelSpec& o) { return o.kernel == spec.kernel && o.constants == spec.constants; }))
    out.push_back(std::move(spec));
}
}  // namespace

std::vector<KernelSpec> layerKernels(const ModelShape& s, int64_t ranks) {
  if (std::string e = validateShape(s, ranks); !e.empty()) throw std::invalid_argument(s.name + ": " + e);
  // The union of the runtime's lists (compiler/abi/LayerKernels.h) over the layer options that change kernels
  // (training, token deduplication, int64 topk_idx), without a SwiGLU clamp; each spec once, in first-seen order.
  std::vector<KernelSpec> out;
  for (int options = 0; options < 8; ++options) {
    abi::LayerShape shape{s.hidden, s.intermediate, s.experts, s.topk, ranks};
    shape.training = options & 1;
    shape.dedup = options & 2;
    shape.topkIdxInt64 = options & 4;
    for (abi::KernelSpec& k : abi::layerKernels(shape).specs) appendOnce(out, {std::move(k.kernel), std::move(k.constants)});
  }
  return out;
}

std::vector<KernelSpec> fp8Kernels(const ModelShape& s, int64_t ranks) {
  if (std::string e = validateShape(s, ranks); !e.empty()) throw std::invalid_argument(s.name + ": " + e);
  std::vector<KernelSpec> out;
  auto add = [&](KernelSpec spec) {
    if (std::string e = find(spec.kernel)->validate(spec); !e.empty())
      throw std::invalid_argument(s.name + " in FP8: " + e);
    appendOnce(out, std::move(spec));
  };
  for (auto [n, k] : {std::pair{2 * s.intermediate, s.hidden}, std::pair{s.hidden, s.intermediate}})
    add(GroupedGemmSpec{GroupedGemmSpec::kNT, s.experts / ranks, n, k, /*fp8=*/true}.spec());
  // The FP8 layer's lists (inference: no training, no dedup), with and without int64 topk_idx.
  for (bool int64Idx : {false, true}) {
    abi::LayerShape shape{s.hidden, s.intermediate, s.experts, s.topk, ranks};
    shape.fp8 = true;
    shape.topkIdxInt64 = int64Idx;
    for (abi::KernelSpec& k : abi::layerKernels(shape).specs) add({std::move(k.kernel), std::move(k.constants)});
  }
  return out;
}

}  // namespace megamoe::kernels
