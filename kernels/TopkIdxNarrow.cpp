// topk_idx_narrow: the caller's int64 top-k indices as the layer's int32 ones (see TopkIdxNarrowSpec).
#include <cstdint>

#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

mlir::OwningOpRef<mlir::ModuleOp> buildTopkIdxNarrow(mlir::MLIRContext& mctx, const TopkIdxNarrowSpec&) {
  using S = TopkIdxNarrowSpec;
  Kernel k(mctx, S::kName, S::kBlockThreads);
  Context ctx = k.context();
  GlobalPtr src = k.ptr("src", Elem::i64);
  GlobalPtr dst = k.ptr("dst", Elem::i32);
  I32 count = k.i32Arg("count");
  I32 grid = k.i32Arg("grid");  // blocks launched
  // A negative count (unsigned: >= 2^31) writes nothing; the pair loop below divides it unsigned.
  k.returnIf(count >= k.i32(INT32_MIN));
  I32 stride = grid * S::kBlockThreads;
  I32 self = k.blockIdx() * S::kBlockThreads + k.threadIdx();

  // Entry i holding v: v when it is in [-1, kLimit) (v + 1 in [0, kLimit]: one unsigned compare), else kBadValue,
  // with the error record claimed as dispatch_prologue claims it for a bad index (flag: the pick, seen: the value,
  // expected: the bound), so that the caller's value, which the int32 entry no longer holds, is what the host sees.
  auto narrow = [&](const I32& i, const I64& v) {
    Bool valid = (v + 1) < k.i64(S::kLimit + 1);
    k.ifThen(!valid, [&] {
      k.reportError(ctx, uint64_t(abi::ErrorCode::kBadIndex), k.widen(i), v, k.i64(S::kLimit));
    });
    return k.select(valid, k.narrow(v), k.i32(S::kBadValue));
  };

  // Pairs: a warp reads 512 contiguous bytes and writes 256, one vector access each per thread. The vector accesses
  // need src 16-byte and dst 8-byte aligned (a caller's view into a larger tensor may be neither): otherwise one
  // entry per thread and step, still coalesced.
  Bool aligned = src.address() % 16 == 0 && dst.address() % 8 == 0;
  k.ifThen(aligned, [&] {
    k.forRange(self, count / 2, stride, [&](I32 p) {
      I64 at = k.widen(p) * 2;
      Vec two = (src + at).load(2);
      I32 i = p * 2;
      (dst + at).store(k.vec({narrow(i, two.laneI64(0)), narrow(i + 1, two.laneI64(1))}));
    });
    k.ifThen(self == 0 && count % 2 == 1, [&] {
      I32 last = count - 1;
      (dst + k.widen(last)).storeI32(narrow(last, (src + k.widen(last)).loadI64()));
    });
  });
  k.ifThen(!aligned, [&] {
    k.forRange(self, count, stride,
               [&](I32 i) { (dst + k.widen(i)).storeI32(narrow(i, (src + k.widen(i)).loadI64())); });
  });
  return k.finish();
}

}  // namespace megamoe::kernels
