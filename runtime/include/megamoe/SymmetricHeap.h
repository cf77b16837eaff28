// The symmetric heap: one device allocation per rank with the same layout on every rank, each mapped into every
// peer, so that a peer's copy of a region is at "local address + DeviceContext.peer_offset[peer]". It also holds
// the rank's DeviceContext and DeviceError record (compiler/abi/DeviceAbi.h), written by the runtime.
//   Mode A (createSingleProcess): one process drives all GPUs; peers are reached through peer access and UVA.
//   Mode B (createMultiProcess): one process per GPU; IPC handles are exchanged through a Rendezvous.
//   Mode C (prepareExchange + join): one process per GPU; the caller exchanges the handles (an all-gather over its
//   process group, MPI, anything), so nothing on the file system is shared and two jobs cannot meet.
// A device error seen by checkErrors() marks the heap unusable for good (docs/decisions/epochs.md).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Backend.h"
#include "megamoe/HeapLayout.h"
#include "megamoe/Rendezvous.h"
#include "megamoe/env.h"

namespace megamoe {

// "rank 0: cross-rank wait timed out on flag 7 (seen 3, expected 4) in block 12"
std::string describeDeviceError(const abi::DeviceError& error);

class SymmetricHeap {
 public:
  static constexpr const char* kContextRegion = "megamoe.context";
  static constexpr const char* kErrorRegion = "megamoe.error";

  // The layout every rank builds: the runtime's regions first, then `regions` in order. Names starting with
  // "megamoe." are reserved (Error(kInvalidArgument)).
  static HeapLayout layoutFor(const std::vector<RegionSpec>& regions);

  // Mode A: heap i lives on devices[i] and is rank i. Enables peer access both ways between every pair of distinct
  // devices (a pair without P2P is an Error(kUnsupported)); ranks may share a device (oversubscription). The allocations are shared by the returned heaps and freed with the
  // last of them.
  static std::vector<std::unique_ptr<SymmetricHeap>> createSingleProcess(
      const std::vector<std::shared_ptr<Device>>& devices, const std::vector<RegionSpec>& regions,
      const RuntimeEnv& env);

  // Mode B: this process is `rank` of `nranks`; every rank calls this with the same regions and path. Returns once
  // every rank has mapped every peer; errors name the rank at fault (see Rendezvous). `agreement`: named values
  // (the caller's configuration) every rank must declare alike; a difference fails every rank naming it. A peer's
  // heap size and backend are checked before its memory is mapped.
  static std::unique_ptr<SymmetricHeap> createMultiProcess(const std::shared_ptr<Device>& device,
                                                           const std::vector<RegionSpec>& regions, int rank,
                                                           int nranks, const std::string& rendezvousPath,
                                                           const RuntimeEnv& env,
                                                           const RendezvousAgreement& agreement = {});

  // Mode C, step 1: allocates and zeroes this rank's heap; exchangeHandle() is what the caller hands to every rank.
  // The heap is unusable until join(). `agreement` as in mode B.
  static std::unique_ptr<SymmetricHeap> prepareExchange(const std::shared_ptr<Device>& device,
                                                        const std::vector<RegionSpec>& regions, int rank, int nranks,
                                                        const RuntimeEnv& env,
                                                        const RendezvousAgreement& agreement = {});
  static constexpr size_t kHandleBytes = 4096;  // every rank's handle, on every rank
  const std::vector<uint8_t>& exchangeHandle() const { return handle_; }
  // Mode C, step 2: `handles` holds every rank's handle in rank order (nranks * kHandleBytes). Each is checked before
  // anything is mapped (format, checksum, its rank and ranks, heap layout and size, backend, agreement), and the
  // first that is wrong is an Error(kRendezvous) naming the rank and the field; then every peer's heap is mapped.
  // Returns without waiting for the peers: the caller meets its ranks before the first kernel that reaches a peer.
  void join(const uint8_t* handles, size_t bytes);
  bool joined() const;
  // One value over what the ranks exchanged (mode C: every handle join() was given; mode B: every rank's payload;
  // mode A: a random draw shared by the group's heaps): equal on the ranks of one group, and not on ranks that were
  // handed another group's handles. The caller compares it across its ranks after the join (the package does); 0
  // before the heap is joined.
  uint64_t groupDigest() const { return groupDigest_; }
  // Closes peer mappings first (IPC close before free), waits for the peers to do the same (mode B, bounded), then
  // frees this rank's allocation. Mode C has no teardown barrier: the caller meets its ranks before destroying.
  ~SymmetricHeap();
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  Device& device() const { return *device_; }
  const std::shared_ptr<Device>& devicePtr() const { return device_; }
  const HeapLayout& layout() const { return layout_; }
  DevicePtr base() const { return base_; }
  // Throws Error(kInvalidArgument) for an unknown name.
  DevicePtr regionAddress(const std::string& name) const;
  // Where peer `peer` keeps what is at `localAddress` here, as seen from this rank's device.
  DevicePtr peerAddress(int peer, DevicePtr localAddress) const;
  DevicePtr contextAddress() const { return regionAddress(kContextRegion); }
  DevicePtr errorAddress() const { return regionAddress(kErrorRegion); }
  // The host copy of what the runtime wrote into the device context (the device's epoch advances on its own).
  const abi::DeviceContext& context() const { return context_; }

  // Synchronises `stream`, then reads the DeviceError record. A non-zero code marks the heap unusable and throws
  // Error(kDeviceError) with describeDeviceError's text; a failed synchronisation also marks it unusable.
  void checkErrors(StreamHandle stream = nullptr);
  bool usable() const;
  // Throws Error(kHeapUnusable) saying why, when the heap is unusable; launches call it.
  void requireUsable() const;

 private:
  struct SharedAllocations;
  SymmetricHeap(std::shared_ptr<Device> device, HeapLayout layout, int rank, int nranks);
  // Modes B and C: this rank's zeroed allocation, and what it tells its peers.
  static std::unique_ptr<SymmetricHeap> allocateOwn(const std::shared_ptr<Device>& device, HeapLayout layout, int rank,
                                                    int nranks);
  std::vector<uint8_t> ownPayload() const;
  // Modes B and C: checks every peer's payload, then maps the peers and writes the context.
  void mapPeers(const std::vector<std::vector<uint8_t>>& payloads, uint64_t waitTimeoutMs);
  void writeContext(const std::vector<int64_t>& peerOffsets, uint64_t waitTimeoutMs);
  void markUnusable(const std::string& reason);

  std::shared_ptr<Device> device_;
  HeapLayout layout_;
  int rank_;
  int nranks_;
  DevicePtr base_ = 0;
  abi::DeviceContext context_{};
  std::shared_ptr<SharedAllocations> shared_;  // mode A: owns every rank's allocation
  std::vector<DevicePtr> peerMappings_;         // mode B: IPC mappings of peers' heaps (0 at our rank)
  std::unique_ptr<Rendezvous> rendezvous_;      // mode B, kept for the teardown barrier
  std::vector<uint8_t> handle_;                 // mode C: this rank's handle
  RendezvousAgreement agreement_;               // mode C: what every handle must declare
  uint64_t waitTimeoutMs_ = 0;                  // mode C: for the context join() writes
  uint64_t groupDigest_ = 0;
  mutable std::mutex stateMutex_;
  bool usable_ = true;
  std::string unusableReason_;
};

}  // namespace megamoe
