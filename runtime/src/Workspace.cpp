// The workspace (see Workspace.h): its local working buffers, the checks of the layers it serves, and its creation
// on every rank (one process, a rendezvous path, or the caller's exchange of handles).
#include "megamoe/Workspace.h"

#include <algorithm>
#include <string>
#include <vector>

#include "LayerRules.h"
#include "megamoe/Error.h"
#include "megamoe/Log.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Rendezvous.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {

namespace {

// The SMs one rank's kernels use: the config's budget, else MEGAMOE_SM_BUDGET, else the device's SMs shared by the
// `sharing` ranks of one process on that device.
int resolveSmBudget(const MoeLayerConfig& c, const RuntimeEnv& env, Device& device, int sharing) {
  const int sms = device.multiprocessors();
  int64_t budget = c.smBudget ? c.smBudget : env.smBudget;
  const char* from = c.smBudget ? "sm_budget" : "MEGAMOE_SM_BUDGET";
  if (budget == 0) {
    budget = (sms / sharing) & ~1;
    if (budget < 2)
      invalid(std::to_string(sharing) + " ranks share device " + std::to_string(device.ordinal()) + " with " +
              std::to_string(sms) + " SMs: each needs at least 2 SMs (one cluster pair)");
    return int(budget);
  }
  if (budget > sms)
    invalid(std::string(from) + "=" + std::to_string(budget) + " exceeds the " + std::to_string(sms) +
            " SMs of device " + std::to_string(device.ordinal()));
  return int(budget);
}

// The local working buffers of a workspace, in one place: the constructor allocates them, bytesFor() counts them.
struct BufferSizes {
  int64_t sendSlot, sendList, sendOff, sendBase, poolOffsets, routeEpoch, prologueScratch, tickets, act, dh, topkIdx32,
      dropped, xCodes, xScales, actCodes, actScales;
  static BufferSizes of(const MoeLayerConfig& c, int ranks) {
    const int64_t picks = c.maxTokens * c.topk, E = c.experts, local = E / ranks, rows = poolRows(c, ranks);
    const int64_t H = c.hidden, I = c.intermediate, fp8 = isFp8(c) ? 1 : 0, group = kFp8ScaleGroup;
    // Tile tickets: i32 [2] for each of the dispatch, the combine and the dW2 GEMM.
    return {picks * 4,   picks * 4, (E + 1) * 4, E * 4, (local + 1) * 4, 8, prologueScratchBytes(E), 24,
            rows * I * kBf16, c.training ? rows * 2 * I * kBf16 : 0, picks * 4, 8,
            fp8 * c.maxTokens * H, fp8 * c.maxTokens * (H / group) * 4, fp8 * rows * I, fp8 * rows * (I / group) * 4};
  }
  // What the device allocates for each (at least 16 bytes; nothing for a size of 0).
  static int64_t allocated(int64_t bytes) { return bytes ? std::max<int64_t>(bytes, 16) : 0; }
  int64_t total() const {
    int64_t t = 0;
    for (int64_t b :
         {sendSlot, sendList, sendOff, sendBase, poolOffsets, routeEpoch, prologueScratch, tickets, act, dh, topkIdx32,
          dropped, xCodes, xScales, actCodes, actScales})
      t += allocated(b);
    return t;
  }
};

}  // namespace

WorkspaceBytes Workspace::bytesFor(const MoeLayerConfig& config, int ranks) {
  if (auto e = MoeLayer::validate(config, ranks); !e.empty()) invalid("workspace: " + e);
  return {SymmetricHeap::layoutFor(MoeLayer::heapRegions(config, ranks)).totalBytes(),
          uint64_t(BufferSizes::of(config, ranks).total())};
}

int64_t Workspace::poolRows() const { return megamoe::poolRows(*config_, ranks()); }

uint64_t Workspace::droppedPicks(StreamHandle stream) const {
  device_->requireNotCapturing(stream, "droppedPicks");
  uint64_t n = 0;
  device_->readBack(&n, buffers_.dropped, sizeof n, stream);
  return n;
}

const MoeLayerConfig& Workspace::config() const { return *config_; }

