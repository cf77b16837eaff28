// What the shared lowering patterns ask of a target: thread and block ids, the block barrier, a nanosecond clock,
// syncscope names, and what must follow shared-memory writes. One implementation per target pass.
#pragma once
#include "megamoe/Dialect/MegaMoe.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Rewrite/FrozenRewritePatternSet.h"

namespace megamoe {

class TargetHooks {
 public:
  virtual ~TargetHooks() = default;
  virtual mlir::Value threadId(mlir::OpBuilder& b, mlir::Location loc) const = 0;   // i32, x dimension
  virtual mlir::Value blockId(mlir::OpBuilder& b, mlir::Location loc) const = 0;    // i32, x dimension
  virtual mlir::Value nowNs(mlir::OpBuilder& b, mlir::Location loc) const = 0;      // i64 nanoseconds
  virtual void blockBarrier(mlir::OpBuilder& b, mlir::Location loc) const = 0;
  virtual llvm::StringRef syncScope(MemScope scope) const = 0;
  // Called after a tile_copy wrote shared memory (sm_90a: make generic-proxy writes visible to wgmma/TMA).
  virtual void afterSharedWrite(mlir::OpBuilder& b, mlir::Location loc) const = 0;
  // Issues one 16-byte global -> shared copy without waiting (zero-filled when `inside` is false) and returns true,
  // or returns false when the target has no asynchronous copy (the caller then copies synchronously).
  virtual bool asyncCopyChunk(mlir::OpBuilder& b, mlir::Location loc, mlir::Value dst, mlir::Value src,
                              mlir::Value inside) const = 0;
  virtual void asyncCommit(mlir::OpBuilder& b, mlir::Location loc) const = 0;
  virtual void asyncWait(mlir::OpBuilder& b, mlir::Location loc, int64_t pending) const = 0;
  // Whether b128_mn tiles are stored transposed into the K-major b128 layout (targets whose MMA operands are
  // K-contiguous per lane, gfx950) instead of as MN-major atoms the MMA reads transposed (sm_90a).
  virtual bool mnMajorTilesAsKMajor() const = 0;
  // Kernel function attributes for `megamoe.kernel` functions with `megamoe.block_threads`.
  virtual void markKernel(mlir::Operation* func, int64_t blockThreads) const = 0;
};

// Small builders shared by the lowerings.
namespace lowering {
mlir::Value i32(mlir::OpBuilder& b, mlir::Location loc, int64_t v);
mlir::Value i64(mlir::OpBuilder& b, mlir::Location loc, int64_t v);
// ptr + byteOffset (i32 or i64), keeping the pointer's address space.
mlir::Value byteGep(mlir::OpBuilder& b, mlir::Location loc, mlir::Value ptr, mlir::Value byteOffset);
// Converts the f32 value to `elem` (bf16, f16 or f32).
mlir::Value convertF32(mlir::OpBuilder& b, mlir::Location loc, mlir::Value v, mlir::Type elem);
// Where a thread's accumulator elements lie in the target atom's placement: element i in row rowBase + row[i] and
// column colBase + col[i], with colBase (the thread's own) below colSpan.
struct FragmentPlace {
  llvm::SmallVector<int64_t> row, col;
  int64_t colSpan;
};
// The FP8 promotion over such a fragment, each replacing its op: acc_row_scales loads one scale per distinct row
// offset, in first-seen order, and multiplies it by each factor (fails where the result's length is not rows x
// factors); acc_scale_add multiplies element i by its row's scale of its column group.
mlir::LogicalResult accRowScales(mlir::PatternRewriter& b, AccRowScalesOp op, mlir::Value rowBase,
                                 const FragmentPlace& place);
mlir::LogicalResult accScaleAdd(mlir::PatternRewriter& b, AccScaleAddOp op, const FragmentPlace& place);
// Marks every func carrying `megamoe.kernel` via hooks.markKernel; fails on a kernel without block_threads.
mlir::LogicalResult markKernels(mlir::Operation* root, const TargetHooks& hooks);
// Runs `patterns` to completion and fails, naming the op, if any megamoe op is left.
mlir::LogicalResult applyLowering(mlir::Operation* root, mlir::FrozenRewritePatternSet patterns);
}  // namespace lowering

}  // namespace megamoe
