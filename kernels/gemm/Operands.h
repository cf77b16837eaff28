// What a grouped GEMM multiplies, for either engine: A, B and C in global memory (and as tensor maps), their ring
// and staging tiles, the copies of one K step into a ring slot, and the default epilogue's row stores.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <vector>

#include "dsl/Dsl.h"
#include "kernels/Kernels.h"
#include "kernels/gemm/Rings.h"
#include "kernels/gemm/TileScheduler.h"

namespace megamoe::kernels {

// The two trailing tensor-map arguments of a kernel that may run the warp-specialised engine with TMA: CUtensorMaps
// where the kernel was built with tensor maps (dsl::Kernel's tensorMaps), otherwise unused pointers (empty here).
// Their boxes are the declaration's for the kernel's constants `spec` (compiler/abi/Kernels.def).
struct TensorMapArgs {
  std::optional<dsl::TensorMap> a, b;
  // Where the kernel declares it (grouped_gemm_tn_tma): C, which the epilogue then stores as boxes from the staging
  // tile (WarpSpecializedEngine::tmaStores).
  std::optional<dsl::TensorMap> c;
};
inline TensorMapArgs tensorMapArgs(dsl::Kernel& k, const KernelSpec& spec) {
  return {k.tensorMap("map_a", spec.constants), k.tensorMap("map_b", spec.constants)};
}
// The layout of MN-major rings (allocateRings): as TMA boxes land where these maps load them, else as tile copies
// write it.
inline dsl::Layout mnRingLayout(const TensorMapArgs& maps) {
  return maps.a ? dsl::Layout::mn128BBoxes : dsl::Layout::mn128B;
}

// NT reads both operands K-major; NN's B and TN's A and B are K x MN slabs kept MN-major.
struct GemmOperands {
  dsl::Kernel& k;
  const GroupedGemmSpec& s;
  const GroupedGemmSpec::Tiles& c;
  dsl::GlobalPtr a, b, out;
  Rings rings;

  // Optional parts of the fused operators.
  // NT only: B's tile is two halves, rows [n0 / 2, + bn / 2) and [gateUpRows + n0 / 2, + bn / 2) of B[e] (the gate
  // and up rows of a SwiGLU pair, so the epilogue sees gate | up side by side). 0 = plain.
  int64_t gateUpRows = 0;
  // NT / NN, copies by the block's threads (not TMA): A's tile row r is global row gatherA[r] (shared i32 [c.m],
  // filled before the tile's first copies and block-synced) instead of row m0 + r. The table is read when copies
  // are issued, so the single-role engine's beforeLoads may rewrite it: every copy of the previous tile was issued
  // before the K loop's last barrier.
  std::optional<dsl::SharedTile> gatherA;
  // 0 (run time) skips the K loop: the tile's accumulator stays zero (communication-only benchmark legs).
  std::function<dsl::I32()> mmaOn;
  // FP8 (c.e4m3, NT): A's per-token scales f32 [rows, K / 128] and B's block scales f32 [E, N / 128, K / 128];
  // rows: the distinct accumulator rows of an MMA thread, the target atom's (Threads::rowScales).
  struct BlockScales {
    dsl::GlobalPtr a, b;
    int64_t rows;
  };
  std::optional<BlockScales> scales;

