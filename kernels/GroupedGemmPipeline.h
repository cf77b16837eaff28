// The grouped GEMM engine shared by grouped_gemm_{nt,nn,tn} and the fused operators (dispatch_grouped_gemm,
// grouped_gemm_combine): a shared prefix table, the tile scheduler over device-side group offsets, the
// asynchronous-copy / MMA main loop, and the two tile loops (static: t = blockIdx + i * grid; dynamic: tickets from
// a global counter, so that blocks which start late, e.g. after pushing rows to peers, still take their share).
// Internal to kernels/.
#pragma once
#include <functional>
#include <initializer_list>
#include <optional>
#include <stdexcept>

#include "dsl/Dsl.h"
#include "kernels/Flags.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {

// first[i] = sum of count(j) for j < i, for i in [0, n], in shared memory, so that "which i holds item t" is a
// binary search in shared memory.
struct PrefixTable {
  dsl::Kernel& k;
  dsl::SharedTile first;  // >= n + 1 i32
  int64_t n;

  // Every thread of the block calls it; returns the total.
  dsl::I32 build(const std::function<dsl::I32(dsl::I32)>& count) const {
    using namespace dsl;
    k.forRange(k.threadIdx(), k.i32(n), k.i32(k.blockThreads()), [&](I32 i) { first.storeI32(i + 1, count(i)); });
    k.blockSync();
    k.ifThen(k.threadIdx() == 0, [&] {
      first.storeI32(k.i32(0), k.i32(0));
      k.forRange(k.i32(1), k.i32(n + 1), k.i32(1), [&](I32 i) { first.storeI32(i, first.loadI32(i) + first.loadI32(i - 1)); });
    });
    k.blockSync();
    return first.loadI32(k.i32(n));
  }
  // The i with first[i] <= t < first[i + 1] (entries with count 0 have first[i] == first[i + 1]: the last such).
  dsl::I32 find(const dsl::I32& t) const {
    using namespace dsl;
    I32 lo = k.i32(0);  // invariant: first[lo] <= t; binary lifting finds the largest such index
    for (int64_t step = int64_t(1) << 12; step > 0; step >>= 1) {
      if (step >= 2 * n) continue;
      I32 probe = lo + step;
      Bool ok = probe < k.i32(n + 1);
      I32 safe = k.select(ok, probe, k.i32(n));
      lo = k.select(ok && (t >= first.loadI32(safe)), probe, lo);
    }
    return lo;
  }
  dsl::I32 at(const dsl::I32& i) const { return first.loadI32(i); }
};

// Where a tile sits: its expert, the group's row range, and the tile's row/column origin.
struct TilePlace {
  dsl::I32 expert, groupStart, groupEnd, mTile, n0;
};

// Tile t -> place. Expert e owns mTiles(e) x (N / bn) consecutive tiles: ceil(size_e / bm) m-tiles for NT/NN (an
// empty expert none), M / bm for TN (every expert, so that an expert without tokens gets its dW = 0 written).
// Within an expert, n-fastest order: measured on the H200 with an earlier engine (bench/results v4 vs v5), bands of 8
// m-tiles lost 10-20% against it on the DeepSeek-V3 cases (at most 28 n-tiles: the tiles in flight cover a few
// m-tiles of B already); NN since measured otherwise (below).
// Wide problems (N / bn >= kBandFrom, e.g. Mixtral's L1 with 112 n-tiles) go in bands of kBandM m-tiles, m fastest
// within a band: n-fastest, the ~132 tiles in flight span about one m-tile, so all of B[e] (235 MB there, far past
// the 50 MB L2) streams from HBM once per m-tile; in bands it streams once per band. NN (B [K, N], an n-tile's
// slab 512-byte pieces of K rows) bands from kBandFromNN n-tiles: DeepSeek-V3's L1 dgrad (28 n-tiles) went from
// 0.91-0.93 to 1.00-1.13 of torch._grouped_mm on both engines, the layer's dx combine from 8.3 to 7.5 ms; the NT
// L2 (also 28) gained alone but lost 0.5 ms inside the forward combine, TN lost 2-5%, NT L1 (16) lost 15-20%
// (bench/results/2026-11-30-h200-band-order).
//
// Drawn from tickets (`ticketed`: the `_tma` kernels), NT and NN tiles go in bands of kBandTicketsM m-tiles below
// those widths too: tickets start consecutive tiles within microseconds, so the m-tiles sharing an n-tile's B slice
// read it from L2 together, where n-fastest started them ~16 tickets apart and part of B came from HBM twice.
// DeepSeek-V3 L1 on the TMA engine: HBM reads 13-16 -> 9 GB (A + B hold 8.4), L2 bytes 59-62 -> 41-44 GB, the same
// time at base clock; at the power limit +2-3% L1, +2% EP8 L1, +1.5% Qwen3 L1, +4.5% L2, +0-3% L2 dgrad (NN), +2%
// random L1 (bench/results/2026-12-01-h200-tickets-bands, band-ab.txt). The 15-20% loss measured above was on the
// static order, whose blocks drift apart. The fused operators on the single-role loop keep their order: the same
// bands there changed neither leg beyond noise (bench/results/2026-12-01-h200x2-bands-layer); the forward dispatch
// as cluster pairs bands (its stage 7.13 -> 6.91 ms, bench/results/2026-12-01-h200-nt-dispatch-pairs).
//
// Pairs (pairRank set; NT / NN): the tiles are pairs of m-tiles (2i, 2i + 1) of one expert and n-tile, run by the
// two blocks of a cluster (rank 0 and 1), which share B's tile; the second m-tile of an expert with an odd count
// lies past the group (its block computes it and stores nothing), unless the expert's n-tiles come in pairs
// (loneSplit): then the odd last m-tile runs as "lone" tiles, its n-tiles 2q and 2q + 1 on the two blocks, each
// loading its own A and B without multicast. Bands count pairs of m-tiles (half as many per band).
struct TileScheduler {
  dsl::Kernel& k;
  const GroupedGemmSpec& s;
  dsl::GlobalPtr offsets;
  int64_t bm, bn;
  std::optional<dsl::I32> pairRank = std::nullopt;
  bool ticketed = false;

