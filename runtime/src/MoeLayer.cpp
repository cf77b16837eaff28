// The MoE layer (see MoeLayer.h): heap and buffer layout, kernel loading, and the launches of one forward and one
// backward. The kernels come from the layer's one list (compiler/abi/LayerKernels.h), their arguments by name from
// their declarations (compiler/abi/KernelAbi.h); kernels/Kernels.h says what each argument means.
#include "megamoe/MoeLayer.h"

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <optional>

#include "LayerRules.h"
#include "compiler/abi/LayerKernels.h"
#include "compiler/abi/Models.h"
#include "megamoe/Error.h"
#include "megamoe/Log.h"
#include "megamoe/Profile.h"
#include "megamoe/Runtime.h"

namespace megamoe {

namespace {

constexpr int64_t kMaxPicks = int64_t(1) << 24;  // pool_src keeps a pick index in 24 bits
// The fused kernels' legs bits (kernels/Kernels.h LegBits).
constexpr int32_t kLegComm = 1, kLegGemm = 2;
int32_t legBits(Leg leg) {
  return leg == Leg::kFused ? kLegComm | kLegGemm : leg == Leg::kCommOnly ? kLegComm : kLegGemm;
}

std::string multipleOf(const char* what, int64_t value, int64_t of, const char* why) {
  if (value > 0 && value % of == 0) return "";
  return std::string(what) + "=" + std::to_string(value) + " must be a positive multiple of " + std::to_string(of) +
         " (" + why + ")";
}

// The most blocks the layer launches (one per SM of its budget; H200: 132, MI355X: 256) times the most threads a
// block has (the hardware's limit): the stride of the kernels' grid-stride loops.
constexpr int64_t kMaxGridBlocks = 1024, kMaxBlockThreads = 1024, kMaxGridThreads = kMaxGridBlocks * kMaxBlockThreads;

// The roles the layer launches its kernels in (compiler/abi/LayerKernels.h).
using Role = abi::LayerKernel;

// The shape fields that decide the layer's kernels.
abi::LayerShape layerShape(const MoeLayerConfig& c, int ranks) {
  abi::LayerShape s;
  s.hidden = c.hidden;
  s.intermediate = c.intermediate;
  s.experts = c.experts;
  s.topk = c.topk;
  s.ranks = ranks;
  s.clampMilli = c.swigluClampMilli;
  s.training = c.training;
  s.dedup = c.dedupTokens;
  s.topkIdxInt64 = c.topkIdxInt64;
  s.fp8 = isFp8(c);
  return s;
}

// The SM budget's device-independent rules (MoeLayerConfig::smBudget); resolveSmBudget (Workspace.cpp) adds the
// device's.
std::string smBudgetError(int64_t budget) {
  if (budget < 0 || budget > kMaxGridBlocks || budget % 2 != 0)
    return "sm_budget=" + std::to_string(budget) + " must be 0 (the default) or an even number of SMs up to " +
           std::to_string(kMaxGridBlocks) + " (the cluster-pair kernels launch whole pairs of blocks)";
  return "";
}

// Upper bounds of the configuration's fields. Each field is bounded before any product of fields is formed, so that
// no product wraps around int64, and the bounds keep every i32 the kernels derive from a configuration in range.
// H, I <= 2^16: the grouped GEMMs (128 x 128 tiles or wider) count tiles and pass row strides (up to 2I) in i32;
// the largest tile count, the dW GEMMs' E/R * (H / 128) * (2I / 128), is then at most 2^10 * 2^9 * 2^10 = 2^29.
constexpr int64_t kMaxHidden = int64_t(1) << 16, kMaxIntermediate = int64_t(1) << 16;
constexpr int64_t kMaxExperts = 1024;  // the grouped GEMMs' shared tile table (kernels/Registry.cpp)
constexpr int64_t kMaxTopk = 32;       // the combine and the dedup push unroll a loop over the picks of a token
constexpr int64_t kMaxTokens = kMaxPicks - 1;   // a pick id t * topk + j keeps 24 bits in pool_src
constexpr int64_t kMaxClampMilli = 1000000000;  // a clamp of 10^6: the field counts thousandths
constexpr int64_t kInt32End = int64_t(1) << 31;  // the first value an i32 cannot hold
// The i32 kernel arguments and loop bounds that follow from the bounds above (MoeLayer::forward, backward).
static_assert(kMaxTokens < kInt32End, "tokens and recv_stride (= max_tokens) are i32 arguments");
static_assert(abi::kMaxRanks * kMaxPicks < kInt32End, "pool_src = source rank * 2^24 + pick is an i32");
static_assert(kMaxPicks + kMaxGridBlocks * 8 <= kInt32End, "swiglu_bwd: row r < 2^24 steps by rowGrid = grid * 8");
static_assert(kMaxExperts * (kMaxHidden / 128) * (2 * kMaxIntermediate / 128) + kMaxGridThreads <= kInt32End,
              "grouped GEMM tile indices step by at most the grid past the tile count");

// a * b * ... when it fits int64 (and hence size_t on the 64-bit hosts the runtime builds for), else nullopt.
std::optional<int64_t> product(std::initializer_list<int64_t> factors) {
  int64_t p = 1;
  for (int64_t f : factors)
    if (__builtin_mul_overflow(p, f, &p)) return std::nullopt;
  if (uint64_t(p) > std::numeric_limits<size_t>::max()) return std::nullopt;
  return p;
}

std::string inRange(const char* what, int64_t value, int64_t lo, int64_t hi, const char* why) {
  if (value >= lo && value <= hi) return "";
  return std::string(what) + "=" + std::to_string(value) + " must be " + std::to_string(lo) + ".." +
         std::to_string(hi) + " (" + why + ")";
}

// Every buffer of the workspace is sized for max_tokens: a call with more tokens would write past them.
void requireTokensInRange(const char* call, int64_t tokens, const MoeLayerConfig& c) {
  if (tokens < 0 || tokens > c.maxTokens)
    invalid(std::string(call) + ": tokens=" + std::to_string(tokens) + " must be in [0, max_tokens=" +
            std::to_string(c.maxTokens) + "]");
}

// A device pointer the kernels access in loads and stores of `bytes` (0 passes: the null checks come first).
void requireAligned(const char* call, const char* name, DevicePtr p, uint64_t bytes, const char* why) {
  if (p % bytes == 0) return;
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(p));
  invalid(std::string(call) + ": " + name + "=" + hex + " must be " + std::to_string(bytes) + "-byte aligned (" +
          why + ")");
}

// validate() keeps the kernels' i32 grid-stride loops in range for grids of up to kMaxGridBlocks blocks.
void requireGridInBounds(uint32_t grid) {
  if (grid > kMaxGridBlocks)
    throw Error(ErrorCode::kUnsupported, "the layer's grid of " + std::to_string(grid) + " blocks exceeds the " +
                                             std::to_string(kMaxGridBlocks) +
                                             " that MoeLayer::validate bounds the kernels' i32 indices for");
}

}  // namespace

