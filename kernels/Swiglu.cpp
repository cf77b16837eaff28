// swiglu_fwd: the elementwise activation between the two grouped GEMMs (see SwigluSpec).
#include "dsl/Dsl.h"
#include "kernels/Activation.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

mlir::OwningOpRef<mlir::ModuleOp> buildSwiglu(mlir::MLIRContext& ctx, const SwigluSpec& s) {
  Kernel k(ctx, SwigluSpec::kName, SwigluSpec::kBlockThreads);
  GlobalPtr h = k.ptr("h", Elem::bf16);    // [M, 2I]: gate | up
  GlobalPtr out = k.ptr("out", Elem::bf16);  // [M, I]
  I32 rows = k.i32Arg("rows");

  const int64_t vectorsPerRow = s.intermediate / SwigluSpec::kVector;
  I32 v = k.blockIdx() * SwigluSpec::kBlockThreads + k.threadIdx();
  I32 row = v / vectorsPerRow;
  k.returnIf(row >= rows);
  I64 col = k.widen(v % vectorsPerRow) * SwigluSpec::kVector;
  I64 gateAt = k.widen(row) * (2 * s.intermediate) + col;
  Vec gate = (h + gateAt).load(SwigluSpec::kVector).toF32();
  Vec up = (h + (gateAt + s.intermediate)).load(SwigluSpec::kVector).toF32();
  (out + (k.widen(row) * s.intermediate + col)).store(swiglu(gate, up, s.clampMilli).to(Elem::bf16));
  return k.finish();
}

}  // namespace megamoe::kernels