std::string Workspace::fits(const MoeLayerConfig& layer) const {
  const MoeLayerConfig& w = *config_;
  const struct {
    const char* name;
    int64_t layer, workspace;
  } sizes[] = {{"hidden", layer.hidden, w.hidden},
               {"intermediate", layer.intermediate, w.intermediate},
               {"experts", layer.experts, w.experts},
               {"topk", layer.topk, w.topk},
               {"max_tokens", layer.maxTokens, w.maxTokens}};
  for (const auto& f : sizes)
    if (f.layer > f.workspace)
      return std::string(f.name) + "=" + std::to_string(f.layer) + " exceeds the workspace's " + f.name + "=" +
             std::to_string(f.workspace);
  if (megamoe::poolRows(layer, ranks()) > poolRows())
    return "the layer's receive rows (" + std::to_string(megamoe::poolRows(layer, ranks())) +
           ") exceed the workspace's receive pool (" + std::to_string(poolRows()) + " rows)";
  // The arrival counters accumulate across calls and are indexed [parity][source][local expert] with the layer's
  // E / R: a layer with fewer experts would zero only part of the stale parity and read another layer's counts.
  if (layer.experts != w.experts)
    return "experts=" + std::to_string(layer.experts) + " must equal the workspace's experts=" +
           std::to_string(w.experts) + " (the arrival counters' layout)";
  if (layer.training && !w.training) return "training=true needs a workspace created with training (its dh buffer)";
  // The receive pool's rows are e4m3 or bf16 and the FP8 buffers exist only in an FP8 workspace.
  if (layer.dtype != w.dtype)
    return "dtype=" + std::string(dtypeName(layer.dtype)) + " differs from the workspace's dtype=" + dtypeName(w.dtype) +
           " (the receive pool's rows and the FP8 buffers)";
  if (layer.smBudget && layer.smBudget != smBudget_)
    return "sm_budget=" + std::to_string(layer.smBudget) + " differs from the workspace's " + std::to_string(smBudget_) +
           " (a workspace's budget is its layers')";
  return "";
}

Workspace::Workspace(Runtime& runtime, const MoeLayerConfig& config, std::unique_ptr<SymmetricHeap> heap,
                     int smBudget)
    : runtime_(runtime), device_(runtime.device()), config_(std::make_unique<MoeLayerConfig>(config)),
      heap_(std::move(heap)),
      smBudget_(smBudget) {
  Device& d = *runtime.device();
  const SymmetricHeap& h = *heap_;
  Buffers& b = buffers_;
  b.ctx = h.contextAddress();
  b.counts = h.regionAddress("moe.counts");
  b.flags = h.regionAddress("moe.flags");
  b.calls = h.regionAddress("moe.calls");
  b.arrivals = h.regionAddress("moe.arrivals");
  b.done = h.regionAddress("moe.done");
  b.pool = h.regionAddress("moe.pool");
  b.poolSrc = h.regionAddress("moe.pool_src");
  b.poolW = h.regionAddress("moe.pool_w");
  b.comb = h.regionAddress("moe.comb");
  b.dw = h.regionAddress("moe.dw");
  b.barrier = h.regionAddress("moe.barrier");
  if (isFp8(config)) b.poolScales = h.regionAddress("moe.pool_scales");
  const BufferSizes sizes = BufferSizes::of(config, ranks());
  auto alloc = [&](int64_t bytes) { return bytes ? d.allocate(size_t(BufferSizes::allocated(bytes))) : DevicePtr(0); };
  try {
    b.sendSlot = alloc(sizes.sendSlot);
    b.sendList = alloc(sizes.sendList);
    b.sendOff = alloc(sizes.sendOff);
    b.sendBase = alloc(sizes.sendBase);
    b.poolOffsets = alloc(sizes.poolOffsets);
    // Zero until a prologue writes it: the backward's dW2 GEMM (no device context) reads it even when the first
    // call's prologue stopped on an error, and then runs over empty groups instead of whatever the memory held.
    d.memsetZero(b.poolOffsets, size_t(sizes.poolOffsets), nullptr);
    b.routeEpoch = alloc(sizes.routeEpoch);
    b.act = alloc(sizes.act);
    b.dh = alloc(sizes.dh);
    b.topkIdx32 = alloc(sizes.topkIdx32);
    // Zero between launches (the kernels reset them): the tile tickets and the prologue's counters.
    b.tickets = alloc(sizes.tickets);
    d.memsetZero(b.tickets, size_t(sizes.tickets), nullptr);
    b.prologueScratch = alloc(sizes.prologueScratch);
    d.memsetZero(b.prologueScratch, size_t(sizes.prologueScratch), nullptr);
    b.dropped = alloc(sizes.dropped);
    d.memsetZero(b.dropped, size_t(sizes.dropped), nullptr);
    b.xCodes = alloc(sizes.xCodes);
    b.xScales = alloc(sizes.xScales);
    b.actCodes = alloc(sizes.actCodes);
    b.actScales = alloc(sizes.actScales);
    d.synchronize(nullptr);
  } catch (...) {  // no destructor runs for a half-built object: free what was allocated (the heap frees itself)
    freeBuffers();
    throw;
  }
  const WorkspaceBytes bytes = bytesFor(config, ranks());
  MEGAMOE_LOG(kInfo, "workspace: rank " + std::to_string(rank()) + " of " + std::to_string(ranks()) + ": heap " +
                         std::to_string(bytes.heap) + " bytes + buffers " + std::to_string(bytes.buffers) +
                         " bytes, receive pool " + std::to_string(poolRows()) + " rows, SM budget " +
                         std::to_string(smBudget));
}

