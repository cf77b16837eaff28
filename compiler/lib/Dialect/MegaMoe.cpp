// megamoe dialect registration and op verifiers: one diagnostic per violated rule (tests/lit/Dialect/invalid.mlir).
#include "megamoe/Dialect/MegaMoe.h"
#include "megamoe/Target/TargetLimits.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/IR/OpImplementation.h"

using namespace mlir;
using namespace megamoe;

#include "megamoe/Dialect/MegaMoeOpsDialect.cpp.inc"
#include "megamoe/Dialect/MegaMoeOpsEnums.cpp.inc"

void MegaMoeDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "megamoe/Dialect/MegaMoeOps.cpp.inc"
      >();
}

static unsigned addressSpace(Type t) { return cast<LLVM::LLVMPointerType>(t).getAddressSpace(); }
static bool isGlobalLike(Type t) {
  unsigned as = addressSpace(t);
  return as == kGlobalSpace || as == kGenericSpace;
}
static bool isShared(Type t) { return addressSpace(t) == kSharedSpace; }

// Block-scope ops are executed by `threads` threads from `first`: the whole block, or in a warp-specialised kernel
// one group of whole warps inside it (threads past the group would compute out-of-range chunks and rows; the
// lowerings do not guard them).
static LogicalResult verifyBlockThreads(Operation* op, int64_t threads, int64_t first = 0) {
  auto fn = op->getParentOfType<LLVM::LLVMFuncOp>();
  if (!fn) return success();
  auto block = fn->getAttrOfType<IntegerAttr>("megamoe.block_threads");
  if (!block) return success();
  if (first == 0 && threads == block.getInt()) return success();
  if (first < 0 || first % 32 != 0 || threads % 32 != 0 || first + threads > block.getInt())
    return op->emitOpError("threads [") << first << ", " << first + threads
                                        << ") must be the kernel's megamoe.block_threads = " << block.getInt()
                                        << " or a group of whole warps inside it";
  return success();
}

// The largest shared-memory tile either target can hold (megamoe/Target/TargetLimits.h).
static constexpr int64_t kMaxSharedTileBytes = kMaxSharedBytesAnyTarget;

static LogicalResult verifyElemType(Operation* op, Type elem) {
  if (!elem.isBF16() && !elem.isF16() && !elem.isF32())
    return op->emitOpError("element type must be bf16, f16 or f32, got ") << elem;
  return success();
}
// Tile copies move 16-byte chunks: FP8 e4m3 rows too, where nothing is transposed element by element.
static LogicalResult verifyCopyElemType(TileCopyOp op, Type elem) {
  if (isa<Float8E4M3FNType>(elem)) {
    if (op.getTranspose() || op.getSwizzle() == Swizzle::b128_mn)
      return op.emitOpError("e4m3 tiles are copied as whole rows (K-major): not transposed, not b128_mn");
    return success();
  }
  return verifyElemType(op, elem);
}

//===----------------------------------------------------------------------===//
// TileCopyOp
//===----------------------------------------------------------------------===//

bool TileCopyOp::isLoad() { return isShared(getDst().getType()); }
int64_t TileCopyOp::elemBytes() { return getElem().getIntOrFloatBitWidth() / 8; }

