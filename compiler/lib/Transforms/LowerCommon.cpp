// Lowering patterns both targets share (tile_copy, peer_ptr, signal, wait), parameterised by TargetHooks.
#include "TargetHooks.h"

#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Target/MmaAtoms.h"
#include "megamoe/Transforms/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"

#include <map>

using namespace mlir;

namespace megamoe {
namespace lowering {

Value i32(OpBuilder& b, Location loc, int64_t v) { return arith::ConstantIntOp::create(b, loc, v, 32); }
Value i64(OpBuilder& b, Location loc, int64_t v) { return arith::ConstantIntOp::create(b, loc, v, 64); }

Value byteGep(OpBuilder& b, Location loc, Value ptr, Value byteOffset) {
  return LLVM::GEPOp::create(b, loc, ptr.getType(), b.getI8Type(), ptr, ValueRange{byteOffset});
}

Value convertF32(OpBuilder& b, Location loc, Value v, Type elem) {
  if (elem.isF32()) return v;
  return arith::TruncFOp::create(b, loc, elem, v);
}

// The distinct row offsets of a fragment in first-seen order, and each element's index among them.
static std::pair<SmallVector<int64_t>, SmallVector<int64_t>> distinctRows(ArrayRef<int64_t> rowOffset) {
  SmallVector<int64_t> rows, slot;
  for (int64_t r : rowOffset) {
    auto it = llvm::find(rows, r);
    slot.push_back(it - rows.begin());
    if (it == rows.end()) rows.push_back(r);
  }
  return {rows, slot};
}

LogicalResult accRowScales(PatternRewriter& b, AccRowScalesOp op, Value rowBase, const FragmentPlace& place) {
  Location loc = op.getLoc();
  const SmallVector<int64_t> rows = distinctRows(place.row).first;
  const int64_t n = int64_t(rows.size()), factors = int64_t(op.getFactors().size());
  auto type = cast<VectorType>(op.getScales().getType());
  if (type.getNumElements() != n * factors)
    return op.emitOpError("this target's fragment holds ")
           << n << " rows per thread; scales has " << type.getNumElements() << " for " << factors << " factors";
  Type f32 = b.getF32Type();
  Value zero = arith::ConstantOp::create(b, loc, f32, b.getF32FloatAttr(0));
  // Bounds by a select: a row past rows_valid reads row 0's scale and uses 0 instead.
  Value out = arith::ConstantOp::create(b, loc, type, DenseElementsAttr::get(type, b.getZeroAttr(f32)));
  for (int64_t j = 0; j < n; ++j) {
    Value row = arith::AddIOp::create(b, loc, rowBase, i32(b, loc, rows[j]));
    Value inside = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, row, op.getRowsValid());
    Value at = arith::SelectOp::create(b, loc, inside, row, i32(b, loc, 0));
    Value index = arith::MulIOp::create(b, loc, arith::ExtUIOp::create(b, loc, b.getI64Type(), at),
                                        arith::ExtUIOp::create(b, loc, b.getI64Type(), op.getLd()));
    Value ptr = byteGep(b, loc, op.getRowScales(), arith::MulIOp::create(b, loc, index, i64(b, loc, 4)));
    Value s = LLVM::LoadOp::create(b, loc, f32, ptr, 4);
    for (int64_t f = 0; f < factors; ++f) {
      Value sf = arith::MulFOp::create(b, loc, s, op.getFactors()[f]);
      out = vector::InsertOp::create(b, loc, arith::SelectOp::create(b, loc, inside, sf, zero), out,
                                     ArrayRef<int64_t>{f * n + j});
    }
  }
  b.replaceOp(op, out);
  return success();
}

LogicalResult accScaleAdd(PatternRewriter& b, AccScaleAddOp op, const FragmentPlace& place) {
  Location loc = op.getLoc();
  const auto [rows, slot] = distinctRows(place.row);
  const int64_t n = int64_t(rows.size()), length = op.getScales().getType().getNumElements();
  if (length % n)
    return op.emitOpError("this target's fragment holds ")
           << n << " rows per thread; scales has " << length << ", not a multiple of them";
  const int64_t groups = length / n, groupCols = op.getN() / groups;
  if (op.getN() % groups || groupCols % place.colSpan)
    return op.emitOpError("") << groups << " column groups of " << op.getN() << " columns: each must be a multiple of "
                              << place.colSpan << " columns (one thread's atom spans that many)";
  SmallVector<Value> scale;
  for (int64_t j = 0; j < length; ++j)
    scale.push_back(vector::ExtractOp::create(b, loc, op.getScales(), ArrayRef<int64_t>{j}));
  Value out = op.getAcc();
  for (int64_t i = 0; i < int64_t(place.row.size()); ++i) {
    Value a = vector::ExtractOp::create(b, loc, op.getAcc(), ArrayRef<int64_t>{i});
    Value p = vector::ExtractOp::create(b, loc, op.getPartial(), ArrayRef<int64_t>{i});
    const int64_t group = place.col[size_t(i)] / groupCols;
    Value v = arith::AddFOp::create(b, loc, a, arith::MulFOp::create(b, loc, p, scale[size_t(group * n + slot[i])]));
    out = vector::InsertOp::create(b, loc, v, out, ArrayRef<int64_t>{i});
  }
  b.replaceOp(op, out);
  return success();
}

LogicalResult markKernels(Operation* root, const TargetHooks& hooks) {
  WalkResult r = root->walk([&](LLVM::LLVMFuncOp f) {
    if (!f->hasAttr("megamoe.kernel")) return WalkResult::advance();
    auto threads = f->getAttrOfType<IntegerAttr>("megamoe.block_threads");
    if (!threads) {
      f.emitError("kernel function needs megamoe.block_threads (the fixed block size)");
      return WalkResult::interrupt();
    }
    hooks.markKernel(f, threads.getInt());
    return WalkResult::advance();
  });
  return failure(r.wasInterrupted());
}

LogicalResult applyLowering(Operation* root, FrozenRewritePatternSet patterns) {
  GreedyRewriteConfig config;
  if (failed(applyPatternsGreedily(root, patterns, config))) return root->emitError("megamoe lowering did not converge");
  Operation* left = nullptr;
  root->walk([&](Operation* op) {
    if (!left && isa<MegaMoeDialect>(op->getDialect())) left = op;
  });
  if (left) return left->emitOpError("has no lowering for this target");
  return success();
}

}  // namespace lowering