  dsl::I32 offset(const dsl::I32& e) const { return (offsets + k.widen(e)).loadI32(); }
  static constexpr int64_t kBandFrom = 48, kBandFromNN = 28, kBandM = 8, kBandTicketsM = 4;
  int64_t nTiles() const { return s.n / bn; }
  bool wide() const { return nTiles() >= (s.layout == GroupedGemmSpec::kNN ? kBandFromNN : kBandFrom); }
  bool banded() const { return wide() || (ticketed && s.layout != GroupedGemmSpec::kTN); }
  // Pairs with an even number of n-tiles split an expert's odd last m-tile by n-tiles ("lone" tiles, below).
  bool loneSplit() const { return pairRank && nTiles() % 2 == 0; }
  // The scheduler's rows: m-tiles, or with pairs pairs of m-tiles (a band then holds half as many).
  dsl::I32 units(const dsl::I32& mTiles) const {
    return pairRank ? (loneSplit() ? mTiles / 2 : (mTiles + 1) / 2) : mTiles;
  }
  // Tiles of an expert with m m-tiles: its rows' tiles, then with loneSplit the odd last m-tile's n-tile pairs.
  dsl::I32 expertTiles(const dsl::I32& m) const {
    dsl::I32 n = units(m) * nTiles();
    return loneSplit() ? n + m % 2 * (nTiles() / 2) : n;
  }
  int64_t bandUnits() const { return (wide() ? kBandM : kBandTicketsM) / (pairRank ? 2 : 1); }
  dsl::I32 mTiles(const dsl::I32& start, const dsl::I32& end) const {
    if (s.layout == GroupedGemmSpec::kTN) return k.i32(s.kOrM / bm);
    return (end - start + (bm - 1)) / bm;
  }
  PrefixTable table(const dsl::SharedTile& first) const { return {k, first, s.experts}; }
  // Once per block: the first tile of every expert. Returns the total.
  dsl::I32 buildTable(const dsl::SharedTile& first) const {
    return table(first).build([&](dsl::I32 e) {
      return expertTiles(mTiles(offset(e), offset(e + 1)));
    });
  }
  // Tile t's place for this block; with loneSplit, *lone (if given) tells whether the pair's two blocks share
  // the tile's rows (a lone tile: n-tiles 2q and 2q + 1 of the expert's last m-tile) instead of its B slice.
  TilePlace place(const dsl::I32& t, const dsl::SharedTile& first, std::optional<dsl::Bool>* lone = nullptr) const {
    PrefixTable tab = table(first);
    // t past the last tile finds index n; clamped so that no offset past the table is read (the place is unused).
    dsl::I32 found = tab.find(t);
    dsl::I32 e = k.select(found < k.i32(s.experts), found, k.i32(s.experts - 1));
    dsl::I32 local = t - tab.at(e);
    dsl::I32 start = offset(e), end = offset(e + 1), m = mTiles(start, end);
    dsl::I32 unit = local / nTiles(), nTile = local % nTiles();
    if (banded()) {
      const int64_t b = bandUnits();
      dsl::I32 band = local / (b * nTiles()), u0 = band * b;
      dsl::I32 left = units(m) - u0;  // lone tiles: garbage, replaced below
      dsl::I32 rows = k.select(left < k.i32(b), left, k.i32(b));
      // Past the last tile (t clamped above) rows can be 0: divide by 1 there (the place is unused).
      rows = k.select(k.i32(0) < rows, rows, k.i32(1));
      dsl::I32 r = local - band * (b * nTiles());
      unit = u0 + r % rows;
      nTile = r / rows;
    }
    if (!loneSplit()) return {e, start, end, pairRank ? unit * 2 + *pairRank : unit, nTile * bn};
    dsl::I32 rowTiles = units(m) * nTiles();
    dsl::Bool isLone = local >= rowTiles;
    if (lone) *lone = isLone;
    dsl::I32 q = local - rowTiles;
    return {e, start, end, k.select(isLone, m - 1, unit * 2 + *pairRank),
            k.select(isLone, q * 2 + *pairRank, nTile) * bn};
  }
};

// The two trailing tensor-map arguments of a kernel that may run the warp-specialised TMA engine: CUtensorMaps where
// the kernel was built with tensor maps (dsl::Kernel's tensorMaps), otherwise unused pointers (empty here).
struct TensorMapArgs {
  std::optional<dsl::TensorMap> a, b;
};
inline TensorMapArgs tensorMapArgs(dsl::Kernel& k) { return {k.tensorMap("map_a"), k.tensorMap("map_b")}; }

// The end of a dynamic tile loop (tickets drawn from tickets[0], global i32 [2] zero at launch): the calling thread,
// one per block, counts its block done in tickets[1]; the last of `grid` blocks resets both for the next launch.
inline void resetTicketsIfLast(dsl::Kernel& k, const dsl::GlobalPtr& tickets, const dsl::I32& grid) {
  resetIfLastBlock(k, tickets + k.i64(1), grid, [&] {
    tickets.storeI32(k.i32(0));
    (tickets + k.i64(1)).storeI32(k.i32(0));
  });
}

// The shared-memory buffers of the main loop and the epilogue, in every kernel that runs the engine.
struct Rings {
  dsl::SharedTile a, b, staging;
};
// stagingRows: c.m, or 64 when the MMA warpgroups take turns with one warpgroup's rows (warp-specialised).
inline Rings allocateRings(dsl::Kernel& k, const GroupedGemmSpec& s, const GroupedGemmSpec::Tiles& c,
                           int64_t stagingRows = 0) {
  using namespace dsl;
  bool tn = s.layout == GroupedGemmSpec::kTN, nt = s.layout == GroupedGemmSpec::kNT;
  // K-major [MN][64] rings, or MN-major [64][MN] ones.
  SharedTile a = tn ? k.dynamicSharedTile(Elem::bf16, c.k, c.m, c.stages) : k.dynamicSharedTile(Elem::bf16, c.m, c.k, c.stages);
  SharedTile b = nt ? k.dynamicSharedTile(Elem::bf16, c.n, c.k, c.stages) : k.dynamicSharedTile(Elem::bf16, c.k, c.n, c.stages);
  // Staging rows padded by 8 elements (16 bytes): the 8 rows a warp's fragment store touches fall in distinct banks.
  return {a, b, k.dynamicSharedTile(Elem::bf16, stagingRows ? stagingRows : c.m, c.n, 1, c.n + 8)};
}
// Shared i32 table of n entries (rounded up to whole 16-byte rows).
inline dsl::SharedTile sharedTable(dsl::Kernel& k, int64_t n) {
  return k.dynamicSharedTile(dsl::Elem::i32, 1, (n + 3) / 4 * 4, 1, 0, /*align=*/16);
}

// The main loop of every layout: a `stages`-deep ring of asynchronous copies; the MMA of stage k overlaps the copies
// of stage k + stages - 1, and the MMA of stage k + 1 is issued before stage k's result is waited for. The ring runs
// on from one tile into the next: a tile's stages start at ring slot `base`, the slot after the previous tile's last
// stage, so that once a tile's last MMA is issued the next tile's first stages can be issued into the free slots
// while that MMA still runs (its place computed then too), before the epilogue. NT reads both operands K-major;
// NN's B and TN's A and B are K x MN slabs kept MN-major.
struct Pipeline {
  dsl::Kernel& k;
  const GroupedGemmSpec& s;
  const GroupedGemmSpec::Tiles& c;
  dsl::GlobalPtr a, b, out;
  dsl::SharedTile ringA, ringB, staging;

  // Optional parts of the fused operators.
  // NT only: B's tile is two halves, rows [n0 / 2, + bn / 2) and [gateUpRows + n0 / 2, + bn / 2) of B[e] (the gate
  // and up rows of a SwiGLU pair, so the epilogue sees gate | up side by side). 0 = plain.
  int64_t gateUpRows = 0;
  // NT / NN: A's tile row r is global row gatherA[r] (shared i32 [c.m], filled by beforeLoads and block-synced)
  // instead of row m0 + r. The table is read when copies are issued, so beforeLoads may rewrite it: every copy of
  // the previous tile was issued before the K loop's last barrier.
  std::optional<dsl::SharedTile> gatherA;
  // Called by every thread before a tile's first copies (may block-sync), e.g. to wait for the rows to arrive.
  std::function<void(const TilePlace&)> beforeLoads;
  // Replaces the default epilogue (staging -> out); called by every thread once the tile is in `staging`.
  std::function<void(const TilePlace&, const dsl::I32& firstRow)> epilogue;
  // 0 (run time) skips the K loop: the tile's accumulator stays zero (communication-only benchmark legs).
  std::function<dsl::I32()> mmaOn;
  // The epilogue sends rows out of the staging tile with bulk copies (Kernel::bulkStore, committed): the next
  // tile's staging waits until they have read it, and the tile loop ends once they are written.
  bool bulkEpilogue = false;