std::string MoeLayer::validate(const MoeLayerConfig& c, int ranks) {
  // Each field on its own, in this order (the first violated one is named), then their products.
  if (ranks < 1 || ranks > abi::kMaxRanks)
    return "ranks=" + std::to_string(ranks) + " must be 1.." + std::to_string(abi::kMaxRanks) + " (one node)";
  if (c.experts < 1 || c.experts > kMaxExperts || c.experts % ranks != 0)
    return "experts=" + std::to_string(c.experts) + " must be 1.." + std::to_string(kMaxExperts) +
           " and a multiple of ranks=" + std::to_string(ranks);
  if (c.topk < 1 || c.topk > std::min(c.experts, kMaxTopk))
    return "topk=" + std::to_string(c.topk) + " must be 1..min(experts, " + std::to_string(kMaxTopk) + ")";
  if (auto e = multipleOf("hidden", c.hidden, 128, "the L2 tile width and the L1 K step"); !e.empty()) return e;
  if (auto e = inRange("hidden", c.hidden, 128, kMaxHidden, "i32 tile counts and strides"); !e.empty()) return e;
  if (auto e = multipleOf("intermediate", c.intermediate, 128, "the gate|up halves of an L1 tile"); !e.empty())
    return e;
  if (auto e = inRange("intermediate", c.intermediate, 128, kMaxIntermediate, "i32 tile counts and strides");
      !e.empty())
    return e;
  if (auto e = inRange("max_tokens", c.maxTokens, 1, kMaxTokens, "2^24 - 1: pick ids keep 24 bits"); !e.empty())
    return e;
  if (auto e = inRange("swiglu_clamp_milli", c.swigluClampMilli, 0, kMaxClampMilli, "thousandths; 0 = no clamp");
      !e.empty())
    return e;
  // The bounds above keep every product below far inside int64; each is still computed with an overflow check.
  const auto rows = product({ranks, c.maxTokens, c.topk});
  if (!rows || *rows >= kMaxPicks)
    return "ranks * max_tokens * topk = " + (rows ? std::to_string(*rows) : std::string("(overflow)")) +
           " must be < 2^24 (pool row ids)";
  // grouped_gemm_combine's weighted sum runs i over [0, tokens * H / 8) in i32 steps of grid * block threads: its
  // last i plus one stride must still fit an i32 (kernels/FusedMoe.cpp, the combine's step 3).
  const auto vectors = product({c.maxTokens, c.hidden / 8});
  if (!vectors || *vectors > kInt32End - kMaxGridThreads)
    return "max_tokens * hidden / 8 = " + (vectors ? std::to_string(*vectors) : std::string("(overflow)")) +
           " must be <= 2^31 - 2^20 (the combine's i32 vector index steps by up to " +
           std::to_string(kMaxGridBlocks) + " blocks x " + std::to_string(kMaxBlockThreads) + " threads)";
  // Every heap region and local buffer (heapRegions(), the constructor): the largest of each shape.
  const struct {
    const char* name;
    std::optional<int64_t> bytes;
  } sizes[] = {
      {"moe.pool", product({*rows, c.hidden, kBf16})},
      {"moe.pool_scales", product({*rows, c.hidden / kFp8ScaleGroup, 4})},
      {"act scales", product({*rows, c.intermediate / kFp8ScaleGroup, 4})},
      {"act", product({*rows, c.intermediate, kBf16})},
      {"h", product({*rows, 2, c.intermediate, kBf16})},
      {"moe.comb", product({c.maxTokens, c.topk, c.hidden, kBf16})},
      {"moe.pool_src", product({*rows, 4})},
      {"send_slot", product({c.maxTokens, c.topk, 4})},
      {"moe.counts", product({2, ranks, c.experts, 4})},
      {"dispatch_prologue scratch", product({4 + kPrologueBlocks * c.experts, 4})},
  };
  for (const auto& s : sizes)
    if (!s.bytes) return std::string(s.name) + "'s size overflows 64 bits";
  if (c.receiveCapacity < 0)
    return "receive_capacity=" + std::to_string(c.receiveCapacity) + " must be >= 0 (0 = the worst case)";
  if (c.dropOverflow && c.dedupTokens)
    return "drop_overflow is not supported with dedup_tokens (a dropped carrier would strand its token's other picks)";
  if (const int64_t area = int64_t(ranks) * c.maxTokens; c.dedupTokens && poolRows(c, ranks) < area)
    return "receive_capacity=" + std::to_string(c.receiveCapacity) + " must be 0 or >= ranks * max_tokens = " +
           std::to_string(area) + " with dedup_tokens (a token's row lands at receive row source * max_tokens + token)";
  if (c.dtype != DType::kBf16 && c.dtype != DType::kFp8E4m3)
    return "dtype=" + std::to_string(int(c.dtype)) + " must be bf16 (0) or fp8_e4m3 (1)";
  if (isFp8(c)) {
    if (c.training)
      return "training=true with dtype fp8_e4m3: the FP8 layer is inference only (there is no FP8 backward yet)";
    if (c.dedupTokens) return "dedup_tokens with dtype fp8_e4m3: the FP8 dispatch pushes a row per pick";
    for (const auto& [name, v] : {std::pair{"hidden", c.hidden}, {"intermediate", c.intermediate}})
      if (v < 256)
        return std::string(name) + "=" + std::to_string(v) +
               " must be >= 256 with dtype fp8_e4m3 (a K of the FP8 ring: two 128-wide stages)";
  }
  if (auto e = smBudgetError(c.smBudget); !e.empty()) return e;
  return "";
}

