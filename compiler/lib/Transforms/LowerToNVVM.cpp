// megamoe-lower-to-nvvm: megamoe ops -> LLVM + NVVM for sm_90a. The MMA lowering follows the wgmma atom
// descriptor in megamoe/Target/MmaAtoms.h.
#include "TargetHooks.h"

#include "megamoe/Target/MmaAtoms.h"
#include "megamoe/Transforms/Passes.h"

using namespace mlir;

namespace megamoe {
#define GEN_PASS_DEF_MEGAMOELOWERTONVVM
#include "megamoe/Transforms/Passes.h.inc"

namespace {
using namespace lowering;
using Atom = atoms::WgmmaM64NK16Bf16;

class NvvmHooks final : public TargetHooks {
 public:
  Value threadId(OpBuilder& b, Location loc) const override { return NVVM::ThreadIdXOp::create(b, loc, b.getI32Type()); }
  Value blockId(OpBuilder& b, Location loc) const override { return NVVM::BlockIdXOp::create(b, loc, b.getI32Type()); }
  Value nowNs(OpBuilder& b, Location loc) const override { return NVVM::GlobalTimerOp::create(b, loc, b.getI64Type()); }
  void blockBarrier(OpBuilder& b, Location loc) const override { NVVM::Barrier0Op::create(b, loc); }
  // NVPTX syncscopes: "" is system, "device" the GPU, "block" the CTA.
  StringRef syncScope(MemScope scope) const override {
    switch (scope) {
      case MemScope::cta: return "block";
      case MemScope::gpu: return "device";
      case MemScope::system: return "";
    }
    llvm_unreachable("scope");
  }
  void afterSharedWrite(OpBuilder& b, Location loc) const override {
    NVVM::FenceProxyOp::create(b, loc, NVVM::ProxyKind::async_shared,
                               NVVM::SharedSpaceAttr::get(b.getContext(), NVVM::SharedSpace::shared_cta));
  }
  // cp.async.cg 16 bytes; a source size of 0 zero-fills the chunk.
  bool asyncCopyChunk(OpBuilder& b, Location loc, Value dst, Value src, Value inside) const override {
    Value bytes = arith::SelectOp::create(b, loc, inside, i32(b, loc, 16), i32(b, loc, 0));
    NVVM::CpAsyncOp::create(b, loc, dst, src, 16, NVVM::LoadCacheModifierKind::CG, bytes);
    return true;
  }
  void asyncCommit(OpBuilder& b, Location loc) const override { NVVM::CpAsyncCommitGroupOp::create(b, loc); }
  bool mnMajorTilesAsKMajor() const override { return false; }  // wgmma reads MN-major operands transposed
  void asyncWait(OpBuilder& b, Location loc, int64_t pending) const override {
    NVVM::CpAsyncWaitGroupOp::create(b, loc, uint32_t(pending));
    afterSharedWrite(b, loc);  // cp.async wrote through the generic proxy; wgmma reads through the async proxy
  }
  void markKernel(Operation* func, int64_t threads) const override {
    Builder b(func->getContext());
    func->setAttr(NVVM::NVVMDialect::getKernelFuncAttrName(), b.getUnitAttr());
    func->setAttr(NVVM::NVVMDialect::getReqntidAttrName(), b.getDenseI32ArrayAttr({int32_t(threads), 1, 1}));
    // Thread-block clusters along x (TMA multicast pairs): .reqnctapercluster, so a plain launch forms them.
    if (auto cluster = func->getAttrOfType<IntegerAttr>("megamoe.cluster_x"))
      func->setAttr(NVVM::NVVMDialect::getClusterDimAttrName(),
                    b.getDenseI32ArrayAttr({int32_t(cluster.getInt()), 1, 1}));
  }
};

Value sharedAddress(OpBuilder& b, Location loc, Value sharedPtr) {
  return LLVM::PtrToIntOp::create(b, loc, b.getI64Type(), sharedPtr);
}

// vector<Nxf32> <-> !llvm.struct<(f32 x N)> (wgmma's register operand form).
Value vectorToStruct(OpBuilder& b, Location loc, Value vec, Type structTy, int64_t n) {
  Value s = LLVM::UndefOp::create(b, loc, structTy);
  for (int64_t i = 0; i < n; ++i) {
    Value e = vector::ExtractOp::create(b, loc, vec, ArrayRef<int64_t>{i});
    s = LLVM::InsertValueOp::create(b, loc, s, e, ArrayRef<int64_t>{i});
  }
  return s;
}
Value structToVector(OpBuilder& b, Location loc, Value s, VectorType vecTy) {
  Value v = arith::ConstantOp::create(b, loc, vecTy, DenseElementsAttr::get(vecTy, b.getF32FloatAttr(0)));
  for (int64_t i = 0; i < vecTy.getNumElements(); ++i) {
    Value e = LLVM::ExtractValueOp::create(b, loc, s, ArrayRef<int64_t>{i});
    v = vector::InsertOp::create(b, loc, e, v, ArrayRef<int64_t>{i});
  }
  return v;
}

// A stage of a shared ring (SharedTile::stage: a byte offset from the ring's base) as that base and the offset, so
// that the descriptor's part from the base is loop-invariant and only offset / 16 is added in the K loop: with the
// 64-bit address arithmetic per step (mask, shift, or), ptxas left ~30 instructions, a dependent chain of ~10,
// between one step's MMA wait and the next step's wgmma; descriptors kept loop-invariant in a probe ran
// DeepSeek-V3 L1 6.5% faster at equal clocks (bench/results/2026-12-01-h200-stall-sites).
// A constant byte offset into a stage (SharedTile::rowSlice of a stage, e.g. one warpgroup's half of B) moves the
// base: the ring's base plus that constant, still loop-invariant.
std::pair<Value, Value> stageOffset(OpBuilder& b, Location loc, Value ptr) {
  auto byteGep = [&](Value p, size_t dynamic) {
    auto gep = p.getDefiningOp<LLVM::GEPOp>();
    return gep && gep.getElemType() == b.getI8Type() && gep.getDynamicIndices().size() == dynamic &&
                   gep.getRawConstantIndices().size() == 1
               ? gep
               : LLVM::GEPOp();
  };
  std::optional<int32_t> within;
  if (auto slice = byteGep(ptr, 0); slice && byteGep(slice.getBase(), 1)) {
    within = slice.getRawConstantIndices()[0];
    ptr = slice.getBase();
  }
  if (auto gep = byteGep(ptr, 1)) {
    Value off = gep.getDynamicIndices()[0];
    if (off.getType() != b.getI32Type()) off = arith::TruncIOp::create(b, loc, b.getI32Type(), off);
    Value base = gep.getBase();
    if (within)
      base = LLVM::GEPOp::create(b, loc, base.getType(), b.getI8Type(), base, ArrayRef<LLVM::GEPArg>{*within});
    return {base, off};
  }
  return {ptr, Value()};
}

// Passes each element of an accumulator vector through an empty volatile asm: no instruction that reads (or
// defines) it can be scheduled across the asm, which stays in order with the wgmma fence and waits around it.
Value pinEach(PatternRewriter& b, Location loc, Value vec) {
  auto vecTy = cast<VectorType>(vec.getType());
  for (int64_t i = 0; i < vecTy.getNumElements(); ++i) {
    Value e = vector::ExtractOp::create(b, loc, vec, ArrayRef<int64_t>{i});
    auto pin = LLVM::InlineAsmOp::create(b, loc, TypeRange{b.getF32Type()}, ValueRange{e}, "", "=f,0",
                                         /*has_side_effects=*/true, /*is_align_stack=*/false,
                                         LLVM::tailcallkind::TailCallKind::None, nullptr, nullptr);
    vec = vector::InsertOp::create(b, loc, pin.getResult(0), vec, ArrayRef<int64_t>{i});
  }
  return vec;
}

// One warpgroup per 64 rows of A: warpgroup g reads A rows [64g, 64g + 64) (8 KB of swizzled rows further on) and
// all of B; k / 16 wgmma ops step the descriptors by 32 bytes each, then commit and wait.
struct MmaTileToWgmma : OpRewritePattern<MmaTileOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MmaTileOp op, PatternRewriter& b) const override {
    if (!Atom::validN(op.getN())) return b.notifyMatchFailure(op, "n is not a wgmma N (multiple of 8 up to 256)");
    Location loc = op.getLoc();
    MLIRContext* ctx = b.getContext();
    int64_t n = op.getN(), accN = Atom::accPerThread(n);
    auto vecTy = cast<VectorType>(op.getAcc().getType());
    Type structTy = LLVM::LLVMStructType::getLiteral(ctx, SmallVector<Type>(accN, b.getF32Type()));

