// The shared-memory tiles both GEMM engines run on: the A and B rings (one slot per K stage) and the staging tile
// the epilogue passes the accumulators through.
#pragma once
#include <cstdint>

#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {

// The shared-memory buffers of the main loop and the epilogue, in every kernel that runs a GEMM engine.
struct Rings {
  dsl::SharedTile a, b, staging;
};
// stagingRows: c.m, or 64 when the MMA warpgroups take turns with one warpgroup's rows (warp-specialised).
inline Rings allocateRings(dsl::Kernel& k, const GroupedGemmSpec& s, const GroupedGemmSpec::Tiles& c,
                           int64_t stagingRows = 0) {
  using namespace dsl;
  bool tn = s.layout == GroupedGemmSpec::kTN, nt = s.layout == GroupedGemmSpec::kNT;
  // K-major [MN][64] rings, or MN-major [64][MN] ones.
  SharedTile a = tn ? k.dynamicSharedTile(Elem::bf16, c.k, c.m, c.stages)
                    : k.dynamicSharedTile(Elem::bf16, c.m, c.k, c.stages);
  SharedTile b = nt ? k.dynamicSharedTile(Elem::bf16, c.n, c.k, c.stages)
                    : k.dynamicSharedTile(Elem::bf16, c.k, c.n, c.stages);
  // Staging rows padded by 8 elements (16 bytes): the 8 rows a warp's fragment store touches fall in distinct banks.
  return {a, b, k.dynamicSharedTile(Elem::bf16, stagingRows ? stagingRows : c.m, c.n, 1, c.n + 8)};
}

}  // namespace megamoe::kernels