LogicalResult TileCopyOp::verify() {
  Type src = getSrc().getType(), dst = getDst().getType();
  bool load = isGlobalLike(src) && isShared(dst), store = isShared(src) && isGlobalLike(dst);
  if (!load && !store)
    return emitOpError("copies between memory levels: one side must be global (address space 0 or 1) and the "
                       "other shared (address space 3)");
  if (failed(verifyCopyElemType(*this, getElem()))) return failure();
  int64_t rows = getRows(), cols = getCols(), threads = getThreads();
  if (rows <= 0 || cols <= 0 || threads <= 0) return emitOpError("rows, cols and threads must be positive");
  int64_t rowBytes = cols * elemBytes();
  if (rows > kMaxSharedTileBytes || cols > kMaxSharedTileBytes || rows * rowBytes > kMaxSharedTileBytes)
    return emitOpError("a tile of ") << rows << " x " << cols << " elements exceeds the " << kMaxSharedTileBytes
                                     << "-byte shared-memory capacity";
  if (failed(verifyBlockThreads(*this, threads, getFirstThread()))) return failure();
  if (rowBytes % 16 != 0) return emitOpError("a tile row must be a multiple of 16 bytes, got ") << rowBytes;
  if ((rows * rowBytes / 16) % threads != 0)
    return emitOpError("the tile's 16-byte chunks (") << rows * rowBytes / 16 << ") must divide evenly among "
                                                      << threads << " threads";
  if (getAsync() && (!load || getTranspose()))
    return emitOpError("async copies are plain loads (global -> shared, not transposed)");
  if (getRowIndex()) {
    if (!load || getTranspose() || getSwizzle() == Swizzle::b128_mn)
      return emitOpError("a gathering copy (row_index) is a plain load: global -> shared, not transposed, not b128_mn");
    if (!isShared(getRowIndex().getType()))
      return emitOpError("row_index is a shared-memory i32 table (address space 3)");
  }
  if (getAsync() && addressSpace(src) != kGlobalSpace)
    return emitOpError("async copies read global memory: the source must be in address space 1");
  if (getTranspose() && getSwizzle() != Swizzle::b128)
    return emitOpError("a transposing copy writes K-major b128-swizzled rows: swizzle must be b128");
  if (getTranspose()) {
    if (!load) return emitOpError("transpose is only supported for loads (global -> shared)");
    if (rows * elemBytes() != 128 || cols % 8 != 0)
      return emitOpError("a transposing copy needs 128-byte shared rows (rows * element bytes == 128) and cols a "
                         "multiple of 8, got ")
             << rows << " x " << cols;
    return success();
  }
  if (getSwizzle() == Swizzle::b128_mn && (!load || rowBytes % 128 != 0 || rows * elemBytes() != 128))
    return emitOpError("b128_mn tiles are loads of 128 / element-bytes K rows (64 bf16) with row bytes a multiple "
                       "of 128, got ")
           << rowBytes << "-byte rows x " << rows;
  if (getSwizzle() == Swizzle::b128 && (rowBytes != 128 || rows % 8 != 0))
    return emitOpError("b128 swizzle needs 128-byte rows and a multiple of 8 rows, got ")
           << rowBytes << "-byte rows x " << rows;
  return success();
}

//===----------------------------------------------------------------------===//
// MmaTileOp / AccStoreOp
//===----------------------------------------------------------------------===//

// Shape rules shared by the MMA tile and its accumulator store; both targets' atoms satisfy them.
static LogicalResult verifyAccShape(Operation* op, VectorType acc, int64_t m, int64_t n, int64_t threads) {
  if (threads <= 0 || threads % 128 != 0)
    return op->emitOpError("threads must be a positive multiple of 128 (one warpgroup / two waves), got ") << threads;
  if (m != 64 * (threads / 128))
    return op->emitOpError("m must be 64 per 128 threads (") << 64 * (threads / 128) << "), got " << m;
  if (n <= 0 || n % 32 != 0 || n > 256) return op->emitOpError("n must be a multiple of 32 in [32, 256], got ") << n;
  if (failed(verifyBlockThreads(op, threads))) return failure();
  if (acc.getNumElements() != m * n / threads)
    return op->emitOpError("accumulator must hold m * n / threads = ") << m * n / threads << " f32 per thread, got "
                                                                          << acc.getNumElements();
  return success();
}

LogicalResult AsyncWaitOp::verify() {
  if (getPending() > 7) return emitOpError("pending must be 0..7, got ") << int64_t(getPending());
  return success();
}

LogicalResult BulkStoreOp::verify() {
  if (!isShared(getSrc().getType())) return emitOpError("source must be in shared memory (address space 3)");
  if (addressSpace(getDst().getType()) != kGlobalSpace)
    return emitOpError("destination must be in global memory (address space 1)");
  return success();
}

LogicalResult BulkWaitOp::verify() {
  if (getPending() > 7) return emitOpError("pending must be 0..7, got ") << int64_t(getPending());
  return success();
}