  bool tn() const { return s.layout == GroupedGemmSpec::kTN; }
  bool aMN() const { return tn(); }
  bool bMN() const { return s.layout != GroupedGemmSpec::kNT; }
  // First output row of the tile: NT/NN rows of the group; TN rows of C[e] (M).
  dsl::I32 m0(const TilePlace& p) const { return tn() ? p.mTile * c.m : p.groupStart + p.mTile * c.m; }
  // K steps: fixed for NT/NN; the group's size for TN.
  dsl::I32 kTiles(const TilePlace& p) const {
    dsl::I32 steps = tn() ? (p.groupEnd - p.groupStart + (c.k - 1)) / c.k : k.i32(s.kOrM / c.k);
    return mmaOn ? steps * mmaOn() : steps;
  }
  dsl::I32 slotOf(const dsl::I32& base, const dsl::I32& kt) const { return (base + kt) % c.stages; }
  // Issues the copies of K step kt of tile p into ring slot `slot`.
  void issue(const TilePlace& p, const dsl::I32& kt, const dsl::I32& slot) const {
    using namespace dsl;
    I32 first = m0(p);
    if (tn()) {
      // Rows are the group's tokens: A [tokens, M], B [tokens, N]; tokens past the group are zero-filled.
      I32 row = p.groupStart + kt * c.k;
      I32 valid = p.groupEnd - row;
      k.copyTileMN(a + (k.widen(row) * s.kOrM + k.widen(first)), k.i32(s.kOrM), ringA.stage(slot), valid, true);
      k.copyTileMN(b + (k.widen(row) * s.n + k.widen(p.n0)), k.i32(s.n), ringB.stage(slot), valid, true);
      return;
    }
    if (gatherA) {
      k.copyTileGather(a + k.widen(kt * c.k), k.i32(s.kOrM), *gatherA, ringA.stage(slot), p.groupEnd - first, true, true);
    } else {
      GlobalPtr aRows = a + k.widen(first) * s.kOrM;
      k.copyTile(aRows + k.widen(kt * c.k), k.i32(s.kOrM), ringA.stage(slot), p.groupEnd - first, true, true);
    }
    if (s.layout == GroupedGemmSpec::kNT && gateUpRows > 0) {
      const int64_t half = c.n / 2;
      SharedTile stage = ringB.stage(slot);
      I64 gate = k.widen(p.expert) * (2 * gateUpRows) + k.widen(p.n0 / 2);
      k.copyTile(b + (gate * s.kOrM + k.widen(kt * c.k)), k.i32(s.kOrM), stage.rowSlice(0, half), k.i32(half), true,
                 true);
      k.copyTile(b + ((gate + gateUpRows) * s.kOrM + k.widen(kt * c.k)), k.i32(s.kOrM), stage.rowSlice(half, half),
                 k.i32(half), true, true);
    } else if (s.layout == GroupedGemmSpec::kNT) {
      GlobalPtr bRows = b + (k.widen(p.expert) * s.n + k.widen(p.n0)) * s.kOrM;
      k.copyTile(bRows + k.widen(kt * c.k), k.i32(s.kOrM), ringB.stage(slot), k.i32(c.n), true, true);
    } else {
      GlobalPtr bSlab = b + ((k.widen(p.expert) * s.kOrM + k.widen(kt * c.k)) * s.n + k.widen(p.n0));
      k.copyTileMN(bSlab, k.i32(s.n), ringB.stage(slot), k.i32(c.k), true);
    }
  }
  // The first stages - 1 stages of tile p, into the slots from `base`, each its own copy group.
  void prologue(const TilePlace& p, const dsl::I32& base) const {
    using namespace dsl;
    if (beforeLoads) beforeLoads(p);
    I32 steps = kTiles(p);
    for (int64_t st = 0; st + 1 < c.stages; ++st) {
      k.ifThen(k.i32(st) < steps, [&] { issue(p, k.i32(st), slotOf(base, k.i32(st))); });
      k.asyncCommit();
    }
  }
  // The tile after the running one.
  struct Next {
    dsl::I32 ticket;   // its index
    dsl::Bool exists;  // ticket < total
  };
  // Runs tile p (its first stages already issued from slot `base`); returns the next tile's place (where it exists)
  // and base. `whatNext` (every thread, may block-sync) runs after the K loop and names the next tile (e.g. once
  // its ticket is published).
  std::pair<TilePlace, dsl::I32> tile(const TileScheduler& sched, const dsl::SharedTile& first, const TilePlace& p,
                                      const dsl::I32& base, const std::function<Next()>& whatNext) const {
    using namespace dsl;
    I32 steps = kTiles(p);
    Acc acc = k.forRange(k.i32(0), steps, k.i32(1), k.zeroAcc(c.m, c.n), [&](I32 kt, Acc acc) {
      k.asyncWait(c.stages - 2);  // stage kt has landed (for this thread) ...
      k.blockSync();              // ... and for every thread
      Acc nextAcc = k.mma(acc, ringA.stage(slotOf(base, kt)), ringB.stage(slotOf(base, kt)), /*pending=*/1, aMN(), bMN());
      // The MMA of stage kt - 1 has finished in every warpgroup: its slot can be refilled.
      k.blockSync();
      I32 fill = kt + (c.stages - 1);
      k.ifThen(fill < steps, [&] { issue(p, fill, slotOf(base, fill)); });
      k.asyncCommit();  // an empty group past the end keeps the wait counts uniform
      return nextAcc;
    });
    // Only the last stage's MMA may still run: the other slots are free for the next tile's first stages.
    Next nx = whatNext();
    I32 nextBase = slotOf(base, steps);
    TilePlace next = sched.place(nx.ticket, first);  // clamped where the next tile does not exist
    k.ifThen(nx.exists, [&] { prologue(next, nextBase); });
    acc = k.drain(acc);
    storeTile(p, acc);
    return {next, nextBase};
  }
  // Epilogue through shared memory: fragments into a padded staging tile, then 16-byte coalesced row stores (or the
  // kernel's own epilogue). Every thread of the MMA group.
  void storeTile(const TilePlace& p, const dsl::Acc& acc) const {
    using namespace dsl;
    if (bulkEpilogue) {
      k.bulkWait(/*readOnly=*/true);  // the previous tile's bulk copies have read the staging tile
      k.blockSync();
    }
    I32 first0 = m0(p);
    k.storeAcc(acc, staging);
    k.blockSync();
    if (epilogue)
      epilogue(p, first0);
    else
      storeStaged(p, first0);
    if (!bulkEpilogue) k.blockSync();  // the next tile's epilogue overwrites the staging tile
  }
  // The default epilogue's stores: the staging tile's rows, C's rows from first0 on (TN: rows of dW[e], all of them;
  // NT / NN: those inside the group, none where first0 lies past it, e.g. a pair's second m-tile).
  void storeStaged(const TilePlace& p, const dsl::I32& first0) const {
    using namespace dsl;
    if (tn())
      k.copyTile(staging, out + ((k.widen(p.expert) * s.kOrM + k.widen(first0)) * s.n + k.widen(p.n0)), k.i32(s.n),
                 k.i32(staging.rows()), /*swizzle=*/false);
    else
      k.copyTile(staging, out + (k.widen(first0) * s.n + k.widen(p.n0)), k.i32(s.n),
                 k.select(first0 < p.groupEnd, p.groupEnd - first0, k.i32(0)), /*swizzle=*/false);
  }
  // After the tile loop: every copy this thread started has completed (bulk stores: written, and ordered before a
  // release that follows).
  void finish() const {
    k.asyncWait(0);
    if (bulkEpilogue) k.bulkWait(/*readOnly=*/false);
  }

  // A tile's place carried from one tile-loop iteration to the next.
  static std::vector<dsl::I32> pack(const TilePlace& p) { return {p.expert, p.groupStart, p.groupEnd, p.mTile, p.n0}; }
  static TilePlace unpack(const std::vector<dsl::I32>& v) { return {v[0], v[1], v[2], v[3], v[4]}; }