namespace {
using namespace lowering;

// Each thread moves (rows * chunksPerRow / threads) 16-byte chunks; chunk q of the tile is row q / chunksPerRow,
// column chunk q % chunksPerRow. Consecutive threads take consecutive chunks, so global accesses coalesce.
struct TileCopyLowering : OpRewritePattern<TileCopyOp> {
  TileCopyLowering(MLIRContext* ctx, const TargetHooks& hooks) : OpRewritePattern(ctx), hooks(hooks) {}
  LogicalResult matchAndRewrite(TileCopyOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    bool load = op.isLoad();
    int64_t eb = op.elemBytes(), chunksPerRow = op.getCols() * eb / 16;
    int64_t total = op.getRows() * chunksPerRow, perThread = total / op.getThreads();
    bool mnAsK = op.getSwizzle() == Swizzle::b128_mn && hooks.mnMajorTilesAsKMajor();
    bool swizzle = op.getSwizzle() == Swizzle::b128 || mnAsK;
    bool transpose = op.getTranspose() || mnAsK;
    auto chunkTy = VectorType::get({4}, b.getI32Type());

    Value tid = hooks.threadId(b, loc);
    if (op.getFirstThread() != 0) tid = arith::SubIOp::create(b, loc, tid, i32(b, loc, op.getFirstThread()));
    Value cpr = i32(b, loc, chunksPerRow), ebc = i32(b, loc, eb), sixteen = i32(b, loc, 16);
    Value srcLd = op.getSrcLd(), dstLd = op.getDstLd();
    auto body = [&](OpBuilder& nb, Location l, Value it, ValueRange) {
      Value row, chunk, rowDiv8, row8;  // row / 8 and row % 8 feed the swizzles
      auto c32 = [&](int64_t v) { return i32(nb, l, v); };
      if (op.getThreads() % chunksPerRow == 0) {
        // The same chunks, written so that only the row moves with `it`, by rpp = threads / chunksPerRow rows
        // from the thread's first row rowT: each thread's addresses are one base plus constant steps, and the
        // swizzle terms row / 8, row % 8 split into a per-thread part and a part of `it` alone (a constant once
        // the loop is unrolled), instead of one 64-bit address and its swizzle arithmetic per chunk.
        int64_t rpp = op.getThreads() / chunksPerRow;
        Value rowT = arith::DivUIOp::create(nb, l, tid, cpr);
        Value step = arith::MulIOp::create(nb, l, it, c32(rpp));
        row = arith::AddIOp::create(nb, l, rowT, step);
        chunk = arith::RemUIOp::create(nb, l, tid, cpr);
        if (rpp % 8 == 0) {
          row8 = arith::RemUIOp::create(nb, l, rowT, c32(8));
          Value groupT = arith::DivUIOp::create(nb, l, rowT, c32(8));  // one op per statement: a fixed op order
          rowDiv8 = arith::AddIOp::create(nb, l, groupT, arith::MulIOp::create(nb, l, it, c32(rpp / 8)));
        } else if (8 % rpp == 0) {  // rowT < rpp, so rowT + step % 8 stays below 8
          row8 = arith::AddIOp::create(nb, l, rowT, arith::RemUIOp::create(nb, l, step, c32(8)));
          rowDiv8 = arith::DivUIOp::create(nb, l, step, c32(8));
        }
      } else {
        Value q = arith::AddIOp::create(nb, l, arith::MulIOp::create(nb, l, it, i32(nb, l, op.getThreads())), tid);
        row = arith::DivUIOp::create(nb, l, q, cpr);
        chunk = arith::RemUIOp::create(nb, l, q, cpr);
      }
      if (!row8) {
        row8 = arith::RemUIOp::create(nb, l, row, c32(8));
        rowDiv8 = arith::DivUIOp::create(nb, l, row, c32(8));
      }
      // Element offset of the chunk on each side; the shared side may be swizzled.
      auto offsetOf = [&](Value ld, bool sharedSide) {
        if (sharedSide && op.getSwizzle() == Swizzle::b128_mn && !mnAsK) {
          // Atom (row / 8, chunk / 8) of 1024 bytes; inside it row % 8 is the 128-byte line, swizzled like b128.
          Value r8 = row8;
          Value atom = arith::AddIOp::create(
              nb, l, arith::MulIOp::create(nb, l, rowDiv8, i32(nb, l, chunksPerRow / 8)),
              arith::DivUIOp::create(nb, l, chunk, i32(nb, l, 8)));
          Value inAtom = arith::XOrIOp::create(nb, l, arith::RemUIOp::create(nb, l, chunk, i32(nb, l, 8)), r8);
          Value bytes = arith::AddIOp::create(
              nb, l, arith::MulIOp::create(nb, l, atom, i32(nb, l, 1024)),
              arith::AddIOp::create(nb, l, arith::MulIOp::create(nb, l, r8, i32(nb, l, 128)),
                                    arith::MulIOp::create(nb, l, inAtom, sixteen)));
          return arith::ExtUIOp::create(nb, l, nb.getI64Type(), bytes).getResult();
        }
        Value c = chunk;
        if (sharedSide && swizzle) c = arith::XOrIOp::create(nb, l, chunk, row8);
        Value globalRow = row;
        if (!sharedSide && op.getRowIndex()) {
          // Gather: the global row is row_index[row] (rows past rows_valid read an entry and use nothing).
          Value at = byteGep(nb, l, op.getRowIndex(), arith::MulIOp::create(nb, l, row, c32(4)));
          globalRow = LLVM::LoadOp::create(nb, l, nb.getI32Type(), at, 4);
        }
        Value rowOff = arith::MulIOp::create(nb, l, arith::ExtUIOp::create(nb, l, nb.getI64Type(), globalRow),
                                             arith::ExtUIOp::create(nb, l, nb.getI64Type(), ld));
        Value colBytes = arith::MulIOp::create(nb, l, c, sixteen);
        Value bytes = arith::AddIOp::create(
            nb, l, arith::MulIOp::create(nb, l, rowOff, arith::ExtUIOp::create(nb, l, nb.getI64Type(), ebc)),
            arith::ExtUIOp::create(nb, l, nb.getI64Type(), colBytes));
        return bytes;
      };
      Value srcPtr = byteGep(nb, l, op.getSrc(), offsetOf(srcLd, !load));
      Value inside = arith::CmpIOp::create(nb, l, arith::CmpIPredicate::ult, row, op.getRowsValid());
      if (transpose) {
        // Source chunk (row r, columns 8c..8c+7) becomes column r of shared rows 8c..8c+7: eight element stores.
        auto ifOp = scf::IfOp::create(nb, l, TypeRange{chunkTy}, inside, /*withElse=*/true);
        OpBuilder tb = ifOp.getThenBodyBuilder();
        scf::YieldOp::create(tb, l, ValueRange{LLVM::LoadOp::create(tb, l, chunkTy, srcPtr, 16).getResult()});
        OpBuilder eb2 = ifOp.getElseBodyBuilder();
        scf::YieldOp::create(eb2, l, ValueRange{arith::ConstantOp::create(
                                         eb2, l, chunkTy, DenseElementsAttr::get(chunkTy, eb2.getI32IntegerAttr(0)))});
        int64_t perChunk = 16 / eb;
        auto elemsTy = VectorType::get({perChunk}, op.getElem());
        Value elems = LLVM::BitcastOp::create(nb, l, elemsTy, ifOp.getResult(0));
        Value dstRowBytes = i32(nb, l, op.getRows() * eb);
        for (int64_t j = 0; j < perChunk; ++j) {
          Value drow = arith::AddIOp::create(nb, l, arith::MulIOp::create(nb, l, chunk, i32(nb, l, perChunk)), i32(nb, l, j));
          Value dchunk = arith::DivUIOp::create(nb, l, row, i32(nb, l, perChunk));
          if (swizzle) dchunk = arith::XOrIOp::create(nb, l, dchunk, arith::RemUIOp::create(nb, l, drow, i32(nb, l, 8)));
          Value bytes = arith::AddIOp::create(
              nb, l,
              arith::AddIOp::create(nb, l, arith::MulIOp::create(nb, l, drow, dstRowBytes),
                                    arith::MulIOp::create(nb, l, dchunk, sixteen)),
              arith::MulIOp::create(nb, l, arith::RemUIOp::create(nb, l, row, i32(nb, l, perChunk)), ebc));
          Value e = vector::ExtractOp::create(nb, l, elems, ArrayRef<int64_t>{j});
          LLVM::StoreOp::create(nb, l, e, byteGep(nb, l, op.getDst(), bytes), unsigned(eb));
        }
        scf::YieldOp::create(nb, l);
        return;
      }
      Value dstPtr = byteGep(nb, l, op.getDst(), offsetOf(dstLd, load));
      if (op.getAsync()) {
        // Rows past rows_valid read nothing: point them at the tile's first chunk and copy 0 bytes (zero fill).
        Value safeSrc = arith::SelectOp::create(nb, l, inside, srcPtr, op.getSrc());
        if (hooks.asyncCopyChunk(nb, l, dstPtr, safeSrc, inside)) {
          scf::YieldOp::create(nb, l);
          return;
        }
      }
      if (load) {
        // Rows past rows_valid read nothing and leave zeros in shared memory.
        auto ifOp = scf::IfOp::create(nb, l, TypeRange{chunkTy}, inside, /*withElse=*/true);
        OpBuilder tb = ifOp.getThenBodyBuilder();
        scf::YieldOp::create(tb, l, ValueRange{LLVM::LoadOp::create(tb, l, chunkTy, srcPtr, 16).getResult()});
        OpBuilder eb2 = ifOp.getElseBodyBuilder();
        Value zero = arith::ConstantOp::create(eb2, l, chunkTy, DenseElementsAttr::get(chunkTy, eb2.getI32IntegerAttr(0)));
        scf::YieldOp::create(eb2, l, ValueRange{zero});
        LLVM::StoreOp::create(nb, l, ifOp.getResult(0), dstPtr, 16);
      } else {
        auto ifOp = scf::IfOp::create(nb, l, TypeRange{}, inside, /*withElse=*/false);
        OpBuilder tb = ifOp.getThenBodyBuilder();
        Value v = LLVM::LoadOp::create(tb, l, chunkTy, srcPtr, 16);
        LLVM::StoreOp::create(tb, l, v, dstPtr, 16);
      }
      scf::YieldOp::create(nb, l);
    };
    scf::ForOp::create(b, loc, i32(b, loc, 0), i32(b, loc, perThread), i32(b, loc, 1), ValueRange{}, body);
    if (load && !op.getAsync()) hooks.afterSharedWrite(b, loc);
    b.eraseOp(op);
    return success();
  }
  const TargetHooks& hooks;
};

struct PeerPtrLowering : OpRewritePattern<PeerPtrOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(PeerPtrOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    Value slot = LLVM::GEPOp::create(b, loc, op.getOffsets().getType(), b.getI64Type(), op.getOffsets(),
                                     ValueRange{op.getPeer()});
    Value offset = LLVM::LoadOp::create(b, loc, b.getI64Type(), slot, 8);
    b.replaceOp(op, byteGep(b, loc, op.getPtr(), offset));
    return success();
  }
};