std::string MoeLayer::validateModel(const abi::Model& m, int ranks) {
  if (std::string rule = validate({m.hidden, m.intermediate, m.experts, m.topk, /*maxTokens=*/4096}, ranks);
      !rule.empty())
    return rule;
  if (const abi::ModelFeatureInfo* f = m.refusingFeature()) return std::string("the layer lacks ") + f->lacking;
  return "";
}

std::vector<RegionSpec> MoeLayer::heapRegions(const MoeLayerConfig& c, int ranks) {
  // The sizes are products of the fields: free of overflow for a valid configuration only.
  if (auto e = validate(c, ranks); !e.empty()) invalid("MoE layer: " + e);
  const uint64_t R = uint64_t(ranks), E = uint64_t(c.experts), local = E / R;
  std::vector<RegionSpec> regions = {
      {"moe.counts", 2 * R * E * 4, 16},                      // [2][R][E] i32: the all-gathered pick counts
      {"moe.flags", R * 8, 16},                               // [R] u64: the prologue's exchange flags
      {"moe.calls", 2 * R * 8, 16},                           // [2][R] u64: each source's call (abi::callWord)
      {"moe.arrivals", 2 * R * local * 8, 16},                // [2][R][E/R] i64: rows arrived per (source, expert)
      {"moe.done", 2 * uint64_t(abi::doneSlots(ranks)) * 8, 16},  // [2][R + chunks] i64: the combine's counters
      {"moe.pool", uint64_t(poolRows(c, ranks)) * uint64_t(c.hidden * rowElemBytes(c)), 256},  // received x rows
      {"moe.pool_src", uint64_t(poolRows(c, ranks)) * 4, 16},                          // [rows] source * 2^24 + pick
      {"moe.pool_w", uint64_t(poolRows(c, ranks)) * 4, 16},                            // [rows] routing weights
      {"moe.comb", uint64_t(c.maxTokens * c.topk * c.hidden) * kBf16, 256},            // L2 rows back home
      {"moe.dw", uint64_t(c.maxTokens * c.topk) * 4, 16},                              // d topk_weights at home
      {"moe.barrier", R * 8, 16},                                                      // backward stages meet
  };
  if (isFp8(c))  // [rows, H / 128] f32: the received rows' scales
    regions.push_back({"moe.pool_scales", uint64_t(poolRows(c, ranks)) * uint64_t(c.hidden / kFp8ScaleGroup) * 4, 16});
  return regions;
}

std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> MoeLayer::kernelSpecs(
    const MoeLayerConfig& c, int ranks) {
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> out;
  for (abi::KernelSpec& spec : abi::layerKernels(layerShape(c, ranks)).specs)
    out.emplace_back(std::move(spec.kernel), std::move(spec.constants));
  return out;
}

struct MoeLayer::Impl {
  Runtime& runtime;
  Device& device;
  const Workspace::Buffers& b;  // the workspace's
  abi::LayerKernelList list;                            // the layer's kernels and their roles
  std::vector<std::shared_ptr<const Kernel>> kernels;  // in list.specs order
  Leg dispatchLeg = Leg::kFused, combineLeg = Leg::kFused;
  bool profiling = false;
  std::array<EventHandle, size_t(Stage::kCount) + 1> events{};
  std::array<EventHandle, 2 * size_t(BackwardStage::kCount)> backwardEvents{};  // start and end of each stage
  uint32_t grid = 0;
  int32_t pushBlocks = 0;
  // The cluster-pair kernels (the dispatches and the forward combine on sm_90a) launch whole pairs of blocks, the
  // pushing ones included.
  int32_t pairGrid = 0, pairPush = 0;
  // A layer with a workspace of its own keeps the last forward's saved state itself (ForwardArgs::saved = 0).
  DevicePtr ownSaved = 0;
  int64_t lastForwardTokens = -1;  // what backward() must match then; -1 before the first forward
  uint32_t number = 0;  // the layer's number on its workspace (creation order): its calls' layer id
  // The tensor maps over the workspace's buffers at this layer's sizes, each for the kernel argument it is passed
  // as (in the box that argument declares); zeros (read as unused pointers) where the backend has no TMA. Forward:
  // the dispatch's A (the pool's rows) and the combine's A (act). Backward: the dgrad dispatch's A (the pool: dy
  // rows), dW2's A and B (the pool, act), dW1's A and B (dh, the pool: x rows) and the dx combine's A (dh).
  using TensorMap = TensorMapBytes;
  TensorMap dispatchPoolMap{}, combineActMap{};
  // The dispatch's map_c: TN stores dW1 through it (encoded per call); the forward and dgrad dispatches take this one
  // over their own out (act), unused.
  TensorMap dispatchOutMap{};
  TensorMap dgradPoolMap{}, wgradPoolMap{}, wgradActMap{}, wgradW1DhMap{}, wgradW1PoolMap{}, dgradDhMap{};
  // The map for argument `arg` of the kernel in `role` over a bf16 [rows, cols] matrix at base.
  TensorMap map(Role role, const char* arg, DevicePtr base, int64_t rows, int64_t cols) const {
    return encodeTensorMap(kernelOf(role), arg, base, rows, cols);
  }

