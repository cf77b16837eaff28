// The split-K tail of the warp-specialised engine: the last round of tickets, which would leave most drawers idle,
// runs split over K; each split stores a partial tile and the last one to arrive sums them into the staging tile.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>

#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"
#include "kernels/gemm/SharedTables.h"

namespace megamoe::kernels {

// A ticket's share of its unit's K steps; code = 0 (whole unit) or (tail unit + 1) | split << 16 | ways << 24.
struct KSlice {
  dsl::I32 k0, steps, code;
};

// Standalone NT / NN with tensor maps (WarpSpecializedEngine::enableSplit). The tickets run out unevenly: U units
// (tiles, or pairs' units) over D drawers (blocks, or pairs) leave r = U mod D units for a last round in which D - r
// drawers idle (docs/decisions/gemm-tiles.md, last round split over K). There the last r units run as
// `ways` = min(D / r, maxSplit, K steps) tickets each, split over K: split s multiplies K steps
// [s K / ways, (s + 1) K / ways), each MMA warpgroup stores its fp32 rows into its own partial tile of the scratch
// and counts itself in the tile's counter; the last of the `ways` to arrive sums the partials in split order (so a
// rerun is bitwise identical whoever arrives last), stores the tile as usual and resets the counter. No split waits
// for another (a block's producer may already hold the next ticket of the same unit, so waiting could deadlock).
struct SplitTail {
  // 16-byte chunks per thread and pass of the sum; most splits of a unit (whatever max_split says).
  static constexpr int64_t kSumChunks = 16, kMaxWays = 255;
  dsl::GlobalPtr counters;  // i32, one per (tail unit, block of a pair, MMA warpgroup): zero at launch, left zero
  dsl::GlobalPtr partials;  // f32 [tail tickets x blocks of a pair][kSplitTileFloats]
  dsl::I32 maxSplit;        // 0 or 1: no split
  dsl::SharedTile last;     // shared i32 [2]: per MMA warpgroup, whether it is the tile's last split
  // Cluster pairs: which block of the pair this is (each block has its own partials and counters).
  std::optional<dsl::I32> blockInPair;

  // The tail over `scratch` (abi::splitScratchBytes(grid)); allocates the shared i32 [2], which the kernel's
  // tables must count (WarpSpecializedEngine::stagesFor(c, {..., 2})).
  static SplitTail over(dsl::Kernel& k, const dsl::GlobalPtr& scratch, const dsl::I32& maxSplit, const dsl::I32& grid,
                        const std::optional<dsl::I32>& blockInPair) {
    dsl::I64 counterInts = k.widen((grid * 2 + 63) / 64 * 64);  // abi::splitCounterBytes(grid) / 4
    return SplitTail{scratch, scratch.as(dsl::Elem::f32) + counterInts, maxSplit, sharedTable(k, "split_state", 2),
                     blockInPair};
  }

  // The producer's side. Units below `main` are whole tickets, then `ways` tickets per unit (`all` tickets).
  struct Rounds {
    dsl::I32 main, ways, all;
  };
  // How the `total` units over `drawers` run, for K steps of kSteps.
  Rounds rounds(dsl::Kernel& k, const dsl::I32& total, const dsl::I32& drawers, int64_t kSteps) const {
    using namespace dsl;
    I32 r = total % drawers;
    I32 most = drawers / k.select(r == 0, k.i32(1), r);
    most = k.select(most < maxSplit, most, maxSplit);
    most = k.select(most < k.i32(kSteps), most, k.i32(kSteps));
    most = k.select(most < k.i32(kMaxWays), most, k.i32(kMaxWays));  // the code's 8-bit split index
    Bool on = !(r == 0) && k.i32(1) < most;
    I32 tailUnits = k.select(on, r, k.i32(0));
    I32 ways = k.select(on, most, k.i32(1));
    I32 main = total - tailUnits;
    return {main, ways, main + tailUnits * ways};
  }
  // Ticket t's unit and its share of the unit's K steps.
  std::pair<dsl::I32, KSlice> share(dsl::Kernel& k, const dsl::I32& t, const Rounds& r, int64_t kSteps) const {
    using namespace dsl;
    Bool tail = t >= r.main;
    I32 at = k.select(tail, t - r.main, k.i32(0)), u = at / r.ways, index = at % r.ways;
    I32 unit = k.select(tail, r.main + u, t);
    I32 k0 = index * kSteps / r.ways;
    return {unit, KSlice{k.select(tail, k0, k.i32(0)),
                         k.select(tail, (index + 1) * kSteps / r.ways - k0, k.i32(kSteps)),
                         k.select(tail, u + 1 + index * 65536 + r.ways * 16777216, k.i32(0))}};
  }

