// Communication kernels over the symmetric heap (see the specs in Kernels.h): the runtime's GPU tests and the
// peer-bandwidth benchmark are written in the DSL like every other kernel.
#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"
#include "kernels/Flags.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

mlir::OwningOpRef<mlir::ModuleOp> buildEpochAdvance(mlir::MLIRContext& mctx, const EpochAdvanceSpec&) {
  Kernel k(mctx, EpochAdvanceSpec::kName, 32);
  Context ctx = k.context();
  k.returnIf(!(k.threadIdx() == 0));
  ctx.epochSlot().storeI64(ctx.epoch() + 1);
  return k.finish();
}

mlir::OwningOpRef<mlir::ModuleOp> buildPingPong(mlir::MLIRContext& mctx, const PingPongSpec& s) {
  Kernel k(mctx, PingPongSpec::kName, 32);
  Context ctx = k.context();
  GlobalPtr flag = k.ptr("flag", Elem::i64);
  GlobalPtr log = k.ptr("log", Elem::i64);
  k.returnIf(!(k.threadIdx() == 0));
  I32 rank = ctx.rank();
  I32 peer = k.i32(1) - rank;
  I64 base = ctx.epoch() * s.rounds;
  k.forRange(k.i32(0), k.i32(s.rounds), k.i32(1), [&](I32 round) {
    I64 value = base + k.widen(round) + 1;
    k.ifThen(k.errorClear(ctx), [&] {
      k.ifThen(round % 2 == rank, [&] {
        k.peer(ctx, log + k.widen(round), peer).storeI64(value);
        k.signal(k.peer(ctx, flag, peer), value, Scope::system);
      });
      k.ifThen(!(round % 2 == rank), [&] { k.waitAtLeast(ctx, flag, value, peerFlagId(k, peer), Scope::system); });
    });
  });
  return k.finish();
}

mlir::OwningOpRef<mlir::ModuleOp> buildAllToAllRows(mlir::MLIRContext& mctx, const AllToAllRowsSpec& s) {
  using S = AllToAllRowsSpec;
  Kernel k(mctx, S::kName, S::kBlockThreads);
  Context ctx = k.context();
  GlobalPtr send = k.ptr("send", Elem::bf16);
  GlobalPtr recv = k.ptr("recv", Elem::bf16);
  GlobalPtr flags = k.ptr("flags", Elem::i64);
  I32 rows = k.i32Arg("rows");
  I32 rank = ctx.rank();
  I32 peer = k.blockIdx() / S::kBlocksPerPeer;
  I32 part = k.blockIdx() % S::kBlocksPerPeer;
  const int64_t chunksPerRow = s.hidden / 8;
  // Chunks of 8 bf16 of the [rows, H] slab, strided over this peer's block group.
  I64 slab = k.widen(rows) * s.hidden;
  GlobalPtr from = send + k.widen(peer) * slab;
  GlobalPtr to = k.peer(ctx, recv + k.widen(rank) * slab, peer);
  I32 chunks = rows * chunksPerRow;
  I32 stride = k.i32(S::kBlocksPerPeer * S::kBlockThreads);
  k.forRange(part * S::kBlockThreads + k.threadIdx(), chunks, stride, [&](I32 c) {
    I64 at = k.widen(c) * 8;
    (to + at).store((from + at).load(8));
  });
  k.block().sync();
  I64 expected = (ctx.epoch() + 1) * S::kBlocksPerPeer;
  k.ifThen(k.threadIdx() == 0, [&] {
    k.signal(k.peer(ctx, flags + k.widen(rank), peer), k.i64(1), Scope::system, /*add=*/true);
    // Block (p, 0) also waits for everything rank p sends us.
    k.ifThen(part == 0, [&] { k.waitAtLeast(ctx, flags + k.widen(peer), expected, peerFlagId(k, peer), Scope::system); });
  });
  return k.finish();
}

mlir::OwningOpRef<mlir::ModuleOp> buildPeerStore(mlir::MLIRContext& mctx, const PeerStoreSpec&) {
  using S = PeerStoreSpec;
  Kernel k(mctx, S::kName, S::kBlockThreads);
  Context ctx = k.context();
  GlobalPtr src = k.ptr("src", Elem::bf16);
  GlobalPtr dst = k.ptr("dst", Elem::bf16);
  I32 chunks = k.i32Arg("chunks");  // 16-byte chunks (< 2^31: 32 GB)
  I32 peer = k.i32Arg("peer");
  I32 grid = k.i32Arg("grid");    // blocks launched
  GlobalPtr remote = k.peer(ctx, dst, peer);
  I32 stride = grid * S::kBlockThreads;
  I32 self = k.blockIdx() * S::kBlockThreads + k.threadIdx();
  auto chunk = [&](const GlobalPtr& p, const I32& c) { return p + k.widen(c) * 8; };
  // Main part: kUnroll loads in flight before their stores.
  I32 steps = chunks / (stride * S::kUnroll);
  k.forRange(k.i32(0), steps, k.i32(1), [&](I32 step) {
    I32 c0 = step * stride * S::kUnroll + self;
    std::vector<Vec> v;
    for (int64_t j = 0; j < S::kUnroll; ++j) v.push_back(chunk(src, c0 + stride * j).load(8));
    for (int64_t j = 0; j < S::kUnroll; ++j) chunk(remote, c0 + stride * j).store(v[size_t(j)]);
  });
  // Tail: one chunk per thread per step.
  k.forRange(steps * stride * S::kUnroll + self, chunks, stride,
             [&](I32 c) { chunk(remote, c).store(chunk(src, c).load(8)); });
  return k.finish();
}

}  // namespace megamoe::kernels