  Impl(Workspace& ws) : runtime(ws.runtime()), device(ws.device()), b(ws.buffers()) {}
  ~Impl() {
    try {
      if (ownSaved) device.free(ownSaved);
      for (EventHandle e : events)
        if (e) device.destroyEvent(e);
      for (EventHandle e : backwardEvents)
        if (e) device.destroyEvent(e);
    } catch (...) {
    }
  }
  // The arguments of the kernel in `role`, by name (compiler/abi/KernelAbi.h), with the rank's context set.
  KernelArgs args(Role role) {
    KernelArgs a(kernelSpecName(role));
    a.context(b.ctx);
    return a;
  }
  // The dispatch's arguments every layout shares: the routing tables and the receive pool.
  KernelArgs dispatchArgs(Role role, int32_t legs, uint64_t topkIdx, uint64_t topkWeights, int64_t recvStride,
                          int64_t capacity) {
    KernelArgs a = args(role);
    a.i32("capacity", capacity);
    a.ptr("topk_weights", topkWeights).ptr("send_list", b.sendList).ptr("send_off", b.sendOff).ptr("send_base", b.sendBase);
    a.ptr("counts", b.counts).ptr("arrivals", b.arrivals).ptr("route_epoch", b.routeEpoch);
    a.ptr("pool", b.pool).ptr("pool_src", b.poolSrc).ptr("pool_w", b.poolW);
    a.ptr("pool_offsets", b.poolOffsets).ptr("topk_idx", topkIdx).i32("legs", legs).i32("recv_stride", recvStride);
    return a;
  }
  // The combine's: where rows go home and how they are summed.
  KernelArgs combineArgs(Role role, int32_t legs, uint64_t topkIdx, uint64_t topkWeights, int64_t tokens) {
    KernelArgs a = args(role);
    a.ptr("pool_offsets", b.poolOffsets).ptr("pool_src", b.poolSrc).ptr("comb", b.comb);
    a.ptr("done", b.done).ptr("topk_idx", topkIdx).ptr("topk_weights", topkWeights).i32("tokens", tokens);
    a.ptr("dw", b.dw).i32("legs", legs);
    return a;
  }
  void launch(Role role, uint32_t blocks, StreamHandle stream, KernelArgs& args, const SymmetricHeap& heap) {
    const Kernel& kernel = kernelOf(role);
    LaunchDims dims;
    dims.grid = {blocks, 1, 1};
    dims.block = {uint32_t(kernel.metadata().blockThreads), 1, 1};
    dims.sharedBytes = uint32_t(kernel.metadata().sharedBytes);
    runtime.launch(kernel, dims, stream, args, &heap);
  }
  // stage_begin: the other parity's counters zeroed, then all ranks meet.
  void stageBegin(StreamHandle stream, const SymmetricHeap& heap) {
    KernelArgs a = args(Role::kStageBegin);
    a.ptr("arrivals", b.arrivals).ptr("done", b.done).ptr("barrier", b.barrier);
    launch(Role::kStageBegin, 1, stream, a, heap);
  }
  // The int32 topk_idx the kernels read: the caller's, or (int64 indices) its narrowed copy in the workspace; with
  // dropping always a copy (the prologue marks the dropped picks -1 in it, never in the caller's).
  DevicePtr topkIdx32(const MoeLayerConfig& c, DevicePtr topkIdx, int64_t tokens, StreamHandle stream,
                      const SymmetricHeap& heap) {
    const int64_t count = tokens * c.topk;
    if (!c.topkIdxInt64 && c.dropOverflow && count > 0)
      device.copyDeviceToDeviceAsync(b.topkIdx32, topkIdx, size_t(count) * 4, stream);
    if (!c.topkIdxInt64) return c.dropOverflow ? b.topkIdx32 : topkIdx;
    const int64_t threads = kernelOf(Role::kTopkIdxNarrow).metadata().blockThreads;
    const int32_t blocks = int32_t(std::clamp<int64_t>((count / 2 + threads - 1) / threads, 1, 8 * int64_t(grid)));
    KernelArgs a = args(Role::kTopkIdxNarrow);
    a.ptr("src", topkIdx).ptr("dst", b.topkIdx32).i32("count", count).i32("grid", blocks);
    launch(Role::kTopkIdxNarrow, uint32_t(blocks), stream, a, heap);
    return b.topkIdx32;
  }
  // What a call of `kind` launches between the ranks' meetings (abi::callRole): a profiled forward meets once more
  // (stage_begin before the combine); the legs change who pushes and who waits.
  uint32_t roleOf(abi::CallKind kind) const {
    const bool profiledForward = kind == abi::CallKind::kForward && profiling;
    return abi::callRole(kind, profiledForward, uint32_t(legBits(dispatchLeg)), uint32_t(legBits(combineLeg)));
  }
  // dispatch_prologue: the routing tables of topk_idx, its counts exchanged with the peers, and this call (the
  // layer's number and the call's role) compared with the peers' (kCallMismatch on every rank when one differs).
  // drop: 0 = an overflow is an error, 1 = dropped and counted (forward), 2 = dropped again (the backward's rerun).
  void prologue(DevicePtr topkIdx, int64_t tokens, int64_t capacity, int32_t drop, abi::CallKind kind,
                StreamHandle stream, const SymmetricHeap& heap) {
    KernelArgs a = args(Role::kPrologue);
    a.ptr("topk_idx", topkIdx).i32("tokens", tokens).ptr("counts", b.counts).ptr("flags", b.flags);
    a.ptr("send_slot", b.sendSlot).ptr("pool_offsets", b.poolOffsets).ptr("send_list", b.sendList);
    a.ptr("send_off", b.sendOff).ptr("send_base", b.sendBase).ptr("arrivals", b.arrivals).ptr("done", b.done);
    // Its blocks meet on a grid barrier, so all must be resident: within the SM budget, like every other grid.
    const int32_t blocks = std::min<int32_t>(kPrologueBlocks, int32_t(grid));
    a.ptr("route_epoch", b.routeEpoch).ptr("scratch", b.prologueScratch).i32("blocks", blocks);
    a.i32("capacity", capacity).i32("drop", drop).ptr("dropped", b.dropped);
    a.ptr("calls", b.calls).i32("layer", int64_t(number)).i32("role", int64_t(roleOf(kind)));
    launch(Role::kPrologue, uint32_t(blocks), stream, a, heap);
  }
  // The saved state a training call uses: the caller's, else the layer's own (a layer with its own workspace).
  DevicePtr savedFor(DevicePtr callers, const char* call) const {
    if (callers % 16 != 0)
      invalid(std::string(call) + ": saved must be 16-byte aligned (16-byte vector accesses)");
    if (callers) return callers;
    if (!ownSaved)
      invalid(std::string(call) + ": saved must be given (MoeLayer::savedBytes() bytes): a layer on a caller's "
              "workspace keeps no saved state itself");
    return ownSaved;
  }
  // quantize_tokens_fp8 (kernels/Kernels.h QuantizeTokensSpec): rows of `width` bf16 to e4m3 codes and scales.
  // rowsAt 0: `rows` rows on a covering grid; else the rows the device counted there (at most `rows`) on 4 blocks
  // an SM of the budget, which loop over them.
  void quantize(Role role, DevicePtr x, DevicePtr codes, DevicePtr scales, int64_t width, int64_t rows,
                DevicePtr rowsAt, StreamHandle stream, const SymmetricHeap& heap) {
    if (!rowsAt && rows == 0) return;
    const int64_t threads = kernelOf(role).metadata().blockThreads, groups = width / kFp8ScaleGroup;
    const int32_t blocks = int32_t(rowsAt ? 4 * int64_t(grid) : (rows * groups + threads - 1) / threads);
    KernelArgs a(kernelSpecName(role));
    a.ptr("x", x).ptr("q", codes).ptr("scales", scales).i32("rows", rows).ptr("rows_at", rowsAt).i32("grid", blocks);
    launch(role, uint32_t(blocks), stream, a, heap);
  }
  void epochAdvance(StreamHandle stream, const SymmetricHeap& heap) {
    KernelArgs a = args(Role::kEpochAdvance);
    launch(Role::kEpochAdvance, 1, stream, a, heap);
  }
  const Kernel& kernelOf(Role role) const { return *kernels.at(list.at(role)); }
  const std::string& kernelSpecName(Role role) const { return kernelOf(role).key().kernel; }
  template <size_t N>
  void mark(std::array<EventHandle, N>& at, size_t index, StreamHandle stream) {
    if (profiling) device.recordEvent(at[index], stream);
  }
  // Stage i runs from at[stride * i] to at[stride * i + 1]: stride 1 when stages follow each other (forward),
  // 2 when each has its own start and end (backward).
  template <size_t M, size_t N>
  std::array<float, M> elapsed(std::array<EventHandle, N>& at, size_t stride) {
    if (!profiling) invalid("stage times: profiling is off (setProfiling(true) before the call)");
    std::array<float, M> ms{};
    device.synchronizeEvent(at.back());
    for (size_t i = 0; i < M; ++i) ms[i] = device.elapsedMilliseconds(at[stride * i], at[stride * i + 1]);
    return ms;
  }
};

