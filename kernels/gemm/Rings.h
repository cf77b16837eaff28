// The shared-memory tiles both GEMM engines run on: the A and B rings (one slot per K stage) and the staging tile
// the epilogue passes the accumulators through; and the mbarrier hand-overs between a producer and its consumers
// (BarrierRing, Turns), so that no engine computes a barrier index or a phase parity itself.
#pragma once
#include <cstdint>
#include <optional>

#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {

// The shared-memory buffers of the main loop and the epilogue, in every kernel that runs a GEMM engine. The rings'
// layouts are what their copies write and the MMA reads: K-major [MN][64] rings (FP8: [MN][128]) in k128B; MN-major [64][MN] ones in
// mn128B (tile copies), or mn128BBoxes where TMA boxes fill them. The staging tile is rowMajor.
struct Rings {
  dsl::SharedTile a, b, staging;
};
// stagingRows: c.m, or 64 when the MMA warpgroups take turns with one warpgroup's rows (warp-specialised).
// mn: the layout of MN-major rings, mn128BBoxes where TMA boxes load them (tensor maps), else mn128B
// (mnRingLayout). stagingBoxes: the staging tile in TMA's boxes (mn128BBoxes), for an epilogue of tmaStores.
inline Rings allocateRings(dsl::Kernel& k, const GroupedGemmSpec& s, const GroupedGemmSpec::Tiles& c, dsl::Layout mn,
                           int64_t stagingRows = 0, bool stagingBoxes = false) {
  using namespace dsl;
  bool tn = s.layout == GroupedGemmSpec::kTN, nt = s.layout == GroupedGemmSpec::kNT;
  const Elem e = c.e4m3 ? Elem::e4m3 : Elem::bf16;  // (FP8 is NT only: its rings are K-major)
  SharedTile a = tn ? k.dynamicSharedTile("ring_a", e, c.k, c.m, c.stages, mn)
                    : k.dynamicSharedTile("ring_a", e, c.m, c.k, c.stages, Layout::k128B);
  SharedTile b = nt ? k.dynamicSharedTile("ring_b", e, c.n, c.k, c.stages, Layout::k128B)
                    : k.dynamicSharedTile("ring_b", e, c.k, c.n, c.stages, mn);
  // Staging rows padded by 8 elements (16 bytes): the 8 rows a warp's fragment store touches fall in distinct banks
  // (in TMA's boxes the swizzle spreads them).
  const int64_t rows = stagingRows ? stagingRows : c.m;
  return {a, b,
          stagingBoxes ? k.dynamicSharedTile("staging", Elem::bf16, rows, c.n, 1, Layout::mn128BBoxes)
                       : k.dynamicSharedTile("staging", Elem::bf16, rows, c.n, 1, Layout::rowMajor, c.n + 8)};
}

// Where a consumer stands in a BarrierRing: the entry of its next hand-over and that round's phase parity, carried
// through a loop (computed one step ahead, so that the barrier address does not wait for arithmetic in the step).
struct RingPosition {
  dsl::I32 entry, phase;
};

// A ring of `depth` entries passed from producers to consumers on mbarriers (CUTLASS's pipeline state, as an object):
// entry e holds a hand-over once full(e) completes a phase, and is free again once empty(e) does. Both sides number
// the hand-overs 0, 1, ...: hand-over n uses entry n % depth in round n / depth, whose phases have parity
// (n / depth) % 2. The producer acquires the entry (waits for the release of round n / depth - 1; round 0 finds it
// free), fills it and commits; the consumer waits, reads and releases. The barriers are bars[fullAt + e] and
// bars[emptyAt + e].
struct BarrierRing {
  dsl::Kernel& k;
  dsl::SharedTile bars;
  int64_t depth, fullAt, emptyAt;

  dsl::I32 entry(const dsl::I32& n) const { return n % depth; }
  // The entry of hand-over n - 1, for n >= 1 (written without the n - 1, which would wrap around at n = 0).
  dsl::I32 entryBefore(const dsl::I32& n) const { return (n + (depth - 1)) % depth; }
  dsl::I32 full(const dsl::I32& e) const { return fullAt ? e + fullAt : e; }
  dsl::I32 empty(const dsl::I32& e) const { return e + emptyAt; }
  RingPosition position(const dsl::I32& n) const { return {n % depth, (n / depth) % 2}; }

