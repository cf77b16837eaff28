// Symmetric heap setup, device-error checking and teardown (see SymmetricHeap.h).
#include "megamoe/SymmetricHeap.h"

#include <cstring>
#include <set>
#include <sstream>

#include "megamoe/Error.h"
#include "megamoe/Log.h"
#include "RendezvousWire.h"
#include "megamoe/Rendezvous.h"

namespace megamoe {
namespace {

// What each rank hands the others in mode B.
struct IpcPayload {
  IpcHandle handle;
  uint64_t heapBytes = 0;
  uint32_t backend = 0;
  uint32_t reserved = 0;
};

std::vector<uint8_t> toBytes(const IpcPayload& p) {
  std::vector<uint8_t> out(sizeof p);
  std::memcpy(out.data(), &p, sizeof p);
  return out;
}

// "1050624 bytes (1.00 MiB)"
std::string bytesText(uint64_t bytes) {
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << bytes << " bytes (" << static_cast<double>(bytes) / (1024.0 * 1024.0) << " MiB)";
  return out.str();
}

// "megamoe.context@0+512, megamoe.error@512+64, x@768+4096"
std::string regionsText(const HeapLayout& layout) {
  std::string out;
  for (const Region& r : layout.regions())
    out += (out.empty() ? "" : ", ") + r.name + "@" + std::to_string(r.offset) + "+" + std::to_string(r.size);
  return out;
}

// Modes B and C: this process is `rank` of `nranks`.
void checkMember(const std::shared_ptr<Device>& device, int rank, int nranks) {
  if (!device) throw Error(ErrorCode::kInvalidArgument, "null device for the symmetric heap");
  if (nranks < 1 || nranks > abi::kMaxRanks)
    throw Error(ErrorCode::kInvalidArgument, "a symmetric heap spans 1 to " + std::to_string(abi::kMaxRanks) +
                                                 " ranks, got " + std::to_string(nranks));
  if (rank < 0 || rank >= nranks)
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank) + " is outside 0.." +
                                                 std::to_string(nranks - 1));
}

// What every rank of one group must compute alike: the layout and the backend.
uint64_t groupHash(const HeapLayout& layout, const Device& device) {
  return layout.hash() ^ (static_cast<uint64_t>(device.kind()) << 56);
}

}  // namespace

// Mode A: every rank's allocation, freed when the last heap of the group goes.
struct SymmetricHeap::SharedAllocations {
  std::vector<std::shared_ptr<Device>> devices;
  std::vector<DevicePtr> bases;
  ~SharedAllocations() {
    for (size_t i = 0; i < bases.size(); ++i) {
      try {
        devices[i]->free(bases[i]);
      } catch (...) {
        // A destructor cannot report; a dead context has released its memory anyway.
      }
    }
  }
};

namespace {

// A layer call's word (abi::callWord) as the mismatch message names it: "layer 1 forward", "layer 0 backward",
// "layer 2 forward profiled, legs dispatch comm-only / combine fused".
std::string describeCall(uint64_t word) {
  const uint32_t role = uint32_t(word);
  const uint32_t kind = role & 0xffu, dispatchLegs = (role >> 16) & 0xffu, combineLegs = (role >> 24) & 0xffu;
  std::string s = "layer " + std::to_string(word >> 32) + " ";
  if (kind == uint32_t(abi::CallKind::kForward))
    s += "forward";
  else if (kind == uint32_t(abi::CallKind::kBackward))
    s += "backward";
  else
    s += "role " + std::to_string(kind);
  if (role & abi::kCallProfiled) s += " profiled";
  // The fused kernels' leg bits (kernels/Kernels.h LegBits): 1 comm, 2 GEMM, both: the layer itself.
  auto leg = [](uint32_t bits) -> std::string {
    if (bits == 3) return "fused";
    if (bits == 1) return "comm-only";
    if (bits == 2) return "gemm-only";
    return std::to_string(bits);
  };
  if (dispatchLegs != 3 || combineLegs != 3)
    s += ", legs dispatch " + leg(dispatchLegs) + " / combine " + leg(combineLegs);
  return s;
}

}  // namespace