  // Static persistent loop: block b runs tiles b, b + grid, ...
  void runStatic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::I32& grid) const {
    using namespace dsl;
    I32 total = sched.buildTable(first);
    I32 b0 = k.blockIdx();
    TilePlace p0 = sched.place(b0, first);
    k.ifThen(b0 < total, [&] { prologue(p0, k.i32(0)); });
    std::vector<I32> init = pack(p0);
    init.push_back(k.i32(0));  // base
    k.forRange(b0, total, grid, init, [&](I32 t, const std::vector<I32>& v) {
      I32 t2 = t + grid;
      auto [next, base] = tile(sched, first, unpack(v), v[5], [&] { return Next{t2, t2 < total}; });
      std::vector<I32> out = pack(next);
      out.push_back(base);
      return out;
    });
    finish();
  }

  // Dynamic loop: tiles in order of tickets drawn from tickets[0] (global i32, zero at launch); `slots` is a shared
  // i32 [1]. A tile draws the next ticket when it starts and publishes it once its K loop is done, so that the
  // atomic's round trip is never waited for. The last of `grid` blocks to run out of tiles resets tickets[0..1] to
  // zero for the next launch.
  void runDynamic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::GlobalPtr& tickets,
                  const dsl::SharedTile& slots, const dsl::I32& total, const dsl::I32& grid) const {
    using namespace dsl;
    // Thread 0 draws; the ticket reaches the block through a shared slot.
    auto draw = [&] { return k.ifElse(k.threadIdx() == 0, [&] { return tickets.atomicAddI32(k.i32(1)); }, k.i32(0)); };
    auto publish = [&](const I32& ticket) {
      k.ifThen(k.threadIdx() == 0, [&] { slots.storeI32(k.i32(0), ticket); });
      k.blockSync();
      return slots.loadI32(k.i32(0));  // the next write is a whole tile (and its barriers) later
    };
    I32 t0 = publish(draw());
    k.ifThen(t0 < total, [&] { prologue(sched.place(t0, first), k.i32(0)); });
    // Carried: the running tile's ticket and base slot. Its place is looked up again when it starts rather than
    // carried like the static loop's: the fused kernels are at the register file's limit (measured: the combine
    // spills otherwise).
    k.whileLoop({t0, k.i32(0)}, [&](const std::vector<I32>& v) { return v[0] < total; },
                [&](const std::vector<I32>& v) {
                  I32 ticket = draw();
                  I32 t2 = k.i32(0);
                  auto next = tile(sched, first, sched.place(v[0], first), v[1], [&] {
                    t2 = publish(ticket);
                    return Next{t2, t2 < total};
                  });
                  return std::vector<I32>{t2, next.second};
                });
    finish();
    k.ifThen(k.threadIdx() == 0, [&] { resetTicketsIfLast(k, tickets, grid); });
  }
};

// The warp-specialised engine (sm_90a, Tiles::warpSpecialized): the last warpgroup (the producer) issues every
// copy, the MMA warpgroups only wait, multiply and store. Ring slot s passes from producer to MMA on full[s] (its
// copies have landed: one cp.async arrival per producer thread) and back on empty[s] (the MMA that read it has
// finished: one arrival per MMA warpgroup). The producer runs up to `stages` slots ahead, across tiles, so the next
// tile's first stages load while the MMA warpgroups run the epilogue. Tiles reach the MMA warpgroups through a
// two-entry hand-over table in shared memory (tileFull / tileEmpty), the last entry marked invalid. Each MMA
// warpgroup runs its own loop over its 64 rows of every tile; the two take turns on a 64-row staging tile. Registers move
// to the MMA warpgroups (setmaxnreg): at 384 threads a block starts at 168 each; the producer gives 112 of them
// back and the MMA warpgroups take them (56 + 2 x 216 fits the 168 x 3 launched; at 48 the producer spilled).
//
// With tensor maps (sm_90a TMA) one producer thread loads each stage as boxes completing on full[s] (expected
// bytes), so the producer's copies cost a few instructions instead of 24 cp.async with their addresses per thread:
// NT / NN's A [rows, K] in boxes of 128 rows x 64 K, NT's B [E * N, K] in boxes of 128 rows x 64 K, NN's B
// [E * K, N] and TN's A [tokens, M] and B [tokens, N] in boxes of 64 K x 64 MN (MN atoms outermost: mma_tile's
// mn_atoms_outer; TN zeroes a group's partial last step in shared memory, zeroTail).
struct WarpSpecialized {
  static constexpr int64_t kHandover = 2, kFields = 8, kProducerRegisters = 56, kMmaRegisters = 216;
  // Split-K tail: 16-byte chunks per thread and pass of the sum; most splits of a unit (whatever max_split says).
  static constexpr int64_t kSumChunks = 16, kMaxWays = 255;
  const Pipeline& pipe;
  // mbarriers: full[S], empty[S], tileFull[2], tileEmpty[2], with pairs mailFull[2], mailEmpty[2], then turn[2];
  // info: i32 [2][8]
  dsl::SharedTile bars, info;
  std::optional<dsl::TensorMap> mapA, mapB;
  // Pairs (with tensor maps, BN = 256): blocks 2c and 2c + 1 form a cluster running the scheduler's m-tile pairs;
  // each loads its own A and one half of B, multicast into both, so B's traffic from L2 halves.
  std::optional<dsl::I32> rank = std::nullopt;
  // Pairs drawing tickets: block 0 of the pair draws, and sends each ticket into block 1's mailbox (i32 [2][4]: two
  // 16-byte slots, the same offsets in both blocks) as a shared-memory copy completing on block 1's mailFull.
  std::optional<dsl::SharedTile> mail = std::nullopt;
  // Split-K tail (standalone NT / NN with tensor maps; enableSplit). The tickets run out unevenly: U units (tiles,
  // or pairs' units) over D drawers (blocks, or pairs) leave r = U mod D units for a last round in which D - r
  // drawers idle, e.g. DeepSeek-V3's L1 as pairs 4 units of 66 (1.5% of the kernel), its L2 dgrad 2 of 66 (3%).
  // There the last r units run as `ways` = min(D / r, maxSplit, K steps) tickets each, split over K: split s
  // multiplies K steps [s K / ways, (s + 1) K / ways), each MMA warpgroup stores its fp32 rows into its own partial
  // tile of the scratch and counts itself in the tile's counter; the last of the `ways` to arrive sums the partials
  // in split order (so a rerun is bitwise identical whoever arrives last), stores the tile as usual and resets the
  // counter. No split waits for another (a block's producer may already hold the next ticket of the same unit, so
  // waiting could deadlock).
  struct SplitTail {
    dsl::GlobalPtr counters;  // i32, one per (tail unit, pair rank, MMA warpgroup): zero at launch, left zero
    dsl::GlobalPtr partials;  // f32 [tail tickets x pair ranks][kSplitTileFloats]
    dsl::I32 maxSplit;        // 0 or 1: no split
    dsl::SharedTile last;     // shared i32 [2]: per MMA warpgroup, whether it is the tile's last split
  };
  std::optional<SplitTail> split = std::nullopt;
  // A ticket's share of its unit's K steps; code = 0 (whole unit) or (tail unit + 1) | split << 16 | ways << 24.
  struct Slice {
    dsl::I32 k0, steps, code;
  };
  // Fused operators (with tensor maps; Pipeline's beforeLoads stays unset): called by the producer leader alone
  // before a tile's loads, e.g. to wait for the tile's rows to arrive.
  std::function<void(const TilePlace&)> leaderBeforeLoads;
  // Replaces the default row stores: called by the 128 threads of MMA warpgroup w (its own group: blockSync is its
  // barrier) once its 64 rows of the tile, from firstRow on, are in the staging tile.
  std::function<void(const TilePlace&, const dsl::I32& firstRow, int64_t w)> epilogue;
  // The epilogue sends staging rows out as bulk copies (committed): they have read the staging tile before the
  // other warpgroup takes its turn, and are written before the MMA warpgroups leave the engine.
  bool bulkEpilogue = false;

