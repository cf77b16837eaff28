// grouped_gemm_{nt,nn,tn}: persistent grouped GEMMs over experts (see GroupedGemmSpec and
// docs/decisions/gemm-tiles.md). Each block walks the tile list t = blockIdx, blockIdx + grid, ... (the `_tma`
// variants: tiles in the order of tickets drawn by the blocks); a tile's expert comes from a per-block table built
// from the device-side group offsets, so group sizes never reach the host. The kernels run the single-role engine
// (kernels/gemm/SingleRoleEngine.h), the `_tma` ones on sm_90a the warp-specialised engine with TMA loads
// (kernels/gemm/WarpSpecializedEngine.h). grouped_gemm_nt_fp8 runs the same engines over e4m3 rings, each stage
// promoted with its block scales (GemmOperands::multiply).
#include "dsl/Dsl.h"
#include "kernels/Kernels.h"
#include "kernels/gemm/SingleRoleEngine.h"
#include "kernels/gemm/WarpSpecializedEngine.h"
#include "megamoe/Target/MmaAtoms.h"

namespace megamoe::kernels {
using namespace dsl;

mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemm(mlir::MLIRContext& ctx, const GroupedGemmSpec& s, Arch arch,
                                                   bool warpSpecialized, bool tensorMaps, bool pairs) {
  using S = GroupedGemmSpec;
  const bool tma = tensorMaps && arch == Arch::sm_90a;
  S::Tiles c = s.tiles(arch, warpSpecialized || tma);
  // The split-K tail (kernels/gemm/SplitTail.h): standalone NT / NN on the warp-specialised engine with TMA.
  const bool splitTail = tma && c.warpSpecialized && s.layout != S::kTN;
  if (c.warpSpecialized)  // tables: the tile table, and the split tail's i32 [2] (an empty table adds nothing)
    c.stages = WarpSpecializedEngine::stagesFor(c, {s.experts + 1, splitTail ? 2 : 0}, tma && pairs);
  Kernel k(ctx, tensorMaps ? S::tmaName(s.layout) : S::name(s.layout), c.threads, tma);
  GlobalPtr a = k.ptr("a", Elem::bf16);
  GlobalPtr b = k.ptr("b", Elem::bf16);
  GlobalPtr out = k.ptr("c", Elem::bf16);
  GlobalPtr offsets = k.ptr("offsets", Elem::i32);
  // The `_tma` kernels draw their tiles from tickets (i32 [2], zero before the first launch; the kernel leaves it
  // zero): blocks sharing an operand then run close together in time, where the static order let them drift apart
  // and re-read B from HBM (bench/results/2026-11-30-h200-dynamic-tiles). Pairs draw them per pair.
  std::optional<GlobalPtr> tickets, splitScratch;
  std::optional<I32> maxSplit;
  if (tensorMaps) {
    tickets = k.ptr("tickets", Elem::i32);
    splitScratch = k.ptr("split", Elem::i32);  // every `_tma` kernel takes them; only splitTail ones use them
    maxSplit = k.i32Arg("max_split");
  }
  I32 grid = k.i32Arg("grid");
  TensorMapArgs maps;
  if (tensorMaps) maps = tensorMapArgs(k, s.tmaSpec(pairs ? 1 : 0));  // gfx950: the same arguments, maps unused
  if (tensorMaps && s.layout == S::kTN) maps.c = k.tensorMap("map_c", s.tmaSpec(0).constants);
  // Pairs: blocks run in clusters of two sharing B's tile (multicast); the grid must then be even.
  std::optional<I32> blockInPair;
  if (tma && pairs) {
    if (c.n != 256) throw std::invalid_argument("pairs need 256-wide tiles (N a multiple of 256)");
    k.setClusterX(2);
    blockInPair = k.blockIdx() % 2;
  }
  TileScheduler sched{k, s, offsets, c.m, c.n, blockInPair, /*ticketed=*/tickets.has_value()};
  Rings rings = allocateRings(k, s, c, mnRingLayout(maps), c.warpSpecialized ? 64 : 0, maps.c.has_value());
  GemmOperands gemm{k, s, c, a, b, out, rings};
  SharedTile first = sharedTable(k, "tile_first", s.experts + 1);
  if (tickets) {
    I32 total = sched.buildTable(first);
    if (c.warpSpecialized) {
      WarpSpecializedEngine engine = WarpSpecializedEngine::allocate(gemm, maps, blockInPair);
      if (splitTail) engine.enableSplit(*splitScratch, *maxSplit, grid);
      engine.runDynamic(sched, first, *tickets, total, grid);
    } else
      SingleRoleEngine{gemm}.runDynamic(sched, first, *tickets, sharedTable(k, "ticket_slot", 1), total, grid);
  } else if (c.warpSpecialized) {  // no pairs here: they come with tensor maps, hence tickets
    WarpSpecializedEngine::allocate(gemm, maps).runStatic(sched, first, grid);
  } else {
    SingleRoleEngine{gemm}.runStatic(sched, first, grid);
  }
  return k.finish();
}

int64_t fp8ScaleRows(Arch arch) {
  return arch == Arch::sm_90a ? atoms::WgmmaM64NK32E4m3::kAccRowsPerThread : atoms::Mfma32x32x16Fp8::kAccRowsPerLane;
}

mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemmFp8(mlir::MLIRContext& ctx, const GroupedGemmSpec& s, Arch arch) {
  using S = GroupedGemmSpec;
  if (!s.fp8 || s.layout != S::kNT) throw std::logic_error("grouped_gemm_nt_fp8: an NT spec with fp8 set");
  const bool tma = arch == Arch::sm_90a;
  S::Tiles c = s.tiles(arch, tma);
  if (c.warpSpecialized) c.stages = WarpSpecializedEngine::stagesFor(c, {s.experts + 1});
  Kernel k(ctx, S::kFp8Name, c.threads, tma);
  GlobalPtr a = k.ptr("a", Elem::e4m3);             // [M_total, K]
  GlobalPtr aScales = k.ptr("a_scales", Elem::f32);  // [M_total, K / 128]
  GlobalPtr b = k.ptr("b", Elem::e4m3);             // [E, N, K]
  GlobalPtr bScales = k.ptr("b_scales", Elem::f32);  // [E, N / 128, K / 128]
  GlobalPtr out = k.ptr("c", Elem::bf16);
  GlobalPtr offsets = k.ptr("offsets", Elem::i32);
  GlobalPtr tickets = k.ptr("tickets", Elem::i32);
  I32 grid = k.i32Arg("grid");
  TensorMapArgs maps = tensorMapArgs(k, s.spec());  // gfx950: the same arguments, maps unused
  TileScheduler sched{k, s, offsets, c.m, c.n, std::nullopt, /*ticketed=*/true};
  Rings rings = allocateRings(k, s, c, mnRingLayout(maps), c.warpSpecialized ? 64 : 0);
  GemmOperands gemm{k, s, c, a, b, out, rings};
  gemm.scales = GemmOperands::BlockScales{aScales, bScales, fp8ScaleRows(arch)};
  SharedTile first = sharedTable(k, "tile_first", s.experts + 1);
  I32 total = sched.buildTable(first);
  if (c.warpSpecialized)
    WarpSpecializedEngine::allocate(gemm, maps).runDynamic(sched, first, tickets, total, grid);
  else
    SingleRoleEngine{gemm}.runDynamic(sched, first, tickets, sharedTable(k, "ticket_slot", 1), total, grid);
  return k.finish();
}

}  // namespace megamoe::kernels