    Value tid = NVVM::ThreadIdXOp::create(b, loc, b.getI32Type());
    Value group = arith::ExtUIOp::create(b, loc, b.getI64Type(), arith::DivUIOp::create(b, loc, tid, i32(b, loc, Atom::kThreads)));
    // Warpgroup g reads A rows [64g, 64g + 64): 64 K-major rows of 128 bytes further on, or the g-th MN atom.
    bool aMN = op.getAMnMajor(), bMN = op.getBMnMajor();
    uint64_t atomsA = uint64_t(op.getM() / 64), atomsB = uint64_t(op.getN() / 64);
    int64_t aGroupBytes = !aMN ? Atom::kM * 128 : op.getMnAtomsOuter() ? op.getK() / 8 * 1024 : 1024;
    auto [aRing, aOff] = stageOffset(b, loc, op.getA());
    auto [bRing, bOff] = stageOffset(b, loc, op.getB());
    // (a_first_rows: every warpgroup reads rows [0, 64).)
    Value aGroupOffset =
        op.getAFirstRows() ? Value() : arith::MulIOp::create(b, loc, group, i64(b, loc, aGroupBytes)).getResult();
    Value aBase = sharedAddress(b, loc, aRing);
    if (aGroupOffset) aBase = arith::AddIOp::create(b, loc, aBase, aGroupOffset);
    // MN-major strides (MmaAtoms.h): b128_mn tiles, or TMA boxes with the MN atoms outermost.
    bool outer = op.getMnAtomsOuter();
    uint64_t kGroups = uint64_t(op.getK() / 8);
    auto lbo = [&](uint64_t atoms) { return outer ? kGroups * 1024 : uint64_t(1024); };
    auto sbo = [&](uint64_t atoms) { return outer ? uint64_t(1024) : atoms * 1024; };
    auto desc = [&](Value addr, bool mn, uint64_t atoms) {
      Value masked = arith::AndIOp::create(b, loc, addr, i64(b, loc, 0x3FFFF));
      Value field = arith::ShRUIOp::create(b, loc, masked, i64(b, loc, 4));
      uint64_t fixed = mn ? Atom::descriptorMN(0, lbo(atoms), sbo(atoms)) : Atom::descriptor(0);
      return arith::OrIOp::create(b, loc, field, i64(b, loc, int64_t(fixed))).getResult();
    };
    Value descA = desc(aBase, aMN, atomsA), descB = desc(sharedAddress(b, loc, bRing), bMN, atomsB);
    uint64_t stepA = aMN ? Atom::descriptorStepPerK16MN(sbo(atomsA)) : Atom::kDescriptorStepPerK16;
    uint64_t stepB = bMN ? Atom::descriptorStepPerK16MN(sbo(atomsB)) : Atom::kDescriptorStepPerK16;
    // The stage's offset goes into the descriptor's low word (address field, bits 0-13: shared addresses stay below
    // 256 KB, so base / 16 + offset / 16 never carries out of it); the high word is the base's, a constant.
    auto withOffset = [&](Value d, Value off, uint64_t step) -> std::function<Value(int64_t)> {
      if (!off) return [&b, loc, d, step](int64_t kk) -> Value {
        return arith::AddIOp::create(b, loc, d, i64(b, loc, kk * int64_t(step)));
      };
      Value lo = arith::TruncIOp::create(b, loc, b.getI32Type(), d);
      Value hi = arith::AndIOp::create(b, loc, d, i64(b, loc, int64_t(~uint64_t(0xFFFFFFFFu))));
      lo = arith::AddIOp::create(b, loc, lo, arith::ShRUIOp::create(b, loc, off, i32(b, loc, 4)));
      return [&b, loc, lo, hi, step](int64_t kk) -> Value {
        Value l = arith::AddIOp::create(b, loc, lo, i32(b, loc, kk * int64_t(step)));
        return arith::OrIOp::create(b, loc, hi, arith::ExtUIOp::create(b, loc, b.getI64Type(), l));
      };
    };
    // k16: only that 16-wide K slice, at a run-time step of both descriptors (within the stage: no carry either).
    // e4m3: k32 steps over the same 32 bytes (WgmmaM64NK32E4m3), K-major only (the verifier says so).
    const bool fp8 = op.getE4m3();
    static_assert(atoms::WgmmaM64NK32E4m3::kDescriptorStepPerK32 == Atom::kDescriptorStepPerK16);
    int64_t kSteps = op.getK() / (fp8 ? atoms::WgmmaM64NK32E4m3::kK : Atom::kK);
    if (Value k16 = op.getK16()) {
      Value at = arith::ExtUIOp::create(b, loc, b.getI64Type(), k16);
      descA = arith::AddIOp::create(b, loc, descA, arith::MulIOp::create(b, loc, at, i64(b, loc, int64_t(stepA))));
      descB = arith::AddIOp::create(b, loc, descB, arith::MulIOp::create(b, loc, at, i64(b, loc, int64_t(stepB))));
      kSteps = 1;
    }
    auto atA = withOffset(descA, aOff, stepA), atB = withOffset(descB, bOff, stepB);

