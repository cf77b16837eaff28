// grouped_gemm_{nt,nn,tn}: persistent grouped GEMMs over experts (see GroupedGemmSpec and
// docs/decisions/gemm-tiles.md). Each CTA walks the tile list t = blockIdx, blockIdx + grid, ...; a tile's expert
// comes from a per-CTA table built from the device-side group offsets, so group sizes never reach the host.
#include "dsl/Dsl.h"
#include "kernels/GroupedGemmPipeline.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemm(mlir::MLIRContext& ctx, const GroupedGemmSpec& s, Arch arch,
                                                   bool warpSpecialized) {
  using S = GroupedGemmSpec;
  const S::Tiles c = s.tiles(arch, warpSpecialized);
  Kernel k(ctx, S::name(s.layout), c.threads);
  GlobalPtr a = k.argPtr(Elem::bf16);
  GlobalPtr b = k.argPtr(Elem::bf16);
  GlobalPtr out = k.argPtr(Elem::bf16);
  GlobalPtr offsets = k.argPtr(Elem::i32);
  I32 grid = k.argI32();
  TileScheduler sched{k, s, offsets, c.m, c.n};
  Rings rings = allocateRings(k, s, c);
  Pipeline pipe{k, s, c, a, b, out, rings.a, rings.b, rings.staging};
  SharedTile first = sharedTable(k, s.experts + 1);
  if (c.warpSpecialized)
    WarpSpecialized::allocate(pipe).runStatic(sched, first, grid);
  else
    pipe.runStatic(sched, first, grid);
  return k.finish();
}

}  // namespace megamoe::kernels
