// quantize_tokens_fp8: bf16 activations to FP8 e4m3 with one scale per token and 128 channels (QuantizeTokensSpec).
#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

mlir::OwningOpRef<mlir::ModuleOp> buildQuantizeTokens(mlir::MLIRContext& ctx, const QuantizeTokensSpec& s) {
  using S = QuantizeTokensSpec;
  Kernel k(ctx, S::kName, S::kBlockThreads);
  GlobalPtr x = k.ptr("x", Elem::bf16);           // [rows, H]
  GlobalPtr q = k.ptr("q", Elem::e4m3);           // [rows, H]
  GlobalPtr scales = k.ptr("scales", Elem::f32);  // [rows, H / 128]
  I32 rows = k.i32Arg("rows");
  GlobalPtr rowsAt = k.ptr("rows_at", Elem::i32);
  I32 grid = k.i32Arg("grid");
  if (s.deviceRows) {
    I32 written = rowsAt.loadI32();
    rows = k.select(written < rows, written, rows);  // unsigned: a negative count reads as the bound
  }

  const int64_t groups = s.hidden / S::kGroup, parts = S::kGroup / S::kVector, chunk = s.chunkRows();
  I32 chunks = (rows + k.i32(chunk - 1)) / chunk;
  k.forRange(k.blockIdx(), chunks, grid, [&](I32 c) {
    // A chunk's (row, group) pairs, one a thread: rows of H / 128 groups each, chunk rows a block.
    k.forRange(k.threadIdx(), k.i32(chunk * groups), k.i32(S::kBlockThreads), [&](I32 j) {
      I32 row = c * chunk + j / groups;
      k.ifThen(row < rows, [&] {
        I64 group = k.widen(row) * groups + k.widen(j % groups);
        I64 at = group * S::kGroup;  // rows are H = groups * 128 wide: the group's first element
        std::vector<Vec> values;
        std::optional<Vec> amax;
        for (int64_t i = 0; i < parts; ++i) {
          values.push_back((x + (at + i * S::kVector)).load(S::kVector).toF32());
          amax = amax ? amax->max(values.back().abs()) : values.back().abs();
        }
        Vec m = amax->maxAll();
        Vec ratio = m.quotient(m.splat(448.f));
        Vec scale = ratio + ratio.stepLE(0.f);  // 1 where amax / 448 is 0 (an all-zero group, or an underflow)
        (scales + group).store(scale);
        Vec wide = scale.repeat(int(S::kVector));
        for (int64_t i = 0; i < parts; ++i)
          (q + (at + i * S::kVector)).store(values[size_t(i)].quotient(wide).toE4m3());
      });
    });
  });
  return k.finish();
}

}  // namespace megamoe::kernels