    // The accumulator's registers are defined before the fence (pinned): a definition between the fence and the
    // wgmma (LLVM sank a tile's zero fill there) makes ptxas serialize every wgmma of the kernel (C7520).
    Value acc = vectorToStruct(b, loc, pinEach(b, loc, op.getAcc()), structTy, accN);
    NVVM::WgmmaFenceAlignedOp::create(b, loc);
    auto shape = NVVM::MMAShapeAttr::get(ctx, Atom::kM, n, fp8 ? atoms::WgmmaM64NK32E4m3::kK : Atom::kK);
    const NVVM::WGMMATypes operandType = fp8 ? NVVM::WGMMATypes::e4m3 : NVVM::WGMMATypes::bf16;
    for (int64_t kk = 0; kk < kSteps; ++kk) {
      Value a = atA(kk), bd = atB(kk);
      // A is M x K: "row" = K-major, "col" = MN-major. B is K x N: "col" = K-major, "row" = MN-major.
      acc = NVVM::WgmmaMmaAsyncOp::create(
          b, loc, structTy, acc, a, bd, shape, operandType, operandType, NVVM::WGMMATypes::f32,
          op.getFresh() && kk == 0 ? NVVM::WGMMAScaleOut::zero : NVVM::WGMMAScaleOut::one, NVVM::WGMMAScaleIn::one,
          NVVM::WGMMAScaleIn::one,
          aMN ? NVVM::MMALayout::col : NVVM::MMALayout::row, bMN ? NVVM::MMALayout::row : NVVM::MMALayout::col, nullptr);
    }
    NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, uint64_t(op.getPending()));
    b.replaceOp(op, structToVector(b, loc, acc, vecTy));
    return success();
  }
};

