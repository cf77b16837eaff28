// The kernel registry, the model table's shapes as presets, and the kernels one MoE layer needs.
#include <algorithm>
#include <stdexcept>

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

std::vector<std::string> KernelInfo::constantNames() const {
  const abi::KernelDecl* decl = abi::findKernelDecl(name);
  if (!decl) throw std::logic_error("kernel " + name + " has no declaration in compiler/abi/KernelAbi.cpp");
  return {decl->constants.begin(), decl->constants.end()};
}

namespace {
std::string positiveMultiple(const char* what, int64_t value, int64_t of, const char* why) {
  if (value <= 0 || value % of != 0)
    return std::string(what) + "=" + std::to_string(value) + " must be a positive multiple of " + std::to_string(of) +
           " (" + why + ")";
  return "";
}

// clamp_milli (SwiGLU's clamp in thousandths): 0 (off) or positive.
std::string clampRule(const KernelSpec& s) {
  return s.get("clamp_milli") < 0 ? "clamp_milli must be >= 0 (0 disables the clamp)" : "";
}

// The experts over the ranks of one node (every kernel with E and ranks): ranks 1..8, E 1..1024 split evenly.
std::string expertsRule(const KernelSpec& s) {
  const int64_t e = s.get("E"), r = s.get("ranks");
  if (r < 1 || r > 8) return "ranks=" + std::to_string(r) + " must be 1..8";
  if (e < 1 || e > 1024 || e % r != 0)
    return "E=" + std::to_string(e) + " must be 1..1024 and a multiple of ranks=" + std::to_string(r);
  return "";
}

// The routing's (dispatch_prologue's): the experts' rule and topk 1..E.
std::string routingRule(const KernelSpec& s) {
  if (std::string e = expertsRule(s); !e.empty()) return e;
  const int64_t topk = s.get("topk");
  return topk < 1 || topk > s.get("E") ? "topk=" + std::to_string(topk) + " must be 1..E" : "";
}

// The constraints both fused operators share: the routing's and the GEMM tiles'.
std::string validateFused(const KernelSpec& s) {
  if (std::string e = routingRule(s); !e.empty()) return e;
  if (auto m = positiveMultiple("H", s.get("H"), GroupedGemmSpec::kBlockN, "BLOCK_N of L2, K of L1"); !m.empty())
    return m;
  return positiveMultiple("I", s.get("I"), GroupedGemmSpec::kBlockN, "the gate|up halves of an L1 tile, K of L2");
}

// The grouped GEMMs' group count E: 1..1024, the rows of the tile table each block builds in shared memory.
std::string groupCountRule(const KernelSpec& s) {
  return s.get("E") > 0 && s.get("E") <= 1024
             ? ""
             : "E=" + std::to_string(s.get("E")) + " must be 1..1024 (the shared tile table)";
}

KernelInfo groupedGemmInfo(GroupedGemmSpec::Layout layout, bool tensorMaps = false) {
  using S = GroupedGemmSpec;
  const char* third = layout == S::kTN ? "M" : "K";
  return {tensorMaps ? S::tmaName(layout) : S::name(layout),
          tensorMaps           ? "grouped bf16 GEMM, warp-specialised with TMA loads through two tensor-map arguments"
          : layout == S::kNT   ? "grouped bf16 GEMM C = A B[e]^T over device-side group offsets (persistent)"
          : layout == S::kNN ? "grouped bf16 GEMM C = A B[e] over device-side group offsets (persistent)"
                             : "grouped bf16 GEMM C[e] = A_e^T B_e, K = group size (weight gradients)",
          [layout, third, tensorMaps](const KernelSpec& s) {
            std::string e = groupCountRule(s);
            if (e.empty()) e = positiveMultiple("N", s.get("N"), S::kBlockN, "BLOCK_N");
            if (e.empty())
              e = layout == S::kTN ? positiveMultiple(third, s.get(third), S::kBlockM, "BLOCK_M")
                                   : positiveMultiple(third, s.get(third), S::kBlockK, "BLOCK_K");
            if (e.empty() && layout != S::kTN && s.get("K") < 128)
              e = "K=" + std::to_string(s.get("K")) + " must be >= 128 (the 3-stage ring's prologue)";
            if (e.empty() && tensorMaps && (s.get("pairs") < 0 || s.get("pairs") > 1))
              e = "pairs must be 0 or 1 (cluster pairs sharing B's tile by multicast)";
            if (e.empty() && tensorMaps && s.get("pairs") && layout == S::kTN)
              e = "pairs must be 0 for TN (each block's tiles read their own group's rows)";
            if (e.empty() && tensorMaps && s.get("pairs") && s.get("N") % 256 != 0)
              e = "pairs=1 needs N a multiple of 256 (each block of a pair loads one 128-row half of B's tile)";
            return e;
          },
          [layout, third, tensorMaps](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) {
            return buildGroupedGemm(ctx, GroupedGemmSpec{layout, s.get("E"), s.get("N"), s.get(third)}, arch,
                                    /*warpSpecialized=*/false, tensorMaps, tensorMaps && s.get("pairs") == 1);
          }};
}

// The FP8 fused kernels' rules beyond validateFused: both GEMMs' K (H for L1, I for L2) at least the FP8 ring's
// two 128-wide stages.
std::string validateFusedFp8(const KernelSpec& s) {
  std::string e = validateFused(s);
  for (const char* k : {"H", "I"})
    if (e.empty() && s.get(k) < 2 * GroupedGemmSpec::kScaleBlock)
      e = std::string(k) + "=" + std::to_string(s.get(k)) + " must be >= 256 (a K of the FP8 ring: two 128-wide stages)";
  return e;
}

KernelInfo dispatchGemmFp8Info() {
  return {DispatchGemmSpec::kFp8Name,
          "fused dispatch + FP8 grouped GEMM (forward): e4m3 rows and their per-token scales pushed to the owners, "
          "L1 with 128 x 128 block-scaled w1, SwiGLU to bf16",
          [](const KernelSpec& s) {
            std::string e = validateFusedFp8(s);
            if (e.empty()) e = clampRule(s);
            return e;
          },
          [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) {
            DispatchGemmSpec d{s.get("E"), s.get("ranks"), s.get("topk"), s.get("H"), s.get("I"), s.get("clamp_milli")};
            d.fp8 = true;
            return buildDispatchGemm(ctx, d, arch);
          }};
}

KernelInfo gemmCombineFp8Info() {
  return {GemmCombineSpec::kFp8Name,
          "fused FP8 grouped GEMM + combine (forward): L2 over e4m3 act with per-token scales and block-scaled w2, "
          "rows stored at their home rank, the weighted top-k sum in fp32",
          validateFusedFp8,
          [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) {
            GemmCombineSpec d{s.get("E"), s.get("ranks"), s.get("topk"), s.get("H"), s.get("I")};
            d.fp8 = true;
            return buildGemmCombine(ctx, d, arch);
          }};
}

// Row-wise kernels around the GEMMs.
std::vector<KernelInfo> elementwiseKernels() {
  return {
    {SwigluSpec::kName,
     "SwiGLU forward over [M, 2I] gate|up rows, bf16, optional clamp",
     [](const KernelSpec& s) {
       std::string e = positiveMultiple("I", s.get("I"), SwigluSpec::kVector, "16-byte bf16 vectors");
       if (e.empty()) e = clampRule(s);
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) {
       return buildSwiglu(ctx, SwigluSpec{s.get("I"), s.get("clamp_milli")});
     }},
    {QuantizeTokensSpec::kName,
     "per-token FP8 e4m3 quantisation of bf16 rows, one f32 scale per 128 channels (amax / 448)",
     [](const KernelSpec& s) {
       std::string e = positiveMultiple("H", s.get("H"), QuantizeTokensSpec::kGroup, "one scale per 128 channels");
       if (e.empty() && s.get("H") > 65536) e = "H=" + std::to_string(s.get("H")) + " must be <= 65536";
       if (e.empty() && s.get("device_rows") != 0 && s.get("device_rows") != 1)
         e = "device_rows must be 0 (rows) or 1 (min(rows, *rows_at))";
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) {
       return buildQuantizeTokens(ctx, QuantizeTokensSpec{s.get("H"), s.get("device_rows") == 1});
     }}
  };
}

// The standalone GEMMs, bf16 and FP8.
std::vector<KernelInfo> gemmKernels() {
  return {
    {GemmNtSpec::kName,
     "one-expert bf16 GEMM C = A B^T through the MMA atom (64x128 tiles)",
     [](const KernelSpec& s) {
       std::string e = positiveMultiple("N", s.get("N"), GemmNtSpec::kBlockN, "BLOCK_N");
       if (e.empty()) e = positiveMultiple("K", s.get("K"), GemmNtSpec::kBlockK, "BLOCK_K, one swizzled 128-byte row");
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) { return buildGemmNt(ctx, GemmNtSpec{s.get("N"), s.get("K")}); }},
    {GemmNtFp8Spec::kName,
     "one-expert FP8 e4m3 GEMM C = A B^T with 128 x 128 block scales promoted per K block (64x128 tiles)",
     [](const KernelSpec& s) {
       std::string e = positiveMultiple("N", s.get("N"), GemmNtFp8Spec::kBlockN, "BLOCK_N, one scale block");
       if (e.empty()) e = positiveMultiple("K", s.get("K"), GemmNtFp8Spec::kBlockK, "one 128-wide scale block per stage");
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) {
       return buildGemmNtFp8(ctx, GemmNtFp8Spec{s.get("N"), s.get("K")}, arch);
     }},
    groupedGemmInfo(GroupedGemmSpec::kNT),
    groupedGemmInfo(GroupedGemmSpec::kNN),
    groupedGemmInfo(GroupedGemmSpec::kTN),
    groupedGemmInfo(GroupedGemmSpec::kNT, /*tensorMaps=*/true),
    groupedGemmInfo(GroupedGemmSpec::kNN, /*tensorMaps=*/true),
    groupedGemmInfo(GroupedGemmSpec::kTN, /*tensorMaps=*/true),
    {GroupedGemmSpec::kFp8Name,
     "grouped FP8 e4m3 GEMM C = A B[e]^T with per-token (A) and 128 x 128 (B) block scales promoted per 128 K "
     "(warp-specialised with TMA loads on sm_90a)",
     [](const KernelSpec& s) {
       using S = GroupedGemmSpec;
       std::string e = groupCountRule(s);
       if (e.empty()) e = positiveMultiple("N", s.get("N"), S::kScaleBlock, "BLOCK_N, one scale block");
       if (e.empty()) e = positiveMultiple("K", s.get("K"), S::kScaleBlock, "one 128-wide scale block per stage");
       if (e.empty() && s.get("K") < 2 * S::kScaleBlock)
         e = "K=" + std::to_string(s.get("K")) + " must be >= 256 (the ring's prologue: two stages)";
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) {
       GroupedGemmSpec g{GroupedGemmSpec::kNT, s.get("E"), s.get("N"), s.get("K")};
       g.fp8 = true;
       return buildGroupedGemmFp8(ctx, g, arch);
     }}
  };
}

// The layer's own kernels: routing, the fused dispatch and combine, the backward's stage kernels.
std::vector<KernelInfo> routingAndFusedKernels() {
  return {
    {DispatchPrologueSpec::kName,
     "routing tables on the device: per-expert counts all-gathered, pool offsets, each pick's pool row",
     routingRule,
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) {
       return buildDispatchPrologue(ctx, DispatchPrologueSpec{s.get("E"), s.get("topk"), s.get("ranks")});
     }},
    {TopkIdxNarrowSpec::kName,
     "int64 top-k indices narrowed to int32; values outside [-1, 2^31) become INT32_MAX and claim kBadIndex",
     [](const KernelSpec&) { return std::string(); },
     [](mlir::MLIRContext& ctx, const KernelSpec&, Arch) { return buildTopkIdxNarrow(ctx, TopkIdxNarrowSpec{}); }},
    {DispatchGemmSpec::kName,
     "fused dispatch + grouped GEMM: rows pushed to the owners, each tile starts once its rows arrived (NT + SwiGLU "
     "forward, NN dgrad, TN wgrad)",
     [](const KernelSpec& s) {
       std::string e = validateFused(s);
       if (e.empty()) e = clampRule(s);
       if (e.empty() && (s.get("layout") < 0 || s.get("layout") > 2)) e = "layout must be 0 (NT), 1 (NN) or 2 (TN)";
       if (e.empty() && (s.get("save_h") < 0 || s.get("save_h") > 1 || (s.get("save_h") && s.get("layout") != 0)))
         e = "save_h must be 0 or 1, and 1 only with layout 0 (NT, the forward)";
       if (e.empty() && (s.get("dedup") < 0 || s.get("dedup") > 1 || (s.get("dedup") && s.get("layout") != 0)))
         e = "dedup must be 0 or 1, and 1 only with layout 0 (NT, the forward)";
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) {
       DispatchGemmSpec d{s.get("E"), s.get("ranks"), s.get("topk"), s.get("H"), s.get("I"), s.get("clamp_milli"),
                          GroupedGemmSpec::Layout(s.get("layout")), s.get("save_h"), s.get("dedup")};
       return buildDispatchGemm(ctx, d, arch);
     }},
    {GemmCombineSpec::kName,
     "fused grouped GEMM + combine: rows stored at their home rank, then the top-k sum in fp32 (NT forward "
     "weighted, NN backward dx)",
     [](const KernelSpec& s) {
       std::string e = validateFused(s);
       if (e.empty() && s.get("layout") != 0 && s.get("layout") != 1) e = "layout must be 0 (NT) or 1 (NN)";
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch arch) {
       GemmCombineSpec d{s.get("E"), s.get("ranks"), s.get("topk"), s.get("H"), s.get("I"),
                         GroupedGemmSpec::Layout(s.get("layout"))};
       return buildGemmCombine(ctx, d, arch);
     }},
    dispatchGemmFp8Info(),
    gemmCombineFp8Info(),
    {SwigluBwdSpec::kName,
     "SwiGLU backward per received row: dh over h, w * act over g, d topk weight to the home rank",
     [](const KernelSpec& s) {
       std::string e = positiveMultiple("I", s.get("I"), 8, "16-byte bf16 vectors");
       if (e.empty()) e = clampRule(s);
       return e;
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) {
       return buildSwigluBwd(ctx, SwigluBwdSpec{s.get("I"), s.get("clamp_milli")});
     }},
    {StageBeginSpec::kName,
     "start of a backward stage: zero the other parity's counters, then a rank barrier",
     expertsRule,
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) {
       return buildStageBegin(ctx, StageBeginSpec{s.get("E"), s.get("ranks")});
     }},
    {EpochAdvanceSpec::kName,
     "advance the rank's epoch by one (launched last in a call; stream-ordered, graph-capturable)",
     [](const KernelSpec&) { return std::string(); },
     [](mlir::MLIRContext& ctx, const KernelSpec&, Arch) { return buildEpochAdvance(ctx, EpochAdvanceSpec{}); }}
  };
}

