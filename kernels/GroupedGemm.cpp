// grouped_gemm_{nt,nn,tn}: persistent grouped GEMMs over experts (see GroupedGemmSpec). Each CTA walks the tile
// list t = blockIdx, blockIdx + grid, ...; a tile is found from the device-side group offsets by one scan over the
// experts, so group sizes never reach the host.
#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

namespace {

// Where a tile sits: its expert, the group's row range, and the tile's row/column origin.
struct TilePlace {
  I32 expert, groupStart, groupEnd, mTile, n0;
};

// Tile t -> place. TN: every expert has the same (M / bm) x (N / bn) tiles. NT/NN: expert e has
// ceil(size_e / bm) x (N / bn) tiles, found by counting the experts whose tiles all come before t.
struct TileScheduler {
  Kernel& k;
  const GroupedGemmSpec& s;
  GlobalPtr offsets;
  int64_t bm, bn;

  I32 offset(const I32& e) const { return (offsets + k.widen(e)).loadI32(); }
  int64_t nTiles() const { return s.n / bn; }
  I32 tilesOf(const I32& e) const {
    I32 size = offset(e + 1) - offset(e);
    return (size + (bm - 1)) / bm * nTiles();
  }
  I32 total() const {
    if (s.layout == GroupedGemmSpec::kTN) return k.i32(s.experts * (s.kOrM / bm) * nTiles());
    return k.forRange(k.i32(0), k.i32(s.experts), k.i32(1), {k.i32(0)},
                      [&](I32 e, const std::vector<I32>& sum) { return std::vector<I32>{sum[0] + tilesOf(e)}; })[0];
  }
  // Once per CTA: first[e] = the first tile of expert e (first[E] = total) in a shared table, so that a tile's
  // expert is a binary search in shared memory instead of a scan over global offsets. Returns the total.
  I32 buildTable(const SharedTile& first) const {
    const int64_t threads = k.blockThreads();
    k.forRange(k.threadIdx(), k.i32(s.experts), k.i32(threads), [&](I32 e) { first.storeI32(e + 1, tilesOf(e)); });
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
    I32 lo = k.i32(0);  // invariant: first[lo] <= t; the answer is in [lo, E)
    for (int64_t step = int64_t(1) << 10; step > 0; step >>= 1) {
      if (step >= 2 * s.experts) continue;
      I32 probe = lo + step;
      Bool ok = probe < k.i32(s.experts + 1);
      I32 safe = k.select(ok, probe, k.i32(s.experts));
      lo = k.select(ok && (t >= first.loadI32(safe)), probe, lo);
    }
    I32 local = t - first.loadI32(lo);
    return {lo, offset(lo), offset(lo + 1), local / nTiles(), (local % nTiles()) * bn};
  }
  TilePlace place(const I32& t) const {
    I32 expert = k.i32(0), local = t;
    if (s.layout == GroupedGemmSpec::kTN) {
      const int64_t perExpert = (s.kOrM / bm) * nTiles();
      expert = t / perExpert;
      local = t % perExpert;
    } else {
      // Carried: tiles seen so far, experts entirely before t, first tile of t's expert.
      auto found = k.forRange(k.i32(0), k.i32(s.experts), k.i32(1), {k.i32(0), k.i32(0), k.i32(0)},
                              [&](I32 e, const std::vector<I32>& v) {
                                I32 end = v[0] + tilesOf(e);
                                Bool before = t >= end;
                                return std::vector<I32>{end, k.select(before, v[1] + 1, v[1]), k.select(before, end, v[2])};
                              });
      expert = found[1];
      local = t - found[2];
    }
    return {expert, offset(expert), offset(expert + 1), local / nTiles(), (local % nTiles()) * bn};
  }
};

// NT main loop: a `stages`-deep ring of asynchronous copies; the MMA of stage k overlaps the copies of stage
// k + stages - 1 and the MMA of stage k + 1 is issued before stage k's result is waited for. The ring's first
// stages for a tile are issued by `prologue` (before the previous tile's epilogue, so its stores overlap them).
struct NtPipeline {
  Kernel& k;
  const GroupedGemmSpec& s;
  const GroupedGemmSpec::Tiles& c;
  GlobalPtr a, b, out;
  SharedTile ringA, ringB;