// Release fence at the scope, then the flag update (itself release-ordered).
struct SignalLowering : OpRewritePattern<SignalOp> {
  SignalLowering(MLIRContext* ctx, const TargetHooks& hooks) : OpRewritePattern(ctx), hooks(hooks) {}
  LogicalResult matchAndRewrite(SignalOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    StringRef scope = hooks.syncScope(op.getScope());
    LLVM::FenceOp::create(b, loc, LLVM::AtomicOrdering::release, scope);
    if (op.getKind() == SignalKind::store)
      LLVM::StoreOp::create(b, loc, op.getValue(), op.getFlag(), 8, false, false, false, LLVM::AtomicOrdering::release,
                            scope);
    else
      LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::add, op.getFlag(), op.getValue(),
                                LLVM::AtomicOrdering::release, scope, 8);
    b.eraseOp(op);
    return success();
  }
  const TargetHooks& hooks;
};

// Spin with acquire loads until flag >= expected or the clock passes the bound; on timeout claim the error
// record (first error wins) and fill it in.
struct WaitLowering : OpRewritePattern<WaitOp> {
  WaitLowering(MLIRContext* ctx, const TargetHooks& hooks) : OpRewritePattern(ctx), hooks(hooks) {}
  LogicalResult matchAndRewrite(WaitOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    StringRef scope = hooks.syncScope(op.getScope());
    Type i64t = b.getI64Type(), i1t = b.getI1Type();
    Value start = hooks.nowNs(b, loc);
    // scf.while carries (seen, reached); it loops while neither reached nor timed out.
    auto loop = scf::WhileOp::create(b, loc, TypeRange{i64t, i1t}, ValueRange{i64(b, loc, 0), arith::ConstantIntOp::create(b, loc, 0, 1)});
    {
      Block* before = b.createBlock(&loop.getBefore(), {}, {i64t, i1t}, {loc, loc});
      b.setInsertionPointToStart(before);
      Value seen = LLVM::LoadOp::create(b, loc, i64t, op.getFlag(), 8, false, false, false, false,
                                        LLVM::AtomicOrdering::acquire, scope);
      Value reached = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::uge, seen, op.getExpected());
      // Elapsed time, not a deadline: now - start cannot wrap for any timeout.
      Value elapsed = arith::SubIOp::create(b, loc, hooks.nowNs(b, loc), start);
      Value late = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ugt, elapsed, op.getTimeoutNs());
      Value stop = arith::OrIOp::create(b, loc, reached, late);
      Value again = arith::XOrIOp::create(b, loc, stop, arith::ConstantIntOp::create(b, loc, 1, 1));
      scf::ConditionOp::create(b, loc, again, ValueRange{seen, reached});
      Block* after = b.createBlock(&loop.getAfter(), {}, {i64t, i1t}, {loc, loc});
      b.setInsertionPointToStart(after);
      scf::YieldOp::create(b, loc, after->getArguments());
    }
    b.setInsertionPointAfter(loop);
    Value seen = loop.getResult(0), reached = loop.getResult(1);
    Value timedOut = arith::XOrIOp::create(b, loc, reached, arith::ConstantIntOp::create(b, loc, 1, 1));
    auto ifOp = scf::IfOp::create(b, loc, TypeRange{}, timedOut, false);
    {
      OpBuilder tb = ifOp.getThenBodyBuilder();
      auto word = [&](int index) {
        return LLVM::GEPOp::create(tb, loc, op.getError().getType(), i64t, op.getError(), ArrayRef<LLVM::GEPArg>{index});
      };
      auto cas = LLVM::AtomicCmpXchgOp::create(tb, loc, word(abi::kErrorWordCode), i64(tb, loc, 0),
                                              i64(tb, loc, uint64_t(abi::ErrorCode::kWaitTimeout)),
                                              LLVM::AtomicOrdering::acq_rel, LLVM::AtomicOrdering::monotonic, "");
      Value claimed = LLVM::ExtractValueOp::create(tb, loc, cas, ArrayRef<int64_t>{1});
      auto fill = scf::IfOp::create(tb, loc, TypeRange{}, claimed, false);
      OpBuilder fb = fill.getThenBodyBuilder();
      auto put = [&](int index, Value v) {
        Value w = LLVM::GEPOp::create(fb, loc, op.getError().getType(), i64t, op.getError(), ArrayRef<LLVM::GEPArg>{index});
        LLVM::StoreOp::create(fb, loc, v, w, 8, /*volatile=*/true);
      };
      put(abi::kErrorWordRank, arith::ExtUIOp::create(fb, loc, i64t, op.getRank()));
      put(abi::kErrorWordFlag, op.getFlagId());
      put(abi::kErrorWordSeen, seen);
      put(abi::kErrorWordExpected, op.getExpected());
      put(abi::kErrorWordBlock, arith::ExtUIOp::create(fb, loc, i64t, hooks.blockId(fb, loc)));
      LLVM::FenceOp::create(fb, loc, LLVM::AtomicOrdering::release, "");
    }
    b.replaceOp(op, reached);
    return success();
  }
  const TargetHooks& hooks;
};

}  // namespace

