// The MoE layer (see MoeLayer.h): heap and buffer layout, kernel loading, and the launches of one forward and one
// backward. Kernel names, constants and argument orders mirror kernels/Kernels.h (DispatchPrologueSpec,
// DispatchGemmSpec, GemmCombineSpec, SwigluBwdSpec, StageBeginSpec, GroupedGemmSpec, EpochAdvanceSpec); the
// runtime-JIT tier checks kernelSpecs() against kernels::layerKernels.
#include "megamoe/MoeLayer.h"

#include <algorithm>

#include "megamoe/Error.h"
#include "megamoe/Runtime.h"

namespace megamoe {

namespace {

constexpr int64_t kBf16 = 2;
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

[[noreturn]] void invalid(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

// GroupedGemmSpec::Layout values (kernels/Kernels.h).
constexpr int64_t kLayoutNT = 0, kLayoutNN = 1, kLayoutTN = 2;
// dispatch_prologue's blocks (each counts 1/16 of the picks; all resident, they meet once) and its scratch: meeting
// counters (4 i32: DispatchPrologueSpec::kScratchHeader in kernels/Kernels.h) and the blocks' counts per expert.
constexpr int32_t kPrologueBlocks = 16;
int64_t prologueScratchBytes(int64_t experts) { return (4 + int64_t(kPrologueBlocks) * experts) * 4; }
// Indices into MoeLayer::kernelSpecs() (and Impl::kernels).
enum KernelIndex : size_t {
  kPrologue, kDispatchNT, kCombineNT, kEpochAdvance, kStageBegin,  // forward (stage_begin: profiling, backward)
  kDispatchNN, kSwigluBwd, kWgradTN, kDispatchTN, kCombineNN,        // backward (training)
};

// Rows of the receive pool: every rank may send every pick to one owner.
int64_t poolRows(const MoeLayerConfig& c, int ranks) { return int64_t(ranks) * c.maxTokens * c.topk; }

// The heap regions' device addresses on one rank (kernel arguments, so non-const).
// Looked up once per layer: a forward passes them as kernel arguments, by address.
struct Regions {
  uint64_t ctx = 0, counts = 0, flags = 0, arrivals = 0, done = 0, pool = 0, poolSrc = 0, poolW = 0, comb = 0, dw = 0,
           barrier = 0;
  static Regions of(const SymmetricHeap& h) {
    return {h.contextAddress(), h.regionAddress("moe.counts"), h.regionAddress("moe.flags"),
            h.regionAddress("moe.arrivals"), h.regionAddress("moe.done"), h.regionAddress("moe.pool"),
            h.regionAddress("moe.pool_src"), h.regionAddress("moe.pool_w"), h.regionAddress("moe.comb"),
            h.regionAddress("moe.dw"), h.regionAddress("moe.barrier")};
  }
};

}  // namespace

std::string MoeLayer::validate(const MoeLayerConfig& c, int ranks) {
  if (ranks < 1 || ranks > abi::kMaxRanks)
    return "ranks=" + std::to_string(ranks) + " must be 1.." + std::to_string(abi::kMaxRanks) + " (one node)";
  if (c.experts < 1 || c.experts > 1024 || c.experts % ranks != 0)
    return "experts=" + std::to_string(c.experts) + " must be 1..1024 and a multiple of ranks=" + std::to_string(ranks);
  if (c.topk < 1 || c.topk > c.experts) return "topk=" + std::to_string(c.topk) + " must be 1..experts";
  if (auto e = multipleOf("hidden", c.hidden, 128, "the L2 tile width and the L1 K step"); !e.empty()) return e;
  if (auto e = multipleOf("intermediate", c.intermediate, 128, "the gate|up halves of an L1 tile"); !e.empty())
    return e;
  if (c.maxTokens < 1) return "max_tokens=" + std::to_string(c.maxTokens) + " must be >= 1";
  if (poolRows(c, ranks) >= kMaxPicks)
    return "ranks * max_tokens * topk = " + std::to_string(poolRows(c, ranks)) + " must be < 2^24 (pool row ids)";
  if (c.maxTokens * (c.hidden / 8) >= (int64_t(1) << 31))
    return "max_tokens * hidden / 8 must be < 2^31 (32-bit vector indices of the combine's weighted sum)";
  if (c.swigluClampMilli < 0) return "swiglu_clamp_milli must be >= 0 (0 = no clamp)";
  if (c.dtype != DType::kBf16) return "dtype must be bf16: the kernels are generated for bf16 only";
  return "";
}

std::vector<RegionSpec> MoeLayer::heapRegions(const MoeLayerConfig& c, int ranks) {
  const uint64_t R = uint64_t(ranks), E = uint64_t(c.experts), local = E / R;
  return {
      {"moe.counts", 2 * R * E * 4, 16},                      // [2][R][E] i32: the all-gathered pick counts
      {"moe.flags", R * 8, 16},                               // [R] u64: the prologue's exchange flags
      {"moe.arrivals", 2 * R * local * 8, 16},                // [2][R][E/R] i64: rows arrived per (source, expert)
      {"moe.done", 2 * R * 8, 16},                            // [2][R] i64: combine blocks done per owner
      {"moe.pool", uint64_t(poolRows(c, ranks)) * uint64_t(c.hidden) * kBf16, 256},  // received x rows
      {"moe.pool_src", uint64_t(poolRows(c, ranks)) * 4, 16},                          // [rows] source * 2^24 + pick
      {"moe.pool_w", uint64_t(poolRows(c, ranks)) * 4, 16},                            // [rows] routing weights
      {"moe.comb", uint64_t(c.maxTokens * c.topk * c.hidden) * kBf16, 256},            // L2 rows back home
      {"moe.dw", uint64_t(c.maxTokens * c.topk) * 4, 16},                              // d topk_weights at home
      {"moe.barrier", R * 8, 16},                                                      // backward stages meet
  };
}

std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> MoeLayer::kernelSpecs(
    const MoeLayerConfig& c, int ranks) {
  const int64_t R = ranks, E = c.experts, k = c.topk, H = c.hidden, I = c.intermediate;
  auto dispatch = [&](int64_t layout, int64_t saveH, int64_t dedup = 0) {
    return std::make_pair(std::string("dispatch_grouped_gemm"),
                          std::vector<std::pair<std::string, int64_t>>{{"E", E}, {"ranks", R}, {"topk", k}, {"H", H},
                                                                       {"I", I}, {"clamp_milli", c.swigluClampMilli},
                                                                       {"layout", layout}, {"save_h", saveH},
                                                                       {"dedup", dedup}});
  };
  auto combine = [&](int64_t layout) {
    return std::make_pair(std::string("grouped_gemm_combine"),
                          std::vector<std::pair<std::string, int64_t>>{
                              {"E", E}, {"ranks", R}, {"topk", k}, {"H", H}, {"I", I}, {"layout", layout}});
  };
  // Order: the Kernel* indices below.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> out = {
      {"dispatch_prologue", {{"E", E}, {"topk", k}, {"ranks", R}}},
      dispatch(kLayoutNT, c.training ? 1 : 0, c.dedupTokens ? 1 : 0),
      combine(kLayoutNT),
      {"epoch_advance", {}},
      {"stage_begin", {{"E", E}, {"ranks", R}}},
  };
  if (c.training) {
    out.push_back(dispatch(kLayoutNN, 0));
    out.push_back({"swiglu_bwd", {{"I", I}, {"clamp_milli", c.swigluClampMilli}}});
    // dW2 on the TMA engine (sm_90a; gfx950 builds the single-role kernel and ignores the two map arguments)
    out.push_back({"grouped_gemm_tn_tma", {{"E", E / R}, {"N", I}, {"M", H}, {"pairs", 0}}});
    out.push_back(dispatch(kLayoutTN, 0));
    out.push_back(combine(kLayoutNN));
  }
  return out;
}

struct MoeLayer::Impl {
  Runtime& runtime;
  Device& device;
  std::vector<std::shared_ptr<const Kernel>> kernels;  // in kernelSpecs() order (KernelIndex)
  Regions regions;
  // Local buffers. h (training) is kept by the forward and becomes dh in the backward; act holds g, then w * act.
  DevicePtr prologueScratch = 0;
  DevicePtr sendSlot = 0, sendList = 0, sendOff = 0, sendBase = 0, poolOffsets = 0, act = 0, h = 0, tickets = 0,
            routeEpoch = 0;
  Leg dispatchLeg = Leg::kFused, combineLeg = Leg::kFused;
  bool profiling = false;
  std::array<EventHandle, size_t(Stage::kCount) + 1> events{};
  std::array<EventHandle, 2 * size_t(BackwardStage::kCount)> backwardEvents{};  // start and end of each stage
  uint32_t grid = 0;
  int32_t pushBlocks = 0;
  // The cluster-pair kernels (the dispatches and the forward combine on sm_90a) launch whole pairs of blocks, the
  // pushing ones included.
  int32_t pairGrid = 0, pairPush = 0;
  int64_t lastForwardTokens = -1;  // what backward() must match; -1 before the first forward
  // The backward's TN tensor maps (kernels/Kernels.h: grouped_gemm_tn_tma for dW2, dispatch_grouped_gemm TN for
  // dW1): the pool (dy rows, then x rows), act and dh, fixed for the layer; zeros (read as unused pointers) where
  // the backend has no TMA.
  using TensorMap = std::array<uint8_t, 128>;
  TensorMap poolMap{}, actMap{}, dhMap{}, noMap{};
  // The dx combine's A (dh), the forward dispatch's (the pool's rows) and the forward combine's (act) in 64-column x
  // 128-row boxes (grouped_gemm_{nn,nt}_tma's A).
  TensorMap dhRowsMap{}, poolRowsMap{}, actRowsMap{};
  // A bf16 [rows, cols] matrix in boxes of 64 columns x boxRows rows.
  TensorMap boxes(DevicePtr base, int64_t rows, int64_t cols, uint32_t boxRows) {
    if (device.kind() != BackendKind::kCuda) return TensorMap{};
    const uint64_t dims[2] = {uint64_t(cols), uint64_t(rows)}, strides[1] = {uint64_t(cols) * 2};
    const uint32_t box[2] = {64, boxRows};
    return device.encodeTensorMapBf16(base, 2, dims, strides, box);
  }
  TensorMap boxes64(DevicePtr base, int64_t rows, int64_t cols) { return boxes(base, rows, cols, 64); }