// Waits until at most `pending` wgmma groups are in flight, then pins each accumulator register so that no read of
// it can be scheduled above the wait.
struct MmaDrainToWgmmaWait : OpRewritePattern<MmaDrainOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MmaDrainOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, uint64_t(op.getPending()));
    b.replaceOp(op, pinEach(b, loc, op.getAcc()));
    return success();
  }
};

// The FP8 promotion over the wgmma fragment: element i of thread t of warpgroup g lies in row 64 g + 16 warp +
// lane / 4 + Atom::acc(0, i).row (two distinct rows per thread).
// Thread 0's placement; another thread's columns lie up to 6 further (2 (lane % 4)), its rows further too.
static FragmentPlace wgmmaPlace(int64_t n) {
  FragmentPlace place{{}, {}, 8};
  for (int64_t i = 0; i < Atom::accPerThread(n); ++i) {
    place.row.push_back(Atom::acc(0, i).row);
    place.col.push_back(Atom::acc(0, i).col);
  }
  return place;
}
struct AccRowScalesOnWgmma : OpRewritePattern<AccRowScalesOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AccRowScalesOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    Value tid = NVVM::ThreadIdXOp::create(b, loc, b.getI32Type());
    Value group = arith::DivUIOp::create(b, loc, tid, i32(b, loc, Atom::kThreads));
    Value t = arith::RemUIOp::create(b, loc, tid, i32(b, loc, Atom::kThreads));
    Value rowBase = arith::AddIOp::create(
        b, loc, arith::MulIOp::create(b, loc, group, i32(b, loc, Atom::kM)),
        arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, arith::DivUIOp::create(b, loc, t, i32(b, loc, 32)), i32(b, loc, 16)),
                              arith::DivUIOp::create(b, loc, arith::RemUIOp::create(b, loc, t, i32(b, loc, 32)), i32(b, loc, 4))));
    return accRowScales(b, op, rowBase, wgmmaPlace(op.getN()));
  }
};
struct AccScaleAddOnWgmma : OpRewritePattern<AccScaleAddOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AccScaleAddOp op, PatternRewriter& b) const override {
    return accScaleAdd(b, op, wgmmaPlace(op.getN()));
  }
};

