// megamoe-lower-to-rocdl: megamoe ops -> LLVM + ROCDL for gfx950. The MMA lowering follows the MFMA atom
// descriptor in megamoe/Target/MmaAtoms.h. gfx950 code is only checked statically: no AMD GPU runs it here.
#include "TargetHooks.h"

#include "megamoe/Target/MmaAtoms.h"
#include "megamoe/Transforms/Passes.h"

using namespace mlir;

namespace megamoe {
#define GEN_PASS_DEF_MEGAMOELOWERTOROCDL
#include "megamoe/Transforms/Passes.h.inc"

namespace {
using namespace lowering;
using Atom = atoms::Mfma32x32x16Bf16;

class RocdlHooks final : public TargetHooks {
 public:
  Value threadId(OpBuilder& b, Location loc) const override { return ROCDL::ThreadIdXOp::create(b, loc, b.getI32Type()); }
  Value blockId(OpBuilder& b, Location loc) const override { return ROCDL::BlockIdXOp::create(b, loc, b.getI32Type()); }
  // s_memrealtime counts a constant 100 MHz clock: 10 ns a tick.
  Value nowNs(OpBuilder& b, Location loc) const override {
    Value ticks = LLVM::CallIntrinsicOp::create(b, loc, b.getI64Type(), b.getStringAttr("llvm.amdgcn.s.memrealtime"),
                                                ValueRange{})
                      .getResult(0);
    return arith::MulIOp::create(b, loc, ticks, i64(b, loc, 10));
  }
  void blockBarrier(OpBuilder& b, Location loc) const override { ROCDL::BarrierOp::create(b, loc); }
  // AMDGPU syncscopes: "" is system, "agent" the GPU, "workgroup" the block.
  StringRef syncScope(MemScope scope) const override {
    switch (scope) {
      case MemScope::cta: return "workgroup";
      case MemScope::gpu: return "agent";
      case MemScope::system: return "";
    }
    llvm_unreachable("scope");
  }
  void afterSharedWrite(OpBuilder&, Location) const override {}
  // Async copies complete at once here (synchronous 16-byte moves); the group ops have nothing to do.
  bool asyncCopyChunk(OpBuilder&, Location, Value, Value, Value) const override { return false; }
  void asyncCommit(OpBuilder&, Location) const override {}
  // MFMA wants 8 consecutive K values per lane: K x MN tiles are transposed into K-major rows while copying, so
  // the MMA lowering reads every operand K-major.
  bool mnMajorTilesAsKMajor() const override { return true; }
  void asyncWait(OpBuilder&, Location, int64_t) const override {}
  void markKernel(Operation* func, int64_t threads) const override {
    Builder b(func->getContext());
    func->setAttr("rocdl.kernel", b.getUnitAttr());
    func->setAttr("rocdl.reqd_work_group_size", b.getDenseI32ArrayAttr({int32_t(threads), 1, 1}));
    func->setAttr("rocdl.flat_work_group_size", b.getStringAttr(std::to_string(threads) + "," + std::to_string(threads)));
  }
};

struct WaveLane {
  Value wave, lane;
};
WaveLane waveLane(OpBuilder& b, Location loc) {
  Value tid = ROCDL::ThreadIdXOp::create(b, loc, b.getI32Type());
  return {arith::DivUIOp::create(b, loc, tid, i32(b, loc, Atom::kLanes)),
          arith::RemUIOp::create(b, loc, tid, i32(b, loc, Atom::kLanes))};
}

// Address of the 16-byte fragment a lane reads for MFMA k-step kk from a swizzled [rows][64] bf16 tile.
Value fragmentPtr(OpBuilder& b, Location loc, Value base, Value row, int64_t kk, Value lane) {
  Value chunk = arith::AddIOp::create(b, loc, i32(b, loc, kk * 2), arith::DivUIOp::create(b, loc, lane, i32(b, loc, 32)));
  Value phys = arith::XOrIOp::create(b, loc, chunk, arith::RemUIOp::create(b, loc, row, i32(b, loc, 8)));
  Value bytes = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, row, i32(b, loc, 128)),
                                      arith::MulIOp::create(b, loc, phys, i32(b, loc, 16)));
  return byteGep(b, loc, base, bytes);
}