std::string describeDeviceError(const abi::DeviceError& e) {
  const std::string rank = "rank " + std::to_string(e.rank) + ": ";
  const std::string block = " in block " + std::to_string(e.block);
  switch (static_cast<abi::ErrorCode>(e.code)) {
    case abi::ErrorCode::kNone: return rank + "no error";
    case abi::ErrorCode::kWaitTimeout: {
      // The flag's kind (compiler/abi/DeviceAbi.h FlagKind) says whom the wait was for.
      const uint64_t index = e.flag & 0xffffffffu;
      const std::string values = " (seen " + std::to_string(e.seen) + ", expected " + std::to_string(e.expected) + ")";
      switch (static_cast<abi::FlagKind>(e.flag >> 32)) {
        case abi::FlagKind::kPeer:
          return rank + "cross-rank wait for rank " + std::to_string(index) + " timed out" + values + block;
        case abi::FlagKind::kArrivals:
          return rank + "cross-rank wait for rank " + std::to_string(index / 65536) + "'s rows of local expert " +
                 std::to_string(index % 65536) + " timed out" + values + block;
        case abi::FlagKind::kRankBarrier:
          return rank + "rank barrier wait for rank " + std::to_string(index) + " timed out" + values + block;
        case abi::FlagKind::kGridBarrier: return rank + "grid barrier of its own blocks timed out" + values + block;
        case abi::FlagKind::kUser: break;
      }
      return rank + "cross-rank wait timed out on flag " + std::to_string(e.flag) + values + block;
    }
    case abi::ErrorCode::kBadIndex:
      return rank + "index out of range at site " + std::to_string(e.flag) + " (value " + std::to_string(int64_t(e.seen)) +
             ", bound " + std::to_string(e.expected) + ")" + block;
    case abi::ErrorCode::kCapacity:
      return rank + "capacity exceeded at site " + std::to_string(e.flag) + " (needed " + std::to_string(e.seen) +
             ", capacity " + std::to_string(e.expected) + ")" + block;
    case abi::ErrorCode::kCallMismatch: {
      const std::string peer = "rank " + std::to_string(e.flag & 0xffffffffu);
      return rank + "layer call differs from " + peer + "'s (this rank: " + describeCall(e.expected) + "; " + peer +
             ": " + describeCall(e.seen) + "): every rank must call the same layers, forward and backward, in the "
             "same order (a workspace's layers are numbered in creation order on each rank)" + block;
    }
  }
  return rank + "unknown device error code " + std::to_string(e.code) + " (flag " + std::to_string(e.flag) +
         ", seen " + std::to_string(e.seen) + ", expected " + std::to_string(e.expected) + ")" + block;
}

HeapLayout SymmetricHeap::layoutFor(const std::vector<RegionSpec>& regions) {
  std::vector<RegionSpec> all;
  all.push_back({kContextRegion, sizeof(abi::DeviceContext), 256});
  all.push_back({kErrorRegion, sizeof(abi::DeviceError), 64});
  for (const RegionSpec& r : regions) {
    if (r.name.rfind("megamoe.", 0) == 0)
      throw Error(ErrorCode::kInvalidArgument, "heap region name '" + r.name +
                                                   "' is reserved (names starting with 'megamoe.' belong to the "
                                                   "runtime)");
    all.push_back(r);
  }
  return HeapLayout::place(all);
}

SymmetricHeap::SymmetricHeap(std::shared_ptr<Device> device, HeapLayout layout, int rank, int nranks)
    : device_(std::move(device)), layout_(std::move(layout)), rank_(rank), nranks_(nranks) {}

void SymmetricHeap::writeContext(const std::vector<int64_t>& peerOffsets, uint64_t waitTimeoutMs) {
  abi::DeviceContext ctx{};
  ctx.heap_base = base_;
  for (int p = 0; p < nranks_; ++p) ctx.peer_offset[p] = peerOffsets[p];
  ctx.rank = static_cast<uint32_t>(rank_);
  ctx.nranks = static_cast<uint32_t>(nranks_);
  ctx.timeout_ns = waitTimeoutMs * 1000000ull;
  ctx.error = errorAddress();
  ctx.epoch = 0;
  device_->copyHostToDevice(contextAddress(), &ctx, sizeof ctx);
  context_ = ctx;
}