// Walks the wgmma accumulator fragment: element pairs (i, i + 1) are adjacent columns of one row.
struct AccStoreFromWgmma : OpRewritePattern<AccStoreOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(AccStoreOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    Type elem = op.getElem();
    int64_t eb = elem.getIntOrFloatBitWidth() / 8, accN = Atom::accPerThread(op.getN());
    Value tid = NVVM::ThreadIdXOp::create(b, loc, b.getI32Type());
    Value group = arith::DivUIOp::create(b, loc, tid, i32(b, loc, Atom::kThreads));
    Value t = arith::RemUIOp::create(b, loc, tid, i32(b, loc, Atom::kThreads));
    Value warp = arith::DivUIOp::create(b, loc, t, i32(b, loc, 32));
    Value lane = arith::RemUIOp::create(b, loc, t, i32(b, loc, 32));
    // Row of element i = 64 g + 16 warp + lane / 4 + 8 ((i / 2) % 2); column = (i / 4) 8 + (lane % 4) 2 + i % 2.
    Value rowBase = arith::AddIOp::create(
        b, loc, arith::MulIOp::create(b, loc, group, i32(b, loc, Atom::kM)),
        arith::AddIOp::create(b, loc, arith::MulIOp::create(b, loc, warp, i32(b, loc, 16)),
                              arith::DivUIOp::create(b, loc, lane, i32(b, loc, 4))));
    Value colBase = arith::MulIOp::create(b, loc, arith::RemUIOp::create(b, loc, lane, i32(b, loc, 4)), i32(b, loc, 2));
    auto pairTy = VectorType::get({2}, elem);
    for (int64_t i = 0; i < accN; i += 2) {
      atoms::Coord c = Atom::acc(0, i);  // the thread-independent part: lane 0 of warp 0
      Value row = arith::AddIOp::create(b, loc, rowBase, i32(b, loc, c.row));
      Value col = arith::AddIOp::create(b, loc, colBase, i32(b, loc, c.col));
      Value inside = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, row, op.getRowsValid());
      auto ifOp = scf::IfOp::create(b, loc, TypeRange{}, inside, false);
      OpBuilder tb = ifOp.getThenBodyBuilder();
      Value pair = arith::ConstantOp::create(tb, loc, pairTy, DenseElementsAttr::get(pairTy, tb.getZeroAttr(elem)));
      for (int64_t j = 0; j < 2; ++j) {
        Value v = vector::ExtractOp::create(tb, loc, op.getAcc(), ArrayRef<int64_t>{i + j});
        pair = vector::InsertOp::create(tb, loc, convertF32(tb, loc, v, elem), pair, ArrayRef<int64_t>{j});
      }
      Value index;
      if (int64_t boxRows = op.getBoxRows()) {
        // TMA's swizzled boxes: column c.col + colBase lies in box c.col / 64 and chunk (c.col % 64) / 8 (both the
        // same for every lane: colBase < 8), row r at r % boxRows of the box, the chunk at chunk ^ (r % 8).
        const int64_t perRow = 128 / eb, chunk = (c.col % 64) / 8;
        Value inBox = arith::RemUIOp::create(tb, loc, row, i32(tb, loc, boxRows));
        Value swizzled = arith::XOrIOp::create(tb, loc, arith::RemUIOp::create(tb, loc, row, i32(tb, loc, 8)),
                                               i32(tb, loc, chunk));
        Value at = arith::AddIOp::create(
            tb, loc, arith::MulIOp::create(tb, loc, inBox, i32(tb, loc, perRow)),
            arith::AddIOp::create(tb, loc, arith::MulIOp::create(tb, loc, swizzled, i32(tb, loc, 16 / eb)), colBase));
        at = arith::AddIOp::create(tb, loc, at, i32(tb, loc, c.col / 64 * boxRows * perRow + c.col % 8));
        index = arith::ExtUIOp::create(tb, loc, tb.getI64Type(), at);
      } else {
        index = arith::AddIOp::create(
            tb, loc,
            arith::MulIOp::create(tb, loc, arith::ExtUIOp::create(tb, loc, tb.getI64Type(), row),
                                  arith::ExtUIOp::create(tb, loc, tb.getI64Type(), op.getLd())),
            arith::ExtUIOp::create(tb, loc, tb.getI64Type(), col));
      }
      Value ptr = LLVM::GEPOp::create(tb, loc, op.getDst().getType(), elem, op.getDst(), ValueRange{index});
      LLVM::StoreOp::create(tb, loc, pair, ptr, 2 * eb);
    }
    // Staged in shared memory: make the writes visible to the async proxy (bulk stores read it from there).
    if (cast<LLVM::LLVMPointerType>(op.getDst().getType()).getAddressSpace() == 3)
      NVVM::FenceProxyOp::create(b, loc, NVVM::ProxyKind::async_shared,
                                 NVVM::SharedSpaceAttr::get(b.getContext(), NVVM::SharedSpace::shared_cta));
    b.eraseOp(op);
    return success();
  }
};