LogicalResult MmaTileOp::verify() {
  if (getPending() > 1) return emitOpError("pending must be 0 or 1, got ") << int64_t(getPending());
  if ((getAMnMajor() && getM() % 64 != 0) || (getBMnMajor() && getN() % 64 != 0))
    return emitOpError("an MN-major operand spans whole 64-element atoms: m and n must be multiples of 64");
  if (!isShared(getA().getType()) || !isShared(getB().getType()))
    return emitOpError("operands A and B must be in shared memory (address space 3)");
  if (getE4m3()) {
    if (getK() != 128) return emitOpError("e4m3: k must be 128 (one 128-byte swizzled e4m3 row per stage), got ") << getK();
    if (getAMnMajor() || getBMnMajor() || getMnAtomsOuter())
      return emitOpError("e4m3 operands must both be K-major (the FP8 MMAs do not transpose)");
    if (getK16()) return emitOpError("e4m3 takes no k16 slice");
  } else if (getK() != 64) {
    return emitOpError("k must be 64 (one 128-byte swizzled bf16 row per stage), got ") << getK();
  }
  if (getAFirstRows() && (getM() != 64 || getThreads() != 128))
    return emitOpError("a_first_rows is one warpgroup's tile: m = 64 and threads = 128, got m = ")
           << getM() << ", threads = " << getThreads();
  if (getAcc().getType() != getResult().getType()) return emitOpError("result type must equal the accumulator type");
  return verifyAccShape(*this, getAcc().getType(), getM(), getN(), getThreads());
}

LogicalResult MmaDrainOp::verify() {
  if (getPending() > 1) return emitOpError("pending must be 0 or 1, got ") << int64_t(getPending());
  return success();
}

LogicalResult AccStoreOp::verify() {
  if (!isGlobalLike(getDst().getType()) && !isShared(getDst().getType()))
    return emitOpError("destination must be global or shared memory");
  if (failed(verifyElemType(*this, getElem()))) return failure();
  if (getBoxRows() != 0 && (!isShared(getDst().getType()) || getElem().getIntOrFloatBitWidth() != 16 ||
                            getN() % 64 != 0 || getBoxRows() < 8 || getBoxRows() % 8 != 0))
    return emitOpError("box_rows: swizzled 64-column boxes of 2-byte elements in shared memory, n a multiple of 64 "
                       "and box_rows of 8 or more, a multiple of 8; got n = ")
           << getN() << ", box_rows = " << getBoxRows();
  return verifyAccShape(*this, getAcc().getType(), getM(), getN(), getThreads());
}

LogicalResult AccRowScalesOp::verify() {
  if (!isGlobalLike(getRowScales().getType())) return emitOpError("row_scales must be in global memory");
  const int64_t factors = int64_t(getFactors().size());
  if (factors == 0) return emitOpError("needs at least one factor (B's block scale)");
  if (getScales().getType().getNumElements() % factors)
    return emitOpError("scales holds one element per row and factor: its length must be a multiple of the ")
           << factors << " factors";
  return success();
}
LogicalResult AccScaleAddOp::verify() {
  if (getScales().getType().getNumElements() > getAcc().getType().getNumElements())
    return emitOpError("scales (one per distinct row of the fragment) must not outnumber the accumulator's elements");
  return verifyAccShape(*this, getAcc().getType(), getM(), getN(), getThreads());
}

LogicalResult PackE4m3Op::verify() {
  const int64_t n = getValues().getType().getNumElements();
  if (getCodes().getType().getNumElements() != n) return emitOpError("codes must have one byte per value");
  if (n % 2) return emitOpError("the value count must be even (the targets convert pairs), got ") << n;
  return success();
}

//===----------------------------------------------------------------------===//
// Heap and signalling
//===----------------------------------------------------------------------===//

LogicalResult PeerPtrOp::verify() {
  if (!isGlobalLike(getPtr().getType())) return emitOpError("only global memory lives on the symmetric heap");
  if (getResult().getType() != getPtr().getType()) return emitOpError("result type must equal the pointer type");
  return success();
}

LogicalResult SignalOp::verify() {
  if (!isGlobalLike(getFlag().getType()) && getScope() != MemScope::cta)
    return emitOpError("a flag in shared memory can only be signalled at cta scope");
  return success();
}