  int64_t kTiles() const { return s.kOrM / c.k; }
  I32 m0(const TilePlace& p) const { return p.groupStart + p.mTile * c.m; }
  void issue(const TilePlace& p, const I32& kt) const {
    I32 slot = kt % c.stages;
    I32 first = m0(p);
    GlobalPtr aRows = a + k.widen(first) * s.kOrM;
    GlobalPtr bRows = b + (k.widen(p.expert) * s.n + k.widen(p.n0)) * s.kOrM;
    k.copyTile(aRows + k.widen(kt * c.k), k.i32(s.kOrM), ringA.stage(slot), p.groupEnd - first, true, true);
    k.copyTile(bRows + k.widen(kt * c.k), k.i32(s.kOrM), ringB.stage(slot), k.i32(c.n), true, true);
  }
  void prologue(const TilePlace& p) const {
    for (int64_t st = 0; st + 1 < c.stages; ++st) {
      issue(p, k.i32(st));
      k.asyncCommit();
    }
  }
  // Runs tile p (its prologue already issued); issues the prologue of `next` when hasNext, then stores.
  void tile(const TilePlace& p, const Bool& hasNext, const std::function<TilePlace()>& next) const {
    Acc acc = k.forRange(k.i32(0), k.i32(kTiles()), k.i32(1), k.zeroAcc(c.m, c.n), [&](I32 kt, Acc acc) {
      k.asyncWait(c.stages - 2);  // stage kt has landed (for this thread) ...
      k.blockSync();              // ... and for every thread
      I32 slot = kt % c.stages;
      Acc nextAcc = k.mma(acc, ringA.stage(slot), ringB.stage(slot), /*pending=*/1);
      // The MMA of stage kt - 1 has finished in every warpgroup: its slot can be refilled.
      k.blockSync();
      I32 ahead = kt + (c.stages - 1);
      k.ifThen(ahead < kTiles(), [&] { issue(p, ahead); });
      k.asyncCommit();  // an empty group past the end keeps the wait counts uniform
      return nextAcc;
    });
    acc = k.drain(acc);
    k.blockSync();  // every warpgroup is done with the ring
    k.ifThen(hasNext, [&] { prologue(next()); });
    I32 first = m0(p);
    k.storeAcc(acc, out + (k.widen(first) * s.n + k.widen(p.n0)), k.i32(s.n), p.groupEnd - first);
  }
};

}  // namespace

mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemm(mlir::MLIRContext& ctx, const GroupedGemmSpec& s) {
  using S = GroupedGemmSpec;
  const S::Tiles c = s.tiles();
  Kernel k(ctx, S::name(s.layout), c.threads);
  GlobalPtr a = k.argPtr(Elem::bf16);
  GlobalPtr b = k.argPtr(Elem::bf16);
  GlobalPtr out = k.argPtr(Elem::bf16);
  GlobalPtr offsets = k.argPtr(Elem::i32);
  I32 grid = k.argI32();
  TileScheduler sched{k, s, offsets, c.m, c.n};

  if (s.layout == S::kNT) {
    NtPipeline nt{k, s, c, a, b, out, k.dynamicSharedTile(Elem::bf16, c.m, c.k, c.stages),
                  k.dynamicSharedTile(Elem::bf16, c.n, c.k, c.stages)};
    SharedTile first = k.dynamicSharedTile(Elem::i32, 1, (s.experts + 1 + 3) / 4 * 4, 1);
    I32 total = sched.buildTable(first);
    k.ifThen(k.blockIdx() < total, [&] { nt.prologue(sched.placeFromTable(k.blockIdx(), first)); });
    k.forRange(k.blockIdx(), total, grid, [&](I32 t) {
      I32 t2 = t + grid;
      nt.tile(sched.placeFromTable(t, first), t2 < total, [&] { return sched.placeFromTable(t2, first); });
    });
    k.asyncWait(0);
    return k.finish();
  }

  SharedTile tileA = k.sharedTile(Elem::bf16, c.m, c.k);
  SharedTile tileB = k.sharedTile(Elem::bf16, c.n, c.k);
  k.forRange(k.blockIdx(), sched.total(), grid, [&](I32 t) {
    TilePlace p = sched.place(t);
    I32 ldn = k.i32(s.n);
    Acc acc = k.zeroAcc(c.m, c.n);
    if (s.layout == S::kTN) {
      // C[e] tile (m0, n0) = sum over the group's rows r of A[r, m0..] x B[r, n0..]; K_e = group size.
      I32 m0 = p.mTile * c.m;
      I32 kSize = p.groupEnd - p.groupStart;
      I32 ldm = k.i32(s.kOrM);
      acc = k.forRange(k.i32(0), kSize, k.i32(c.k), acc, [&](I32 k0, Acc acc) {
        I64 row = k.widen(p.groupStart + k0);
        k.copyTileTransposed(a + (row * s.kOrM + k.widen(m0)), ldm, tileA, kSize - k0);
        k.copyTileTransposed(b + (row * s.n + k.widen(p.n0)), ldn, tileB, kSize - k0);
        k.blockSync();
        Acc next = k.mma(acc, tileA, tileB);
        k.blockSync();
        return next;
      });
      k.storeAcc(acc, out + ((k.widen(p.expert) * s.kOrM + k.widen(m0)) * s.n + k.widen(p.n0)), ldn, k.i32(c.m));
    } else {
      // NN: B[e] is [K, N]; its K x 128 tiles are transposed into the K-major layout on the way in.
      I32 m0 = p.groupStart + p.mTile * c.m;
      I32 rowsValid = p.groupEnd - m0;
      I32 ldk = k.i32(s.kOrM);
      GlobalPtr aRows = a + k.widen(m0) * s.kOrM;
      acc = k.forRange(k.i32(0), k.i32(s.kOrM), k.i32(c.k), acc, [&](I32 k0, Acc acc) {
        k.copyTile(aRows + k.widen(k0), ldk, tileA, rowsValid, /*swizzle=*/true);
        k.copyTileTransposed(b + ((k.widen(p.expert) * s.kOrM + k.widen(k0)) * s.n + k.widen(p.n0)), ldn, tileB,
                             k.i32(c.k));
        k.blockSync();
        Acc next = k.mma(acc, tileA, tileB);
        k.blockSync();
        return next;
      });
      k.storeAcc(acc, out + (k.widen(m0) * s.n + k.widen(p.n0)), ldn, rowsValid);
    }
  });
  return k.finish();
}

}  // namespace megamoe::kernels