// bulk_store -> cp.async.bulk.global.shared::cta.bulk_group; the group ops -> cp.async.bulk.commit_group /
// wait_group[.read]; a full wait adds fence.proxy.async.global so that a later release covers the written data.
struct BulkStoreToCpAsyncBulk : OpRewritePattern<BulkStoreOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(BulkStoreOp op, PatternRewriter& b) const override {
    NVVM::CpAsyncBulkSharedCTAToGlobalOp::create(b, op.getLoc(), op.getDst(), op.getSrc(), op.getBytes(), Value(),
                                                 Value());
    b.eraseOp(op);
    return success();
  }
};
struct BulkCommitToNvvm : OpRewritePattern<BulkCommitOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(BulkCommitOp op, PatternRewriter& b) const override {
    NVVM::CpAsyncBulkCommitGroupOp::create(b, op.getLoc());
    b.eraseOp(op);
    return success();
  }
};
struct BulkWaitToNvvm : OpRewritePattern<BulkWaitOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(BulkWaitOp op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, b.getI32IntegerAttr(int32_t(op.getPending())),
                                         op.getRead() ? b.getUnitAttr() : UnitAttr());
    if (!op.getRead()) NVVM::FenceProxyOp::create(b, loc, NVVM::ProxyKind::async_global, NVVM::SharedSpaceAttr());
    b.eraseOp(op);
    return success();
  }
};

// Warp specialisation: group barriers, mbarriers, cp.async arrivals, TMA and register budgets map one to one, each
// op replaced by what its emitter builds.
template <typename OpT>
struct EmitInstead : OpRewritePattern<OpT> {
  using Emit = void (*)(PatternRewriter&, OpT);
  EmitInstead(MLIRContext* ctx, Emit emit) : OpRewritePattern<OpT>(ctx), emit(emit) {}
  LogicalResult matchAndRewrite(OpT op, PatternRewriter& b) const override {
    emit(b, op);
    b.eraseOp(op);
    return success();
  }
  Emit emit;
};
template <typename OpT>
void addEmitter(RewritePatternSet& patterns, typename EmitInstead<OpT>::Emit emit) {
  patterns.add(std::make_unique<EmitInstead<OpT>>(patterns.getContext(), emit));
}

// PTX with side effects and a memory clobber, for instructions the NVVM dialect has no op for here.
void inlinePtx(OpBuilder& b, Location loc, ValueRange operands, StringRef text, StringRef constraints) {
  LLVM::InlineAsmOp::create(b, loc, TypeRange{}, operands, text, constraints, /*has_side_effects=*/true,
                            /*is_align_stack=*/false, LLVM::tailcallkind::TailCallKind::None, nullptr, nullptr);
}

