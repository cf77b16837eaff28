// A workspace: what every MoE layer of a model shares on one rank - the symmetric heap (receive pool, combine
// buffer, counters, flags) and the working buffers (routing tables, the L1 activation, dh) - sized for the largest
// layer it serves. Layers (MoeLayer::create(workspace, config)) hold only their kernels and their tensor maps, so
// 58 layers cost one workspace, not 58; what one training forward keeps for its backward lives in a buffer the
// caller owns (MoeLayer::savedBytes), never here. Calls of all layers on one workspace are ordered on one stream.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "megamoe/Backend.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {

class Runtime;
struct MoeLayerConfig;

// One rank's bytes of a workspace: the symmetric heap (mapped by every peer) and the local working buffers.
struct WorkspaceBytes {
  uint64_t heap = 0, buffers = 0;
  uint64_t total() const { return heap + buffers; }
};

class Workspace {
 public:
  // What a workspace for layers up to `config` at `ranks` ranks takes on each rank, without allocating anything.
  // Error(kInvalidArgument) naming the violated constraint for a configuration MoeLayer::validate refuses.
  static WorkspaceBytes bytesFor(const MoeLayerConfig& config, int ranks);

  // One process drives every rank: workspace i on runtimes[i]'s device (ranks may share a device, each on its
  // share of the SMs: MoeLayerConfig::smBudget).
  static std::vector<std::shared_ptr<Workspace>> createLocal(const std::vector<Runtime*>& runtimes,
                                                             const MoeLayerConfig& config);
  // This process is `rank` of `ranks`; the ranks meet at `rendezvousPath` (Rendezvous.h) and agree on `config`.
  static std::shared_ptr<Workspace> create(Runtime& runtime, const MoeLayerConfig& config, int rank, int ranks,
                                           const std::string& rendezvousPath);
  // Rendezvous through the caller (an all-gather over its process group, MPI, anything; no socket): prepare()
  // allocates this rank's share and makes its handle (handleBytes(), equal on every rank); the caller gathers every
  // rank's handle in rank order; join() checks them (a difference names the rank and the field, e.g. "rank 1's
  // intermediate=1024 differs from rank 0's intermediate=2048") and maps the peers. Every rank's workspace may be
  // used once every rank's join() has returned: the caller meets its ranks (a barrier) first, and again before
  // destroying it (a peer may write into this rank's heap until its last call has finished).
  class Pending {
   public:
    ~Pending();
    const std::vector<uint8_t>& handle() const;
   private:
    friend class Workspace;
    Pending() = default;
    Runtime* runtime_ = nullptr;
    std::unique_ptr<MoeLayerConfig> config_;
    std::unique_ptr<SymmetricHeap> heap_;
    int smBudget_ = 0;
  };
  static size_t handleBytes() { return SymmetricHeap::kHandleBytes; }
  static std::unique_ptr<Pending> prepare(Runtime& runtime, const MoeLayerConfig& config, int rank, int ranks);
  // `handles`: ranks * handleBytes() bytes. On success `pending` is emptied (its heap now belongs to the workspace);
  // on failure it may be joined again with corrected handles.
  static std::shared_ptr<Workspace> join(Pending& pending, const uint8_t* handles, size_t bytes);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // The largest layer this workspace serves (a layer fits when each of its sizes is at most this one's and its
  // experts are the same).
  const MoeLayerConfig& config() const;
  // "" when a layer of `layer` can run here; else the size that does not fit.
  std::string fits(const MoeLayerConfig& layer) const;
  int rank() const { return heap_->rank(); }
  int ranks() const { return heap_->nranks(); }
  int smBudget() const { return smBudget_; }
  // SymmetricHeap::groupDigest: equal on every rank of this workspace's group; compare it across ranks after join().
  uint64_t groupDigest() const { return heap_->groupDigest(); }
  SymmetricHeap& heap() { return *heap_; }
  Runtime& runtime() const { return runtime_; }
  Device& device() const { return *device_; }
  WorkspaceBytes bytes() const { return bytesFor(*config_, ranks()); }

  // The working buffers and heap regions, as the layer's launches pass them (device addresses).
  struct Buffers {
    DevicePtr ctx = 0, counts = 0, flags = 0, calls = 0, arrivals = 0, done = 0, pool = 0, poolSrc = 0, poolW = 0,
              comb = 0, dw = 0, barrier = 0,                                   // heap regions
              poolScales = 0;                                                  // heap, FP8 only
    DevicePtr sendSlot = 0, sendList = 0, sendOff = 0, sendBase = 0, poolOffsets = 0, routeEpoch = 0,
              prologueScratch = 0, tickets = 0, act = 0, dh = 0,               // local (dh: training only)
              topkIdx32 = 0,  // the int32 topk_idx (int64 narrowed; with dropping, a copy the prologue edits)
              dropped = 0;    // i64: picks dropped so far
    // FP8 only (local): x quantised [max_tokens, H] e4m3 + [max_tokens, H / 128] f32, act quantised [rows, I] e4m3
    // + [rows, I / 128] f32.
    DevicePtr xCodes = 0, xScales = 0, actCodes = 0, actScales = 0;
  };
  const Buffers& buffers() const { return buffers_; }
  // Rows of the receive pool (every rank may send every pick to this one).
  int64_t poolRows() const;
  // The picks this rank's forwards dropped so far (MoeLayerConfig::dropOverflow), over every layer of the workspace;
  // synchronises `stream` (the stream of the layers' calls).
  uint64_t droppedPicks(StreamHandle stream) const;
  // The next layer's number on this workspace (MoeLayer::number): 0, 1, ... in creation order, below 2^31.
  uint32_t takeLayerNumber() { return layersMade_.fetch_add(1) & 0x7fffffffu; }

 private:
  Workspace(Runtime& runtime, const MoeLayerConfig& config, std::unique_ptr<SymmetricHeap> heap, int smBudget);
  void freeBuffers() noexcept;  // the local buffers allocated so far (the destructor's, and a failed constructor's)
  Runtime& runtime_;
  std::shared_ptr<Device> device_;  // frees the buffers, whatever becomes of the runtime object
  std::unique_ptr<MoeLayerConfig> config_;
  std::unique_ptr<SymmetricHeap> heap_;
  int smBudget_;
  Buffers buffers_;
  std::atomic<uint32_t> layersMade_{0};
};

}  // namespace megamoe
