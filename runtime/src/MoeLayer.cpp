// The MoE layer (see MoeLayer.h): heap and buffer layout, kernel loading, and the launches of one forward.
// Kernel names, constants and argument orders mirror kernels/Kernels.h (DispatchPrologueSpec, DispatchGemmSpec,
// GemmCombineSpec, EpochAdvanceSpec); the codegen tier checks kernelSpecs() against kernels::layerKernels.
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

// Rows of the receive pool: every rank may send every pick to one owner.
int64_t poolRows(const MoeLayerConfig& c, int ranks) { return int64_t(ranks) * c.maxTokens * c.topk; }

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
      {"moe.comb", uint64_t(c.maxTokens * c.topk * c.hidden) * kBf16, 256},            // L2 rows back home
  };
}

std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> MoeLayer::kernelSpecs(
    const MoeLayerConfig& c, int ranks) {
  const int64_t R = ranks;
  return {
      {"dispatch_prologue", {{"E", c.experts}, {"topk", c.topk}, {"ranks", R}}},
      {"dispatch_grouped_gemm",
       {{"E", c.experts}, {"ranks", R}, {"topk", c.topk}, {"H", c.hidden}, {"I", c.intermediate},
        {"clamp_milli", c.swigluClampMilli}}},
      {"grouped_gemm_combine",
       {{"E", c.experts}, {"ranks", R}, {"topk", c.topk}, {"H", c.hidden}, {"I", c.intermediate}}},
      {"epoch_advance", {}},
  };
}

struct MoeLayer::Impl {
  Runtime& runtime;
  Device& device;
  std::shared_ptr<const Kernel> prologue, dispatchGemm, gemmCombine, epochAdvance;
  // Local buffers.
  DevicePtr sendSlot = 0, sendList = 0, sendOff = 0, sendBase = 0, poolOffsets = 0, act = 0, tickets = 0;
  Leg dispatchLeg = Leg::kFused, combineLeg = Leg::kFused;
  bool profiling = false;
  std::array<EventHandle, size_t(Stage::kCount) + 1> events{};
  uint32_t grid = 0;
  int32_t pushBlocks = 0;

  Impl(Runtime& rt) : runtime(rt), device(*rt.device()) {}
  ~Impl() {
    try {
      for (DevicePtr p : {sendSlot, sendList, sendOff, sendBase, poolOffsets, act, tickets}) device.free(p);
      for (EventHandle e : events)
        if (e) device.destroyEvent(e);
    } catch (...) {
    }
  }
  void launch(const Kernel& kernel, uint32_t blocks, StreamHandle stream, std::vector<void*> params,
              const SymmetricHeap& heap) {
    LaunchDims dims;
    dims.grid = {blocks, 1, 1};
    dims.block = {uint32_t(kernel.metadata().blockThreads), 1, 1};
    dims.sharedBytes = uint32_t(kernel.metadata().sharedBytes);
    runtime.launch(kernel, dims, stream, params.data(), &heap);
  }
  void mark(Stage stage, StreamHandle stream) {
    if (profiling) device.recordEvent(events[size_t(stage)], stream);
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
    auto kernel = runtime.loadKernel(key, "megamoe-cache generate --kernel " + name +
                                              (text.empty() ? "" : " --spec " + text) + " --targets " +
                                              m.device.target());
    if (name == "dispatch_prologue") m.prologue = kernel;
    else if (name == "dispatch_grouped_gemm") m.dispatchGemm = kernel;
    else if (name == "grouped_gemm_combine") m.gemmCombine = kernel;
    else m.epochAdvance = kernel;
  }
  const int64_t picks = config.maxTokens * config.topk, E = config.experts, local = E / ranks;
  auto alloc = [&](int64_t bytes) { return m.device.allocate(size_t(std::max<int64_t>(bytes, 16))); };
  m.sendSlot = alloc(picks * 4);
  m.sendList = alloc(picks * 4);
  m.sendOff = alloc((E + 1) * 4);
  m.sendBase = alloc(E * 4);
  m.poolOffsets = alloc((local + 1) * 4);
  m.act = alloc(poolRows(config, ranks) * config.intermediate * kBf16);
  m.tickets = alloc(16);  // [2] per fused kernel, zero between launches (the kernels reset them)
  m.device.memsetZero(m.tickets, 16, nullptr);
  m.device.synchronize(nullptr);
  // One block per SM, all resident: the combine's blocks wait for each other (see docs/decisions/fused-dispatch.md).
  m.grid = uint32_t(m.device.multiprocessors());
  m.pushBlocks = std::min<int32_t>(runtime.env().pushBlocks, int32_t(m.grid));
  for (EventHandle& e : m.events) e = m.device.createEvent();
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
  auto heap = runtime.createHeap(heapRegions(config, ranks), rank, ranks, rendezvousPath);
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
  SymmetricHeap& h = *heap_;
  uint64_t ctx = h.contextAddress(), counts = h.regionAddress("moe.counts"), flags = h.regionAddress("moe.flags"),
           arrivals = h.regionAddress("moe.arrivals"), done = h.regionAddress("moe.done"),
           pool = h.regionAddress("moe.pool"), poolSrc = h.regionAddress("moe.pool_src"),
           comb = h.regionAddress("moe.comb");
  uint64_t x = a.x, idx = a.topkIdx, weights = a.topkWeights, w1 = a.w1, w2 = a.w2, y = a.y;
  int32_t tokens = int32_t(a.tokens), grid = int32_t(m.grid), push = m.pushBlocks;
  int32_t dispatchLegs = legBits(m.dispatchLeg), combineLegs = legBits(m.combineLeg);
  uint64_t tickets0 = m.tickets, tickets1 = m.tickets + 8;