// Address of the 8-byte fragment a lane reads for FP8 MFMA k-step kk (16 e4m3 = one 16-byte chunk of the row) from a
// swizzled [rows][128] e4m3 tile: the chunk's half lane / 32.
Value fp8FragmentPtr(OpBuilder& b, Location loc, Value base, Value row, int64_t kk, Value lane) {
  Value phys = arith::XOrIOp::create(b, loc, i32(b, loc, kk), arith::RemUIOp::create(b, loc, row, i32(b, loc, 8)));
  Value half = arith::MulIOp::create(b, loc, arith::DivUIOp::create(b, loc, lane, i32(b, loc, 32)), i32(b, loc, 8));
  Value bytes = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, row, i32(b, loc, 128)),
                                      arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, phys, i32(b, loc, 16)), half));
  return byteGep(b, loc, base, bytes);
}

// One wave per 32 rows of A; each wave covers all n columns as n / 32 MFMA tiles, k / 16 steps each.
struct MmaTileToMfma : OpRewritePattern<MmaTileOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MmaTileOp op, PatternRewriter& b) const override {
    // gfx950 tiles are K-major after their (transposing) copies; TMA box placements never reach it.
    if (op.getMnAtomsOuter()) return b.notifyMatchFailure(op, "mn_atoms_outer is an sm_90a (TMA) placement");
    if (op.getK16()) return b.notifyMatchFailure(op, "k16 (one K slice at run time) is an sm_90a form");
    Location loc = op.getLoc();
    int64_t tilesN = op.getN() / Atom::kN;
    // e4m3: v_mfma_f32_32x32x16_fp8_fp8 on 8 bytes (one i64) per lane and step, the same placement (Mfma32x32x16Fp8).
    const bool fp8 = op.getE4m3();
    static_assert(atoms::Mfma32x32x16Fp8::kK == Atom::kK && atoms::Mfma32x32x16Fp8::kAccPerLane == Atom::kAccPerLane);
    Type fragTy = fp8 ? Type(b.getI64Type()) : Type(VectorType::get({Atom::kOperandPerLane}, b.getBF16Type()));
    auto load = [&](Value tile, Value row, int64_t kk, Value lane) -> Value {
      if (fp8)
        return LLVM::LoadOp::create(b, loc, fragTy, fp8FragmentPtr(b, loc, tile, row, kk, lane), 8);
      return LLVM::LoadOp::create(b, loc, fragTy, fragmentPtr(b, loc, tile, row, kk, lane), 16);
    };
    auto accTy = VectorType::get({Atom::kAccPerLane}, b.getF32Type());
    auto [wave, lane] = waveLane(b, loc);
    // a_first_rows: the waves of every warpgroup read A's rows [0, 64), those of warpgroup 0.
    Value waveA = op.getAFirstRows() ? arith::RemUIOp::create(b, loc, wave, i32(b, loc, 64 / Atom::kM)).getResult() : wave;
    Value rowA = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, waveA, i32(b, loc, Atom::kM)),
                                       arith::RemUIOp::create(b, loc, lane, i32(b, loc, 32)));
    SmallVector<Value> acc;
    // Element-wise split and join (vector.{extract,insert}_strided_slice have no direct LLVM lowering); `fresh`:
    // the chain starts from zeros instead.
    for (int64_t s = 0; s < tilesN; ++s) {
      if (op.getFresh()) {
        acc.push_back(arith::ConstantOp::create(b, loc, accTy, DenseElementsAttr::get(accTy, b.getZeroAttr(b.getF32Type()))));
        continue;
      }
      SmallVector<Value> parts;
      for (int64_t i = 0; i < Atom::kAccPerLane; ++i)
        parts.push_back(vector::ExtractOp::create(b, loc, op.getAcc(), ArrayRef<int64_t>{s * Atom::kAccPerLane + i}));
      acc.push_back(vector::FromElementsOp::create(b, loc, accTy, parts));
    }
    Value zero = i32(b, loc, 0);
    for (int64_t kk = 0; kk < op.getK() / Atom::kK; ++kk) {
      // Operands are K-major here whatever their mn_major flags say (see mnMajorTilesAsKMajor).
      Value a = load(op.getA(), rowA, kk, lane);
      for (int64_t s = 0; s < tilesN; ++s) {
        Value rowB = arith::AddIOp::create(b, loc, i32(b, loc, s * Atom::kN), arith::RemUIOp::create(b, loc, lane, i32(b, loc, 32)));
        Value bf = load(op.getB(), rowB, kk, lane);
        SmallVector<Value, 6> operands{a, bf, acc[s], zero, zero, zero};
        acc[s] = fp8 ? ROCDL::mfma_f32_32x32x16_fp8_fp8::create(b, loc, accTy, operands).getResult()
                     : ROCDL::mfma_f32_32x32x16_bf16::create(b, loc, accTy, operands).getResult();
      }
    }
    SmallVector<Value> all;
    for (int64_t s = 0; s < tilesN; ++s)
      for (int64_t i = 0; i < Atom::kAccPerLane; ++i)
        all.push_back(vector::ExtractOp::create(b, loc, acc[s], ArrayRef<int64_t>{i}));
    Value result = vector::FromElementsOp::create(b, loc, op.getAcc().getType(), all);
    b.replaceOp(op, result);
    return success();
  }
};