std::vector<std::unique_ptr<SymmetricHeap>> SymmetricHeap::createSingleProcess(
    const std::vector<std::shared_ptr<Device>>& devices, const std::vector<RegionSpec>& regions,
    const RuntimeEnv& env) {
  const int nranks = static_cast<int>(devices.size());
  if (nranks < 1 || nranks > abi::kMaxRanks)
    throw Error(ErrorCode::kInvalidArgument, "a symmetric heap spans 1 to " + std::to_string(abi::kMaxRanks) +
                                                 " ranks, got " + std::to_string(nranks));
  for (const auto& d : devices) {
    if (!d) throw Error(ErrorCode::kInvalidArgument, "null device in the symmetric heap's device list");
    if (d->kind() != devices[0]->kind())
      throw Error(ErrorCode::kInvalidArgument, "a symmetric heap cannot mix CUDA and HIP devices");
  }
  const HeapLayout layout = layoutFor(regions);
  // Several ranks may share one device (oversubscription, for tests and development on one GPU): their heaps are
  // separate allocations in the same address space, so no peer access is needed between them.
  auto sameDevice = [&](int i, int j) { return devices[i]->ordinal() == devices[j]->ordinal(); };

  for (int i = 0; i < nranks; ++i)
    for (int j = 0; j < nranks; ++j)
      if (!sameDevice(i, j) && !devices[i]->canAccessPeer(*devices[j]))
        throw Error(ErrorCode::kUnsupported, "device " + std::to_string(devices[i]->ordinal()) +
                                                 " cannot access device " + std::to_string(devices[j]->ordinal()) +
                                                 " (no peer-to-peer path); the single-process heap needs P2P "
                                                 "between every pair");
  for (int i = 0; i < nranks; ++i)
    for (int j = 0; j < nranks; ++j)
      if (!sameDevice(i, j)) devices[i]->enablePeerAccess(*devices[j]);

  auto shared = std::make_shared<SharedAllocations>();
  for (int i = 0; i < nranks; ++i) {
    const DevicePtr base = devices[i]->allocate(layout.totalBytes());
    shared->devices.push_back(devices[i]);
    shared->bases.push_back(base);
    devices[i]->memsetZero(base, layout.totalBytes(), nullptr);
  }

  std::vector<std::unique_ptr<SymmetricHeap>> heaps;
  const uint64_t nonce = wire::randomNonce();
  const uint64_t digest = wire::groupDigest({std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(&nonce),
                                                                  reinterpret_cast<const uint8_t*>(&nonce + 1))});
  for (int r = 0; r < nranks; ++r) {
    std::unique_ptr<SymmetricHeap> heap(new SymmetricHeap(devices[r], layout, r, nranks));
    heap->groupDigest_ = digest;
    heap->base_ = shared->bases[r];
    heap->shared_ = shared;
    // One address space (UVA): a peer's heap is its base, seen from here.
    std::vector<int64_t> offsets(nranks);
    for (int p = 0; p < nranks; ++p)
      offsets[p] = static_cast<int64_t>(shared->bases[p] - shared->bases[r]);
    heap->writeContext(offsets, env.waitTimeoutMs);
    heaps.push_back(std::move(heap));
  }
  for (int r = 0; r < nranks; ++r) devices[r]->synchronizeDevice();
  MEGAMOE_LOG(kInfo, [&] {
    std::string ordinals;
    for (const auto& d : devices) ordinals += (ordinals.empty() ? "" : ",") + std::to_string(d->ordinal());
    return "symmetric heap: single process (mode A), " + std::to_string(nranks) + " ranks on " +
           backendKindName(devices[0]->kind()) + " devices " + ordinals + ": " + bytesText(layout.totalBytes()) +
           " per rank, " + std::to_string(layout.regions().size()) + " regions, device wait timeout " +
           std::to_string(env.waitTimeoutMs) + " ms";
  }());
  MEGAMOE_LOG(kDebug, "symmetric heap regions: " + regionsText(layout));
  return heaps;
}