LogicalResult WaitOp::verify() {
  if (!isGlobalLike(getFlag().getType()) && getScope() != MemScope::cta)
    return emitOpError("a flag in shared memory can only be waited on at cta scope");
  if (!isGlobalLike(getError().getType())) return emitOpError("the error record must be in global memory");
  return success();
}

LogicalResult GridBarrierOp::verify() {
  if (!isGlobalLike(getCounter().getType())) return emitOpError("the barrier counter must be in global memory");
  if (!isGlobalLike(getError().getType())) return emitOpError("the error record must be in global memory");
  return success();
}

LogicalResult RankBarrierOp::verify() {
  if (!isGlobalLike(getFlags().getType())) return emitOpError("the flag array must be on the symmetric heap");
  if (!isGlobalLike(getError().getType())) return emitOpError("the error record must be in global memory");
  return success();
}

//===----------------------------------------------------------------------===//
// Warp specialisation
//===----------------------------------------------------------------------===//

LogicalResult GroupBarrierOp::verify() {
  if (getId() < 1 || getId() > 15) return emitOpError("id must be 1..15 (0 is the block's own barrier), got ") << getId();
  if (getThreads() <= 0 || getThreads() % 32 != 0)
    return emitOpError("threads must be a positive multiple of 32 (whole warps), got ") << getThreads();
  return verifyBlockThreads(*this, getThreads(), 0);
}

static LogicalResult verifyBarrierPtr(Operation* op, Type bar) {
  if (!isShared(bar)) return op->emitOpError("the mbarrier must be in shared memory (address space 3)");
  return success();
}
LogicalResult MbarrierInitOp::verify() { return verifyBarrierPtr(*this, getBar().getType()); }
LogicalResult MbarrierArriveOp::verify() { return verifyBarrierPtr(*this, getBar().getType()); }
LogicalResult MbarrierWaitOp::verify() { return verifyBarrierPtr(*this, getBar().getType()); }
LogicalResult AsyncArriveOp::verify() { return verifyBarrierPtr(*this, getBar().getType()); }
LogicalResult MbarrierExpectTxOp::verify() { return verifyBarrierPtr(*this, getBar().getType()); }
LogicalResult MbarrierArrivePeerOp::verify() { return verifyBarrierPtr(*this, getBar().getType()); }
LogicalResult SharedStorePeerOp::verify() {
  if (!isShared(getPtr().getType())) return emitOpError("the slot is shared memory (address space 3)");
  return success();
}
LogicalResult SharedCopyPeerOp::verify() {
  if (failed(verifyBarrierPtr(*this, getBar().getType()))) return failure();
  if (!isShared(getSrc().getType())) return emitOpError("the source is shared memory (address space 3)");
  if (getBytes() <= 0 || getBytes() % 16 != 0)
    return emitOpError("bytes must be a positive multiple of 16, got ") << getBytes();
  return success();
}
LogicalResult TmaLoadOp::verify() {
  if (failed(verifyBarrierPtr(*this, getBar().getType()))) return failure();
  if (!isShared(getDst().getType())) return emitOpError("the box lands in shared memory (address space 3)");
  if (getCoords().empty() || getCoords().size() > 5)
    return emitOpError("a tensor map has 1 to 5 dimensions, got ") << getCoords().size() << " coordinates";
  if (getMulticast() < 0 || getMulticast() > 0xFFFF) return emitOpError("multicast is a 16-bit mask of cluster CTAs");
  return success();
}

LogicalResult TmaStoreOp::verify() {
  if (!isShared(getSrc().getType())) return emitOpError("the box comes from shared memory (address space 3)");
  if (getCoords().empty() || getCoords().size() > 5)
    return emitOpError("a tensor map has 1 to 5 dimensions, got ") << getCoords().size() << " coordinates";
  return success();
}

LogicalResult SetMaxRegistersOp::verify() {
  if (getCount() < 24 || getCount() > 256 || getCount() % 8 != 0)
    return emitOpError("count must be a multiple of 8 in [24, 256], got ") << getCount();
  return success();
}

#define GET_OP_CLASSES
#include "megamoe/Dialect/MegaMoeOps.cpp.inc"