// The FP8 promotion over the MFMA fragment: element i of tile s of lane l of wave w lies in row 32 w + 4 (l / 32) +
// Atom::acc(0, i).row, the same 16 rows in every N tile.
// Lane 0's placement over the n / 32 tiles side by side; another lane's columns lie up to 31 further.
static FragmentPlace mfmaPlace(int64_t n) {
  FragmentPlace place{{}, {}, Atom::kN};
  for (int64_t s = 0; s < n / Atom::kN; ++s)
    for (int64_t i = 0; i < Atom::kAccPerLane; ++i) {
      place.row.push_back(Atom::acc(0, i).row);
      place.col.push_back(s * Atom::kN + Atom::acc(0, i).col);
    }
  return place;
}
struct AccRowScalesOnMfma : OpRewritePattern<AccRowScalesOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AccRowScalesOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    auto [wave, lane] = waveLane(b, loc);
    Value rowBase = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, wave, i32(b, loc, Atom::kM)),
                                          arith::MulIOp::create(b, loc, arith::DivUIOp::create(b, loc, lane, i32(b, loc, 32)), i32(b, loc, 4)));
    return accRowScales(b, op, rowBase, mfmaPlace(op.getN()));
  }
};
struct AccScaleAddOnMfma : OpRewritePattern<AccScaleAddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AccScaleAddOp op, PatternRewriter& b) const override {
    return accScaleAdd(b, op, mfmaPlace(op.getN()));
  }
};

// Walks the MFMA accumulator fragment: element i of tile s is (8 (i / 4) + 4 (lane / 32) + i % 4, 32 s + lane % 32).
struct AccStoreFromMfma : OpRewritePattern<AccStoreOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AccStoreOp op, PatternRewriter& b) const override {
    if (op.getBoxRows()) return b.notifyMatchFailure(op, "box_rows: TMA's boxes, sm_90a only");
    Location loc = op.getLoc();
    Type elem = op.getElem();
    int64_t eb = elem.getIntOrFloatBitWidth() / 8, tilesN = op.getN() / Atom::kN;
    auto [wave, lane] = waveLane(b, loc);
    Value rowBase = arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, wave, i32(b, loc, Atom::kM)),
                                          arith::MulIOp::create(b, loc, arith::DivUIOp::create(b, loc, lane, i32(b, loc, 32)), i32(b, loc, 4)));
    Value colBase = arith::RemUIOp::create(b, loc, lane, i32(b, loc, 32));
    for (int64_t s = 0; s < tilesN; ++s) {
      for (int64_t i = 0; i < Atom::kAccPerLane; ++i) {
        atoms::Coord c = Atom::acc(0, i);  // lane 0's coordinates: the lane-independent part
        Value row = arith::AddIOp::create(b, loc, rowBase, i32(b, loc, c.row));
        Value col = arith::AddIOp::create(b, loc, colBase, i32(b, loc, s * Atom::kN + c.col));
        Value inside = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, row, op.getRowsValid());
        auto ifOp = scf::IfOp::create(b, loc, TypeRange{}, inside, false);
        OpBuilder tb = ifOp.getThenBodyBuilder();
        Value v = vector::ExtractOp::create(tb, loc, op.getAcc(), ArrayRef<int64_t>{s * Atom::kAccPerLane + i});
        Value index = arith::AddIOp::create(
            tb, loc,
            arith::MulIOp::create(tb, loc, arith::ExtUIOp::create(tb, loc, tb.getI64Type(), row),
                                  arith::ExtUIOp::create(tb, loc, tb.getI64Type(), op.getLd())),
            arith::ExtUIOp::create(tb, loc, tb.getI64Type(), col));
        Value ptr = LLVM::GEPOp::create(tb, loc, op.getDst().getType(), elem, op.getDst(), ValueRange{index});
        LLVM::StoreOp::create(tb, loc, convertF32(tb, loc, v, elem), ptr, eb);
      }
    }
    b.eraseOp(op);
    return success();
  }
};