std::unique_ptr<SymmetricHeap> SymmetricHeap::createMultiProcess(const std::shared_ptr<Device>& device,
                                                                 const std::vector<RegionSpec>& regions, int rank,
                                                                 int nranks, const std::string& rendezvousPath,
                                                                 const RuntimeEnv& env,
                                                                 const RendezvousAgreement& agreement) {
  checkMember(device, rank, nranks);
  const HeapLayout layout = layoutFor(regions);
  MEGAMOE_LOG(kInfo, "symmetric heap: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                     ", one process per GPU (mode B), " + backendKindName(device->kind()) + " device " +
                     std::to_string(device->ordinal()) + ": " + bytesText(layout.totalBytes()) + ", " +
                     std::to_string(layout.regions().size()) + " regions, device wait timeout " +
                     std::to_string(env.waitTimeoutMs) + " ms" +
                     (nranks > 1 ? ", rendezvous at " + rendezvousPath : std::string()));
  MEGAMOE_LOG(kDebug, "symmetric heap regions: " + regionsText(layout));
  std::unique_ptr<SymmetricHeap> heap = allocateOwn(device, layout, rank, nranks);
  RendezvousOptions options;
  options.path = rendezvousPath;
  options.rank = rank;
  options.nranks = nranks;
  options.layoutHash = groupHash(layout, *device);
  options.timeoutS = env.rendezvousTimeoutS;
  options.secret = env.rendezvousSecret;
  options.agreement = agreement;
  heap->rendezvous_ = std::make_unique<Rendezvous>(options, heap->ownPayload());
  heap->groupDigest_ = wire::groupDigest(heap->rendezvous_->payloads());
  try {
    heap->mapPeers(heap->rendezvous_->payloads(), env.waitTimeoutMs);
    // Nobody returns before everybody has mapped everybody: a kernel launched next may write into any peer.
    heap->rendezvous_->barrier("heap setup");
  } catch (const std::exception& e) {
    heap->rendezvous_->abandon("rank " + std::to_string(rank) + " could not set up its heap: " + e.what());
    throw;
  }
  return heap;
}

std::unique_ptr<SymmetricHeap> SymmetricHeap::allocateOwn(const std::shared_ptr<Device>& device, HeapLayout layout,
                                                          int rank, int nranks) {
  std::unique_ptr<SymmetricHeap> heap(new SymmetricHeap(device, std::move(layout), rank, nranks));
  heap->base_ = device->allocate(heap->layout_.totalBytes());
  // Zero before anyone can see the memory: flags and counters start at 0 (epoch scheme).
  device->memsetZero(heap->base_, heap->layout_.totalBytes(), nullptr);
  device->synchronize(nullptr);
  return heap;
}

std::vector<uint8_t> SymmetricHeap::ownPayload() const {
  IpcPayload mine;
  if (nranks_ > 1) mine.handle = device_->exportIpcHandle(base_);
  mine.heapBytes = layout_.totalBytes();
  mine.backend = static_cast<uint32_t>(device_->kind());
  return toBytes(mine);
}

void SymmetricHeap::mapPeers(const std::vector<std::vector<uint8_t>>& payloads, uint64_t waitTimeoutMs) {
  const uint64_t heapBytes = layout_.totalBytes();
  peerMappings_.assign(nranks_, 0);
  std::vector<int64_t> offsets(nranks_, 0);
  // Each peer's payload, field by field, before anything is mapped: the layout hash agreed at the rendezvous is
  // what the peers said; the payload is what they would have us map.
  std::vector<IpcPayload> theirs(nranks_);
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    const std::string who = "rank " + std::to_string(p) + "'s heap payload";
    const std::vector<uint8_t>& bytes = payloads[p];
    if (bytes.size() != sizeof(IpcPayload))
      throw Error(ErrorCode::kRendezvous, who + " is " + std::to_string(bytes.size()) + " bytes, not " +
                                              std::to_string(sizeof(IpcPayload)));
    std::memcpy(&theirs[p], bytes.data(), sizeof(IpcPayload));
    if (theirs[p].heapBytes != heapBytes)
      throw Error(ErrorCode::kRendezvous, who + " has heapBytes=" + std::to_string(theirs[p].heapBytes) +
                                              ", but rank " + std::to_string(rank_) + "'s layout totals " +
                                              std::to_string(heapBytes) + " bytes");
    if (theirs[p].backend != static_cast<uint32_t>(device_->kind()))
      throw Error(ErrorCode::kRendezvous,
                  who + " has backend=" +
                      (theirs[p].backend <= static_cast<uint32_t>(BackendKind::kHip)
                           ? std::string(backendKindName(static_cast<BackendKind>(theirs[p].backend)))
                           : std::to_string(theirs[p].backend)) +
                      ", but rank " + std::to_string(rank_) + "'s is " + backendKindName(device_->kind()));
    if (theirs[p].reserved != 0)
      throw Error(ErrorCode::kRendezvous, who + " has reserved=" + std::to_string(theirs[p].reserved) +
                                              " (must be 0: another version of megamoe?)");
  }
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    peerMappings_[p] = device_->openIpcHandle(theirs[p].handle);
    offsets[p] = static_cast<int64_t>(peerMappings_[p] - base_);
  }
  writeContext(offsets, waitTimeoutMs);
  device_->synchronize(nullptr);
  if (nranks_ > 1)
    MEGAMOE_LOG(kDebug, "symmetric heap: rank " + std::to_string(rank_) + " mapped the heaps of its " +
                        std::to_string(nranks_ - 1) + " peers");
}