MoeLayer::MoeLayer(std::shared_ptr<Workspace> workspace, const MoeLayerConfig& config)
    : config_(config), workspace_(std::move(workspace)), impl_(std::make_unique<Impl>(*workspace_)) {
  Impl& m = *impl_;
  const int ranks = workspace_->ranks();
  m.list = abi::layerKernels(layerShape(config, ranks));
  for (const abi::KernelSpec& spec : m.list.specs) {
    cache::KernelKey key{spec.kernel, spec.constants, m.device.target(), defaultTargetOptions(m.device.target()),
                         /*any*/ ""};
    m.kernels.push_back(m.runtime.loadKernel(key, ""));  // a miss names the megamoe-cache command (KernelLoader)
  }
  // One block per SM of the budget, all resident: the combine's blocks wait for each other (see
  // docs/decisions/fused-dispatch.md).
  m.grid = uint32_t(workspace_->smBudget());
  m.pushBlocks = std::min<int32_t>(m.runtime.env().pushBlocks, int32_t(m.grid));
  m.pairGrid = int32_t(m.grid) & ~1;
  m.pairPush = std::min<int32_t>((m.pushBlocks + 1) & ~1, m.pairGrid);
  const int64_t rows = workspace_->poolRows(), H = config.hidden, I = config.intermediate;
  m.dispatchPoolMap = m.map(Role::kDispatchNT, "map_a", m.b.pool, rows, H);  // bf16 or e4m3 rows, as declared
  // FP8: the combine's A is act quantised (the dispatch writes act bf16 and has no map_c).
  m.combineActMap = m.map(Role::kCombineNT, "map_a", isFp8(config) ? m.b.actCodes : m.b.act, rows, I);
  if (!isFp8(config)) m.dispatchOutMap = m.map(Role::kDispatchNT, "map_c", m.b.act, rows, I);
  if (config.training) {
    m.dgradPoolMap = m.map(Role::kDispatchNN, "map_a", m.b.pool, rows, H);
    m.wgradPoolMap = m.map(Role::kWgradTN, "map_a", m.b.pool, rows, H);
    m.wgradActMap = m.map(Role::kWgradTN, "map_b", m.b.act, rows, I);
    m.wgradW1DhMap = m.map(Role::kDispatchTN, "map_a", m.b.dh, rows, 2 * I);
    m.wgradW1PoolMap = m.map(Role::kDispatchTN, "map_b", m.b.pool, rows, H);
    m.dgradDhMap = m.map(Role::kCombineNN, "map_a", m.b.dh, rows, 2 * I);
  }
  for (EventHandle& e : m.events) e = m.device.createEvent();
  for (EventHandle& e : m.backwardEvents) e = m.device.createEvent();
  // Last, once nothing can throw: a layer that failed to build takes no number.
  m.number = workspace_->takeLayerNumber();
  MEGAMOE_LOG(kInfo, "layer " + std::to_string(m.number) + ": rank " + std::to_string(workspace_->rank()) + " of " +
                         std::to_string(ranks) + ": hidden " + std::to_string(config.hidden) + ", intermediate " +
                         std::to_string(config.intermediate) + ", experts " + std::to_string(config.experts) + " (" +
                         std::to_string(config.experts / ranks) + " local), topk " + std::to_string(config.topk) +
                         ", max_tokens " + std::to_string(config.maxTokens) + ", " + dtypeName(config.dtype) + ", training " +
                         std::to_string(int(config.training)) + ", SM budget " + std::to_string(m.grid) +
                         ", push blocks " + std::to_string(m.pushBlocks) + ", " + std::to_string(m.kernels.size()) +
                         " kernels");
}