  bool tn() const { return s.layout == GroupedGemmSpec::kTN; }
  // First output row of the tile: NT/NN rows of the group; TN rows of C[e] (M).
  dsl::I32 m0(const TilePlace& p) const { return tn() ? p.mTile * c.m : p.groupStart + p.mTile * c.m; }
  // K steps: fixed for NT/NN; the group's size for TN.
  dsl::I32 kTiles(const TilePlace& p) const {
    dsl::I32 steps = tn() ? (p.groupEnd - p.groupStart + (c.k - 1)) / c.k : k.i32(s.kOrM / c.k);
    return mmaOn ? steps * mmaOn() : steps;
  }
  // K step kt of tile p through the MMA of `by` (the block, or an MMA warpgroup): acc + A's stage x B's stage. FP8:
  // the stage is one 128-K scale block, multiplied from zero to completion and promoted into acc with its scales
  // (pending does not apply; the warp-specialised engine overlaps the two instead: stageScales, promote); bf16: an
  // MMA left `pending` (Threads::mma).
  dsl::Acc multiply(const dsl::Threads& by, const dsl::Acc& acc, const dsl::SharedTile& a, const dsl::SharedTile& b,
                    const TilePlace& p, const dsl::I32& kt, int64_t pending, bool aFirstRows = false,
                    const std::optional<dsl::I32>& k16 = std::nullopt) const {
    if (!c.e4m3) return by.mma(acc, a, b, pending, aFirstRows, k16);
    if (aFirstRows || k16) throw std::logic_error("FP8 stages: whole tiles");
    dsl::Vec stage = stageScales(by, acc, p, kt);
    return by.scaleAdd(acc, by.mmaFresh(by.zeroAcc(acc.m, acc.n), a, b), stage);
  }
  // FP8: the promotion scales of K step kt (one 128-K block) for this thread's rows of tile p's accumulator like
  // `acc` (Threads::rowScales): A's per-token scales times B's block scales, one per column group: each 128 columns
  // of the tile (one 128-row block of B), or with gateUpRows the gate half's and the up half's (each inside one
  // block); rows past the group get 0, all of them in a pair's m-tile past it.
  dsl::Vec stageScales(const dsl::Threads& by, const dsl::Acc& acc, const TilePlace& p, const dsl::I32& kt) const {
    using namespace dsl;
    if (!scales || s.layout != GroupedGemmSpec::kNT) throw std::logic_error("FP8 stages: NT, with the block scales");
    const int64_t kBlocks = s.kOrM / GroupedGemmSpec::kScaleBlock, block = GroupedGemmSpec::kScaleBlock;
    I32 first = m0(p);
    GlobalPtr rowScales = scales->a + (k.widen(first) * kBlocks + k.widen(kt));
    // B's block of row `row` of expert p.expert's N rows.
    auto bScale = [&](const I32& row) {
      return (scales->b + ((k.widen(p.expert) * (s.n / block) + k.widen(row / block)) * kBlocks + k.widen(kt))).load(1);
    };
    std::vector<Vec> factors;
    if (gateUpRows > 0) {
      if (gateUpRows % block || c.n / 2 > block) throw std::logic_error("FP8 gate | up tiles: halves inside a block");
      factors = {bScale(p.n0 / 2), bScale(p.n0 / 2 + gateUpRows)};
    } else {
      if (c.n % block) throw std::logic_error("FP8 tiles: whole 128-row blocks of B");
      for (int64_t f = 0; f < c.n / block; ++f) factors.push_back(bScale(p.n0 + block * f));
    }
    // (first < groupEnd compares non-negative rows: the DSL's < is unsigned.)
    I32 valid = k.select(first < p.groupEnd, p.groupEnd - first, k.i32(0));
    return by.rowScales(acc, scales->rows, rowScales, k.i32(kBlocks), valid, factors);
  }
  // Issues the copies (cp.async on sm_90a, synchronous on gfx950) of K step kt of tile p into ring slot `slot`, each
  // in its ring's layout (Rings), by the threads `by` (the block, or a producer warpgroup).
  void issue(const dsl::Threads& by, const TilePlace& p, const dsl::I32& kt, const dsl::I32& slot) const {
    using namespace dsl;
    I32 first = m0(p);
    if (tn()) {
      // Rows are the group's tokens: A [tokens, M], B [tokens, N]; tokens past the group are zero-filled.
      I32 row = p.groupStart + kt * c.k;
      I32 valid = p.groupEnd - row;
      by.copyTile(a + (k.widen(row) * s.kOrM + k.widen(first)), k.i32(s.kOrM), rings.a.stage(slot), valid,
                  Copy::async);
      by.copyTile(b + (k.widen(row) * s.n + k.widen(p.n0)), k.i32(s.n), rings.b.stage(slot), valid, Copy::async);
      return;
    }
    if (gatherA) {
      by.copyTileGather(a + k.widen(kt * c.k), k.i32(s.kOrM), *gatherA, rings.a.stage(slot), p.groupEnd - first,
                        Copy::async);
    } else {
      GlobalPtr aRows = a + k.widen(first) * s.kOrM;
      by.copyTile(aRows + k.widen(kt * c.k), k.i32(s.kOrM), rings.a.stage(slot), p.groupEnd - first, Copy::async);
    }
    if (s.layout == GroupedGemmSpec::kNT && gateUpRows > 0) {
      const int64_t half = c.n / 2;
      SharedTile stage = rings.b.stage(slot);
      I64 gate = k.widen(p.expert) * (2 * gateUpRows) + k.widen(p.n0 / 2);
      by.copyTile(b + (gate * s.kOrM + k.widen(kt * c.k)), k.i32(s.kOrM), stage.rowSlice(0, half), k.i32(half),
                  Copy::async);
      by.copyTile(b + ((gate + gateUpRows) * s.kOrM + k.widen(kt * c.k)), k.i32(s.kOrM), stage.rowSlice(half, half),
                  k.i32(half), Copy::async);
    } else if (s.layout == GroupedGemmSpec::kNT) {
      GlobalPtr bRows = b + (k.widen(p.expert) * s.n + k.widen(p.n0)) * s.kOrM;
      by.copyTile(bRows + k.widen(kt * c.k), k.i32(s.kOrM), rings.b.stage(slot), k.i32(c.n), Copy::async);
    } else {
      GlobalPtr bSlab = b + ((k.widen(p.expert) * s.kOrM + k.widen(kt * c.k)) * s.n + k.widen(p.n0));
      by.copyTile(bSlab, k.i32(s.n), rings.b.stage(slot), k.i32(c.k), Copy::async);
    }
  }
  // The default epilogue's stores: the staging tile's rows, C's rows from first0 on (TN: rows of dW[e], all of them;
  // NT / NN: those inside the group, none where first0 lies past it, e.g. a pair's second m-tile), by the threads `by`.
  void storeStaged(const dsl::Threads& by, const TilePlace& p, const dsl::I32& first0) const {
    using namespace dsl;
    if (tn())
      by.copyTile(rings.staging, out + ((k.widen(p.expert) * s.kOrM + k.widen(first0)) * s.n + k.widen(p.n0)),
                  k.i32(s.n), k.i32(rings.staging.rows()));
    else
      by.copyTile(rings.staging, out + (k.widen(first0) * s.n + k.widen(p.n0)), k.i32(s.n),
                  k.select(first0 < p.groupEnd, p.groupEnd - first0, k.i32(0)));
  }
};

}  // namespace megamoe::kernels