std::unique_ptr<SymmetricHeap> SymmetricHeap::prepareExchange(const std::shared_ptr<Device>& device,
                                                              const std::vector<RegionSpec>& regions, int rank,
                                                              int nranks, const RuntimeEnv& env,
                                                              const RendezvousAgreement& agreement) {
  checkMember(device, rank, nranks);
  if (const std::string wrong = wire::agreementNamesError(agreement); !wrong.empty())
    throw Error(ErrorCode::kInvalidArgument, wrong);
  const HeapLayout layout = layoutFor(regions);
  std::unique_ptr<SymmetricHeap> heap = allocateOwn(device, layout, rank, nranks);
  wire::HandleHeader fields;
  fields.rank = rank;
  fields.nranks = nranks;
  fields.layoutHash = groupHash(layout, *device);
  fields.nonce = wire::randomNonce();
  heap->handle_ = wire::encodeHandle(fields, agreement, heap->ownPayload());
  heap->agreement_ = agreement;
  heap->waitTimeoutMs_ = env.waitTimeoutMs;
  MEGAMOE_LOG(kInfo, "symmetric heap: rank " + std::to_string(rank) + " of " + std::to_string(nranks) +
                         ", handles exchanged by the caller (mode C), " + backendKindName(device->kind()) +
                         " device " + std::to_string(device->ordinal()) + ": " + bytesText(layout.totalBytes()) +
                         ", " + std::to_string(layout.regions().size()) + " regions, device wait timeout " +
                         std::to_string(env.waitTimeoutMs) + " ms");
  MEGAMOE_LOG(kDebug, "symmetric heap regions: " + regionsText(layout));
  return heap;
}

bool SymmetricHeap::joined() const { return handle_.empty() || !peerMappings_.empty(); }

void SymmetricHeap::join(const uint8_t* handles, size_t bytes) {
  auto refuse = [](const std::string& why) { throw Error(ErrorCode::kRendezvous, why); };
  if (handle_.empty()) throw Error(ErrorCode::kInvalidArgument, "join(): this heap was not made by prepareExchange");
  if (joined()) throw Error(ErrorCode::kInvalidArgument, "join(): rank " + std::to_string(rank_) + " joined already");
  if (!handles) throw Error(ErrorCode::kInvalidArgument, "join(): handles is null");
  const size_t expected = size_t(nranks_) * kHandleBytes;
  if (bytes != expected)
    throw Error(ErrorCode::kInvalidArgument, "join(): " + std::to_string(bytes) + " bytes of handles, expected " +
                                                 std::to_string(nranks_) + " ranks x " +
                                                 std::to_string(kHandleBytes) + " = " + std::to_string(expected));
  static_assert(kHandleBytes == wire::kHandleBytes, "one handle size");
  const wire::HandleHeader& mine = *reinterpret_cast<const wire::HandleHeader*>(handle_.data());
  std::vector<std::vector<uint8_t>> payloads(nranks_);
  for (int p = 0; p < nranks_; ++p) {
    const uint8_t* at = handles + size_t(p) * kHandleBytes;
    const std::string who = "the handle at position " + std::to_string(p);
    if (p == rank_) {
      // Our own must come back as we gave it: anything else means the caller gathered out of order.
      if (std::memcmp(at, handle_.data(), kHandleBytes) != 0)
        refuse(who + " is not rank " + std::to_string(rank_) + "'s own handle (gathered out of rank order, or from " +
               "another group?)");
      payloads[p] = {};
      continue;
    }
    wire::DecodedHandle theirs;
    if (const std::string wrong = wire::decodeHandle(at, &theirs); !wrong.empty()) refuse(who + " " + wrong);
    const wire::HandleHeader& h = theirs.header;
    if (h.nranks != nranks_)
      refuse(who + " is of a group of " + std::to_string(h.nranks) + " ranks, rank " + std::to_string(rank_) +
             "'s of " + std::to_string(nranks_));
    if (h.rank != p)
      refuse(who + " is rank " + std::to_string(h.rank) + "'s (handles must be gathered in rank order)");
    // The agreed values first: a layout follows from them, and they name the field.
    const std::string difference = wire::agreementDifference(agreement_, theirs.agreement, "rank " + std::to_string(p),
                                                             "rank " + std::to_string(rank_));
    if (!difference.empty()) refuse(difference);
    if (h.layoutHash != mine.layoutHash)
      refuse("rank " + std::to_string(p) + "'s heap layout (hash " + std::to_string(h.layoutHash) +
             ") differs from rank " + std::to_string(rank_) + "'s (" + std::to_string(mine.layoutHash) + ")");
    payloads[p] = std::move(theirs.payload);
  }
  std::vector<std::vector<uint8_t>> perRank(nranks_);
  for (int p = 0; p < nranks_; ++p)
    perRank[p].assign(handles + size_t(p) * kHandleBytes, handles + size_t(p + 1) * kHandleBytes);
  try {
    mapPeers(payloads, waitTimeoutMs_);
    groupDigest_ = wire::groupDigest(perRank);
  } catch (...) {
    for (DevicePtr& mapped : peerMappings_) {
      try {
        if (mapped) device_->closeIpcHandle(mapped);
      } catch (...) {  // the mapping error is the one to report
      }
      mapped = 0;
    }
    peerMappings_.clear();
    throw;
  }
}