void addWarpSpecialisationPatterns(RewritePatternSet& patterns) {
  addEmitter<GroupBarrierOp>(patterns, [](PatternRewriter& b, GroupBarrierOp op) {
    Location loc = op.getLoc();
    if (op.getArrive())
      NVVM::BarrierArriveOp::create(b, loc, i32(b, loc, op.getId()), i32(b, loc, op.getThreads()));
    else
      NVVM::BarrierOp::create(b, loc, Type(), i32(b, loc, op.getId()), i32(b, loc, op.getThreads()),
                              NVVM::BarrierReductionAttr(), Value());
  });
  addEmitter<MbarrierInitOp>(patterns, [](PatternRewriter& b, MbarrierInitOp op) {
    NVVM::MBarrierInitOp::create(b, op.getLoc(), op.getBar(), op.getCount(), Value());
  });
  addEmitter<MbarrierArriveOp>(patterns, [](PatternRewriter& b, MbarrierArriveOp op) {
    NVVM::MBarrierArriveOp::create(b, op.getLoc(), Type(), op.getBar(), Value(), NVVM::MemScopeKind::CTA, false);
  });
  // try_wait.parity in a loop until the phase has completed (the hint asks the hardware to suspend up to ~1 ms
  // per try rather than spin).
  // With `cluster`: the same loop, acquiring at cluster scope (inline: the op has no scope here).
  addEmitter<MbarrierWaitOp>(patterns, [](PatternRewriter& b, MbarrierWaitOp op) {
    if (!op.getCluster()) {
      NVVM::MBarrierTryWaitParityOp::create(b, op.getLoc(), op.getBar(), op.getParity(), i32(b, op.getLoc(), 1000000));
      return;
    }
    Value addr = LLVM::PtrToIntOp::create(b, op.getLoc(), b.getI32Type(), op.getBar());
    inlinePtx(b, op.getLoc(), ValueRange{addr, op.getParity()},
              "{\n.reg .pred P1;\nLAB_WAIT:\n"
              "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [$0], $1, 1000000;\n"
              "@P1 bra.uni DONE;\nbra.uni LAB_WAIT;\nDONE:\n}",
              "r,r,~{memory}");
  });
  addEmitter<AsyncArriveOp>(patterns, [](PatternRewriter& b, AsyncArriveOp op) {
    NVVM::CpAsyncMBarrierArriveOp::create(b, op.getLoc(), op.getBar(), /*noinc=*/true);
  });
  addEmitter<ProxyFenceOp>(patterns, [](PatternRewriter& b, ProxyFenceOp op) {
    if (op.getGlobal())
      NVVM::FenceProxyOp::create(b, op.getLoc(), NVVM::ProxyKind::async_global, NVVM::SharedSpaceAttr());
    else
      NVVM::FenceProxyOp::create(b, op.getLoc(), NVVM::ProxyKind::async_shared,
                                 NVVM::SharedSpaceAttr::get(b.getContext(), NVVM::SharedSpace::shared_cta));
  });
  addEmitter<MbarrierExpectTxOp>(patterns, [](PatternRewriter& b, MbarrierExpectTxOp op) {
    NVVM::MBarrierArriveExpectTxOp::create(b, op.getLoc(), Type(), op.getBar(), op.getBytes(), NVVM::MemScopeKind::CTA,
                                           false, Value());
  });
  // cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes: the destination is addressed in
  // the shared::cluster window (address space 7), which holds this CTA's shared memory too.
  addEmitter<TmaLoadOp>(patterns, [](PatternRewriter& b, TmaLoadOp op) {
    Location loc = op.getLoc();
    Value dst = LLVM::AddrSpaceCastOp::create(b, loc, LLVM::LLVMPointerType::get(b.getContext(), 7), op.getDst());
    Value mask = op.getMulticast()
                     ? arith::ConstantOp::create(b, loc, b.getI16IntegerAttr(int16_t(op.getMulticast()))).getResult()
                     : Value();
    NVVM::CpAsyncBulkTensorGlobalToSharedClusterOp::create(b, loc, dst, op.getMap(), op.getCoords(), op.getBar(),
                                                          ValueRange{}, mask, Value(), NVVM::TMALoadMode::TILE,
                                                          false, NVVM::CTAGroupKindAttr(), Value());
  });
  // cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group: in this thread's bulk-store group (bulk_commit / wait).
  addEmitter<TmaStoreOp>(patterns, [](PatternRewriter& b, TmaStoreOp op) {
    NVVM::CpAsyncBulkTensorSharedCTAToGlobalOp::create(b, op.getLoc(), op.getMap(), op.getSrc(), op.getCoords(),
                                                       Value(), NVVM::TMAStoreMode::TILE, Value());
  });
  // mapa turns this CTA's shared offset into the peer's address in the cluster window. A ring slot's arrival keeps
  // the default (release, CTA) semantics: the slot's readers are this warpgroup's wgmmas, already complete
  // (wait_group) when it arrives, so the peer's producer needs no cluster-scope release to overwrite it; that release
  // fenced the MMA warps every K step (bench/results/2026-11-30-h200-pairs-arrive: pairs 0.71-0.81 -> 0.94-1.06 of
  // torch). `cluster` asks for it where this thread's own accesses must be ordered for the peer.
  addEmitter<MbarrierArrivePeerOp>(patterns, [](PatternRewriter& b, MbarrierArrivePeerOp op) {
    Value addr = LLVM::PtrToIntOp::create(b, op.getLoc(), b.getI32Type(), op.getBar());
    inlinePtx(b, op.getLoc(), ValueRange{addr, op.getCta()},
              std::string("{\n.reg .b32 peer;\nmapa.shared::cluster.u32 peer, $0, $1;\nmbarrier.arrive") +
                  (op.getCluster() ? ".release.cluster" : "") + ".shared::cluster.b64 _, [peer];\n}",
              "r,r,~{memory}");
  });
  // Both shared offsets mapped into CTA `cta`'s window; the bytes complete on its barrier.
  addEmitter<SharedCopyPeerOp>(patterns, [](PatternRewriter& b, SharedCopyPeerOp op) {
    Location loc = op.getLoc();
    Value src = LLVM::PtrToIntOp::create(b, loc, b.getI32Type(), op.getSrc());
    Value bar = LLVM::PtrToIntOp::create(b, loc, b.getI32Type(), op.getBar());
    inlinePtx(b, loc, ValueRange{src, bar, op.getCta()},
              "{\n.reg .b32 dst, bar;\nmapa.shared::cluster.u32 dst, $0, $2;\nmapa.shared::cluster.u32 bar, $1, $2;\n"
              "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [$0], " +
                  std::to_string(op.getBytes()) + ", [bar];\n}",
              "r,r,r,~{memory}");
  });
  addEmitter<SharedStorePeerOp>(patterns, [](PatternRewriter& b, SharedStorePeerOp op) {
    Value addr = LLVM::PtrToIntOp::create(b, op.getLoc(), b.getI32Type(), op.getPtr());
    inlinePtx(b, op.getLoc(), ValueRange{addr, op.getValue(), op.getCta()},
              "{\n.reg .b32 dst;\nmapa.shared::cluster.u32 dst, $0, $2;\nst.shared::cluster.u32 [dst], $1;\n}",
              "r,r,r,~{memory}");
  });
  addEmitter<ClusterSyncOp>(patterns, [](PatternRewriter& b, ClusterSyncOp op) {
    inlinePtx(b, op.getLoc(), ValueRange{},
              "fence.mbarrier_init.release.cluster;\nbarrier.cluster.arrive.release.aligned;\n"
              "barrier.cluster.wait.acquire.aligned;",
              "~{memory}");
  });
  addEmitter<SetMaxRegistersOp>(patterns, [](PatternRewriter& b, SetMaxRegistersOp op) {
    NVVM::SetMaxRegisterOp::create(b, op.getLoc(), uint32_t(op.getCount()),
                                   op.getIncrease() ? NVVM::SetMaxRegisterAction::increase
                                                    : NVVM::SetMaxRegisterAction::decrease);
  });
}