  // One thread, before anyone uses the ring (a block or cluster barrier must follow): arrivals that complete a
  // phase of each full and each empty barrier.
  void init(int64_t fullArrivals, int64_t emptyArrivals) const {
    for (int64_t e = 0; e < depth; ++e) {
      k.mbarrierInit(bars, full(k.i32(e)), fullArrivals);
      k.mbarrierInit(bars, empty(k.i32(e)), emptyArrivals);
    }
  }
  // Producer of hand-over n into its entry e (= entry(n)): waits until the consumers of the entry's previous round
  // have released it. clusterAcquire: they released it from another CTA of the cluster (releasePeer).
  void acquire(const dsl::I32& n, const dsl::I32& e, bool clusterAcquire = false) const {
    k.ifThen(k.i32(depth - 1) < n, [&] { k.mbarrierWait(bars, empty(e), (n / depth + 1) % 2, clusterAcquire); });
  }
  // Producer: entry e is filled (this thread's arrival; the async copies' (commitAsync), or the arrival that also
  // expects `bytes` from TMA loads completing on full(e) (commitExpecting)).
  void commit(const dsl::I32& e) const { k.mbarrierArrive(bars, full(e)); }
  void commitAsync(const dsl::I32& e) const { k.asyncArrive(bars, full(e)); }
  void commitExpecting(const dsl::I32& e, int64_t bytes) const { k.mbarrierArriveExpectTx(bars, full(e), bytes); }
  // Consumer: waits for hand-over n (in entry(n)), for hand-over n in its entry e, or at a carried position.
  void wait(const dsl::I32& n) const { k.mbarrierWait(bars, full(n % depth), (n / depth) % 2); }
  void wait(const dsl::I32& n, const dsl::I32& e) const { k.mbarrierWait(bars, full(e), (n / depth) % 2); }
  void wait(const RingPosition& at) const { k.mbarrierWait(bars, full(at.entry), at.phase); }
  // Consumer: done with entry e. With `blockInPair` (a cluster pair whose producers both write this block's copy
  // of the entry) the other block's producer is told too.
  void release(const dsl::I32& e, const std::optional<dsl::I32>& blockInPair = std::nullopt) const {
    dsl::I32 bar = empty(e);
    k.mbarrierArrive(bars, bar);
    if (blockInPair) k.mbarrierArrivePeer(bars, bar, k.i32(1) - *blockInPair);
  }
  // Consumer in another CTA of the cluster than the producer: releases entry e of CTA `cta`'s ring (cluster scope).
  void releasePeer(const dsl::I32& e, const dsl::I32& cta) const {
    k.mbarrierArrivePeer(bars, empty(e), cta, /*clusterRelease=*/true);
  }
  // The step from position `at`: the entry before it (the previous hand-over's) and the position after it.
  struct Step {
    dsl::I32 previous;
    RingPosition next;
  };
  Step step(const RingPosition& at) const {
    dsl::Bool last = at.entry == depth - 1;
    dsl::I32 previous = k.select(at.entry == 0, k.i32(depth - 1), at.entry - 1);
    return {previous, {k.select(last, k.i32(0), at.entry + 1), k.select(last, k.i32(1) - at.phase, at.phase)}};
  }
};

// Two parties taking turns on one resource (e.g. the MMA warpgroups on the staging tile), on mbarriers bars[at] and
// bars[at + 1]: party 0's turn j follows party 1's turn j - 1, party 1's turn j follows party 0's turn j.
struct Turns {
  dsl::Kernel& k;
  dsl::SharedTile bars;
  int64_t at;

  dsl::I32 barrier(int64_t party) const { return k.i32(at + party); }
  // One thread: `arrivals` (the other party's threads) complete a turn.
  void init(int64_t arrivals) const {
    for (int64_t w = 0; w < 2; ++w) k.mbarrierInit(bars, barrier(w), arrivals);
  }
  // Party w waits for its turn j.
  void wait(int64_t w, const dsl::I32& j) const {
    if (w == 0)
      k.ifThen(k.i32(0) < j, [&] { k.mbarrierWait(bars, barrier(0), (j - 1) % 2); });
    else
      k.mbarrierWait(bars, barrier(1), j % 2);
  }
  // Party w is done: the other party's turn (every thread of w arrives; or one thread for party w, a run-time 0 / 1,
  // where init counted one arrival).
  void pass(int64_t w) const { k.mbarrierArrive(bars, barrier(1 - w)); }
  void passFor(const dsl::I32& w) const { k.mbarrierArrive(bars, k.i32(at + 1) - w); }
};

}  // namespace megamoe::kernels