  // MMA warpgroup w's side: fields of a split's code, and its partial tile (rows 64w .. are this warpgroup's).
  struct Part {
    dsl::I32 unit, index, ways;
  };
  static Part part(const KSlice& sl) { return {sl.code % 65536 - 1, sl.code / 65536 % 256, sl.code / 16777216}; }
  dsl::I32 blockInPairOr0(dsl::Kernel& k) const { return blockInPair ? *blockInPair : k.i32(0); }
  dsl::GlobalPtr partial(dsl::Kernel& k, const Part& sp, const dsl::I32& index) const {
    dsl::I32 at = (sp.unit * sp.ways + index) * (blockInPair ? 2 : 1) + blockInPairOr0(k);
    return partials + k.widen(at) * abi::kSplitTileFloats;
  }
  // Stores MMA warpgroup wg's partial of an n-wide tile and counts it in; true (every thread of the warpgroup) where
  // it was the last.
  dsl::Bool arrive(dsl::Kernel& k, const dsl::Threads& wg, int64_t n, const dsl::Acc& acc, const KSlice& sl) const {
    using namespace dsl;
    const int64_t w = wg.first() / 128;
    Part sp = part(sl);
    k.ifThen(!(sl.code == 0), [&] {
      wg.storeAcc(acc, partial(k, sp, sp.index), k.i32(n), k.i32(INT32_MAX));
      k.fence();    // this thread's partial before the count ...
      wg.sync();    // ... and every thread's, before the leader counts the warpgroup in
      k.ifThen(k.threadIdx() % 128 == 0, [&] {
        GlobalPtr counter =
            counters + k.widen((sp.unit * (blockInPair ? 2 : 1) + blockInPairOr0(k)) * 2 + int64_t(w));
        Bool lastOne = counter.atomicAddI32(k.i32(1), /*acqRel=*/true) == sp.ways - 1;
        k.ifThen(lastOne, [&] { counter.storeI32(k.i32(0)); });  // every split has counted: reset for the next launch
        last.storeI32(k.i32(w), k.select(lastOne, k.i32(1), k.i32(0)));
      });
      wg.sync();
    });
    return last.loadI32(k.i32(w)) == 1;
  }
  // The last split of warpgroup w: the sum of every split's partial rows, in split order, into `staging` (its 64
  // rows of n columns).
  void sum(dsl::Kernel& k, int64_t n, const dsl::SharedTile& staging, const KSlice& sl, int64_t w) const {
    using namespace dsl;
    const int64_t chunksPerRow = n / 4, chunks = 64 * chunksPerRow / 128;
    Part sp = part(sl);
    k.fence();  // the other splits' partials, seen through the counter, before these loads
    I32 lane = k.threadIdx() % 128;
    // Passes of kSumChunks 16-byte chunks per thread (chunk i of the pass: rows of 64 chunks, a warp's 32 adjacent).
    for (int64_t first = 0; first < chunks; first += kSumChunks) {
      auto at = [&](int64_t i) { return (k.i32(first + i) * 128 + lane); };
      Vec zero = k.zeros(int(4 * kSumChunks), Elem::f32);
      Vec sums = k.forRange(k.i32(0), sp.ways, k.i32(1), zero, [&](I32 idx, Vec acc) {
        GlobalPtr rows = partial(k, sp, idx) + k.i64(64 * w * n);
        for (int64_t i = 0; i < kSumChunks; ++i) {
          I32 q = at(i);
          Vec piece = (rows + k.widen(q / chunksPerRow * n + q % chunksPerRow * 4)).load(4);
          acc = acc.with(int(4 * i), acc.slice(int(4 * i), 4) + piece);
        }
        return acc;
      });
      for (int64_t i = 0; i < kSumChunks; ++i) {
        I32 q = at(i);
        staging.store(q / chunksPerRow, q % chunksPerRow * 4, sums.slice(int(4 * i), 4).to(Elem::bf16));
      }
    }
  }
};

}  // namespace megamoe::kernels