Workspace::~Workspace() { freeBuffers(); }

void Workspace::freeBuffers() noexcept {
  Device& d = *device_;
  Buffers& b = buffers_;
  for (DevicePtr* p : {&b.sendSlot, &b.sendList, &b.sendOff, &b.sendBase, &b.poolOffsets, &b.routeEpoch, &b.act,
                       &b.dh, &b.tickets, &b.prologueScratch, &b.topkIdx32, &b.dropped, &b.xCodes, &b.xScales,
                       &b.actCodes, &b.actScales}) {
    try {
      if (*p) d.free(*p);
    } catch (...) {
    }
    *p = 0;
  }
}

std::vector<std::shared_ptr<Workspace>> Workspace::createLocal(const std::vector<Runtime*>& runtimes,
                                                               const MoeLayerConfig& config) {
  if (runtimes.empty()) invalid("createLocal needs at least one runtime");
  if (auto e = MoeLayer::validate(config, int(runtimes.size())); !e.empty()) invalid("MoE layer: " + e);
  std::vector<std::shared_ptr<Device>> devices;
  for (Runtime* rt : runtimes) {
    if (!rt) invalid("createLocal: a runtime is null");
    devices.push_back(rt->device());
  }
  // Ranks on one device run side by side, each on its share of the SMs: their budgets must fit the device
  // together, or a rank's persistent kernels could wait for SMs that a peer's kernels, waiting for it, hold.
  std::vector<int> budgets;
  for (size_t i = 0; i < runtimes.size(); ++i) {
    int sharing = 0;
    for (const auto& d : devices) sharing += d->ordinal() == devices[i]->ordinal();
    budgets.push_back(resolveSmBudget(config, runtimes[i]->env(), *devices[i], sharing));
  }
  // Every rank launches the same grid: the combine counts the owner's blocks against its own grid, so unequal
  // budgets (e.g. 8 ranks over 3 devices) gave early sums or timeouts. The smallest budget serves all.
  std::fill(budgets.begin(), budgets.end(), *std::min_element(budgets.begin(), budgets.end()));
  for (size_t i = 0; i < runtimes.size(); ++i) {
    int64_t used = 0;
    std::string ranksThere;
    for (size_t j = 0; j < runtimes.size(); ++j) {
      if (devices[j]->ordinal() != devices[i]->ordinal()) continue;
      used += budgets[j];
      ranksThere += (ranksThere.empty() ? "" : ",") + std::to_string(j);
    }
    if (used > devices[i]->multiprocessors())
      invalid("the SM budgets of ranks " + ranksThere + " on device " + std::to_string(devices[i]->ordinal()) +
              " add up to " + std::to_string(used) + " SMs, more than its " +
              std::to_string(devices[i]->multiprocessors()) + " (ranks on one device must all be resident)");
  }
  auto heaps = SymmetricHeap::createSingleProcess(devices, MoeLayer::heapRegions(config, int(runtimes.size())),
                                                  runtimes[0]->env());
  std::vector<std::shared_ptr<Workspace>> out;
  for (size_t i = 0; i < runtimes.size(); ++i)
    out.push_back(std::shared_ptr<Workspace>(new Workspace(*runtimes[i], config, std::move(heaps[i]), budgets[i])));
  return out;
}

