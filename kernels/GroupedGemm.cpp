// grouped_gemm_{nt,nn,tn}: persistent grouped GEMMs over experts (see GroupedGemmSpec and
// docs/decisions/gemm-tiles.md). Each CTA walks the tile list t = blockIdx, blockIdx + grid, ...; a tile's expert
// comes from a per-CTA table built from the device-side group offsets, so group sizes never reach the host.
#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

namespace {

// Where a tile sits: its expert, the group's row range, and the tile's row/column origin.
struct TilePlace {
  I32 expert, groupStart, groupEnd, mTile, n0;
};

// Tile t -> place. Expert e owns mTiles(e) x (N / bn) consecutive tiles: ceil(size_e / bm) m-tiles for NT/NN (an
// empty expert none), M / bm for TN (every expert, so that an expert without tokens gets its dW = 0 written).
struct TileScheduler {
  Kernel& k;
  const GroupedGemmSpec& s;
  GlobalPtr offsets;
  int64_t bm, bn;

  I32 offset(const I32& e) const { return (offsets + k.widen(e)).loadI32(); }
  int64_t nTiles() const { return s.n / bn; }
  I32 mTiles(const I32& start, const I32& end) const {
    if (s.layout == GroupedGemmSpec::kTN) return k.i32(s.kOrM / bm);
    return (end - start + (bm - 1)) / bm;
  }
  // Once per CTA: first[e] = the first tile of expert e (first[E] = total) in a shared table, so that a tile's
  // expert is a binary search in shared memory instead of a scan over global offsets. Returns the total.
  I32 buildTable(const SharedTile& first) const {
    const int64_t threads = k.blockThreads();
    k.forRange(k.threadIdx(), k.i32(s.experts), k.i32(threads),
               [&](I32 e) { first.storeI32(e + 1, mTiles(offset(e), offset(e + 1)) * nTiles()); });
    k.blockSync();
    k.ifThen(k.threadIdx() == 0, [&] {
      first.storeI32(k.i32(0), k.i32(0));
      k.forRange(k.i32(1), k.i32(s.experts + 1), k.i32(1),
                 [&](I32 e) { first.storeI32(e, first.loadI32(e) + first.loadI32(e - 1)); });
    });
    k.blockSync();
    return first.loadI32(k.i32(s.experts));
  }
  // The expert e with first[e] <= t < first[e + 1] (empty experts have first[e] == first[e + 1]: the last such).
  TilePlace placeFromTable(const I32& t, const SharedTile& first) const {
    I32 lo = k.i32(0);  // invariant: first[lo] <= t; binary lifting finds the largest such index
    for (int64_t step = int64_t(1) << 10; step > 0; step >>= 1) {
      if (step >= 2 * s.experts) continue;
      I32 probe = lo + step;
      Bool ok = probe < k.i32(s.experts + 1);
      I32 safe = k.select(ok, probe, k.i32(s.experts));
      lo = k.select(ok && (t >= first.loadI32(safe)), probe, lo);
    }
    I32 local = t - first.loadI32(lo);
    I32 start = offset(lo), end = offset(lo + 1);
    // Raster: bands of kGroupM m-tiles, walked n-tile by n-tile. Measured on the H200 (bench/results v4 vs v5):
    // bands of 8 m-tiles lost 10-20% against plain n-fastest order (kGroupM = 1) on every DeepSeek-V3 case.
    constexpr int64_t kGroupM = 1;
    I32 band = local / (kGroupM * nTiles());
    I32 inBand = local % (kGroupM * nTiles());
    I32 firstM = band * kGroupM;
    I32 left = mTiles(start, end) - firstM;
    I32 bandRows = k.select(left < k.i32(kGroupM), left, k.i32(kGroupM));
    return {lo, start, end, firstM + inBand % bandRows, (inBand / bandRows) * bn};
  }
};

// The main loop of every layout: a `stages`-deep ring of asynchronous copies; the MMA of stage k overlaps the copies
// of stage k + stages - 1, and the MMA of stage k + 1 is issued before stage k's result is waited for. The ring's
// first stages for a tile are issued by `prologue` (before the previous tile's epilogue, so its stores overlap
// them). NT reads both operands K-major; NN's B and TN's A and B are K x MN slabs kept MN-major.
struct Pipeline {
  Kernel& k;
  const GroupedGemmSpec& s;
  const GroupedGemmSpec::Tiles& c;
  GlobalPtr a, b, out;
  SharedTile ringA, ringB, staging;