struct AsyncCommitLowering : OpRewritePattern<AsyncCommitOp> {
  AsyncCommitLowering(MLIRContext* ctx, const TargetHooks& hooks) : OpRewritePattern(ctx), hooks(hooks) {}
  LogicalResult matchAndRewrite(AsyncCommitOp op, PatternRewriter& b) const override {
    hooks.asyncCommit(b, op.getLoc());
    b.eraseOp(op);
    return success();
  }
  const TargetHooks& hooks;
};

struct AsyncWaitLowering : OpRewritePattern<AsyncWaitOp> {
  AsyncWaitLowering(MLIRContext* ctx, const TargetHooks& hooks) : OpRewritePattern(ctx), hooks(hooks) {}
  LogicalResult matchAndRewrite(AsyncWaitOp op, PatternRewriter& b) const override {
    hooks.asyncWait(b, op.getLoc(), op.getPending());
    b.eraseOp(op);
    return success();
  }
  const TargetHooks& hooks;
};

void populateCommonLoweringPatterns(RewritePatternSet& patterns, const TargetHooks& hooks) {
  MLIRContext* ctx = patterns.getContext();
  patterns.add<TileCopyLowering, SignalLowering, WaitLowering, AsyncCommitLowering, AsyncWaitLowering>(ctx, hooks);
  patterns.add<PeerPtrLowering>(ctx);
}

}  // namespace megamoe