namespace {

// What every rank of a workspace must declare alike; the heap layout alone misses most fields (intermediate,
// training, ...). "kernels" catches ranks whose builds derive different kernels from the same fields; "sm_budget"
// ranks that would launch different grids (the combine counts the owner's blocks against its own grid).
RendezvousAgreement layerAgreement(const MoeLayerConfig& config, int ranks, int smBudget) {
  std::string kernels;
  for (const auto& [name, spec] : MoeLayer::kernelSpecs(config, ranks)) {
    kernels += (kernels.empty() ? "" : " ") + name + "(";
    for (size_t i = 0; i < spec.size(); ++i)
      kernels += (i ? "," : "") + spec[i].first + "=" + std::to_string(spec[i].second);
    kernels += ")";
  }
  return {
      {"hidden", std::to_string(config.hidden)},
      {"intermediate", std::to_string(config.intermediate)},
      {"experts", std::to_string(config.experts)},
      {"topk", std::to_string(config.topk)},
      {"max_tokens", std::to_string(config.maxTokens)},
      {"swiglu_clamp_milli", std::to_string(config.swigluClampMilli)},
      {"training", config.training ? "true" : "false"},
      {"dtype", dtypeName(config.dtype)},
      {"dedup_tokens", config.dedupTokens ? "true" : "false"},
      {"receive_capacity", std::to_string(megamoe::poolRows(config, ranks))},
      {"drop_overflow", config.dropOverflow ? "true" : "false"},
      {"kernels", kernels},
      {"sm_budget", std::to_string(smBudget)},
  };
}

}  // namespace

std::shared_ptr<Workspace> Workspace::create(Runtime& runtime, const MoeLayerConfig& config, int rank, int ranks,
                                             const std::string& rendezvousPath) {
  if (auto e = MoeLayer::validate(config, ranks); !e.empty()) invalid("MoE layer: " + e);
  const int budget = resolveSmBudget(config, runtime.env(), *runtime.device(), 1);
  auto heap = runtime.createHeap(MoeLayer::heapRegions(config, ranks), rank, ranks, rendezvousPath,
                                 layerAgreement(config, ranks, budget));
  return std::shared_ptr<Workspace>(new Workspace(runtime, config, std::move(heap), budget));
}

Workspace::Pending::~Pending() = default;

const std::vector<uint8_t>& Workspace::Pending::handle() const {
  if (!heap_) invalid("Workspace::Pending::handle(): this pending workspace was joined already");
  return heap_->exchangeHandle();
}

std::unique_ptr<Workspace::Pending> Workspace::prepare(Runtime& runtime, const MoeLayerConfig& config, int rank,
                                                       int ranks) {
  if (auto e = MoeLayer::validate(config, ranks); !e.empty()) invalid("MoE layer: " + e);
  std::unique_ptr<Pending> pending(new Pending());
  pending->runtime_ = &runtime;
  pending->config_ = std::make_unique<MoeLayerConfig>(config);
  pending->smBudget_ = resolveSmBudget(config, runtime.env(), *runtime.device(), 1);
  pending->heap_ = SymmetricHeap::prepareExchange(runtime.device(), MoeLayer::heapRegions(config, ranks), rank, ranks,
                                                  runtime.env(), layerAgreement(config, ranks, pending->smBudget_));
  return pending;
}

std::shared_ptr<Workspace> Workspace::join(Pending& pending, const uint8_t* handles, size_t bytes) {
  if (!pending.heap_) invalid("Workspace::join(): this pending workspace was joined already");
  pending.heap_->join(handles, bytes);
  std::shared_ptr<Workspace> ws(
      new Workspace(*pending.runtime_, *pending.config_, std::move(pending.heap_), pending.smBudget_));
  return ws;
}

}  // namespace megamoe
