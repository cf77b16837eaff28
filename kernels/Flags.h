// Flag identities the communicating kernels report in the device error record (compiler/abi/DeviceAbi.h), and the
// end of the counters a kernel's blocks share within a launch.
#pragma once
#include <functional>
#include <optional>

#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"

namespace megamoe::kernels {

// DeviceError::flag of a wait for peer `peer`'s signal, and of a wait for the rows source rank `source` pushes for
// local expert `expert`: the host's message then names the rank waited for (describeDeviceError).
inline dsl::I64 peerFlagId(dsl::Kernel& k, const dsl::I32& peer) {
  return k.widen(peer) + int64_t(abi::flagId(abi::FlagKind::kPeer, 0));
}
inline dsl::I64 arrivalFlagId(dsl::Kernel& k, const dsl::I32& source, const dsl::I32& expert) {
  return k.widen(source * 65536 + expert) + int64_t(abi::flagId(abi::FlagKind::kArrivals, 0));
}

// The calling thread, one per block, once its block is done with the counters the blocks share: counts the block in
// `done` (global i32, zero at launch); the last of `blocks` runs `reset`, which zeroes those counters (`done`
// included) for the next launch (a kernel boundary separates the two).
inline void resetIfLastBlock(dsl::Kernel& k, const dsl::GlobalPtr& done, const dsl::I32& blocks,
                             const std::function<void()>& reset) {
  dsl::I32 past = done.atomicAddI32(k.i32(1));
  k.ifThen(past == blocks - 1, reset);
}

// The start of a kernel after an earlier kernel of the call may have claimed the error record (a bad index, a
// timeout): return at once where it has. Thread 0 reads the record once and the block (with blockInPair, both blocks
// of the cluster pair: once both run, each stores what it read into its own and its partner's shared slot, then the
// pair meets)
// decides on what was read, so all threads of a block and both blocks of a pair return together or go on together.
// A load per thread could see a claim landing between two loads, and a block, or a warp, that went on would wait for
// its partner's cluster barriers or mailbox forever.
// `seen`: a shared i32 table of 2 entries (static or dynamic, as the kernel's other tiles), the same offset in both
// blocks of a pair; entry b holds what block b of the pair read (0 clear, 1 claimed), entry 0 without pairs.
inline void returnIfErrorAtStart(dsl::Kernel& k, const dsl::Context& ctx, const dsl::SharedTile& seen,
                                 const std::optional<dsl::I32>& blockInPair) {
  using namespace dsl;
  I32 mine = blockInPair ? *blockInPair : k.i32(0);
  // A block may write its partner's shared memory only once the partner runs (compute-sanitizer's racecheck reported
  // the store into a block "that might not have entered yet" without this first meeting).
  if (blockInPair) k.clusterSync();
  k.ifThen(k.threadIdx() == 0, [&] {
    I32 claimed = k.select(k.errorClear(ctx), k.i32(0), k.i32(1));
    seen.storeI32(mine, claimed);
    if (blockInPair) seen.storePeerI32(mine, claimed, k.i32(1) - mine);
  });
  if (blockInPair) {
    k.clusterSync();
    k.returnIf(!(seen.loadI32(k.i32(0)) + seen.loadI32(k.i32(1)) == 0));
  } else {
    k.block().sync();
    k.returnIf(!(seen.loadI32(k.i32(0)) == 0));
  }
}

// Of `count` rows starting at row `start` of a receive pool, how many lie below its `capacity` (the rows it holds;
// the rest are dropped picks'). `start` may lie at or past the capacity (then none): both are compared as they are,
// never through a difference, since the DSL's comparisons are unsigned.
inline dsl::I32 rowsBelowCapacity(dsl::Kernel& k, const dsl::I32& start, const dsl::I32& count,
                                  const dsl::I32& capacity) {
  dsl::I32 room = capacity - start;  // meaningful only where start < capacity
  return k.select(start < capacity, k.select(room < count, room, count), k.i32(0));
}

// Threads [0, threads) of one block: zero the stale epoch parity's cross-rank counters, the arrivals (heap i64
// [2][R][local]) and the combine's `done` (heap i64 [2][abi::doneSlots(R)]). Safe because every increment of the call
// that used them was waited for before this call could begin (docs/decisions/fused-dispatch.md).
inline void zeroStaleCounters(dsl::Kernel& k, const dsl::GlobalPtr& arrivals, const dsl::GlobalPtr& done,
                              const dsl::I64& stale, int64_t R, int64_t local, const dsl::I32& tid, int64_t threads) {
  k.forRange(tid, k.i32(R * local), k.i32(threads),
             [&](dsl::I32 i) { (arrivals + (stale * (R * local) + k.widen(i))).storeI64(k.i64(0)); });
  const int64_t slots = abi::doneSlots(R);
  k.ifThen(tid < k.i32(slots), [&] { (done + (stale * slots + k.widen(tid))).storeI64(k.i64(0)); });
}

}  // namespace megamoe::kernels
