// grouped_gemm_{nt,nn,tn}: persistent grouped GEMMs over experts (see GroupedGemmSpec). Each CTA walks the tile
// list t = blockIdx, blockIdx + grid, ...; a tile is found from the device-side group offsets by one scan over the
// experts, so group sizes never reach the host.
#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemm(mlir::MLIRContext& ctx, const GroupedGemmSpec& s) {
  using S = GroupedGemmSpec;
  Kernel k(ctx, S::name(s.layout), S::kBlockThreads);
  GlobalPtr a = k.argPtr(Elem::bf16);
  GlobalPtr b = k.argPtr(Elem::bf16);
  GlobalPtr c = k.argPtr(Elem::bf16);
  GlobalPtr offsets = k.argPtr(Elem::i32);
  I32 grid = k.argI32();

  const int64_t nTiles = s.n / S::kBlockN;
  auto offset = [&](const I32& e) { return (offsets + k.widen(e)).loadI32(); };
  SharedTile tileA = k.sharedTile(Elem::bf16, S::kBlockM, S::kBlockK);
  SharedTile tileB = k.sharedTile(Elem::bf16, S::kBlockN, S::kBlockK);

  // Tile t -> (expert, m-tile, n-tile). TN: every expert has the same (M / 64) x (N / 128) tiles. NT/NN: expert e
  // has ceil(size_e / 64) x (N / 128) tiles, found by counting the experts whose tiles all come before t.
  auto tilesOf = [&](const I32& e) {
    I32 size = offset(e + 1) - offset(e);
    return (size + (S::kBlockM - 1)) / S::kBlockM * nTiles;
  };
  I32 total = s.layout == S::kTN
                  ? k.i32(s.experts * (s.kOrM / S::kBlockM) * nTiles)
                  : k.forRange(k.i32(0), k.i32(s.experts), k.i32(1), {k.i32(0)},
                               [&](I32 e, const std::vector<I32>& sum) { return std::vector<I32>{sum[0] + tilesOf(e)}; })[0];

  k.forRange(k.blockIdx(), total, grid, [&](I32 t) {
    I32 expert = k.i32(0), local = t;
    if (s.layout == S::kTN) {
      const int64_t perExpert = (s.kOrM / S::kBlockM) * nTiles;
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
    I32 mTile = local / nTiles, n0 = (local % nTiles) * S::kBlockN;
    I32 groupStart = offset(expert), groupEnd = offset(expert + 1);
    I32 ldn = k.i32(s.n);

    Acc acc = k.zeroAcc(S::kBlockM, S::kBlockN);
    if (s.layout == S::kTN) {
      // C[e] tile (m0, n0) = sum over the group's rows r of A[r, m0..] x B[r, n0..]; K_e = group size.
      I32 m0 = mTile * S::kBlockM;
      I32 kSize = groupEnd - groupStart;
      I32 ldm = k.i32(s.kOrM);
      acc = k.forRange(k.i32(0), kSize, k.i32(S::kBlockK), acc, [&](I32 k0, Acc acc) {
        I64 row = k.widen(groupStart + k0);
        k.copyTileTransposed(a + (row * s.kOrM + k.widen(m0)), ldm, tileA, kSize - k0);
        k.copyTileTransposed(b + (row * s.n + k.widen(n0)), ldn, tileB, kSize - k0);
        k.blockSync();
        Acc next = k.mma(acc, tileA, tileB);
        k.blockSync();
        return next;
      });
      GlobalPtr out = c + ((k.widen(expert) * s.kOrM + k.widen(m0)) * s.n + k.widen(n0));
      k.storeAcc(acc, out, ldn, k.i32(S::kBlockM));
    } else {
      I32 m0 = groupStart + mTile * S::kBlockM;
      I32 rowsValid = groupEnd - m0;
      I32 ldk = k.i32(s.kOrM);
      GlobalPtr aRows = a + k.widen(m0) * s.kOrM;
      acc = k.forRange(k.i32(0), k.i32(s.kOrM), k.i32(S::kBlockK), acc, [&](I32 k0, Acc acc) {
        k.copyTile(aRows + k.widen(k0), ldk, tileA, rowsValid, /*swizzle=*/true);
        if (s.layout == S::kNT) {
          GlobalPtr bRows = b + (k.widen(expert) * s.n + k.widen(n0)) * s.kOrM;
          k.copyTile(bRows + k.widen(k0), ldk, tileB, k.i32(S::kBlockN), /*swizzle=*/true);
        } else {
          GlobalPtr bTile = b + ((k.widen(expert) * s.kOrM + k.widen(k0)) * s.n + k.widen(n0));
          k.copyTileTransposed(bTile, ldn, tileB, k.i32(S::kBlockK));
        }
        k.blockSync();
        Acc next = k.mma(acc, tileA, tileB);
        k.blockSync();
        return next;
      });
      k.storeAcc(acc, c + (k.widen(m0) * s.n + k.widen(n0)), ldn, rowsValid);
    }
  });
  return k.finish();
}

}  // namespace megamoe::kernels