  // Ring stages: 4 when they fit the 227 KB beside the 64-row staging tile, the engine's barriers (1024-byte
  // aligned, as every mbarriers() tile) and hand-over table and the kernel's own shared i32 tables (entries each;
  // sharedTable rounds to 16 bytes), else 3.
  static constexpr int64_t kMailBytes = 16;  // a pair's ticket mailbox slot (cp.async.bulk: a multiple of 16)
  static int64_t stagesFor(const GroupedGemmSpec::Tiles& c, std::initializer_list<int64_t> tables, bool pairs = false) {
    // 16 barriers: full / empty at 4 stages, the tile hand-over's 4 and the staging turns' 2 (pairs: 4 more).
    int64_t bytes = 1024 + 16 * 8 + kHandover * kFields * 4 + 64 * (c.n + 8) * 2;
    if (pairs) bytes += 4 * 8 + 2 * kMailBytes;  // the mailbox's barriers and slots
    for (int64_t n : tables) bytes += (n + 3) / 4 * 16;
    return bytes + 4 * (c.m + c.n) * c.k * 2 <= 227 * 1024 ? 4 : 3;
  }

  // The staging tile holds one warpgroup's 64 rows (allocateRings(..., 64)): the MMA warpgroups run their own K
  // loops over the shared ring and take turns storing, so one stores while the other multiplies.
  static WarpSpecialized allocate(const Pipeline& pipe, std::optional<dsl::TensorMap> mapA = std::nullopt,
                                  std::optional<dsl::TensorMap> mapB = std::nullopt,
                                  std::optional<dsl::I32> rank = std::nullopt) {
    if (mapA.has_value() != mapB.has_value() || (mapA && pipe.beforeLoads) ||
        (mapA && pipe.gateUpRows && (pipe.s.layout != GroupedGemmSpec::kNT || pipe.c.n != 256)))
      throw std::logic_error("tensor maps: both operands; gate | up halves only as NT's two 128-row boxes");
    if (rank && (!mapA || pipe.c.n != 256 || pipe.tn())) throw std::logic_error("pairs: tensor maps, NT / NN, BN = 256");
    if (pipe.staging.rows() != 64 || pipe.epilogue || pipe.bulkEpilogue)
      throw std::logic_error("warp-specialised: a 64-row staging tile and the default epilogue");
    WarpSpecialized ws{pipe, pipe.k.mbarriers(2 * pipe.c.stages + 2 * kHandover + (rank ? 4 : 0) + 2),
                       pipe.k.dynamicSharedTile(dsl::Elem::i32, 1, kHandover * kFields, 1, 0, /*align=*/16), mapA,
                       mapB, rank};
    if (rank) ws.mail = pipe.k.dynamicSharedTile(dsl::Elem::i32, 1, kMailBytes / 4, 2, 0, /*align=*/16);
    return ws;
  }
  // The split-K tail over `scratch` (abi::splitScratchBytes(grid)); the kernel's tables must count the shared
  // i32 [2] it allocates (stagesFor(c, {..., 2})).
  void enableSplit(const dsl::GlobalPtr& scratch, const dsl::I32& maxSplit, const dsl::I32& grid) {
    dsl::Kernel& k = pipe.k;
    if (!tma() || pipe.tn() || pipe.epilogue || pipe.mmaOn)
      throw std::logic_error("split-K tail: plain NT / NN with TMA");
    dsl::I64 counterInts = k.widen((grid * 2 + 63) / 64 * 64);  // abi::splitCounterBytes(grid) / 4
    split = SplitTail{scratch, scratch.as(dsl::Elem::f32) + counterInts, maxSplit, sharedTable(k, 2)};
  }
  int64_t warpgroups() const { return pipe.c.mmaThreads() / 128; }
  // The staging tile passes between the MMA warpgroups on mbarrier turn(w) (warpgroup w's turn): the other
  // warpgroup's 128 threads arrive once done with it (release), w waits before using it (acquire). Named barriers
  // (bar.arrive / bar.sync) ordered the same accesses, but compute-sanitizer racecheck does not follow bar.arrive
  // and reported every hand-over as a hazard; it follows mbarriers.
  dsl::I32 turn(int64_t w) const { return pipe.k.i32(2 * stages() + 2 * kHandover + (rank ? 4 : 0) + w); }
  // TN with TMA: both MMA warpgroups meet here once they have zeroed their share of a group's last K step.
  static constexpr int kTailBarrier = 7;
  // Rows of one 64 MN x 64 K TMA box (8 KB: 64 K rows of 128 bytes) in a [K][MN] ring tile of `cols` elements.
  static int64_t boxRows(const dsl::SharedTile& t) { return 8192 / (t.cols() * 2); }
  bool tma() const { return mapA.has_value(); }
  int64_t stages() const { return pipe.c.stages; }
  dsl::I32 full(const dsl::I32& slot) const { return slot; }
  dsl::I32 empty(const dsl::I32& slot) const { return slot + stages(); }
  dsl::I32 tileFull(const dsl::I32& q) const { return q + 2 * stages(); }
  dsl::I32 tileEmpty(const dsl::I32& q) const { return q + (2 * stages() + kHandover); }
  dsl::I32 mailFull(const dsl::I32& q) const { return q + (2 * stages() + 2 * kHandover); }
  dsl::I32 mailEmpty(const dsl::I32& q) const { return q + (2 * stages() + 2 * kHandover + 2); }

