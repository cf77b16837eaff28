// gemm_nt: the one-expert bf16 GEMM tile kernel (see GemmNtSpec). Each 64-wide K stage is copied into swizzled
// shared memory by the whole block, then multiplied with the target's MMA atom (wgmma / MFMA).
#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

namespace {
// The block's tile of the one-expert GEMMs: rows [m0, m0 + BLOCK_M) of A and C (the block returns when m0 >= m),
// columns [n0, n0 + BLOCK_N) of C, and the two K-major shared tiles of one stage.
struct OneTile {
  I32 m0, n0, rowsValid;
  SharedTile a, b;
};
template <typename S>
OneTile oneTile(Kernel& k, const I32& m, Elem e) {
  I32 m0 = k.blockIdx(1) * S::kBlockM;
  k.returnIf(m0 >= m);
  I32 n0 = k.blockIdx(0) * S::kBlockN;
  I32 rowsValid = m - m0;
  SharedTile a = k.sharedTile("tile_a", e, S::kBlockM, S::kBlockK, Layout::k128B);
  SharedTile b = k.sharedTile("tile_b", e, S::kBlockN, S::kBlockK, Layout::k128B);
  return {m0, n0, rowsValid, a, b};
}
}  // namespace

mlir::OwningOpRef<mlir::ModuleOp> buildGemmNt(mlir::MLIRContext& ctx, const GemmNtSpec& s) {
  using S = GemmNtSpec;
  Kernel k(ctx, S::kName, S::kBlockThreads);
  GlobalPtr a = k.ptr("a", Elem::bf16);  // [M, K]
  GlobalPtr b = k.ptr("b", Elem::bf16);  // [N, K]
  GlobalPtr c = k.ptr("c", Elem::bf16);  // [M, N]
  I32 m = k.i32Arg("m");

  const OneTile t = oneTile<S>(k, m, Elem::bf16);
  const I32 &m0 = t.m0, &n0 = t.n0, &rowsValid = t.rowsValid;
  const SharedTile &tileA = t.a, &tileB = t.b;
  I32 ldk = k.i32(s.k);
  GlobalPtr aRows = a + k.widen(m0) * s.k;
  GlobalPtr bRows = b + k.widen(n0) * s.k;

  const Threads block = k.block();  // every op of this kernel is the whole block's
  Acc acc = k.forRange(k.i32(0), k.i32(s.k), k.i32(S::kBlockK), block.zeroAcc(S::kBlockM, S::kBlockN),
                       [&](I32 k0, Acc acc) {
                         block.copyTile(aRows + k.widen(k0), ldk, tileA, rowsValid);
                         block.copyTile(bRows + k.widen(k0), ldk, tileB, k.i32(S::kBlockN));
                         block.sync();
                         Acc next = block.mma(acc, tileA, tileB);
                         block.sync();  // the next stage overwrites the tiles
                         return next;
                       });
  block.storeAcc(acc, c + (k.widen(m0) * s.n + k.widen(n0)), k.i32(s.n), rowsValid);
  return k.finish();
}

mlir::OwningOpRef<mlir::ModuleOp> buildGemmNtFp8(mlir::MLIRContext& ctx, const GemmNtFp8Spec& s, Arch arch) {
  using S = GemmNtFp8Spec;
  static_assert(S::kBlockK == S::kScaleBlock && S::kBlockN == S::kScaleBlock, "one scale block per tile and stage");
  Kernel k(ctx, S::kName, S::kBlockThreads);
  GlobalPtr a = k.ptr("a", Elem::e4m3);            // [M, K]
  GlobalPtr aScales = k.ptr("a_scales", Elem::f32);  // [M, K / 128]
  GlobalPtr b = k.ptr("b", Elem::e4m3);            // [N, K]
  GlobalPtr bScales = k.ptr("b_scales", Elem::f32);  // [N / 128, K / 128]
  GlobalPtr c = k.ptr("c", Elem::bf16);            // [M, N]
  I32 m = k.i32Arg("m");

  const OneTile t = oneTile<S>(k, m, Elem::e4m3);
  const I32 &m0 = t.m0, &n0 = t.n0, &rowsValid = t.rowsValid;
  const SharedTile &tileA = t.a, &tileB = t.b;
  const int64_t kBlocks = s.k / S::kScaleBlock;
  I32 ldk = k.i32(s.k);
  GlobalPtr aRows = a + k.widen(m0) * s.k;
  GlobalPtr bRows = b + k.widen(n0) * s.k;
  GlobalPtr aRowScales = aScales + k.widen(m0) * kBlocks;
  GlobalPtr bTileScales = bScales + k.widen(k.blockIdx(0)) * kBlocks;

  const Threads block = k.block();
  Acc acc = k.forRange(k.i32(0), k.i32(kBlocks), k.i32(1), block.zeroAcc(S::kBlockM, S::kBlockN), [&](I32 kb, Acc acc) {
    I64 k0 = k.widen(kb) * S::kBlockK;
    block.copyTile(aRows + k0, ldk, tileA, rowsValid);
    block.copyTile(bRows + k0, ldk, tileB, k.i32(S::kBlockN));
    block.sync();
    Vec scales = block.rowScales(acc, fp8ScaleRows(arch), aRowScales + k.widen(kb), k.i32(kBlocks), rowsValid,
                                 {(bTileScales + k.widen(kb)).load(1)});
    Acc next = block.scaleAdd(acc, block.mmaFresh(block.zeroAcc(S::kBlockM, S::kBlockN), tileA, tileB), scales);
    block.sync();  // the next stage overwrites the tiles
    return next;
  });
  block.storeAcc(acc, c + (k.widen(m0) * s.n + k.widen(n0)), k.i32(s.n), rowsValid);
  return k.finish();
}

}  // namespace megamoe::kernels
