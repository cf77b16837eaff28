// The binary contract between generated kernels and the host runtime: error record layout, error codes and
// the per-rank device context. Plain C++ with no LLVM/MLIR so that runtime/ can include it.
#pragma once
#include <cstdint>

namespace megamoe::abi {

// Most ranks one node holds; sizes the peer-offset table in DeviceContext.
inline constexpr int kMaxRanks = 8;

// What a kernel reports through the device error record. The first error wins (CAS on `code`).
enum class ErrorCode : uint64_t {
  kNone = 0,
  kWaitTimeout = 1,     // a bounded wait saw `seen` < `expected` on flag `flag` past its timeout
  kBadIndex = 2,        // an index read on the device was out of range (`seen` = value, `expected` = bound)
  kCapacity = 3,        // a pool or buffer would overflow (`seen` = needed, `expected` = capacity)
  kCallMismatch = 4,    // a peer's layer call differs from this rank's (`flag` = the peer (kPeer), `seen` = its
                        // call word, `expected` = this rank's: callWord)
};

// A layer call as dispatch_prologue publishes it to every peer beside its counts (its `layer` and `role`
// arguments): each rank compares every peer's call word with its own where it waits for their counts, and one that
// differs claims the record with kCallMismatch on every rank, before a row moves. `layer` is the layer's number on
// its workspace (creation order, below 2^31); `role` says what the call launches between the ranks' meetings:
// kind | kCallProfiled (a forward that meets before its combine) | dispatch legs << 16 | combine legs << 24 (the
// fused kernels' leg bits: 1 comm, 2 GEMM).
enum class CallKind : uint32_t { kForward = 1, kBackward = 2 };
inline constexpr uint32_t kCallProfiled = 1u << 8;
inline constexpr uint32_t callRole(CallKind kind, bool profiled, uint32_t dispatchLegs, uint32_t combineLegs) {
  return uint32_t(kind) | (profiled ? kCallProfiled : 0u) | ((dispatchLegs & 0xffu) << 16) |
         ((combineLegs & 0xffu) << 24);
}
inline constexpr uint64_t callWord(uint32_t layer, uint32_t role) { return (uint64_t(layer) << 32) | role; }

// What the fused dispatch writes beside each received row (its pool_src entry): the source rank times
// kPoolSourceShift plus the pick's index in that rank's topk_idx (token * topk + j).
inline constexpr int64_t kPoolSourceShift = int64_t(1) << 24;

// Device error record: one per rank, in device memory, zeroed once by the runtime.
// Word order is fixed: lowering writes words by index (see kErrorWord*).
struct DeviceError {
  uint64_t code;      // ErrorCode; written last-but-CAS: 0 -> code claims the record
  uint64_t rank;      // rank that observed the error
  uint64_t flag;      // which flag (a kernel-chosen id, usually the flag's byte offset in the heap)
  uint64_t seen;      // value observed
  uint64_t expected;  // value waited for / bound
  uint64_t block;     // linear block id of the reporter
};
inline constexpr int kErrorWordCode = 0, kErrorWordRank = 1, kErrorWordFlag = 2, kErrorWordSeen = 3,
                     kErrorWordExpected = 4, kErrorWordBlock = 5, kErrorWords = 6;
static_assert(sizeof(DeviceError) == kErrorWords * sizeof(uint64_t));

// DeviceError::flag encoding: kind in the high 32 bits, index in the low 32.
enum class FlagKind : uint32_t {
  kUser = 0,         // a kernel's own flag; index chosen by the kernel (e.g. expert or peer)
  kRankBarrier = 1,  // rank_barrier slot; index = the peer whose arrival was awaited
  kGridBarrier = 2,  // grid_barrier counter; index 0
  kPeer = 3,         // a flag one peer signals; index = that peer's rank
  kArrivals = 4,     // rows one source pushes for one local expert; index = source rank * 65536 + local expert
};
inline constexpr uint64_t flagId(FlagKind kind, uint32_t index) {
  return (uint64_t(kind) << 32) | index;
}

// Per-rank context in device memory, handed to every communicating kernel as one pointer.
// Field offsets are part of the ABI: dsl/ loads them by offsetof.
struct DeviceContext {
  uint64_t heap_base;                 // this rank's symmetric heap base (device address)
  int64_t peer_offset[kMaxRanks];     // peer p's heap base minus ours: peer address = local address + offset
  uint32_t rank;
  uint32_t nranks;
  uint64_t timeout_ns;                // bound of every cross-rank wait
  uint64_t error;                     // device address of this rank's DeviceError
  uint64_t epoch;                     // device-advanced call counter (see docs/decisions/epochs.md)
};

// dispatch_prologue's scratch (kernels/Kernels.h DispatchPrologueSpec) for `blocks` blocks and `experts` experts: its
// meeting counters (kPrologueScratchHeader i32), then each block's pick counts per expert (i32 [blocks][experts]);
// zero before the first launch, left zero by each.
inline constexpr int64_t kPrologueScratchHeader = 4;
inline constexpr int64_t prologueScratchBytes(int64_t blocks, int64_t experts) {
  return (kPrologueScratchHeader + blocks * experts) * 4;
}

// The fused combine's counters (heap moe.done, i64 [2][doneSlots(R)], indexed by the epoch's parity; the stale
// parity's are zeroed by dispatch_prologue and stage_begin): [0, R) the blocks done per owner rank, then
// [R, R + kCombineChunks) the MMA warpgroups of every rank past each column chunk (the early reduce).
inline constexpr int64_t kCombineChunks = 8;
inline constexpr int64_t doneSlots(int64_t ranks) { return ranks + kCombineChunks; }

// The split scratch of the grouped_gemm_{nt,nn,tn}_tma kernels (kernels/Kernels.h) for a grid: i32 counters, 2 per
// block in whole 256-byte lines (zero before the first launch; every launch leaves them zero), then one fp32
// 128 x 256 partial tile per block (any contents).
inline constexpr int64_t kSplitTileFloats = 128 * 256;
inline constexpr int64_t splitCounterBytes(int64_t grid) { return (grid * 2 + 63) / 64 * 256; }
inline constexpr int64_t splitScratchBytes(int64_t grid) {
  return splitCounterBytes(grid) + grid * kSplitTileFloats * 4;
}

}  // namespace megamoe::abi