  m.mark(Stage::kPrologue, stream);
  m.launch(*m.prologue, 1, stream,
           {&ctx, &idx, &tokens, &counts, &flags, &m.sendSlot, &m.poolOffsets, &m.sendList, &m.sendOff, &m.sendBase,
            &arrivals, &done},
           h);
  m.mark(Stage::kDispatchGemm, stream);
  m.launch(*m.dispatchGemm, m.grid, stream,
           {&ctx, &x, &m.sendList, &m.sendOff, &m.sendBase, &counts, &arrivals, &pool, &poolSrc, &m.poolOffsets, &w1,
            &m.act, &tickets0, &push, &grid, &dispatchLegs},
           h);
  m.mark(Stage::kGemmCombine, stream);
  m.launch(*m.gemmCombine, m.grid, stream,
           {&ctx, &m.act, &w2, &m.poolOffsets, &poolSrc, &comb, &done, &idx, &weights, &tokens, &y, &tickets1, &grid,
            &combineLegs},
           h);
  m.mark(Stage::kCount, stream);
  m.launch(*m.epochAdvance, 1, stream, {&ctx}, h);
}

void MoeLayer::setLegs(Leg dispatch, Leg combine) {
  impl_->dispatchLeg = dispatch;
  impl_->combineLeg = combine;
}

void MoeLayer::setProfiling(bool on) { impl_->profiling = on; }

std::array<float, size_t(Stage::kCount)> MoeLayer::stageMilliseconds() {
  Impl& m = *impl_;
  if (!m.profiling) invalid("stageMilliseconds: profiling is off (setProfiling(true) before the forward)");
  std::array<float, size_t(Stage::kCount)> ms{};
  m.device.synchronizeEvent(m.events.back());
  for (size_t i = 0; i < ms.size(); ++i) ms[i] = m.device.elapsedMilliseconds(m.events[i], m.events[i + 1]);
  return ms;
}

uint64_t MoeLayer::activationBytes() const {
  const MoeLayerConfig& c = config_;
  const uint64_t rows = uint64_t(poolRows(c, ranks()));
  return rows * uint64_t(c.hidden + c.intermediate) * kBf16 + uint64_t(c.maxTokens * c.topk * c.hidden) * kBf16;
}

}  // namespace megamoe