  // Thread 0 sets up the barriers; every thread of the block calls it.
  void init() const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    k.ifThen(k.threadIdx() == 0, [&] {
      for (int64_t sl = 0; sl < stages(); ++sl) {
        k.mbarrierInit(bars, full(k.i32(sl)), tma() ? 1 : k.blockThreads() - pipe.c.mmaThreads());
        k.mbarrierInit(bars, empty(k.i32(sl)), warpgroups() * (rank ? 2 : 1));
      }
      for (int64_t q = 0; q < kHandover; ++q) {
        k.mbarrierInit(bars, tileFull(k.i32(q)), 1);
        k.mbarrierInit(bars, tileEmpty(k.i32(q)), pipe.c.mmaThreads());  // every reader of the entry
      }
      for (int64_t w = 0; w < 2; ++w) k.mbarrierInit(bars, turn(w), 128);
      if (rank)
        for (int64_t q = 0; q < 2; ++q) {
          k.mbarrierInit(bars, mailFull(k.i32(q)), 1);   // block 1: its own expect_tx, then the copy's bytes
          k.mbarrierInit(bars, mailEmpty(k.i32(q)), 1);  // block 0: block 1 has read the slot
        }
    });
    if (rank)
      k.clusterSync();  // both blocks' barriers exist before either multicasts or arrives on the other's
    else
      k.blockSync();
  }

  // Producer leader: hands tile number j (its place, or the end mark) to the MMA warpgroups.
  void handOver(const dsl::I32& j, const TilePlace* p, const std::optional<Slice>& slice = std::nullopt) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    I32 q = j % kHandover;
    k.ifThen(k.i32(kHandover - 1) < j, [&] { k.mbarrierWait(bars, tileEmpty(q), (j / kHandover + 1) % 2); });
    I32 at = q * kFields;
    info.storeI32(at, k.i32(p ? 1 : 0));
    if (p) {
      std::vector<I32> v = Pipeline::pack(*p);
      for (size_t f = 0; f < v.size(); ++f) info.storeI32(at + int64_t(f + 1), v[f]);
      if (slice) {  // fields 6 and 7 (K steps below 2^16)
        info.storeI32(at + 6, slice->k0 + slice->steps * 65536);
        info.storeI32(at + 7, slice->code);
      }
    }
    k.mbarrierArrive(bars, tileFull(q));
  }
  // MMA warpgroups: waits for tile number j's entry; returns its valid flag.
  dsl::I32 receive(const dsl::I32& j) const {
    pipe.k.mbarrierWait(bars, tileFull(j % kHandover), (j / kHandover) % 2);
    return info.loadI32((j % kHandover) * kFields);
  }
  TilePlace placeOf(const dsl::I32& q) const {
    std::vector<dsl::I32> v;
    for (int64_t f = 1; f <= 5; ++f) v.push_back(info.loadI32(q * kFields + f));
    return Pipeline::unpack(v);
  }
  Slice sliceOf(const dsl::I32& q) const {
    dsl::I32 ks = info.loadI32(q * kFields + 6);
    return {ks % 65536, ks / 65536, info.loadI32(q * kFields + 7)};
  }

  // Producer: the copies of tile p's K steps from stage counter g on; returns the counter after them.
  dsl::I32 load(const TilePlace& p, const dsl::I32& g) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    if (pipe.beforeLoads) pipe.beforeLoads(p);
    I32 steps = pipe.kTiles(p);
    k.forRange(k.i32(0), steps, k.i32(1), [&](I32 kt) {
      I32 gi = g + kt, slot = gi % stages();
      // Refilling a slot waits until the MMA of its previous round has finished reading it.
      k.ifThen(k.i32(stages() - 1) < gi, [&] { k.mbarrierWait(bars, empty(slot), (gi / stages() + 1) % 2); });
      pipe.issue(p, kt, slot);
      k.asyncArrive(bars, full(slot));
    });
    return g + steps;
  }

  // Producer leader with tensor maps: hands tile p over as tile number j, then (after leaderBeforeLoads) loads its
  // boxes from stage counter g on; returns the counter after them.
  dsl::I32 produceBoxes(const TilePlace& p, const dsl::I32& j, const dsl::I32& g,
                        const std::optional<dsl::Bool>& lone = std::nullopt,
                        const std::optional<Slice>& slice = std::nullopt) const {
    handOver(j, &p, slice);
    if (leaderBeforeLoads) leaderBeforeLoads(p);
    return loadBoxes(p, g, lone, slice);
  }

  // Producer leader with tensor maps: tile p's boxes from stage counter g on; returns the counter after them. Pairs:
  // each block loads its A and half of B multicast into both, or all of its own B where the tile is lone.
  dsl::I32 loadBoxes(const TilePlace& p, const dsl::I32& g, const std::optional<dsl::Bool>& lone = std::nullopt,
                     const std::optional<Slice>& slice = std::nullopt) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    const auto& c = pipe.c;
    const auto& s = pipe.s;
    I32 steps = slice ? slice->steps : pipe.kTiles(p);
    k.forRange(k.i32(0), steps, k.i32(1), [&](I32 kt) {
      I32 gi = g + kt, slot = gi % stages(), kk = (slice ? slice->k0 + kt : kt) * c.k;
      k.ifThen(k.i32(stages() - 1) < gi, [&] { k.mbarrierWait(bars, empty(slot), (gi / stages() + 1) % 2); });
      k.mbarrierArriveExpectTx(bars, full(slot), (c.m + c.n) * c.k * 2);
      if (pipe.tn()) {  // K x MN slabs of the group's rows: A's M atoms and B's N atoms, one 64 x 64 box each
        SharedTile a = pipe.ringA.stage(slot), b = pipe.ringB.stage(slot);
        I32 row = p.groupStart + kk;
        for (int64_t at = 0; at < c.m / 64; ++at)
          k.tmaLoad(*mapA, {pipe.m0(p) + 64 * at, row}, a.rowSlice(boxRows(a) * at, boxRows(a)), bars, full(slot));
        for (int64_t at = 0; at < c.n / 64; ++at)
          k.tmaLoad(*mapB, {p.n0 + 64 * at, row}, b.rowSlice(boxRows(b) * at, boxRows(b)), bars, full(slot));
        return;
      }
      k.tmaLoad(*mapA, {kk, pipe.m0(p)}, pipe.ringA.stage(slot), bars, full(slot));
      SharedTile stage = pipe.ringB.stage(slot);
      // B's boxes: all of them, or with pairs this block's half, multicast into both blocks of the cluster.
      auto loadB = [&](int64_t half, int64_t halves, int64_t multicast) {
        if (s.layout == GroupedGemmSpec::kNT) {
          for (int64_t h = half * 2 / halves; h < (half + 1) * 2 / halves; ++h) {
            // Rows of B[e]: the tile's, or with gate | up halves n0 / 2 .. of the gate rows, then of the up rows.
            I32 row = pipe.gateUpRows ? p.n0 / 2 + h * pipe.gateUpRows : p.n0 + 128 * h;
            k.tmaLoad(*mapB, {kk, p.expert * s.n + row}, stage.rowSlice(128 * h, 128), bars, full(slot), multicast);
          }
        } else {  // K x 64 boxes: 64 rows of 128 bytes, MN atom a at a * 8 KB
          for (int64_t a = half * (c.n / 64) / halves; a < (half + 1) * (c.n / 64) / halves; ++a)
            k.tmaLoad(*mapB, {p.n0 + 64 * a, p.expert * s.kOrM + kk}, stage.rowSlice(c.k / 4 * a, c.k / 4), bars,
                      full(slot), multicast);
        }
      };
      if (rank) {
        if (lone) {
          k.ifThen(!*lone && *rank == 0, [&] { loadB(0, 2, 0b11); });
          k.ifThen(!*lone && *rank == 1, [&] { loadB(1, 2, 0b11); });
          k.ifThen(*lone, [&] { loadB(0, 1, 0); });
        } else {
          k.ifThen(*rank == 0, [&] { loadB(0, 2, 0b11); });
          k.ifThen(*rank == 1, [&] { loadB(1, 2, 0b11); });
        }
      } else {
        loadB(0, 1, 0);
      }
    });
    return g + steps;
  }

  // A warpgroup leader gives a ring slot back: to this block's producer, and with pairs to the peer's too (its
  // multicast writes this block's copy of the slot).
  void release(const dsl::I32& bar) const {
    pipe.k.mbarrierArrive(bars, bar);
    if (rank) pipe.k.mbarrierArrivePeer(bars, bar, pipe.k.i32(1) - *rank);
  }

  // MMA warpgroup w (its own thread group): tile number j, at p, its K loop from stage counter g on (rows 64w ..
  // of the tile), then its rows' epilogue; returns the counter after it.
  dsl::I32 compute(const TilePlace& p, const dsl::I32& g, int64_t w, const dsl::I32& j,
                   const std::optional<Slice>& slice = std::nullopt) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    const auto& c = pipe.c;
    Bool wgLeader = k.threadIdx() % 128 == 0;
    I32 steps = slice ? slice->steps : pipe.kTiles(p);
    // Both warpgroups multiply every tile, even where one's 64 rows lie past the group: letting that one only pass
    // the ring slots on measured 20-30% slower on groups of random sizes (bench/results/2026-11-30-h200x2-tma).
    // The step's ring slot and phase are carried, computed one step ahead: the barrier and operand addresses then
    // do not wait for arithmetic behind the previous step's MMA wait (bench/results/2026-12-01-h200-stall-sites).
    auto looped = k.forRange(
        k.i32(0), steps, k.i32(1), k.zeroAcc(64, c.n), {g % stages(), (g / stages()) % 2},
        [&](I32 kt, Acc acc, const std::vector<I32>& at) {
          I32 slot = at[0], phase = at[1];
          Bool last = slot == stages() - 1;
          I32 previous = k.select(slot == 0, k.i32(stages() - 1), slot - 1);
          std::vector<I32> next{k.select(last, k.i32(0), slot + 1), k.select(last, k.i32(1) - phase, phase)};
          k.mbarrierWait(bars, full(slot), phase);
          if (tma() && pipe.tn()) zeroTail(p, kt, slot, w);
          if (!tma()) k.proxyFence();  // the producer's cp.async wrote through the generic proxy (TMA: the async one)
          Acc out = k.mma(acc, pipe.ringA.stage(slot), pipe.ringB.stage(slot), /*pending=*/1, pipe.aMN(),
                          pipe.bMN(), /*mnAtomsOuter=*/tma());
          // The MMA of step kt - 1 has finished in this warpgroup: its slot goes back to the producer(s).
          k.ifThen(k.i32(0) < kt && wgLeader, [&] { release(empty(previous)); });
          return std::pair<Acc, std::vector<I32>>{out, next};
        });
    Acc acc = k.drain(looped.first);
    k.ifThen(k.i32(0) < steps && wgLeader, [&] { release(empty((g + steps + (stages() - 1)) % stages())); });
    // A split of the tail: its partial out, and whether this warpgroup is its tile's last split (then it stores).
    std::optional<Bool> isSplit, reduce;
    if (split && slice) {
      isSplit = !(slice->code == 0);
      reduce = *isSplit && splitArrive(acc, *slice, w);
    }
    // Warpgroup 0 stores tile j after warpgroup 1 has stored tile j - 1 (turn(0)'s phase j - 1); warpgroup 1 after
    // warpgroup 0 tile j (turn(1)'s phase j).
    if (w == 0)
      k.ifThen(k.i32(0) < j, [&] { k.mbarrierWait(bars, turn(0), (j - 1) % 2); });
    else
      k.mbarrierWait(bars, turn(1), j % 2);
    // The staging tile's rows out (once filled: by the accumulator, or by the split's sum), every thread.
    auto stageAndStore = [&](const std::function<void()>& fill) {
      fill();
      k.blockSync();
      if (epilogue)
        epilogue(p, pipe.m0(p) + 64 * w, w);
      else
        pipe.storeStaged(p, pipe.m0(p) + 64 * w);
    };
    auto fromAcc = [&] { k.storeAcc(acc, pipe.staging.asRowsOf(64 * w)); };
    if (isSplit) {
      k.ifThen(!*isSplit, [&] { stageAndStore(fromAcc); });
      k.ifThen(*reduce, [&] { stageAndStore([&] { splitSum(*slice, w); }); });
    } else {
      stageAndStore(fromAcc);
    }
    if (bulkEpilogue) {
      k.bulkWait(/*readOnly=*/true);  // this thread's copies have read their staging rows ...
      k.blockSync();                  // ... and every thread's, before the other warpgroup may overwrite them
    }
    k.mbarrierArrive(bars, turn(1 - w));
    return g + steps;
  }

  // Split-K tail, MMA warpgroup w: fields of a split's code, and its partial tile (rows 64w .. are this warpgroup's).
  struct SplitPart {
    dsl::I32 unit, index, ways;
  };
  SplitPart splitPart(const Slice& sl) const {
    return {sl.code % 65536 - 1, sl.code / 65536 % 256, sl.code / 16777216};
  }
  dsl::I32 pairRank() const { return rank ? *rank : pipe.k.i32(0); }
  dsl::GlobalPtr partial(const SplitPart& sp, const dsl::I32& index) const {
    dsl::Kernel& k = pipe.k;
    dsl::I32 at = (sp.unit * sp.ways + index) * (rank ? 2 : 1) + pairRank();
    return split->partials + k.widen(at) * abi::kSplitTileFloats;
  }
  // Stores the warpgroup's partial and counts it in; true (every thread of the warpgroup) where it was the last.
  dsl::Bool splitArrive(const dsl::Acc& acc, const Slice& sl, int64_t w) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    SplitPart sp = splitPart(sl);
    k.ifThen(!(sl.code == 0), [&] {
      k.storeAcc(acc, partial(sp, sp.index), k.i32(pipe.c.n), k.i32(INT32_MAX));
      k.fence();       // this thread's partial before the count ...
      k.blockSync();   // ... and every thread's, before the leader counts the warpgroup in
      k.ifThen(k.threadIdx() % 128 == 0, [&] {
        GlobalPtr counter = split->counters + k.widen((sp.unit * (rank ? 2 : 1) + pairRank()) * 2 + int64_t(w));
        Bool lastOne = counter.atomicAddI32(k.i32(1), /*acqRel=*/true) == sp.ways - 1;
        k.ifThen(lastOne, [&] { counter.storeI32(k.i32(0)); });  // every split has counted: reset for the next launch
        split->last.storeI32(k.i32(w), k.select(lastOne, k.i32(1), k.i32(0)));
      });
      k.blockSync();
    });
    return split->last.loadI32(k.i32(w)) == 1;
  }
  // The last split of warpgroup w: the sum of every split's partial rows, in split order, into the staging tile.
  void splitSum(const Slice& sl, int64_t w) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    const int64_t n = pipe.c.n, chunksPerRow = n / 4, chunks = 64 * chunksPerRow / 128;
    SplitPart sp = splitPart(sl);
    k.fence();  // the other splits' partials, seen through the counter, before these loads
    I32 lane = k.threadIdx() % 128;
    // Passes of kSumChunks 16-byte chunks per thread (chunk i of the pass: rows of 64 chunks, a warp's 32 adjacent).
    for (int64_t first = 0; first < chunks; first += kSumChunks) {
      auto at = [&](int64_t i) { return (k.i32(first + i) * 128 + lane); };
      Vec zero = k.zeros(int(4 * kSumChunks), Elem::f32);
      Vec sums = k.forRange(k.i32(0), sp.ways, k.i32(1), zero, [&](I32 idx, Vec acc) {
        GlobalPtr rows = partial(sp, idx) + k.i64(64 * w * n);
        for (int64_t i = 0; i < kSumChunks; ++i) {
          I32 q = at(i);
          Vec part = (rows + k.widen(q / chunksPerRow * n + q % chunksPerRow * 4)).load(4);
          acc = acc.with(int(4 * i), acc.slice(int(4 * i), 4) + part);
        }
        return acc;
      });
      for (int64_t i = 0; i < kSumChunks; ++i) {
        I32 q = at(i);
        pipe.staging.store(q / chunksPerRow, q % chunksPerRow * 4, sums.slice(int(4 * i), 4).to(Elem::bf16));
      }
    }
  }

  // TN with TMA, K step kt of tile p in `slot`: where it is the group's last and partial, the K rows past the group
  // (the next group's tokens, or zero fill) become zeros before any MMA reads them. Warpgroup w clears its own A
  // box and its half of B's boxes; both then meet on kTailBarrier (after a proxy fence: wgmma reads through the
  // async proxy), so that neither multiplies the slot before the other's zeros are in.
  void zeroTail(const TilePlace& p, const dsl::I32& kt, const dsl::I32& slot, int64_t w) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    const auto& c = pipe.c;
    I32 valid = p.groupEnd - p.groupStart - kt * c.k;  // > 0: kt is one of the group's steps
    k.ifThen(valid < k.i32(c.k), [&] {
      I32 lane = k.threadIdx() % 128;
      auto clear = [&](const SharedTile& ring, int64_t at) {
        SharedTile box = ring.stage(slot).rowSlice(boxRows(ring) * at, boxRows(ring));
        const int64_t rowBytes = box.cols() * 2;
        // 16-byte chunks of K rows valid .. 63 (128 bytes each: the swizzle only permutes chunks within a row).
        k.forRange(lane, (k.i32(c.k) - valid) * 8, k.i32(128), [&](I32 q) {
          I32 at8 = (valid + q / 8) * 128 + (q % 8) * 16;
          box.store(at8 / rowBytes, at8 % rowBytes / 2, k.zeros(8, Elem::bf16));
        });
      };
      clear(pipe.ringA, w);
      const int64_t bBoxes = c.n / 64, share = bBoxes / warpgroups();
      for (int64_t at = w * share; at < (w + 1) * share; ++at) clear(pipe.ringB, at);
      k.proxyFence();
      k.namedBarrier(kTailBarrier, int(pipe.c.mmaThreads()), /*arriveOnly=*/false);
    });
  }

  // Static persistent loop (block b runs tiles b, b + grid, ...), split between producer and MMA warpgroups.
  void runStatic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::I32& grid) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    const auto& c = pipe.c;
    if (rank) throw std::logic_error("pairs draw tickets (runDynamic)");
    I32 total = sched.buildTable(first);
    init();
    k.group(c.mmaThreads(), k.blockThreads() - c.mmaThreads(), /*barrier=*/2, [&] {
      k.setMaxRegisters(kProducerRegisters, /*increase=*/false);
      Bool leader = k.threadIdx() == k.i32(c.mmaThreads());
      // cp.async: every producer thread copies, the leader hands tiles over; TMA: the leader alone.
      auto produce = [&](bool boxes) {
        std::vector<I32> end = k.forRange(k.blockIdx(), total, grid, {k.i32(0), k.i32(0)},
                                          [&](I32 t, const std::vector<I32>& v) {
                                            TilePlace p = sched.place(t, first);
                                            if (boxes) return std::vector<I32>{produceBoxes(p, v[1], v[0]), v[1] + 1};
                                            k.ifThen(leader, [&] { handOver(v[1], &p); });
                                            return std::vector<I32>{load(p, v[0]), v[1] + 1};
                                          });
        if (boxes) {
          handOver(end[1], nullptr);
          return;
        }
        k.ifThen(leader, [&] { handOver(end[1], nullptr); });
        k.asyncCommit();
        k.asyncWait(0);
      };
      if (tma())
        k.ifThen(leader, [&] { produce(true); });
      else
        produce(false);
    });
    multiply();
  }

  // The MMA warpgroups, each in its own group: tiles as handed over until the end mark.
  void multiply() const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    for (int64_t w = 0; w < warpgroups(); ++w) {
      k.group(128 * w, 128, /*barrier=*/3 + int(w), [&] {
        k.setMaxRegisters(kMmaRegisters, /*increase=*/true);
        k.whileLoop(
            {receive(k.i32(0)), k.i32(0), k.i32(0)}, [&](const std::vector<I32>& v) { return !(v[0] == 0); },
            [&](const std::vector<I32>& v) {
              I32 j = v[1];
              std::optional<Slice> slice;
              if (split) slice = sliceOf(j % kHandover);
              I32 g = compute(placeOf(j % kHandover), v[2], w, j, slice);
              // Entry j has been read: each thread gives it back itself (racecheck does not follow a warpgroup
              // leader's arrival after a barrier of its group, and flagged the producer's rewrite of the entry).
              k.mbarrierArrive(bars, tileEmpty(j % kHandover));
              return std::vector<I32>{receive(j + 1), j + 1, g};
            });
        if (bulkEpilogue) k.bulkWait(/*readOnly=*/false);  // written before what follows the engine (e.g. a signal)
      });
    }
  }

  // Dynamic loop with tensor maps (Pipeline::runDynamic's protocol): the producer leader draws tickets from
  // tickets[0] (global i32, zero at launch) and hands each tile over; the last of `grid` blocks to run out resets
  // tickets[0..1]. Every thread of the block calls it, after the kernel's own block-wide work.
  void runDynamic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::GlobalPtr& tickets,
                  const dsl::I32& total, const dsl::I32& grid) const {
    using namespace dsl;
    dsl::Kernel& k = pipe.k;
    const auto& c = pipe.c;
    if (!tma()) throw std::logic_error("runDynamic: tensor maps");
    init();
    k.group(c.mmaThreads(), k.blockThreads() - c.mmaThreads(), /*barrier=*/2, [&] {
      k.setMaxRegisters(kProducerRegisters, /*increase=*/false);
      k.ifThen(k.threadIdx() == k.i32(c.mmaThreads()), [&] {
        // Ticket number j of this block (pairs: of the pair; both blocks get the same).
        auto draw = [&](const I32& j) {
          if (!rank) return tickets.atomicAddI32(k.i32(1));
          I32 q = j % 2;
          I32 drawn = k.ifElse(*rank == 0, [&] {
            // Slot q is free once block 1 has read ticket j - 2 from it.
            k.ifThen(k.i32(1) < j,
                     [&] { k.mbarrierWait(bars, mailEmpty(q), (j / 2 + 1) % 2, /*clusterAcquire=*/true); });
            I32 t = tickets.atomicAddI32(k.i32(1));
            mail->stage(q).storeI32(k.i32(0), t);
            k.proxyFence();  // the generic store before the async-proxy copy reads it
            k.sharedCopyPeer(mail->stage(q), bars, mailFull(q), k.i32(1));
            return t;
          }, k.i32(0));
          I32 received = k.ifElse(*rank == 1, [&] {
            k.mbarrierArriveExpectTx(bars, mailFull(q), kMailBytes);
            k.mbarrierWait(bars, mailFull(q), (j / 2) % 2);
            I32 t = mail->stage(q).loadI32(k.i32(0));
            // Cluster scope: the slot's read above is ordered before block 0 overwrites it.
            k.mbarrierArrivePeer(bars, mailEmpty(q), k.i32(0), /*clusterRelease=*/true);
            return t;
          }, k.i32(0));
          return drawn + received;
        };
        // Split-K tail: units below `main` are whole tickets, then `ways` tickets per unit (tickets in all).
        I32 main = total, ways = k.i32(1), all = total;
        const int64_t kSteps = pipe.s.kOrM / c.k;
        if (split) {
          I32 drawers = rank ? grid / 2 : grid;
          I32 r = total % drawers;
          I32 most = drawers / k.select(r == 0, k.i32(1), r);
          most = k.select(most < split->maxSplit, most, split->maxSplit);
          most = k.select(most < k.i32(kSteps), most, k.i32(kSteps));
          most = k.select(most < k.i32(kMaxWays), most, k.i32(kMaxWays));  // the code's 8-bit split index
          Bool on = !(r == 0) && k.i32(1) < most;
          I32 tailUnits = k.select(on, r, k.i32(0));
          ways = k.select(on, most, k.i32(1));
          main = total - tailUnits;
          all = main + tailUnits * ways;
        }
        std::vector<I32> end = k.whileLoop(
            {draw(k.i32(0)), k.i32(0), k.i32(0)}, [&](const std::vector<I32>& v) { return v[0] < all; },
            [&](const std::vector<I32>& v) {
              std::optional<Bool> lone;
              std::optional<Slice> slice;
              I32 unit = v[0];
              if (split) {
                Bool tail = v[0] >= main;
                I32 at = k.select(tail, v[0] - main, k.i32(0)), u = at / ways, part = at % ways;
                unit = k.select(tail, main + u, v[0]);
                I32 k0 = part * kSteps / ways;
                slice = Slice{k.select(tail, k0, k.i32(0)),
                              k.select(tail, (part + 1) * kSteps / ways - k0, k.i32(kSteps)),
                              k.select(tail, u + 1 + part * 65536 + ways * 16777216, k.i32(0))};
              }
              TilePlace p = sched.place(unit, first, &lone);
              I32 g = produceBoxes(p, v[1], v[2], lone, slice);
              return std::vector<I32>{draw(v[1] + 1), v[1] + 1, g};
            });
        handOver(end[1], nullptr);
        if (rank)
          k.ifThen(*rank == 0, [&] { resetTicketsIfLast(k, tickets, grid / 2); });  // block 0s draw
        else
          resetTicketsIfLast(k, tickets, grid);
      });
    });
    multiply();
    if (rank) k.clusterSync();  // no block leaves while its peer may still copy, multicast or arrive into it
  }
};

}  // namespace megamoe::kernels