MoeLayer::~MoeLayer() = default;

uint32_t MoeLayer::number() const { return impl_->number; }

uint64_t MoeLayer::savedBytes(const MoeLayerConfig& config, int ranks) {
  if (auto e = validate(config, ranks); !e.empty()) invalid("MoE layer: " + e);
  return config.training ? uint64_t(poolRows(config, ranks)) * uint64_t(2 * config.intermediate) * kBf16 : 0;
}

std::unique_ptr<MoeLayer> MoeLayer::create(std::shared_ptr<Workspace> workspace, const MoeLayerConfig& config) {
  if (!workspace) invalid("MoeLayer::create: the workspace is null");
  if (auto e = validate(config, workspace->ranks()); !e.empty()) invalid("MoE layer: " + e);
  if (auto e = workspace->fits(config); !e.empty()) invalid("MoE layer: " + e);
  return std::unique_ptr<MoeLayer>(new MoeLayer(std::move(workspace), config));
}

namespace {
// A layer with a workspace of its own, and for training its own saved state.
std::unique_ptr<MoeLayer> ownLayer(std::shared_ptr<Workspace> workspace, const MoeLayerConfig& config,
                                   DevicePtr* ownSaved) {
  auto layer = MoeLayer::create(std::move(workspace), config);
  if (config.training) *ownSaved = layer->workspace().device().allocate(size_t(layer->savedBytes()));
  return layer;
}
}  // namespace

std::vector<std::unique_ptr<MoeLayer>> MoeLayer::createLocal(const std::vector<Runtime*>& runtimes,
                                                             const MoeLayerConfig& config) {
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (auto& ws : Workspace::createLocal(runtimes, config)) {
    DevicePtr saved = 0;
    layers.push_back(ownLayer(ws, config, &saved));
    layers.back()->impl_->ownSaved = saved;
  }
  return layers;
}

std::unique_ptr<MoeLayer> MoeLayer::create(Runtime& runtime, const MoeLayerConfig& config, int rank, int ranks,
                                           const std::string& rendezvousPath) {
  DevicePtr saved = 0;
  auto layer = ownLayer(Workspace::create(runtime, config, rank, ranks, rendezvousPath), config, &saved);
  layer->impl_->ownSaved = saved;
  return layer;
}

void MoeLayer::forward(const ForwardArgs& a, StreamHandle stream) {
  const MoeLayerConfig& c = config_;
  const bool fp8 = isFp8(c);
  requireTokensInRange("forward", a.tokens, c);
  if (!a.w1 || !a.w2) invalid("forward: w1 and w2 must not be null (every rank computes its experts)");
  if (a.tokens > 0 && (!a.x || !a.topkIdx || !a.topkWeights || !a.y))
    invalid("forward: x, topk_idx, topk_weights and y must not be null when tokens > 0");
  if (fp8 && (!a.w1Scales || !a.w2Scales))
    invalid("forward: w1_scales and w2_scales must not be null (dtype fp8_e4m3: the weights' 128 x 128 block scales)");
  if (!fp8 && (a.xScales || a.w1Scales || a.w2Scales))
    invalid("forward: x_scales, w1_scales and w2_scales are for a dtype fp8_e4m3 layer; this one is bf16");
  for (const auto& [name, p] : {std::pair{"x", a.x}, {"y", a.y}, {"w1", a.w1}, {"w2", a.w2}})
    requireAligned("forward", name, p, 16, "16-byte vector accesses");
  requireAligned("forward", "topk_idx", a.topkIdx, c.topkIdxInt64 ? 8 : 4, "i32 / i64 loads");
  requireAligned("forward", "topk_weights", a.topkWeights, 4, "f32 loads");
  for (const auto& [name, p] : {std::pair{"x_scales", a.xScales}, {"w1_scales", a.w1Scales}, {"w2_scales", a.w2Scales}})
    requireAligned("forward", name, p, 4, "f32 loads");
  requireGridInBounds(impl_->grid);
  heap().requireUsable();
  Impl& m = *impl_;
  const int32_t dispatchLegs = legBits(m.dispatchLeg), combineLegs = legBits(m.combineLeg);

  const DevicePtr saved = c.training ? m.savedFor(a.saved, "forward") : 0;
  // The maps of w1 [E/R * 2I, H] and w2 [E/R * H, I] (bf16 or e4m3, as the kernels declare them), encoded per call
  // (a CUDA graph captures them by value) and before anything is enqueued: a driver error then leaves no prologue
  // waiting for a dispatch that never comes.
  const int64_t local = c.experts / ranks();
  const TensorMapBytes w1Map = m.map(Role::kDispatchNT, "map_b", a.w1, local * 2 * c.intermediate, c.hidden);
  const TensorMapBytes w2Map = m.map(Role::kCombineNT, "map_b", a.w2, local * c.hidden, c.intermediate);

  ProfileRange range("megamoe.forward");
  MEGAMOE_LOG(kDebug, "layer forward: rank " + std::to_string(rank()) + ", " + std::to_string(a.tokens) + " tokens");
  m.mark(m.events, size_t(Stage::kPrologue), stream);
  // FP8 given bf16 x: x quantised first (local work that nothing waits on).
  DevicePtr src = a.x, srcScales = a.xScales;
  if (fp8 && !a.xScales) {
    src = m.b.xCodes, srcScales = m.b.xScales;
    m.quantize(Role::kQuantizeX, a.x, src, srcScales, c.hidden, a.tokens, 0, stream, heap());
  }
  const DevicePtr idx = m.topkIdx32(c, a.topkIdx, a.tokens, stream, heap());
  m.prologue(idx, a.tokens, poolRows(c, ranks()), c.dropOverflow ? 1 : 0, abi::CallKind::kForward, stream, heap());
  // The dispatch and the combine (kernels/Kernels.h DispatchGemmSpec, GemmCombineSpec) run as cluster pairs on
  // sm_90a, bf16 and FP8: an even grid and push_blocks.
  const int32_t grid = m.pairGrid, push = m.pairPush;
  m.mark(m.events, size_t(Stage::kDispatchGemm), stream);
  KernelArgs dispatch = m.dispatchArgs(Role::kDispatchNT, dispatchLegs, idx, a.topkWeights, c.maxTokens, poolRows(c, ranks()));
  dispatch.ptr("src", src).ptr("weights", a.w1).ptr("extra", saved).ptr("out", m.b.act);
  dispatch.ptr("tickets", m.b.tickets).i32("push_blocks", push).i32("grid", grid);
  dispatch.tensorMap("map_a", m.dispatchPoolMap).tensorMap("map_b", w1Map);
  if (fp8)
    dispatch.ptr("src_scales", srcScales).ptr("pool_scales", m.b.poolScales).ptr("weight_scales", a.w1Scales);
  else
    dispatch.tensorMap("map_c", m.dispatchOutMap);
  m.launch(Role::kDispatchNT, uint32_t(grid), stream, dispatch, heap());
  // FP8: act quantised for L2, over the rows this rank received (pool_offsets[E/R], which the prologue wrote).
  if (fp8)
    m.quantize(Role::kQuantizeAct, m.b.act, m.b.actCodes, m.b.actScales, c.intermediate, poolRows(c, ranks()),
               m.b.poolOffsets + uint64_t(local) * 4, stream, heap());
  // Profiling: the combine's stage time is its own, not how much later the peer finished its dispatch (the rank
  // barrier of stage_begin; its counter zeroing repeats the prologue's: the other parity is idle in this call).
  if (m.profiling) m.stageBegin(stream, heap());
  m.mark(m.events, size_t(Stage::kGemmCombine), stream);
  KernelArgs combine = m.combineArgs(Role::kCombineNT, combineLegs, idx, a.topkWeights, a.tokens);
  combine.ptr("a", fp8 ? m.b.actCodes : m.b.act).ptr("b", a.w2).ptr("y", a.y).ptr("d_topk_weights", 0);
  combine.ptr("tickets", m.b.tickets + 8).i32("grid", grid).tensorMap("map_a", m.combineActMap);
  combine.tensorMap("map_b", w2Map);
  if (fp8) combine.ptr("a_scales", m.b.actScales).ptr("b_scales", a.w2Scales);
  m.launch(Role::kCombineNT, uint32_t(grid), stream, combine, heap());
  m.mark(m.events, size_t(Stage::kCount), stream);
  m.epochAdvance(stream, heap());
  if (!a.saved) m.lastForwardTokens = a.tokens;
}