  bool tn() const { return s.layout == GroupedGemmSpec::kTN; }
  bool aMN() const { return tn(); }
  bool bMN() const { return s.layout != GroupedGemmSpec::kNT; }
  // First output row of the tile: NT/NN rows of the group; TN rows of C[e] (M).
  I32 m0(const TilePlace& p) const { return tn() ? p.mTile * c.m : p.groupStart + p.mTile * c.m; }
  // K steps: fixed for NT/NN; the group's size for TN.
  I32 kTiles(const TilePlace& p) const {
    return tn() ? (p.groupEnd - p.groupStart + (c.k - 1)) / c.k : k.i32(s.kOrM / c.k);
  }
  void issue(const TilePlace& p, const I32& kt) const {
    I32 slot = kt % c.stages;
    I32 first = m0(p);
    if (tn()) {
      // Rows are the group's tokens: A [tokens, M], B [tokens, N]; tokens past the group are zero-filled.
      I32 row = p.groupStart + kt * c.k;
      I32 valid = p.groupEnd - row;
      k.copyTileMN(a + (k.widen(row) * s.kOrM + k.widen(first)), k.i32(s.kOrM), ringA.stage(slot), valid, true);
      k.copyTileMN(b + (k.widen(row) * s.n + k.widen(p.n0)), k.i32(s.n), ringB.stage(slot), valid, true);
      return;
    }
    GlobalPtr aRows = a + k.widen(first) * s.kOrM;
    k.copyTile(aRows + k.widen(kt * c.k), k.i32(s.kOrM), ringA.stage(slot), p.groupEnd - first, true, true);
    if (s.layout == GroupedGemmSpec::kNT) {
      GlobalPtr bRows = b + (k.widen(p.expert) * s.n + k.widen(p.n0)) * s.kOrM;
      k.copyTile(bRows + k.widen(kt * c.k), k.i32(s.kOrM), ringB.stage(slot), k.i32(c.n), true, true);
    } else {
      GlobalPtr bSlab = b + ((k.widen(p.expert) * s.kOrM + k.widen(kt * c.k)) * s.n + k.widen(p.n0));
      k.copyTileMN(bSlab, k.i32(s.n), ringB.stage(slot), k.i32(c.k), true);
    }
  }
  void prologue(const TilePlace& p) const {
    I32 steps = kTiles(p);
    for (int64_t st = 0; st + 1 < c.stages; ++st) {
      if (tn())
        k.ifThen(k.i32(st) < steps, [&] { issue(p, k.i32(st)); });
      else
        issue(p, k.i32(st));  // NT/NN: K >= 128 is validated, so the first stages exist
      k.asyncCommit();
    }
  }
  // Runs tile p (its prologue already issued); issues the prologue of `next` when hasNext, then stores.
  void tile(const TilePlace& p, const Bool& hasNext, const std::function<TilePlace()>& next) const {
    I32 steps = kTiles(p);
    Acc acc = k.forRange(k.i32(0), steps, k.i32(1), k.zeroAcc(c.m, c.n), [&](I32 kt, Acc acc) {
      k.asyncWait(c.stages - 2);  // stage kt has landed (for this thread) ...
      k.blockSync();              // ... and for every thread
      I32 slot = kt % c.stages;
      Acc nextAcc = k.mma(acc, ringA.stage(slot), ringB.stage(slot), /*pending=*/1, aMN(), bMN());
      // The MMA of stage kt - 1 has finished in every warpgroup: its slot can be refilled.
      k.blockSync();
      I32 ahead = kt + (c.stages - 1);
      k.ifThen(ahead < steps, [&] { issue(p, ahead); });
      k.asyncCommit();  // an empty group past the end keeps the wait counts uniform
      return nextAcc;
    });
    acc = k.drain(acc);
    if (tn()) k.asyncWait(0);  // a TN tile shorter than the ring ends with copies never waited for
    k.blockSync();   // every warpgroup is done with the ring
    k.ifThen(hasNext, [&] { prologue(next()); });
    // Epilogue through shared memory: fragments into a padded staging tile, then 16-byte coalesced row stores.
    I32 first = m0(p);
    k.storeAcc(acc, staging);
    k.blockSync();
    if (tn())
      k.copyTile(staging, out + ((k.widen(p.expert) * s.kOrM + k.widen(first)) * s.n + k.widen(p.n0)), k.i32(s.n),
                 k.i32(c.m), /*swizzle=*/false);
    else
      k.copyTile(staging, out + (k.widen(first) * s.n + k.widen(p.n0)), k.i32(s.n), p.groupEnd - first,
                 /*swizzle=*/false);
    k.blockSync();  // the next tile's epilogue overwrites the staging tile
  }
};

}  // namespace

mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemm(mlir::MLIRContext& ctx, const GroupedGemmSpec& s, Arch arch) {
  using S = GroupedGemmSpec;
  const S::Tiles c = s.tiles(arch);
  Kernel k(ctx, S::name(s.layout), c.threads);
  GlobalPtr a = k.argPtr(Elem::bf16);
  GlobalPtr b = k.argPtr(Elem::bf16);
  GlobalPtr out = k.argPtr(Elem::bf16);
  GlobalPtr offsets = k.argPtr(Elem::i32);
  I32 grid = k.argI32();
  TileScheduler sched{k, s, offsets, c.m, c.n};
  bool tn = s.layout == S::kTN, nt = s.layout == S::kNT;
  // Shared layouts: K-major [MN][64] rings, or MN-major [64][MN] ones.
  SharedTile ringA = tn ? k.dynamicSharedTile(Elem::bf16, c.k, c.m, c.stages)
                        : k.dynamicSharedTile(Elem::bf16, c.m, c.k, c.stages);
  SharedTile ringB = nt ? k.dynamicSharedTile(Elem::bf16, c.n, c.k, c.stages)
                        : k.dynamicSharedTile(Elem::bf16, c.k, c.n, c.stages);
  // Staging rows padded by 8 elements (16 bytes): the 8 rows a warp's fragment store touches fall in distinct banks.
  SharedTile staging = k.dynamicSharedTile(Elem::bf16, c.m, c.n, 1, c.n + 8);
  Pipeline pipe{k, s, c, a, b, out, ringA, ringB, staging};
  SharedTile first = k.dynamicSharedTile(Elem::i32, 1, (s.experts + 1 + 3) / 4 * 4, 1);
  I32 total = sched.buildTable(first);
  k.ifThen(k.blockIdx() < total, [&] { pipe.prologue(sched.placeFromTable(k.blockIdx(), first)); });
  k.forRange(k.blockIdx(), total, grid, [&](I32 t) {
    I32 t2 = t + grid;
    pipe.tile(sched.placeFromTable(t, first), t2 < total, [&] { return sched.placeFromTable(t2, first); });
  });
  k.asyncWait(0);
  return k.finish();
}

}  // namespace megamoe::kernels