// Communication probes (benchmarks and tests of the symmetric heap).
std::vector<KernelInfo> commKernels() {
  return {
    {PingPongSpec::kName,
     "cross-rank ping-pong between ranks 0 and 1 through the symmetric heap",
     [](const KernelSpec& s) {
       return s.get("rounds") > 0 ? std::string() : "rounds=" + std::to_string(s.get("rounds")) + " must be > 0";
     },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) { return buildPingPong(ctx, PingPongSpec{s.get("rounds")}); }},
    {AllToAllRowsSpec::kName,
     "all-to-all of bf16 rows [nranks][rows][H] through the symmetric heap, flag per source rank",
     [](const KernelSpec& s) { return positiveMultiple("H", s.get("H"), 8, "16-byte bf16 vectors"); },
     [](mlir::MLIRContext& ctx, const KernelSpec& s, Arch) { return buildAllToAllRows(ctx, AllToAllRowsSpec{s.get("H")}); }},
    {PeerStoreSpec::kName,
     "stream 16-byte chunks into a peer's heap (peer bandwidth benchmark)",
     [](const KernelSpec&) { return std::string(); },
     [](mlir::MLIRContext& ctx, const KernelSpec&, Arch) { return buildPeerStore(ctx, PeerStoreSpec{}); }}
  };
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
    add({GroupedGemmSpec::kFp8Name, {{"E", s.experts / ranks}, {"N", n}, {"K", k}}});
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