// MFMA results are ready when the instruction retires: nothing is in flight.
struct MmaDrainToValue : OpRewritePattern<MmaDrainOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MmaDrainOp op, PatternRewriter& b) const override {
    b.replaceOp(op, op.getAcc());
    return success();
  }
};

// bulk_store: no bulk copy engine is used here; the thread copies its bytes at once, 16 at a time, so the group
// ops have nothing to track.
struct BulkStoreToCopies : OpRewritePattern<BulkStoreOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(BulkStoreOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    auto chunkTy = VectorType::get({4}, b.getI32Type());
    Value chunks = arith::DivUIOp::create(b, loc, op.getBytes(), i32(b, loc, 16));
    scf::ForOp::create(b, loc, i32(b, loc, 0), chunks, i32(b, loc, 1), ValueRange{},
                       [&](OpBuilder& nb, Location l, Value i, ValueRange) {
                         Value off = arith::MulIOp::create(nb, l, i, i32(nb, l, 16));
                         Value v = LLVM::LoadOp::create(nb, l, chunkTy, byteGep(nb, l, op.getSrc(), off), 16);
                         LLVM::StoreOp::create(nb, l, v, byteGep(nb, l, op.getDst(), off), 16);
                         scf::YieldOp::create(nb, l);
                       });
    b.eraseOp(op);
    return success();
  }
};
template <typename Op>
struct EraseOp : OpRewritePattern<Op> {
  using OpRewritePattern<Op>::OpRewritePattern;
  LogicalResult matchAndRewrite(Op op, PatternRewriter& b) const override {
    b.eraseOp(op);
    return success();
  }
};

// pack_e4m3 on v_cvt_pk_fp8_f32 (gfx950: the OCP e4m3 format), two values into each half of a 32-bit word, the
// first of a pair in the half's low byte. The values are clamped to +-448 first (compare + select: NaN stays NaN),
// so that saturation does not depend on the instruction's clamp mode.
struct PackE4m3ToCvtPk : OpRewritePattern<PackE4m3Op> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(PackE4m3Op op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    auto codesTy = op.getCodes().getType();
    const int64_t n = codesTy.getNumElements();
    Value codes = arith::ConstantOp::create(b, loc, codesTy, DenseElementsAttr::get(codesTy, b.getI8IntegerAttr(0)));
    Value top = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(448.f));
    Value bottom = arith::ConstantOp::create(b, loc, b.getF32FloatAttr(-448.f));
    auto value = [&](int64_t i) {
      Value v = vector::ExtractOp::create(b, loc, op.getValues(), ArrayRef<int64_t>{i});
      v = arith::SelectOp::create(b, loc, arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OGT, v, top), top, v);
      return Value(
          arith::SelectOp::create(b, loc, arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, v, bottom), bottom, v));
    };
    auto bytesTy = VectorType::get({4}, b.getI8Type());
    for (int64_t i = 0; i < n; i += 4) {
      Value word = lowering::i32(b, loc, 0);
      for (int64_t half = 0; half < 2 && i + 2 * half < n; ++half)
        word = ROCDL::CvtPkFp8F32Op::create(b, loc, b.getI32Type(), value(i + 2 * half), value(i + 2 * half + 1), word,
                                            b.getIntegerAttr(b.getI1Type(), half));
      Value bytes = LLVM::BitcastOp::create(b, loc, bytesTy, word);
      for (int64_t j = 0; j < 4 && i + j < n; ++j)
        codes = vector::InsertOp::create(b, loc, vector::ExtractOp::create(b, loc, bytes, ArrayRef<int64_t>{j}), codes,
                                         ArrayRef<int64_t>{i + j});
    }
    b.replaceOp(op, codes);
    return success();
  }
};

struct LowerToROCDLPass : impl::MegaMoeLowerToROCDLBase<LowerToROCDLPass> {
  void runOnOperation() override {
    RocdlHooks hooks;
    if (failed(markKernels(getOperation(), hooks))) return signalPassFailure();
    RewritePatternSet patterns(&getContext());
    populateExpandBarriersPatterns(patterns);
    populateCommonLoweringPatterns(patterns, hooks);
    patterns.add<MmaTileToMfma, MmaDrainToValue, AccStoreFromMfma, AccRowScalesOnMfma, AccScaleAddOnMfma, BulkStoreToCopies, EraseOp<BulkCommitOp>,
                 EraseOp<BulkWaitOp>, PackE4m3ToCvtPk>(&getContext());
    if (failed(applyLowering(getOperation(), std::move(patterns)))) signalPassFailure();
  }
};
}  // namespace
}  // namespace megamoe