void MoeLayer::backward(const BackwardArgs& a, StreamHandle stream) {
  const MoeLayerConfig& c = config_;
  Impl& m = *impl_;
  if (!c.training) invalid("backward: the layer was created without training (MoeLayerConfig::training)");
  requireTokensInRange("backward", a.tokens, c);
  const DevicePtr saved = m.savedFor(a.saved, "backward");
  if (!a.saved && m.lastForwardTokens < 0) invalid("backward: no forward to differentiate yet");
  if (!a.saved && a.tokens != m.lastForwardTokens)
    invalid("backward: tokens=" + std::to_string(a.tokens) + " differs from the last forward's tokens=" +
            std::to_string(m.lastForwardTokens));
  if (!a.w1 || !a.w2 || !a.dW1 || !a.dW2) invalid("backward: w1, w2, dW1 and dW2 must not be null");
  if (a.tokens > 0 && (!a.dy || !a.x || !a.topkIdx || !a.topkWeights || !a.dx || !a.dTopkWeights))
    invalid("backward: dy, x, topk_idx, topk_weights, dx and d_topk_weights must not be null when tokens > 0");
  for (const auto& [name, p] : {std::pair{"dy", a.dy}, {"x", a.x}, {"dx", a.dx}, {"w1", a.w1}, {"w2", a.w2},
                                {"dW1", a.dW1}, {"dW2", a.dW2}})
    requireAligned("backward", name, p, 16, "16-byte vector accesses");
  requireAligned("backward", "topk_idx", a.topkIdx, c.topkIdxInt64 ? 8 : 4, "i32 / i64 loads");
  requireAligned("backward", "topk_weights", a.topkWeights, 4, "f32 loads");
  requireAligned("backward", "d_topk_weights", a.dTopkWeights, 4, "f32 stores");
  requireGridInBounds(m.grid);
  heap().requireUsable();
  const Workspace::Buffers& r = m.b;
  const int64_t local = c.experts / ranks();
  const int32_t grid = int32_t(m.grid), rowGrid = int32_t(m.grid) * 8;
  const int32_t dispatchLegs = legBits(m.dispatchLeg), combineLegs = legBits(m.combineLeg);
  // The per-call maps (a CUDA graph captures them by value), encoded before anything is enqueued, as in forward():
  // w2 and w1 as K x N slabs of the dgrad dispatch and the dx combine, dW2 and dW1 as the TN stores' boxes.
  const TensorMapBytes w2Map = m.map(Role::kDispatchNN, "map_b", a.w2, local * c.hidden, c.intermediate);
  const TensorMapBytes dW2Map = m.map(Role::kWgradTN, "map_c", a.dW2, local * c.hidden, c.intermediate);
  const TensorMapBytes dW1Map = m.map(Role::kDispatchTN, "map_c", a.dW1, local * 2 * c.intermediate, c.hidden);
  const TensorMapBytes w1Map = m.map(Role::kCombineNN, "map_b", a.w1, local * 2 * c.intermediate, c.hidden);
  auto begin = [&] { m.stageBegin(stream, heap()); };
  auto advance = [&] { m.epochAdvance(stream, heap()); };
  // Stage times cover the stage's own kernels: not stage_begin's barrier, i.e. not how late a peer finished the
  // previous stage.
  auto start = [&](BackwardStage stage) { m.mark(m.backwardEvents, 2 * size_t(stage), stream); };
  auto end = [&](BackwardStage stage) { m.mark(m.backwardEvents, 2 * size_t(stage) + 1, stream); };

  ProfileRange range("megamoe.backward");
  MEGAMOE_LOG(kDebug, "layer backward: rank " + std::to_string(rank()) + ", " + std::to_string(a.tokens) + " tokens");
  // The forward's routing again (deterministic: the same pool rows for the same topk_idx on every rank), so that the
  // backward needs nothing of the forward but its saved h, whatever ran on the workspace in between.
  start(BackwardStage::kDgradDispatch);
  const DevicePtr idx = m.topkIdx32(c, a.topkIdx, a.tokens, stream, heap());
  m.prologue(idx, a.tokens, poolRows(c, ranks()), c.dropOverflow ? 2 : 0, abi::CallKind::kBackward, stream, heap());
  // dy re-dispatched; B is w2 [E/R * H, I] as K x N slabs. It runs as cluster pairs on sm_90a (DispatchGemmSpec).
  KernelArgs dgrad = m.dispatchArgs(Role::kDispatchNN, dispatchLegs, idx, a.topkWeights, c.maxTokens, poolRows(c, ranks()));
  dgrad.ptr("src", a.dy).ptr("weights", a.w2).ptr("extra", 0).ptr("out", m.b.act).ptr("tickets", m.b.tickets);
  dgrad.i32("push_blocks", m.pairPush).i32("grid", m.pairGrid).tensorMap("map_a", m.dgradPoolMap);
  dgrad.tensorMap("map_b", w2Map);
  dgrad.tensorMap("map_c", m.dispatchOutMap);
  m.launch(Role::kDispatchNN, uint32_t(m.pairGrid), stream, dgrad, heap());
  end(BackwardStage::kDgradDispatch);
  advance();
  start(BackwardStage::kSwigluBackward);
  KernelArgs swiglu = m.args(Role::kSwigluBwd);
  swiglu.ptr("g", m.b.act).ptr("h", saved).ptr("dh", m.b.dh).ptr("pool_w", r.poolW).ptr("pool_src", r.poolSrc);
  swiglu.ptr("rows_at", m.b.poolOffsets + uint64_t(local) * 4).ptr("dw", r.dw).i32("grid", rowGrid);
  m.launch(Role::kSwigluBwd, uint32_t(rowGrid), stream, swiglu, heap());
  end(BackwardStage::kSwigluBackward);
  start(BackwardStage::kWgradW2);
  KernelArgs wgrad(m.kernelSpecName(Role::kWgradTN));  // TN takes no split-K tail (kernels/Kernels.h): no scratch
  wgrad.ptr("a", r.pool).ptr("b", m.b.act).ptr("c", a.dW2).ptr("offsets", m.b.poolOffsets).ptr("tickets", m.b.tickets + 16);
  wgrad.ptr("split", 0).i32("max_split", 0).i32("grid", grid).tensorMap("map_a", m.wgradPoolMap).tensorMap("map_b", m.wgradActMap);
  wgrad.tensorMap("map_c", dW2Map);
  m.launch(Role::kWgradTN, m.grid, stream, wgrad, heap());
  end(BackwardStage::kWgradW2);
  begin();
  start(BackwardStage::kWgradW1Dispatch);
  KernelArgs wgradW1 = m.dispatchArgs(Role::kDispatchTN, dispatchLegs, idx, a.topkWeights, c.maxTokens, poolRows(c, ranks()));
  wgradW1.ptr("src", a.x).ptr("weights", a.w1).ptr("extra", m.b.dh).ptr("out", a.dW1).ptr("tickets", m.b.tickets);
  wgradW1.i32("push_blocks", m.pushBlocks).i32("grid", grid).tensorMap("map_a", m.wgradW1DhMap).tensorMap("map_b", m.wgradW1PoolMap);
  wgradW1.tensorMap("map_c", dW1Map);
  m.launch(Role::kDispatchTN, m.grid, stream, wgradW1, heap());
  end(BackwardStage::kWgradW1Dispatch);
  advance();
  begin();
  start(BackwardStage::kDgradCombine);
  // dx rows; B is w1 [E/R * 2I, H] as K x N slabs (kernels/Kernels.h GemmCombineSpec).
  KernelArgs dgradCombine = m.combineArgs(Role::kCombineNN, combineLegs, idx, a.topkWeights, a.tokens);
  dgradCombine.ptr("a", m.b.dh).ptr("b", a.w1).ptr("y", a.dx).ptr("d_topk_weights", a.dTopkWeights);
  dgradCombine.ptr("tickets", m.b.tickets + 8).i32("grid", grid).tensorMap("map_a", m.dgradDhMap);
  dgradCombine.tensorMap("map_b", w1Map);
  m.launch(Role::kCombineNN, m.grid, stream, dgradCombine, heap());
  end(BackwardStage::kDgradCombine);
  advance();
}

void MoeLayer::setLegs(Leg dispatch, Leg combine) {
  impl_->dispatchLeg = dispatch;
  impl_->combineLeg = combine;
}

void MoeLayer::setProfiling(bool on) { impl_->profiling = on; }

std::array<float, size_t(Stage::kCount)> MoeLayer::stageMilliseconds() {
  return impl_->elapsed<size_t(Stage::kCount)>(impl_->events, 1);
}

std::array<float, size_t(BackwardStage::kCount)> MoeLayer::backwardStageMilliseconds() {
  return impl_->elapsed<size_t(BackwardStage::kCount)>(impl_->backwardEvents, 2);
}

uint64_t MoeLayer::keptBytesWithoutRecompute() const {
  if (!config_.training) return 0;
  return keptBytes() + uint64_t(poolRows(config_, ranks())) * uint64_t(config_.hidden) * kBf16;
}

}  // namespace megamoe
