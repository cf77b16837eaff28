// megamoe-expand-barriers: grid and cross-rank barriers become signals, bounded waits and block barriers.
#include "TargetHooks.h"

#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Transforms/Passes.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

using namespace mlir;

namespace megamoe {
#define GEN_PASS_DEF_MEGAMOEEXPANDBARRIERS
#include "megamoe/Transforms/Passes.h.inc"

namespace {
using namespace lowering;

Value threadIsZero(OpBuilder& b, Location loc) {
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value zero = arith::ConstantIndexOp::create(b, loc, 0);
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, tid, zero);
}

// After the block re-converges, every thread reads the rank's error code: any error anywhere means "exit".
Value errorRecordClear(OpBuilder& b, Location loc, Value error) {
  Value code = LLVM::LoadOp::create(b, loc, b.getI64Type(), error, 8, false, false, false, false,
                                    LLVM::AtomicOrdering::acquire, "");
  return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, code, i64(b, loc, 0));
}

struct ExpandGridBarrier : OpRewritePattern<GridBarrierOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(GridBarrierOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    gpu::BarrierOp::create(b, loc);
    auto ifOp = scf::IfOp::create(b, loc, TypeRange{}, threadIsZero(b, loc), false);
    {
      OpBuilder tb = ifOp.getThenBodyBuilder();
      SignalOp::create(tb, loc, op.getCounter(), i64(tb, loc, 1), MemScope::gpu, SignalKind::add);
      WaitOp::create(tb, loc, tb.getI1Type(), op.getCounter(), op.getExpected(), op.getTimeoutNs(), op.getError(), op.getRank(),
                     i64(tb, loc, abi::flagId(abi::FlagKind::kGridBarrier, 0)), MemScope::gpu);
    }
    gpu::BarrierOp::create(b, loc);
    b.replaceOp(op, errorRecordClear(b, loc, op.getError()));
    return success();
  }
};

struct ExpandRankBarrier : OpRewritePattern<RankBarrierOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(RankBarrierOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    Type i64t = b.getI64Type(), i1t = b.getI1Type();
    Value flags = op.getFlags();
    auto slot = [&](OpBuilder& nb, Value index) {
      return LLVM::GEPOp::create(nb, loc, flags.getType(), i64t, flags, ValueRange{index}).getResult();
    };
    gpu::BarrierOp::create(b, loc);
    auto ifOp = scf::IfOp::create(b, loc, TypeRange{}, threadIsZero(b, loc), false);
    {
      OpBuilder tb = ifOp.getThenBodyBuilder();
      Value zero = i32(tb, loc, 0), one = i32(tb, loc, 1);
      // Arrive: our slot [rank] in every peer's array (ourselves included).
      scf::ForOp::create(tb, loc, zero, op.getNranks(), one, ValueRange{},
                         [&](OpBuilder& nb, Location l, Value peer, ValueRange) {
                           Value remote = PeerPtrOp::create(nb, l, flags.getType(), slot(nb, op.getRank()),
                                                            op.getOffsets(), peer);
                           SignalOp::create(nb, l, remote, op.getValue(), MemScope::system, SignalKind::store);
                           scf::YieldOp::create(nb, l);
                         });
      // Wait for every peer's arrival; after the first timeout the rest are skipped (one bound, not nranks).
      Value okInit = arith::ConstantIntOp::create(tb, loc, 1, 1);
      scf::ForOp::create(
          tb, loc, zero, op.getNranks(), one, ValueRange{okInit},
          [&](OpBuilder& nb, Location l, Value peer, ValueRange iter) {
            auto w = scf::IfOp::create(nb, l, TypeRange{i1t}, iter[0], true);
            OpBuilder wb = w.getThenBodyBuilder();
            Value id = arith::OrIOp::create(wb, l, i64(wb, l, abi::flagId(abi::FlagKind::kRankBarrier, 0)),
                                            arith::ExtUIOp::create(wb, l, i64t, peer));
            Value ok = WaitOp::create(wb, l, wb.getI1Type(), slot(wb, peer), op.getValue(), op.getTimeoutNs(), op.getError(),
                                      op.getRank(), id, MemScope::system);
            scf::YieldOp::create(wb, l, ValueRange{ok});
            OpBuilder eb = w.getElseBodyBuilder();
            scf::YieldOp::create(eb, l, ValueRange{iter[0]});
            scf::YieldOp::create(nb, l, ValueRange{w.getResult(0)});
          });
    }
    gpu::BarrierOp::create(b, loc);
    b.replaceOp(op, errorRecordClear(b, loc, op.getError()));
    return success();
  }
};

struct ExpandBarriersPass : impl::MegaMoeExpandBarriersBase<ExpandBarriersPass> {
  void runOnOperation() override {
    RewritePatternSet patterns(&getContext());
    populateExpandBarriersPatterns(patterns);
    if (failed(applyPatternsGreedily(getOperation(), std::move(patterns)))) signalPassFailure();
  }
};
}  // namespace

void populateExpandBarriersPatterns(RewritePatternSet& patterns) {
  patterns.add<ExpandGridBarrier, ExpandRankBarrier>(patterns.getContext());
}

}  // namespace megamoe
