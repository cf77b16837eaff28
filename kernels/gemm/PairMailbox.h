// The ticket mailbox of a cluster pair (warp-specialised engine): block 0 of the pair draws each ticket and copies
// it into block 1's shared memory, so that both blocks run the same tiles.
#pragma once
#include <cstdint>

#include "dsl/Dsl.h"
#include "kernels/gemm/Rings.h"

namespace megamoe::kernels {

// Two 16-byte slots (i32 [2][4], the same offsets in both blocks) used in turn: ticket j travels in slot j % 2 as a
// shared-memory copy (cp.async.bulk shared::cluster) completing on block 1's full(q); block 1 gives the slot back
// on block 0's empty(q) with a cluster-scope arrival once it has read it.
struct PairMailbox {
  static constexpr int64_t kSlotBytes = 16;  // cp.async.bulk: a multiple of 16
  static constexpr int64_t kBarriers = 4;    // full[2], empty[2]
  // Shared memory it takes beside the engine's: its barriers and slots.
  static constexpr int64_t kSharedBytes = kBarriers * 8 + 2 * kSlotBytes;
  dsl::Kernel& k;
  dsl::SharedTile bars;  // the engine's mbarriers: the mailbox's kBarriers from firstBarrier on
  int64_t firstBarrier;
  dsl::I32 blockInPair;  // which block of the pair this is
  dsl::SharedTile slots;

  static PairMailbox allocate(dsl::Kernel& k, const dsl::SharedTile& bars, int64_t firstBarrier,
                              const dsl::I32& blockInPair) {
    return {k, bars, firstBarrier, blockInPair,
            k.dynamicSharedTile("pair_mailbox", dsl::Elem::i32, 1, kSlotBytes / 4, 2, dsl::Layout::rowMajor, 0,
                                /*align=*/16)};
  }
  // The two slots as a ring: ticket j is hand-over j (block 0 produces, block 1 consumes).
  BarrierRing ring() const { return {k, bars, 2, firstBarrier, firstBarrier + 2}; }

  // Thread 0, with the engine's barriers. full: block 1's own expect_tx, then the copy's bytes; empty: block 1 has
  // read the slot (its arrival on block 0's barrier).
  void init() const { ring().init(1, 1); }
  // The producer leader of each block: ticket number j of the pair, drawn from tickets[0] by block 0.
  dsl::I32 draw(const dsl::GlobalPtr& tickets, const dsl::I32& j) const {
    using namespace dsl;
    const BarrierRing r = ring();
    I32 q = r.entry(j);
    I32 drawn = k.ifElse(blockInPair == 0, [&] {
      // Slot q is free once block 1 has read ticket j - 2 from it.
      r.acquire(j, q, /*clusterAcquire=*/true);
      I32 t = tickets.atomicAddI32(k.i32(1));
      slots.stage(q).storeI32(k.i32(0), t);
      k.proxyFence();  // the generic store before the async-proxy copy reads it
      k.sharedCopyPeer(slots.stage(q), bars, r.full(q), k.i32(1));  // commits: completes on block 1's full(q)
      return t;
    }, k.i32(0));
    I32 received = k.ifElse(blockInPair == 1, [&] {
      r.commitExpecting(q, kSlotBytes);
      r.wait(j, q);
      I32 t = slots.stage(q).loadI32(k.i32(0));
      // Cluster scope: the slot's read above is ordered before block 0 overwrites it.
      r.releasePeer(q, k.i32(0));
      return t;
    }, k.i32(0));
    return drawn + received;
  }
};

}  // namespace megamoe::kernels