  Impl(Runtime& rt) : runtime(rt), device(*rt.device()) {}
  ~Impl() {
    try {
      for (DevicePtr p :
           {sendSlot, sendList, sendOff, sendBase, poolOffsets, act, h, tickets, routeEpoch, prologueScratch})
        device.free(p);
      for (EventHandle e : events)
        if (e) device.destroyEvent(e);
      for (EventHandle e : backwardEvents)
        if (e) device.destroyEvent(e);
    } catch (...) {
    }
  }
  void launch(KernelIndex index, uint32_t blocks, StreamHandle stream, std::vector<void*> params,
              const SymmetricHeap& heap) {
    const Kernel& kernel = *kernels.at(index);
    LaunchDims dims;
    dims.grid = {blocks, 1, 1};
    dims.block = {uint32_t(kernel.metadata().blockThreads), 1, 1};
    dims.sharedBytes = uint32_t(kernel.metadata().sharedBytes);
    runtime.launch(kernel, dims, stream, params.data(), &heap);
  }
  // stage_begin: the other parity's counters zeroed, then all ranks meet.
  void stageBegin(StreamHandle stream, const SymmetricHeap& heap) {
    launch(kStageBegin, 1, stream, {&regions.ctx, &regions.arrivals, &regions.done, &regions.barrier}, heap);
  }
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

MoeLayer::MoeLayer(Runtime& runtime, const MoeLayerConfig& config, std::unique_ptr<SymmetricHeap> heap)
    : config_(config), heap_(std::move(heap)), impl_(std::make_unique<Impl>(runtime)) {
  Impl& m = *impl_;
  const int ranks = heap_->nranks();
  for (const auto& [name, spec] : kernelSpecs(config, ranks)) {
    cache::KernelKey key{name, spec, m.device.target(), defaultTargetOptions(m.device.target()), /*any*/ ""};
    std::string text;
    for (const auto& [k, v] : spec) text += (text.empty() ? "" : ",") + k + "=" + std::to_string(v);
    m.kernels.push_back(runtime.loadKernel(key, "megamoe-cache generate --kernel " + name +
                                                    (text.empty() ? "" : " --spec " + text) + " --targets " +
                                                    m.device.target()));
  }
  const int64_t picks = config.maxTokens * config.topk, E = config.experts, local = E / ranks;
  auto alloc = [&](int64_t bytes) { return m.device.allocate(size_t(std::max<int64_t>(bytes, 16))); };
  m.sendSlot = alloc(picks * 4);
  m.sendList = alloc(picks * 4);
  m.sendOff = alloc((E + 1) * 4);
  m.sendBase = alloc(E * 4);
  m.poolOffsets = alloc((local + 1) * 4);
  m.act = alloc(poolRows(config, ranks) * config.intermediate * kBf16);
  if (config.training) m.h = alloc(poolRows(config, ranks) * 2 * config.intermediate * kBf16);
  m.routeEpoch = alloc(8);
  m.regions = Regions::of(*heap_);
  // Tile tickets, i32 [2] each: the dispatch, the combine, the dW2 GEMM; zero between launches (the kernels reset
  // them).
  m.tickets = alloc(24);
  m.device.memsetZero(m.tickets, 24, nullptr);
  const int64_t scratchBytes = prologueScratchBytes(E);
  m.prologueScratch = alloc(scratchBytes);  // zero between launches (the prologue resets its counters)
  m.device.memsetZero(m.prologueScratch, size_t(scratchBytes), nullptr);
  m.device.synchronize(nullptr);
  // One block per SM, all resident: the combine's blocks wait for each other (see docs/decisions/fused-dispatch.md).
  m.grid = uint32_t(m.device.multiprocessors());
  m.pushBlocks = std::min<int32_t>(runtime.env().pushBlocks, int32_t(m.grid));
  m.pairGrid = int32_t(m.grid) & ~1;
  m.pairPush = std::min<int32_t>((m.pushBlocks + 1) & ~1, m.pairGrid);
  m.poolRowsMap = m.boxes(m.regions.pool, poolRows(config, ranks), config.hidden, 128);
  m.actRowsMap = m.boxes(m.act, poolRows(config, ranks), config.intermediate, 128);
  if (config.training) {
    m.dhRowsMap = m.boxes(m.h, poolRows(config, ranks), 2 * config.intermediate, 128);
    m.poolMap = m.boxes64(m.regions.pool, poolRows(config, ranks), config.hidden);
    m.actMap = m.boxes64(m.act, poolRows(config, ranks), config.intermediate);
    m.dhMap = m.boxes64(m.h, poolRows(config, ranks), 2 * config.intermediate);
  }
  for (EventHandle& e : m.events) e = m.device.createEvent();
  for (EventHandle& e : m.backwardEvents) e = m.device.createEvent();
}

MoeLayer::~MoeLayer() = default;

std::vector<std::unique_ptr<MoeLayer>> MoeLayer::createLocal(const std::vector<Runtime*>& runtimes,
                                                             const MoeLayerConfig& config) {
  if (runtimes.empty()) invalid("createLocal needs at least one runtime");
  if (auto e = validate(config, int(runtimes.size())); !e.empty()) invalid("MoE layer: " + e);
  std::vector<std::shared_ptr<Device>> devices;
  for (Runtime* rt : runtimes) {
    if (!rt) invalid("createLocal: a runtime is null");
    devices.push_back(rt->device());
  }
  auto heaps = SymmetricHeap::createSingleProcess(devices, heapRegions(config, int(runtimes.size())),
                                                  runtimes[0]->env());
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (size_t i = 0; i < runtimes.size(); ++i)
    layers.push_back(std::unique_ptr<MoeLayer>(new MoeLayer(*runtimes[i], config, std::move(heaps[i]))));
  return layers;
}

std::unique_ptr<MoeLayer> MoeLayer::create(Runtime& runtime, const MoeLayerConfig& config, int rank, int ranks,
                                           const std::string& rendezvousPath) {
  if (auto e = validate(config, ranks); !e.empty()) invalid("MoE layer: " + e);
  // Every rank must build the same layer; the heap layout alone misses most fields (intermediate, training, ...).
  // "kernels" catches ranks whose builds derive different kernels from the same fields.
  std::string kernels;
  for (const auto& [name, spec] : kernelSpecs(config, ranks)) {
    kernels += (kernels.empty() ? "" : " ") + name + "(";
    for (size_t i = 0; i < spec.size(); ++i)
      kernels += (i ? "," : "") + spec[i].first + "=" + std::to_string(spec[i].second);
    kernels += ")";
  }
  const RendezvousAgreement agreement = {
      {"hidden", std::to_string(config.hidden)},
      {"intermediate", std::to_string(config.intermediate)},
      {"experts", std::to_string(config.experts)},
      {"topk", std::to_string(config.topk)},
      {"max_tokens", std::to_string(config.maxTokens)},
      {"swiglu_clamp_milli", std::to_string(config.swigluClampMilli)},
      {"training", config.training ? "true" : "false"},
      {"dtype", config.dtype == DType::kBf16 ? "bf16" : std::to_string(int(config.dtype))},
      {"dedup_tokens", config.dedupTokens ? "true" : "false"},
      {"kernels", kernels},
  };
  auto heap = runtime.createHeap(heapRegions(config, ranks), rank, ranks, rendezvousPath, agreement);
  return std::unique_ptr<MoeLayer>(new MoeLayer(runtime, config, std::move(heap)));
}

void MoeLayer::forward(const ForwardArgs& a, StreamHandle stream) {
  const MoeLayerConfig& c = config_;
  if (a.tokens < 0 || a.tokens > c.maxTokens)
    invalid("forward: tokens=" + std::to_string(a.tokens) + " must be in [0, max_tokens=" +
            std::to_string(c.maxTokens) + "]");
  if (!a.w1 || !a.w2) invalid("forward: w1 and w2 must not be null (every rank computes its experts)");
  if (a.tokens > 0 && (!a.x || !a.topkIdx || !a.topkWeights || !a.y))
    invalid("forward: x, topk_idx, topk_weights and y must not be null when tokens > 0");
  for (DevicePtr p : {a.x, a.y, a.w1, a.w2})
    if (p % 16 != 0) invalid("forward: x, y, w1 and w2 must be 16-byte aligned (16-byte vector accesses)");
  heap_->requireUsable();
  Impl& m = *impl_;
  Regions& r = m.regions;
  uint64_t x = a.x, idx = a.topkIdx, weights = a.topkWeights, w1 = a.w1, w2 = a.w2, y = a.y, none = 0;
  int32_t tokens = int32_t(a.tokens), recvStride = int32_t(c.maxTokens);
  int32_t dispatchLegs = legBits(m.dispatchLeg), combineLegs = legBits(m.combineLeg);
  uint64_t tickets0 = m.tickets, tickets1 = m.tickets + 8;

  m.mark(m.events, size_t(Stage::kPrologue), stream);
  int32_t prologueBlocks = kPrologueBlocks;
  m.launch(kPrologue, uint32_t(prologueBlocks), stream,
           {&r.ctx, &idx, &tokens, &r.counts, &r.flags, &m.sendSlot, &m.poolOffsets, &m.sendList, &m.sendOff,
            &m.sendBase, &r.arrivals, &r.done, &m.routeEpoch, &m.prologueScratch, &prologueBlocks},
           *heap_);
  // The dispatch and the combine (kernels/Kernels.h DispatchGemmSpec, GemmCombineSpec) run as cluster pairs on
  // sm_90a (m.pairGrid, m.pairPush); w1 [E/R * 2I, H] and w2 [E/R * H, I] in 64 x 128 boxes, encoded per call (a
  // CUDA graph captures them by value).
  const int64_t local = c.experts / ranks();
  Impl::TensorMap w1Rows = m.boxes(w1, local * 2 * c.intermediate, c.hidden, 128);
  Impl::TensorMap w2Rows = m.boxes(w2, local * c.hidden, c.intermediate, 128);
  m.mark(m.events, size_t(Stage::kDispatchGemm), stream);
  m.launch(kDispatchNT, uint32_t(m.pairGrid), stream,
           {&r.ctx, &x, &weights, &m.sendList, &m.sendOff, &m.sendBase, &r.counts, &r.arrivals, &m.routeEpoch,
            &r.pool, &r.poolSrc, &r.poolW, &m.poolOffsets, &w1, c.training ? &m.h : &none, &m.act, &tickets0,
            &m.pairPush, &m.pairGrid, &dispatchLegs, &idx, &recvStride, m.poolRowsMap.data(), w1Rows.data()},
           *heap_);
  // Profiling: the combine's stage time is its own, not how much later the peer finished its dispatch (the rank
  // barrier of stage_begin; its counter zeroing repeats the prologue's: the other parity is idle in this call).
  if (m.profiling) m.stageBegin(stream, *heap_);
  m.mark(m.events, size_t(Stage::kGemmCombine), stream);
  m.launch(kCombineNT, uint32_t(m.pairGrid), stream,
           {&r.ctx, &m.act, &w2, &m.poolOffsets, &r.poolSrc, &r.comb, &r.done, &idx, &weights, &tokens, &y, &r.dw,
            &none, &tickets1, &m.pairGrid, &combineLegs, m.actRowsMap.data(), w2Rows.data()},
           *heap_);
  m.mark(m.events, size_t(Stage::kCount), stream);
  m.launch(kEpochAdvance, 1, stream, {&r.ctx}, *heap_);
  m.lastForwardTokens = a.tokens;
}

void MoeLayer::backward(const BackwardArgs& a, StreamHandle stream) {
  const MoeLayerConfig& c = config_;
  Impl& m = *impl_;
  if (!c.training) invalid("backward: the layer was created without training (MoeLayerConfig::training)");
  if (m.lastForwardTokens < 0) invalid("backward: no forward to differentiate yet");
  if (a.tokens != m.lastForwardTokens)
    invalid("backward: tokens=" + std::to_string(a.tokens) + " differs from the last forward's tokens=" +
            std::to_string(m.lastForwardTokens));
  if (!a.w1 || !a.w2 || !a.dW1 || !a.dW2) invalid("backward: w1, w2, dW1 and dW2 must not be null");
  if (a.tokens > 0 && (!a.dy || !a.x || !a.topkIdx || !a.topkWeights || !a.dx || !a.dTopkWeights))
    invalid("backward: dy, x, topk_idx, topk_weights, dx and d_topk_weights must not be null when tokens > 0");
  for (DevicePtr p : {a.dy, a.x, a.dx, a.w1, a.w2, a.dW1, a.dW2})
    if (p % 16 != 0) invalid("backward: dy, x, dx, w1, w2, dW1 and dW2 must be 16-byte aligned");
  heap_->requireUsable();
  Regions& r = m.regions;
  const int64_t local = c.experts / ranks();
  uint64_t dy = a.dy, x = a.x, idx = a.topkIdx, weights = a.topkWeights, w1 = a.w1, w2 = a.w2, dx = a.dx,
           dTopk = a.dTopkWeights, dW1 = a.dW1, dW2 = a.dW2, none = 0, rowsAt = m.poolOffsets + uint64_t(local) * 4;
  int32_t tokens = int32_t(a.tokens), grid = int32_t(m.grid), push = m.pushBlocks, recvStride = int32_t(c.maxTokens);
  int32_t rowGrid = int32_t(m.grid) * 8, dispatchLegs = legBits(m.dispatchLeg), combineLegs = legBits(m.combineLeg);
  uint64_t tickets0 = m.tickets, tickets1 = m.tickets + 8, tickets2 = m.tickets + 16;
  // The dx combine's B (kernels/Kernels.h GemmCombineSpec): w1 [E/R * 2I, H] as K x N slabs, encoded per call (a
  // CUDA graph captures it by value).
  Impl::TensorMap w1Map = m.boxes64(w1, local * 2 * c.intermediate, c.hidden);
  // The dgrad dispatch's B: w2 [E/R * H, I] as K x N slabs. It runs as cluster pairs on sm_90a (DispatchGemmSpec).
  Impl::TensorMap w2Map = m.boxes64(w2, local * c.hidden, c.intermediate);
  auto begin = [&] { m.stageBegin(stream, *heap_); };
  auto advance = [&] { m.launch(kEpochAdvance, 1, stream, {&r.ctx}, *heap_); };
  // Stage times cover the stage's own kernels: not stage_begin's barrier, i.e. not how late a peer finished the
  // previous stage.
  auto start = [&](BackwardStage stage) { m.mark(m.backwardEvents, 2 * size_t(stage), stream); };
  auto end = [&](BackwardStage stage) { m.mark(m.backwardEvents, 2 * size_t(stage) + 1, stream); };

  begin();
  start(BackwardStage::kDgradDispatch);
  m.launch(kDispatchNN, uint32_t(m.pairGrid), stream,
           {&r.ctx, &dy, &weights, &m.sendList, &m.sendOff, &m.sendBase, &r.counts, &r.arrivals, &m.routeEpoch,
            &r.pool, &r.poolSrc, &r.poolW, &m.poolOffsets, &w2, &none, &m.act, &tickets0, &m.pairPush, &m.pairGrid,
            &dispatchLegs, &idx, &recvStride, m.poolRowsMap.data(), w2Map.data()},
           *heap_);
  end(BackwardStage::kDgradDispatch);
  advance();
  start(BackwardStage::kSwigluBackward);
  m.launch(kSwigluBwd, uint32_t(rowGrid), stream,
           {&r.ctx, &m.act, &m.h, &r.poolW, &r.poolSrc, &rowsAt, &r.dw, &rowGrid}, *heap_);
  end(BackwardStage::kSwigluBackward);
  start(BackwardStage::kWgradW2);
  uint64_t noSplit = 0;  // TN takes no split-K tail (kernels/Kernels.h): no scratch, max_split 0
  int32_t maxSplit = 0;
  m.launch(kWgradTN, m.grid, stream,
           {&r.pool, &m.act, &dW2, &m.poolOffsets, &tickets2, &noSplit, &maxSplit, &grid, m.poolMap.data(),
            m.actMap.data()},
           *heap_);
  end(BackwardStage::kWgradW2);
  begin();
  start(BackwardStage::kWgradW1Dispatch);
  m.launch(kDispatchTN, m.grid, stream,
           {&r.ctx, &x, &weights, &m.sendList, &m.sendOff, &m.sendBase, &r.counts, &r.arrivals, &m.routeEpoch,
            &r.pool, &r.poolSrc, &r.poolW, &m.poolOffsets, &w1, &m.h, &dW1, &tickets0, &push, &grid, &dispatchLegs,
            &idx, &recvStride, m.dhMap.data(), m.poolMap.data()},
           *heap_);
  end(BackwardStage::kWgradW1Dispatch);
  advance();
  begin();
  start(BackwardStage::kDgradCombine);
  m.launch(kCombineNN, m.grid, stream,
           {&r.ctx, &m.h, &w1, &m.poolOffsets, &r.poolSrc, &r.comb, &r.done, &idx, &weights, &tokens, &dx, &r.dw,
            &dTopk, &tickets1, &grid, &combineLegs, m.dhRowsMap.data(), w1Map.data()},
           *heap_);
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

uint64_t MoeLayer::keptBytes() const {
  const MoeLayerConfig& c = config_;
  if (!c.training) return 0;
  const uint64_t rows = uint64_t(poolRows(c, ranks())), picks = uint64_t(c.maxTokens * c.topk),
                 E = uint64_t(c.experts), local = E / uint64_t(ranks());
  // h, then the routing: send_slot, send_list, send_off, send_base, pool_offsets, pool_src, pool_w.
  return rows * uint64_t(2 * c.intermediate) * kBf16 + picks * 8 + (E + 1) * 4 + E * 4 + (local + 1) * 4 + rows * 8;
}

uint64_t MoeLayer::keptBytesWithoutRecompute() const {
  if (!config_.training) return 0;
  return keptBytes() + uint64_t(poolRows(config_, ranks())) * uint64_t(config_.hidden) * kBf16;
}

uint64_t MoeLayer::activationBytes() const {
  const MoeLayerConfig& c = config_;
  const uint64_t rows = uint64_t(poolRows(c, ranks()));
  return rows * uint64_t(c.hidden + c.intermediate + (c.training ? 2 * c.intermediate : 0)) * kBf16 +
         uint64_t(c.maxTokens * c.topk * c.hidden) * kBf16;
}

}  // namespace megamoe