// pack_e4m3 one pair at a time on cvt.rn.satfinite.e4m3x2.f32, which puts its first operand's code in the high
// byte: each pair passes (odd, even), so that the vector<2xi8> result reads (even's code, odd's) in memory order.
struct PackE4m3ToCvt : OpRewritePattern<PackE4m3Op> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(PackE4m3Op op, PatternRewriter& b) const override {
    Location loc = op.getLoc();
    auto codesTy = op.getCodes().getType();
    Value codes = arith::ConstantOp::create(b, loc, codesTy, DenseElementsAttr::get(codesTy, b.getI8IntegerAttr(0)));
    auto pairTy = VectorType::get({2}, b.getI8Type());
    auto rn = NVVM::FPRoundingModeAttr::get(b.getContext(), NVVM::FPRoundingMode::RN);
    auto sat = NVVM::SaturationModeAttr::get(b.getContext(), NVVM::SaturationMode::SATFINITE);
    auto e4m3 = TypeAttr::get(b.getType<Float8E4M3FNType>());
    for (int64_t i = 0; i < codesTy.getNumElements(); i += 2) {
      Value even = vector::ExtractOp::create(b, loc, op.getValues(), ArrayRef<int64_t>{i});
      Value odd = vector::ExtractOp::create(b, loc, op.getValues(), ArrayRef<int64_t>{i + 1});
      Value pair = NVVM::ConvertF32x2ToF8x2Op::create(b, loc, pairTy, odd, even, rn, sat, b.getBoolAttr(false), e4m3);
      for (int64_t j = 0; j < 2; ++j)
        codes = vector::InsertOp::create(b, loc, vector::ExtractOp::create(b, loc, pair, ArrayRef<int64_t>{j}), codes,
                                         ArrayRef<int64_t>{i + j});
    }
    b.replaceOp(op, codes);
    return success();
  }
};

struct LowerToNVVMPass : impl::MegaMoeLowerToNVVMBase<LowerToNVVMPass> {
  void runOnOperation() override {
    NvvmHooks hooks;
    if (failed(markKernels(getOperation(), hooks))) return signalPassFailure();
    RewritePatternSet patterns(&getContext());
    populateExpandBarriersPatterns(patterns);
    populateCommonLoweringPatterns(patterns, hooks);
    patterns.add<MmaTileToWgmma, MmaDrainToWgmmaWait, AccStoreFromWgmma, AccRowScalesOnWgmma, AccScaleAddOnWgmma, BulkStoreToCpAsyncBulk, BulkCommitToNvvm,
                 BulkWaitToNvvm, PackE4m3ToCvt>(&getContext());
    addWarpSpecialisationPatterns(patterns);
    if (failed(applyLowering(getOperation(), std::move(patterns)))) signalPassFailure();
  }
};
}  // namespace
}  // namespace megamoe