SymmetricHeap::~SymmetricHeap() {
  for (DevicePtr mapped : peerMappings_) {
    if (!mapped) continue;
    try {
      device_->closeIpcHandle(mapped);
    } catch (...) {
    }
  }
  if (rendezvous_) {
    try {
      // Peers may still map our memory until they have closed their handles too.
      rendezvous_->barrier("heap teardown");
    } catch (const std::exception& e) {
      // A dead or late peer: free anyway, its mappings are its own problem now.
      MEGAMOE_LOG(kWarn, "symmetric heap: rank " + std::to_string(rank_) + " freed its heap without the peers' " +
                         "agreement: " + e.what());
    } catch (...) {
    }
  }
  if (!shared_ && base_) {
    try {
      device_->free(base_);
    } catch (...) {
    }
  }
}

DevicePtr SymmetricHeap::regionAddress(const std::string& name) const { return base_ + layout_.region(name).offset; }

DevicePtr SymmetricHeap::peerAddress(int peer, DevicePtr localAddress) const {
  if (peer < 0 || peer >= nranks_)
    throw Error(ErrorCode::kInvalidArgument, "peer " + std::to_string(peer) + " is outside 0.." +
                                                 std::to_string(nranks_ - 1));
  if (localAddress < base_ || localAddress - base_ >= layout_.totalBytes())
    throw Error(ErrorCode::kInvalidArgument, "address is not inside rank " + std::to_string(rank_) +
                                                 "'s symmetric heap");
  return localAddress + static_cast<uint64_t>(context_.peer_offset[peer]);
}

bool SymmetricHeap::usable() const {
  std::lock_guard<std::mutex> lock(stateMutex_);
  return usable_ && joined();
}

void SymmetricHeap::requireUsable() const {
  if (!joined())
    throw Error(ErrorCode::kHeapUnusable, "the symmetric heap of rank " + std::to_string(rank_) +
                                              " waits for join(): the ranks' handles were not exchanged yet");
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (!usable_)
    throw Error(ErrorCode::kHeapUnusable, "the symmetric heap of rank " + std::to_string(rank_) +
                                              " is unusable after an earlier device error (" + unusableReason_ +
                                              "); destroy it and create a new one");
}

void SymmetricHeap::markUnusable(const std::string& reason) {
  std::lock_guard<std::mutex> lock(stateMutex_);
  if (!usable_) return;
  usable_ = false;
  unusableReason_ = reason;
}

void SymmetricHeap::checkErrors(StreamHandle stream) {
  requireUsable();
  device_->requireNotCapturing(stream, "checkErrors");
  try {
    device_->synchronize(stream);
  } catch (const Error& e) {
    const std::string message = "rank " + std::to_string(rank_) + ": " + e.what() +
                                "; the symmetric heap is now marked unusable";
    markUnusable(message);
    MEGAMOE_LOG(kError, message);  // after markUnusable: its lock is released
    throw Error(e.code(), message);
  }
  abi::DeviceError record{};
  device_->readBack(&record, errorAddress(), sizeof record, stream);
  if (record.code == static_cast<uint64_t>(abi::ErrorCode::kNone)) return;
  const std::string message = describeDeviceError(record) + "; the symmetric heap is now marked unusable";
  markUnusable(message);
  MEGAMOE_LOG(kError, "device error: " + message);  // after markUnusable: its lock is released
  throw Error(ErrorCode::kDeviceError, message);
}

}  // namespace megamoe
