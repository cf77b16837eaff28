// Implementation of the kernel DSL (see Dsl.h): every handle operation becomes one or a few ops at the kernel's
// insertion point. This is the only DSL file that includes dialect headers.
#include "dsl/Dsl.h"

#include <cstdint>
#include <algorithm>
#include <cstddef>
#include <stdexcept>

#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Dialect/MegaMoe.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;

namespace megamoe::dsl {
namespace {
int64_t elemBytes(Elem e) {
  switch (e) {
    case Elem::e4m3: return 1;
    case Elem::bf16:
    case Elem::f16: return 2;
    case Elem::f32:
    case Elem::i32: return 4;
    case Elem::i64: return 8;
  }
  return 0;
}
Type ptrType(MLIRContext* ctx, unsigned space) { return LLVM::LLVMPointerType::get(ctx, space); }
bool mnMajor(Layout l) { return l == Layout::mn128B || l == Layout::mn128BBoxes; }
}  // namespace

const char* layoutName(Layout layout) {
  switch (layout) {
    case Layout::rowMajor: return "rowMajor (unswizzled)";
    case Layout::k128B: return "k128B (K-major, 128-byte swizzle)";
    case Layout::mn128B: return "mn128B (MN-major 128-byte swizzle atoms, K groups outermost)";
    case Layout::mn128BBoxes: return "mn128BBoxes (MN-major 128-byte swizzle atoms, MN atoms outermost: TMA boxes)";
  }
  return "?";
}

// The tile_copy swizzle that writes (or reads) `tile` in its layout; `what` names the copy for the message.
static Swizzle copySwizzle(const std::string& kernel, const SharedTile& tile, const char* what, bool mnAllowed) {
  switch (tile.layout()) {
    case Layout::rowMajor: return Swizzle::none;
    case Layout::k128B: return Swizzle::b128;
    case Layout::mn128B:
      if (mnAllowed) return Swizzle::b128_mn;
      break;
    case Layout::mn128BBoxes: break;
  }
  throw std::logic_error(kernel + ": " + what + " shared tile '" + tile.name() + "', which holds the " +
                         layoutName(tile.layout()) + " layout: " +
                         (mnAllowed ? "a tile copy writes rowMajor, k128B or mn128B (TMA boxes: tmaLoad)"
                                    : "this copy reads or writes rowMajor or k128B only"));
}

// A shared tile that a layout-blind access (row-major addresses) writes or reads.
static void requireRowMajor(const std::string& kernel, const SharedTile& tile, const char* what) {
  if (tile.layout() != Layout::rowMajor)
    throw std::logic_error(kernel + ": " + what + " shared tile '" + tile.name() + "', which holds the " +
                           layoutName(tile.layout()) + " layout; it writes and reads rowMajor (unswizzled)");
}

// A swizzled layout holds whole 1024-byte swizzle atoms from a 1024-byte aligned base.
static void checkAllocation(const std::string& kernel, const std::string& name, Elem e, int64_t rows, int64_t cols,
                            int64_t pitch, int64_t align, Layout layout) {
  if (layout == Layout::rowMajor) return;
  const int64_t rowBytes = cols * elemBytes(e);
  if (align != 1024 || pitch != cols || (layout == Layout::k128B ? rowBytes != 128 : rowBytes % 128 != 0) ||
      rows * rowBytes % 1024 != 0)
    throw std::invalid_argument(kernel + ": shared tile '" + name + "' in the " + layoutName(layout) +
                                " layout needs 1024-byte alignment, no row padding, rows of " +
                                (layout == Layout::k128B ? "128 bytes" : "a multiple of 128 bytes") +
                                " and whole 1024-byte atoms (it is " + std::to_string(rows) + " x " +
                                std::to_string(cols) + " at pitch " + std::to_string(pitch) + ", align " +
                                std::to_string(align) + ")");
}

static const char* staticAfterDynamic =
    "a kernel uses either static shared tiles or dynamic ones, not both: dynamic shared memory would start after "
    "the static part at a 16-byte alignment, breaking the 1024-byte alignment swizzled MMA operands need";


// ---- scalars ---------------------------------------------------------------------------------------------------

#define MEGAMOE_BINOP(OP, ARITH)                                                  \
  template <int B>                                                               \
  Int<B> Int<B>::operator OP(const Int<B>& o) const {                            \
    return {k_, ARITH::create(k_->builder(), k_->loc(), v_, o.v_)};              \
  }
MEGAMOE_BINOP(+, arith::AddIOp)
MEGAMOE_BINOP(-, arith::SubIOp)
MEGAMOE_BINOP(*, arith::MulIOp)
MEGAMOE_BINOP(/, arith::DivUIOp)
MEGAMOE_BINOP(%, arith::RemUIOp)
#undef MEGAMOE_BINOP

template <int B>
static Int<B> constant(Kernel* k, int64_t c) {
  return {k, arith::ConstantIntOp::create(k->builder(), k->loc(), c, B)};
}
template <int B> Int<B> Int<B>::operator+(int64_t c) const { return *this + constant<B>(k_, c); }
template <int B> Int<B> Int<B>::operator-(int64_t c) const { return *this - constant<B>(k_, c); }
template <int B> Int<B> Int<B>::operator*(int64_t c) const { return *this * constant<B>(k_, c); }
template <int B> Int<B> Int<B>::operator/(int64_t c) const { return *this / constant<B>(k_, c); }
template <int B> Int<B> Int<B>::operator%(int64_t c) const { return *this % constant<B>(k_, c); }
template <int B>
static Bool compare(Kernel* k, arith::CmpIPredicate p, Value a, Value b) {
  return {k, arith::CmpIOp::create(k->builder(), k->loc(), p, a, b)};
}
template <int B> Bool Int<B>::operator<(const Int& o) const { return compare<B>(k_, arith::CmpIPredicate::ult, v_, o.v_); }
template <int B> Bool Int<B>::operator>=(const Int& o) const { return compare<B>(k_, arith::CmpIPredicate::uge, v_, o.v_); }
template <int B> Bool Int<B>::operator==(const Int& o) const { return compare<B>(k_, arith::CmpIPredicate::eq, v_, o.v_); }
template <int B> Bool Int<B>::operator<(int64_t c) const { return *this < constant<B>(k_, c); }
template <int B> Bool Int<B>::operator==(int64_t c) const { return *this == constant<B>(k_, c); }
template class Int<32>;
template class Int<64>;

Bool Bool::operator&&(const Bool& o) const { return {k_, arith::AndIOp::create(k_->builder(), k_->loc(), v_, o.v_)}; }
Bool Bool::operator||(const Bool& o) const { return {k_, arith::OrIOp::create(k_->builder(), k_->loc(), v_, o.v_)}; }
Bool Bool::operator!() const {
  Value one = arith::ConstantIntOp::create(k_->builder(), k_->loc(), 1, 1);
  return {k_, arith::XOrIOp::create(k_->builder(), k_->loc(), v_, one)};
}

// ---- vectors ---------------------------------------------------------------------------------------------------

Vec Vec::to(Elem e) const {
  auto vt = cast<VectorType>(v_.getType());
  Type target = k_->type(e);
  if (vt.getElementType() == target) return *this;
  auto nt = VectorType::get(vt.getShape(), target);
  if (vt.getElementType().getIntOrFloatBitWidth() < target.getIntOrFloatBitWidth())
    return {k_, arith::ExtFOp::create(k_->builder(), k_->loc(), nt, v_)};
  return {k_, arith::TruncFOp::create(k_->builder(), k_->loc(), nt, v_)};
}
Vec Vec::toF32() const { return to(Elem::f32); }
Vec Vec::operator+(const Vec& o) const { return {k_, arith::AddFOp::create(k_->builder(), k_->loc(), v_, o.v_)}; }
Vec Vec::operator*(const Vec& o) const { return {k_, arith::MulFOp::create(k_->builder(), k_->loc(), v_, o.v_)}; }
// Approximate division (a reciprocal and a multiply, ~2 ulp): the IEEE-rounded divide is a long instruction sequence
// with a slow path, and in the SwiGLU epilogue of dispatch_grouped_gemm it cost 2.5 of 9.3 ms (H200, ncu + variants).
Vec Vec::operator/(const Vec& o) const {
  auto op = arith::DivFOp::create(k_->builder(), k_->loc(), v_, o.v_);
  op.setFastmath(arith::FastMathFlags::afn | arith::FastMathFlags::arcp);
  return {k_, op};
}
Vec Vec::operator-() const { return {k_, arith::NegFOp::create(k_->builder(), k_->loc(), v_)}; }
// llvm.exp2 directly: both backends have a native instruction (ex2.approx / v_exp_f32); math.exp2 would become a
// device-library call (__nv_exp2f / __ocml_exp2_f32) that the code objects cannot resolve.
// (As a call_intrinsic: the GPU conversions mark llvm.intr.exp2 illegal to force the library route.)
Vec Vec::exp2() const {
  auto vt = cast<VectorType>(v_.getType());
  if (!vt.getElementType().isF32()) throw std::invalid_argument("exp2 needs an f32 vector");
  std::string name = "llvm.exp2.v" + std::to_string(vt.getNumElements()) + "f32";
  return {k_, LLVM::CallIntrinsicOp::create(k_->builder(), k_->loc(), vt, k_->builder().getStringAttr(name), ValueRange{v_})
                  .getResult(0)};
}
Vec Vec::splat(float c) const {
  auto vt = cast<VectorType>(v_.getType());
  auto attr = DenseElementsAttr::get(vt, k_->builder().getFloatAttr(vt.getElementType(), c));
  return {k_, arith::ConstantOp::create(k_->builder(), k_->loc(), vt, attr)};
}
Vec Vec::stepLE(float c) const {
  Value keep = arith::CmpFOp::create(k_->builder(), k_->loc(), arith::CmpFPredicate::OLE, v_, splat(c).v_);
  return {k_, arith::SelectOp::create(k_->builder(), k_->loc(), keep, splat(1.f).v_, splat(0.f).v_)};
}
Vec Vec::sum() const {
  auto vt = cast<VectorType>(v_.getType());
  Value s = vector::ReductionOp::create(k_->builder(), k_->loc(), vector::CombiningKind::ADD, v_);
  return {k_, vector::BroadcastOp::create(k_->builder(), k_->loc(), VectorType::get({1}, vt.getElementType()), s)};
}
// vector.shuffle (a plain shufflevector on both targets).
Vec Vec::slice(int first, int n) const {
  SmallVector<int64_t> mask;
  for (int i = 0; i < n; ++i) mask.push_back(first + i);
  return {k_, vector::ShuffleOp::create(k_->builder(), k_->loc(), v_, v_, mask)};
}
Vec Vec::with(int first, const Vec& part) const {
  int64_t n = cast<VectorType>(v_.getType()).getNumElements(), m = cast<VectorType>(part.v_.getType()).getNumElements();
  SmallVector<int64_t> mask;
  for (int64_t i = 0; i < n; ++i) mask.push_back(i >= first && i < first + m ? n + (i - first) : i);
  return {k_, vector::ShuffleOp::create(k_->builder(), k_->loc(), v_, part.v_, mask)};
}
I64 Vec::laneI64(int lane) const {
  auto vt = cast<VectorType>(v_.getType());
  if (!vt.getElementType().isInteger(64) || lane < 0 || lane >= vt.getNumElements())
    throw std::invalid_argument("laneI64 needs an i64 vector and a lane inside it");
  return {k_, vector::ExtractOp::create(k_->builder(), k_->loc(), v_, ArrayRef<int64_t>{lane})};
}
// Compare + select: arith.minnumf/maxnumf would become libdevice calls (__nv_fminf) on sm_90a.
static Value selectBound(Kernel* k, Value v, Value bound, arith::CmpFPredicate keepIf) {
  Value keep = arith::CmpFOp::create(k->builder(), k->loc(), keepIf, v, bound);
  return arith::SelectOp::create(k->builder(), k->loc(), keep, v, bound);
}
Vec Vec::min(float c) const { return {k_, selectBound(k_, v_, splat(c).v_, arith::CmpFPredicate::ULE)}; }
Vec Vec::max(float c) const { return {k_, selectBound(k_, v_, splat(c).v_, arith::CmpFPredicate::UGE)}; }
Vec Vec::max(const Vec& o) const { return {k_, selectBound(k_, v_, o.v_, arith::CmpFPredicate::UGE)}; }
Vec Vec::abs() const { return max(-*this); }
Vec Vec::maxAll() const {
  Vec m = *this;
  for (int n = int(cast<VectorType>(v_.getType()).getNumElements()); n > 1; n /= 2) {
    Vec folded = m.slice(0, n / 2).max(m.slice(n / 2, n / 2));
    if (n % 2) folded = folded.with(0, folded.slice(0, 1).max(m.slice(n - 1, 1)));  // an odd count's last element
    m = folded;
  }
  return m;
}
Vec Vec::repeat(int n) const {
  auto vt = cast<VectorType>(v_.getType());
  if (vt.getNumElements() != 1) throw std::invalid_argument("repeat needs a 1-element vector");
  Value one = vector::ExtractOp::create(k_->builder(), k_->loc(), v_, ArrayRef<int64_t>{0});
  return {k_, vector::BroadcastOp::create(k_->builder(), k_->loc(), VectorType::get({n}, vt.getElementType()), one)};
}
Vec Vec::quotient(const Vec& o) const { return {k_, arith::DivFOp::create(k_->builder(), k_->loc(), v_, o.v_)}; }
Vec Vec::toE4m3() const {
  auto vt = cast<VectorType>(v_.getType());
  if (!vt.getElementType().isF32()) throw std::invalid_argument("toE4m3 needs an f32 vector");
  auto codes = VectorType::get(vt.getShape(), k_->builder().getI8Type());
  return {k_, PackE4m3Op::create(k_->builder(), k_->loc(), codes, v_)};
}

// ---- pointers --------------------------------------------------------------------------------------------------

GlobalPtr GlobalPtr::operator+(const I64& elements) const {
  return {k_, LLVM::GEPOp::create(k_->builder(), k_->loc(), v_.getType(), k_->storageType(elem_), v_, ValueRange{elements.value()}),
          elem_};
}
Vec GlobalPtr::load(int n) const {
  auto vt = VectorType::get({n}, k_->storageType(elem_));
  unsigned align = unsigned(std::min<int64_t>(16, n * elemBytes(elem_)));
  return {k_, LLVM::LoadOp::create(k_->builder(), k_->loc(), vt, v_, align)};
}
void GlobalPtr::store(const Vec& v) const {
  auto vt = cast<VectorType>(v.value().getType());
  unsigned align = unsigned(std::min<int64_t>(16, vt.getNumElements() * elemBytes(elem_)));
  LLVM::StoreOp::create(k_->builder(), k_->loc(), v.value(), v_, align);
}
void GlobalPtr::storeI32(const I32& v) const { LLVM::StoreOp::create(k_->builder(), k_->loc(), v.value(), v_, 4); }
void GlobalPtr::storeI64(const I64& v) const { LLVM::StoreOp::create(k_->builder(), k_->loc(), v.value(), v_, 8); }
I32 GlobalPtr::loadI32() const {
  return {k_, LLVM::LoadOp::create(k_->builder(), k_->loc(), k_->builder().getI32Type(), v_, 4)};
}
Vec GlobalPtr::loadSplat(int n) const {
  Value one = LLVM::LoadOp::create(k_->builder(), k_->loc(), k_->storageType(elem_), v_, unsigned(elemBytes(elem_)));
  auto vt = VectorType::get({n}, k_->storageType(elem_));
  return {k_, vector::BroadcastOp::create(k_->builder(), k_->loc(), vt, one)};
}
I32 GlobalPtr::atomicAddI32(const I32& v, bool acqRel) const {
  return {k_, LLVM::AtomicRMWOp::create(k_->builder(), k_->loc(), LLVM::AtomicBinOp::add, v_, v.value(),
                                        acqRel ? LLVM::AtomicOrdering::acq_rel : LLVM::AtomicOrdering::monotonic,
                                        /*syncscope=*/"", 4)};
}
I64 GlobalPtr::address() const {
  return {k_, LLVM::PtrToIntOp::create(k_->builder(), k_->loc(), k_->builder().getI64Type(), v_)};
}
I64 GlobalPtr::loadI64() const {
  return {k_, LLVM::LoadOp::create(k_->builder(), k_->loc(), k_->builder().getI64Type(), v_, 8)};
}

// ---- device context --------------------------------------------------------------------------------------------

namespace {
Value contextField(Kernel* k, Value ctx, size_t offset) {
  Value off = arith::ConstantIntOp::create(k->builder(), k->loc(), int64_t(offset), 64);
  return LLVM::GEPOp::create(k->builder(), k->loc(), ctx.getType(), k->builder().getI8Type(), ctx, ValueRange{off});
}
}  // namespace
I32 Context::rank() const {
  return {k_, LLVM::LoadOp::create(k_->builder(), k_->loc(), k_->builder().getI32Type(),
                                   contextField(k_, p_, offsetof(abi::DeviceContext, rank)), 4)};
}
I32 Context::nranks() const {
  return {k_, LLVM::LoadOp::create(k_->builder(), k_->loc(), k_->builder().getI32Type(),
                                   contextField(k_, p_, offsetof(abi::DeviceContext, nranks)), 4)};
}
I64 Context::timeoutNs() const {
  return GlobalPtr(k_, contextField(k_, p_, offsetof(abi::DeviceContext, timeout_ns)), Elem::i64).loadI64();
}
I64 Context::epoch() const {
  return GlobalPtr(k_, contextField(k_, p_, offsetof(abi::DeviceContext, epoch)), Elem::i64).loadI64();
}
GlobalPtr Context::epochSlot() const {
  return {k_, contextField(k_, p_, offsetof(abi::DeviceContext, epoch)), Elem::i64};
}
GlobalPtr Context::error() const {
  I64 addr = GlobalPtr(k_, contextField(k_, p_, offsetof(abi::DeviceContext, error)), Elem::i64).loadI64();
  return {k_, LLVM::IntToPtrOp::create(k_->builder(), k_->loc(), p_.getType(), addr.value()), Elem::i64};
}
GlobalPtr Context::peerOffsets() const {
  return {k_, contextField(k_, p_, offsetof(abi::DeviceContext, peer_offset)), Elem::i64};
}

// ---- kernel ----------------------------------------------------------------------------------------------------

namespace {
const abi::KernelDecl& declared(std::string_view name) {
  if (const abi::KernelDecl* d = abi::findKernelDecl(name)) return *d;
  throw std::invalid_argument("kernel '" + std::string(name) + "' has no declaration in compiler/abi/Kernels.def");
}
abi::Elem abiElem(Elem e) {
  switch (e) {
    case Elem::bf16: return abi::Elem::kBf16;
    case Elem::f32: return abi::Elem::kF32;
    case Elem::i32: return abi::Elem::kI32;
    case Elem::i64: return abi::Elem::kI64;
    case Elem::e4m3: return abi::Elem::kE4m3;
    case Elem::f16: break;
  }
  return abi::Elem::kNone;
}
}  // namespace

Kernel::Kernel(MLIRContext& ctx, std::string_view name, int64_t blockThreads, bool tensorMaps)
    : Kernel(ctx, declared(name), blockThreads, tensorMaps) {}

Kernel::Kernel(MLIRContext& ctx, const abi::KernelDecl& decl, int64_t blockThreads, bool tensorMaps)
    : decl_(decl), tensorMaps_(tensorMaps), name_(decl.name), blockThreads_(blockThreads), b_(&ctx),
      loc_(NameLoc::get(b_.getStringAttr(name_))) {
  ctx.loadDialect<MegaMoeDialect, LLVM::LLVMDialect, gpu::GPUDialect, scf::SCFDialect, arith::ArithDialect,
                  math::MathDialect, vector::VectorDialect>();
  if (blockThreads <= 0 || blockThreads > 1024) throw std::invalid_argument("block size must be 1..1024 threads");
  module_ = ModuleOp::create(loc_);
  (*module_)->setAttr("gpu.container_module", b_.getUnitAttr());
  b_.setInsertionPointToEnd(module_->getBody());
  auto gm = gpu::GPUModuleOp::create(b_, loc_, name_ + "_module");
  gpuModule_ = gm;
  b_.setInsertionPointToStart(gm.getBody());
  auto fnType = LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(&ctx), {});
  auto fn = LLVM::LLVMFuncOp::create(b_, loc_, name_, fnType);
  fn->setAttr("megamoe.kernel", b_.getUnitAttr());
  fn->setAttr("megamoe.block_threads", b_.getI64IntegerAttr(blockThreads));
  fn->setAttr("megamoe.signature", b_.getStringAttr(abi::signatureHash(decl_)));
  func_ = fn;
  Block* entry = fn.addEntryBlock(b_);
  b_.setInsertionPointToStart(entry);
  MLIRContext* c = b_.getContext();
  for (const abi::ArgDecl& a : decl_.args) {
    switch (a.kind) {
      case abi::ArgKind::kPtr:
      case abi::ArgKind::kContext: args_.push_back(addArg(ptrType(c, kGlobalSpace))); break;
      case abi::ArgKind::kI32: args_.push_back(addArg(b_.getI32Type())); break;
      case abi::ArgKind::kI64: args_.push_back(addArg(b_.getI64Type())); break;
      case abi::ArgKind::kTensorMap: {
        if (!tensorMaps_) {  // the same argument list on every target: an unused pointer
          args_.push_back(addArg(ptrType(c, kGlobalSpace)));
          break;
        }
        // By value and grid-constant (../shared/TOOLCHAIN.md): without nvvm.grid_constant LLVM copies the map to
        // local memory and TMA faults. The generic pointer is the parameter's own address.
        NamedAttribute attrs[] = {
            b_.getNamedAttr("llvm.byval", TypeAttr::get(LLVM::LLVMArrayType::get(b_.getI8Type(), 128))),
            b_.getNamedAttr("llvm.align", b_.getI64IntegerAttr(64)),
            b_.getNamedAttr("nvvm.grid_constant", b_.getUnitAttr())};
        args_.push_back(addArg(ptrType(c, 0), b_.getDictionaryAttr(attrs)));
        break;
      }
    }
  }
}

Value Kernel::arg(std::string_view name, abi::ArgKind kind, abi::Elem elem) {
  const int i = decl_.indexOf(name);
  if (i < 0) throw std::invalid_argument(name_ + " declares no argument '" + std::string(name) + "'");
  const abi::ArgDecl& a = decl_.args[size_t(i)];
  if (a.kind != kind || a.elem != elem)
    throw std::invalid_argument(name_ + "'s argument '" + std::string(name) + "' is declared " +
                                abi::argKindName(a.kind) + (a.elem != abi::Elem::kNone ? " of " : "") +
                                abi::elemName(a.elem) + "; the builder reads it as " + abi::argKindName(kind) +
                                (elem != abi::Elem::kNone ? " of " : "") + abi::elemName(elem));
  return args_[size_t(i)];
}

Kernel::~Kernel() = default;

Type Kernel::type(Elem e) {
  switch (e) {
    case Elem::bf16: return b_.getBF16Type();
    case Elem::f16: return b_.getF16Type();
    case Elem::f32: return b_.getF32Type();
    case Elem::i32: return b_.getI32Type();
    case Elem::i64: return b_.getI64Type();
    case Elem::e4m3: return b_.getType<Float8E4M3FNType>();
  }
  return {};
}

Type Kernel::storageType(Elem e) { return e == Elem::e4m3 ? Type(b_.getI8Type()) : type(e); }

Value Kernel::addArg(Type t, DictionaryAttr attrs) {
  auto fn = cast<LLVM::LLVMFuncOp>(func_);
  Block& entry = fn.getBody().front();
  Value arg = entry.addArgument(t, loc_);
  SmallVector<Type> inputs(entry.getArgumentTypes());
  fn.setFunctionTypeAttr(TypeAttr::get(LLVM::LLVMFunctionType::get(LLVM::LLVMVoidType::get(b_.getContext()), inputs)));
  // Argument attributes: one dictionary per argument once any argument has some.
  ArrayAttr existing = fn.getArgAttrsAttr();
  if (attrs || existing) {
    SmallVector<Attribute> dicts;
    for (unsigned i = 0; i + 1 < inputs.size(); ++i)
      dicts.push_back(existing && i < existing.size() ? existing[i] : DictionaryAttr::get(b_.getContext()));
    dicts.push_back(attrs ? attrs : DictionaryAttr::get(b_.getContext()));
    fn.setArgAttrsAttr(ArrayAttr::get(b_.getContext(), dicts));
  }
  return arg;
}

GlobalPtr Kernel::ptr(std::string_view name, Elem e) {
  return {this, arg(name, abi::ArgKind::kPtr, abiElem(e)), e};
}
I32 Kernel::i32Arg(std::string_view name) { return {this, arg(name, abi::ArgKind::kI32)}; }
I64 Kernel::i64Arg(std::string_view name) { return {this, arg(name, abi::ArgKind::kI64)}; }
Context Kernel::context() { return {this, arg("ctx", abi::ArgKind::kContext)}; }
std::optional<TensorMap> Kernel::tensorMap(std::string_view name, const abi::SpecConstants& spec) {
  Value v = arg(name, abi::ArgKind::kTensorMap);
  const abi::TensorMapBox box = abi::tensorMapBox(decl_, name, spec);
  if (!tensorMaps_) return std::nullopt;
  return TensorMap(v, box);
}

I32 Kernel::i32(int64_t v) { return constant<32>(this, v); }
I64 Kernel::i64(int64_t v) { return constant<64>(this, v); }
I64 Kernel::widen(const I32& v) { return {this, arith::ExtUIOp::create(b_, loc_, b_.getI64Type(), v.value())}; }
I64 Kernel::widenSigned(const I32& v) { return {this, arith::ExtSIOp::create(b_, loc_, b_.getI64Type(), v.value())}; }
I32 Kernel::narrow(const I64& v) { return {this, arith::TruncIOp::create(b_, loc_, b_.getI32Type(), v.value())}; }
Vec Kernel::vec(const std::vector<I32>& values) {
  if (values.empty()) throw std::invalid_argument("vec needs at least one value");
  SmallVector<Value> elements;
  for (const I32& v : values) elements.push_back(v.value());
  auto vt = VectorType::get({int64_t(values.size())}, b_.getI32Type());
  return {this, vector::FromElementsOp::create(b_, loc_, vt, elements)};
}
I32 Kernel::threadIdx() {
  Value id = gpu::ThreadIdOp::create(b_, loc_, gpu::Dimension::x);
  return {this, arith::IndexCastUIOp::create(b_, loc_, b_.getI32Type(), id)};
}
I32 Kernel::blockIdx(int dim) {
  gpu::Dimension d = dim == 0 ? gpu::Dimension::x : dim == 1 ? gpu::Dimension::y : gpu::Dimension::z;
  Value id = gpu::BlockIdOp::create(b_, loc_, d);
  return {this, arith::IndexCastUIOp::create(b_, loc_, b_.getI32Type(), id)};
}
Vec Kernel::zeros(int n, Elem e) {
  auto vt = VectorType::get({n}, type(e));
  return {this, arith::ConstantOp::create(b_, loc_, vt, DenseElementsAttr::get(vt, b_.getZeroAttr(type(e))))};
}

void Kernel::forRange(const I32& lo, const I32& hi, const I32& step, const std::function<void(I32)>& body) {
  auto loop = scf::ForOp::create(b_, loc_, lo.value(), hi.value(), step.value());
  OpBuilder::InsertionGuard guard(b_);
  b_.setInsertionPoint(loop.getBody()->getTerminator());
  body(I32(this, loop.getInductionVar()));
}

std::vector<I32> Kernel::scalars(ValueRange values) {
  std::vector<I32> out;
  for (Value v : values) out.emplace_back(this, v);
  return out;
}

std::vector<Value> Kernel::loop(const I32& lo, const I32& hi, const I32& step, const std::vector<Value>& init,
                                const std::function<std::vector<Value>(I32, std::vector<Value>)>& body) {
  auto loop = scf::ForOp::create(b_, loc_, lo.value(), hi.value(), step.value(), init);
  {
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToEnd(loop.getBody());
    auto args = loop.getRegionIterArgs();
    std::vector<Value> next = body(I32(this, loop.getInductionVar()), std::vector<Value>(args.begin(), args.end()));
    if (next.size() != init.size()) throw std::logic_error("forRange body must return one value per carried value");
    scf::YieldOp::create(b_, loc_, next);
  }
  auto results = loop.getResults();
  return std::vector<Value>(results.begin(), results.end());
}

Acc Kernel::forRange(const I32& lo, const I32& hi, const I32& step, const Acc& init,
                     const std::function<Acc(I32, Acc)>& body) {
  return forRange(lo, hi, step, init, {}, [&](I32 i, Acc a, const std::vector<I32>&) {
           return std::pair<Acc, std::vector<I32>>{body(i, a), {}};
         }).first;
}

std::pair<Acc, std::vector<I32>> Kernel::forRange(
    const I32& lo, const I32& hi, const I32& step, const Acc& init, const std::vector<I32>& scalars,
    const std::function<std::pair<Acc, std::vector<I32>>(I32, Acc, const std::vector<I32>&)>& body) {
  Carried out = forRange(lo, hi, step, Carried{{init}, {}, scalars}, [&](I32 i, const Carried& c) {
    auto [acc, next] = body(i, c.accs[0], c.scalars);
    return Carried{{acc}, {}, next};
  });
  return {out.accs[0], out.scalars};
}

Kernel::Carried Kernel::forRange(const I32& lo, const I32& hi, const I32& step, const Carried& init,
                                 const std::function<Carried(I32, const Carried&)>& body) {
  std::vector<Value> inits;
  for (const Acc& a : init.accs) inits.push_back(a.value);
  for (const Vec& v : init.vecs) inits.push_back(v.value());
  for (const I32& v : init.scalars) inits.push_back(v.value());
  auto unpack = [&](const std::vector<Value>& vs) {
    Carried c;
    size_t at = 0;
    for (const Acc& a : init.accs) c.accs.push_back(Acc{vs[at++], a.m, a.n});
    for (size_t i = 0; i < init.vecs.size(); ++i) c.vecs.emplace_back(this, vs[at++]);
    for (size_t i = 0; i < init.scalars.size(); ++i) c.scalars.emplace_back(this, vs[at++]);
    return c;
  };
  std::vector<Value> out = loop(lo, hi, step, inits, [&](I32 i, std::vector<Value> carried) {
    Carried next = body(i, unpack(carried));
    if (next.accs.size() != init.accs.size() || next.vecs.size() != init.vecs.size() ||
        next.scalars.size() != init.scalars.size())
      throw std::logic_error("forRange body must return what it carries: as many accumulators, vectors and scalars");
    std::vector<Value> yields;
    for (const Acc& a : next.accs) yields.push_back(a.value);
    for (const Vec& v : next.vecs) yields.push_back(v.value());
    for (const I32& v : next.scalars) yields.push_back(v.value());
    return yields;
  });
  return unpack(out);
}

Vec Kernel::forRange(const I32& lo, const I32& hi, const I32& step, const Vec& init,
                     const std::function<Vec(I32, Vec)>& body) {
  Acc carried = forRange(lo, hi, step, Acc{init.value(), 0, 0}, [&](I32 i, Acc a) {
    return Acc{body(i, Vec(this, a.value)).value(), 0, 0};
  });
  return {this, carried.value};
}

std::vector<I32> Kernel::forRange(const I32& lo, const I32& hi, const I32& step, const std::vector<I32>& init,
                                  const std::function<std::vector<I32>(I32, const std::vector<I32>&)>& body) {
  std::vector<Value> inits;
  for (const I32& v : init) inits.push_back(v.value());
  return scalars(loop(lo, hi, step, inits, [&](I32 i, std::vector<Value> carried) {
    std::vector<Value> yields;
    for (const I32& v : body(i, scalars(carried))) yields.push_back(v.value());
    return yields;
  }));
}

std::vector<I32> Kernel::whileLoop(const std::vector<I32>& init,
                                   const std::function<Bool(const std::vector<I32>&)>& cond,
                                   const std::function<std::vector<I32>(const std::vector<I32>&)>& body) {
  SmallVector<Value> inits;
  SmallVector<Type> types;
  for (const I32& v : init) {
    inits.push_back(v.value());
    types.push_back(v.value().getType());
  }
  OpBuilder::InsertionGuard guard(b_);
  auto loop = scf::WhileOp::create(
      b_, loc_, types, inits,
      [&](OpBuilder& nested, Location, ValueRange args) {
        b_.setInsertionPointToEnd(nested.getInsertionBlock());
        Bool go = cond(scalars(args));
        scf::ConditionOp::create(b_, loc_, go.value(), args);
      },
      [&](OpBuilder& nested, Location, ValueRange args) {
        b_.setInsertionPointToEnd(nested.getInsertionBlock());
        std::vector<I32> next = body(scalars(args));
        if (next.size() != init.size()) throw std::logic_error("whileLoop body must return one value per carried value");
        SmallVector<Value> yields;
        for (const I32& v : next) yields.push_back(v.value());
        scf::YieldOp::create(b_, loc_, yields);
      });
  return scalars(loop.getResults());
}

I32 Kernel::select(const Bool& cond, const I32& a, const I32& b) {
  return {this, arith::SelectOp::create(b_, loc_, cond.value(), a.value(), b.value())};
}

Vec Kernel::select(const Bool& cond, const Vec& a, const Vec& b) {
  return {this, arith::SelectOp::create(b_, loc_, cond.value(), a.value(), b.value())};
}

void Kernel::ifThen(const Bool& cond, const std::function<void()>& body) {
  auto op = scf::IfOp::create(b_, loc_, TypeRange{}, cond.value(), false);
  OpBuilder::InsertionGuard guard(b_);
  b_.setInsertionPoint(op.thenBlock()->getTerminator());
  body();
}

I32 Kernel::ifElse(const Bool& cond, const std::function<I32()>& then, const I32& otherwise) {
  auto op = scf::IfOp::create(b_, loc_, TypeRange{b_.getI32Type()}, cond.value(), /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPointToStart(op.thenBlock());
    I32 v = then();
    scf::YieldOp::create(b_, loc_, ValueRange{v.value()});
    b_.setInsertionPointToStart(op.elseBlock());
    scf::YieldOp::create(b_, loc_, ValueRange{otherwise.value()});
  }
  return {this, op.getResult(0)};
}

void Kernel::returnIf(const Bool& cond) {
  Block* here = b_.getInsertionBlock();
  if (here->getParentOp() != func_)
    throw std::logic_error("returnIf is only allowed at the top level of the kernel body, not inside loops or ifs");
  Region* region = here->getParent();
  Block* exit = b_.createBlock(region, region->end());
  LLVM::ReturnOp::create(b_, loc_, ValueRange{});
  Block* cont = b_.createBlock(region, region->end());
  b_.setInsertionPointToEnd(here);
  LLVM::CondBrOp::create(b_, loc_, cond.value(), exit, cont);
  b_.setInsertionPointToStart(cont);
}

SharedTile Kernel::sharedTile(std::string name, Elem e, int64_t rows, int64_t cols, Layout layout) {
  if (dynamicSharedBytes_ > 0) throw std::logic_error(staticAfterDynamic);
  checkAllocation(name_, name, e, rows, cols, cols, 1024, layout);
  int64_t bytes = rows * cols * elemBytes(e);
  auto arrayTy = LLVM::LLVMArrayType::get(b_.getI8Type(), uint64_t(bytes));
  std::string sym = name_ + "_smem" + std::to_string(sharedCount_++);
  {
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPoint(func_);
    LLVM::GlobalOp::create(b_, loc_, arrayTy, false, LLVM::Linkage::Internal, sym, Attribute(), 1024, kSharedSpace);
  }
  Value base = LLVM::AddressOfOp::create(b_, loc_, ptrType(b_.getContext(), kSharedSpace), sym);
  return {this, base, std::move(name), e, rows, cols, 1, 0, layout};
}

int64_t SharedTile::bytes() const { return rows_ * pitch_ * elemBytes(elem_); }
SharedTile SharedTile::view(Value base, int64_t rows, int64_t cols) const {
  return {k_, base, name_, elem_, rows, cols, 1, pitch_, layout_};
}
SharedTile SharedTile::stage(const I32& s) const {
  I64 offset = k_->widen(s) * bytes();
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI8Type(), base_,
                                ValueRange{offset.value()});
  return view(p, rows_, cols_);
}

SharedTile SharedTile::rowSlice(int64_t first, int64_t count) const {
  if (first < 0 || count <= 0 || first + count > rows_)
    throw std::invalid_argument("rowSlice outside shared tile '" + name_ + "'");
  const int64_t offset = first * pitch_ * elemBytes(elem_);
  if (swizzled() && offset % 1024 != 0)
    throw std::invalid_argument("rowSlice of shared tile '" + name_ + "' (" + layoutName(layout_) + ") at byte " +
                                std::to_string(offset) + ", not at a 1024-byte swizzle atom");
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI8Type(), base_,
                                ArrayRef<LLVM::GEPArg>{int32_t(offset)});
  return view(p, count, cols_);
}
SharedTile SharedTile::asRowsOf(int64_t firstRow) const {
  if (swizzled())
    throw std::invalid_argument("asRowsOf of shared tile '" + name_ + "': rowMajor tiles only, it is " +
                                layoutName(layout_));
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI8Type(), base_,
                                ArrayRef<LLVM::GEPArg>{int32_t(-firstRow * pitch_ * elemBytes(elem_))});
  return view(p, rows_, cols_);
}
SharedTile SharedTile::colSlice(int64_t first, int64_t count) const {
  if (first < 0 || count <= 0 || first + count > cols_)
    throw std::invalid_argument("colSlice outside shared tile '" + name_ + "'");
  if (swizzled())
    throw std::invalid_argument("colSlice of shared tile '" + name_ + "': rowMajor tiles only, it is " +
                                layoutName(layout_));
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI8Type(), base_,
                                ArrayRef<LLVM::GEPArg>{int32_t(first * elemBytes(elem_))});
  return view(p, rows_, count);
}
Vec SharedTile::load(const I32& row, const I32& col, int n) const {
  I32 index = row * pitch_ + col;
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->storageType(elem_), base_,
                                ValueRange{index.value()});
  auto vt = VectorType::get({n}, k_->storageType(elem_));
  return {k_, LLVM::LoadOp::create(k_->builder(), k_->loc(), vt, p, unsigned(std::min<int64_t>(16, n * elemBytes(elem_))))};
}

void SharedTile::store(const I32& row, const I32& col, const Vec& v) const {
  I32 index = row * pitch_ + col;
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->storageType(elem_), base_,
                                ValueRange{index.value()});
  auto n = cast<VectorType>(v.value().getType()).getNumElements();
  LLVM::StoreOp::create(k_->builder(), k_->loc(), v.value(), p, unsigned(std::min<int64_t>(16, n * elemBytes(elem_))));
}

I32 SharedTile::loadI32(const I32& index) const {
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI32Type(), base_,
                                ValueRange{index.value()});
  return {k_, LLVM::LoadOp::create(k_->builder(), k_->loc(), k_->builder().getI32Type(), p, 4)};
}
void SharedTile::storeI32(const I32& index, const I32& v) const {
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI32Type(), base_,
                                ValueRange{index.value()});
  LLVM::StoreOp::create(k_->builder(), k_->loc(), v.value(), p, 4);
}

void SharedTile::storePeerI32(const I32& index, const I32& v, const I32& cta) const {
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI32Type(), base_,
                                ValueRange{index.value()});
  SharedStorePeerOp::create(k_->builder(), k_->loc(), p, v.value(), cta.value());
}

I32 SharedTile::atomicAddI32(const I32& index, const I32& v) const {
  Value p = LLVM::GEPOp::create(k_->builder(), k_->loc(), base_.getType(), k_->builder().getI32Type(), base_,
                                ValueRange{index.value()});
  return {k_, LLVM::AtomicRMWOp::create(k_->builder(), k_->loc(), LLVM::AtomicBinOp::add, p, v.value(),
                                        LLVM::AtomicOrdering::monotonic, /*syncscope=*/"", 4)};
}

SharedTile Kernel::dynamicSharedTile(std::string name, Elem e, int64_t rows, int64_t cols, int64_t stages,
                                     Layout layout, int64_t pitch, int64_t align) {
  if (align < 16 || align > 1024 || (align & (align - 1)))
    throw std::invalid_argument("dynamicSharedTile: align must be a power of two in [16, 1024]");
  if (pitch == 0) pitch = cols;
  checkAllocation(name_, name, e, rows, cols, pitch, align, layout);
  // Dynamic shared memory starts after the static part, aligned only to 16 bytes: swizzled tiles need 1024.
  if (sharedCount_ > 0) throw std::logic_error(staticAfterDynamic);
  std::string sym = name_ + "_dynamic_smem";
  if (dynamicSharedBytes_ == 0) {
    OpBuilder::InsertionGuard guard(b_);
    b_.setInsertionPoint(func_);
    // A zero-sized external array in the shared space is the dynamic shared memory (gpu.dynamic_shared_memory
    // mislowers on LLVM 22's NVPTX, see ../shared/TOOLCHAIN.md).
    LLVM::GlobalOp::create(b_, loc_, LLVM::LLVMArrayType::get(b_.getI8Type(), 0), false, LLVM::Linkage::External, sym,
                           Attribute(), 1024, kSharedSpace);
  }
  int64_t offset = (dynamicSharedBytes_ + align - 1) / align * align;
  dynamicSharedBytes_ = offset + rows * pitch * elemBytes(e) * stages;
  func_->setAttr("megamoe.dynamic_shared_bytes", b_.getI64IntegerAttr(dynamicSharedBytes_));
  Value base = LLVM::AddressOfOp::create(b_, loc_, ptrType(b_.getContext(), kSharedSpace), sym);
  base = LLVM::GEPOp::create(b_, loc_, base.getType(), b_.getI8Type(), base, ArrayRef<LLVM::GEPArg>{int32_t(offset)});
  return {this, base, std::move(name), e, rows, cols, stages, pitch, layout};
}

// Every tile_copy the DSL emits: `tile` is the shared side (its shape and element type are the copy's).
static void createTileCopy(OpBuilder& b, Location loc, int64_t first, int64_t threads, Value src, Value srcLd, Value dst,
                           Value dstLd, Value rowsValid, const SharedTile& tile, Type elem, Swizzle swizzle, bool async,
                           Value rowIndex = {}) {
  TileCopyOp::create(b, loc, src, srcLd, dst, dstLd, rowsValid, uint64_t(tile.rows()), uint64_t(tile.cols()),
                     uint64_t(threads), elem, swizzle, /*transpose=*/false, async, uint64_t(first), rowIndex);
}

void Kernel::bulkStore(const SharedTile& src, const I32& row, const GlobalPtr& dst, int64_t bytes) {
  if (bytes <= 0 || bytes % 16 != 0) throw std::invalid_argument("bulkStore: bytes must be a positive multiple of 16");
  requireRowMajor(name_, src, "a bulkStore of a row of");
  I32 offset = row * (src.pitch() * elemBytes(src.elem()));
  Value p = LLVM::GEPOp::create(b_, loc_, src.value().getType(), b_.getI8Type(), src.value(), ValueRange{offset.value()});
  BulkStoreOp::create(b_, loc_, p, dst.value(), i32(bytes).value());
}
void Kernel::bulkCommit() { BulkCommitOp::create(b_, loc_); }
void Kernel::bulkWait(bool readOnly) { BulkWaitOp::create(b_, loc_, 0, readOnly); }
void Kernel::asyncCommit() { AsyncCommitOp::create(b_, loc_); }
void Kernel::asyncWait(int64_t pending) { AsyncWaitOp::create(b_, loc_, pending); }

Threads Kernel::block() {
  Threads view(this, 0, blockThreads_, 0);
  checkView(view, "block()");
  return view;
}
void Kernel::checkView(const Threads& view, const char* op) const {
  if (inGroup_ && view.barrier() == 0)
    throw std::logic_error(name_ + ": the block's " + op + " inside a group: the group's threads alone run there; "
                           "use the view the group's body gets");
}

void Threads::sync() const {
  k_->checkView(*this, "sync()");
  if (barrier_ == 0)
    gpu::BarrierOp::create(k_->builder(), k_->loc());
  else
    GroupBarrierOp::create(k_->builder(), k_->loc(), barrier_, count_);
}

void Kernel::namedBarrier(int id, int64_t threads, bool arriveOnly) {
  auto op = GroupBarrierOp::create(b_, loc_, id, threads);
  if (arriveOnly) op.setArrive(true);
}

void Kernel::group(int64_t first, int64_t threads, int barrier, const std::function<void(const Threads&)>& body) {
  if (first < 0 || threads <= 0 || first % 32 != 0 || threads % 32 != 0 || first + threads > blockThreads_)
    throw std::invalid_argument("group: threads [" + std::to_string(first) + ", " + std::to_string(first + threads) +
                                ") must be whole warps inside the block of " + std::to_string(blockThreads_));
  if (barrier < 1 || barrier > 15) throw std::invalid_argument("group: barrier must be 1..15 (0 is the block's)");
  if (inGroup_) throw std::logic_error("group: groups do not nest");
  I32 tid = threadIdx();
  ifThen(tid >= i32(first) && tid < i32(first + threads), [&] {
    inGroup_ = true;
    body(Threads(this, first, threads, barrier));
    inGroup_ = false;
  });
}

SharedTile Kernel::mbarriers(int64_t n) { return dynamicSharedTile("mbarriers", Elem::i64, 1, (n + 1) / 2 * 2, 1); }
Value Kernel::mbarrierAt(const SharedTile& bars, const I32& i) {
  return LLVM::GEPOp::create(b_, loc_, bars.value().getType(), b_.getI64Type(), bars.value(), ValueRange{i.value()});
}
void Kernel::mbarrierInit(const SharedTile& bars, const I32& i, int64_t count) {
  MbarrierInitOp::create(b_, loc_, mbarrierAt(bars, i), i32(count).value());
}
void Kernel::mbarrierArrive(const SharedTile& bars, const I32& i) { MbarrierArriveOp::create(b_, loc_, mbarrierAt(bars, i)); }
void Kernel::mbarrierWait(const SharedTile& bars, const I32& i, const I32& parity, bool clusterAcquire) {
  auto op = MbarrierWaitOp::create(b_, loc_, mbarrierAt(bars, i), parity.value());
  if (clusterAcquire) op.setCluster(true);
}
void Kernel::asyncArrive(const SharedTile& bars, const I32& i) { AsyncArriveOp::create(b_, loc_, mbarrierAt(bars, i)); }
void Kernel::proxyFence(bool global) {
  auto op = ProxyFenceOp::create(b_, loc_);
  if (global) op.setGlobal(true);
}
void Kernel::fence() { LLVM::FenceOp::create(b_, loc_, LLVM::AtomicOrdering::acq_rel, /*syncscope=*/""); }
void Kernel::mbarrierArriveExpectTx(const SharedTile& bars, const I32& i, int64_t bytes) {
  MbarrierExpectTxOp::create(b_, loc_, mbarrierAt(bars, i), i32(bytes).value());
}
// A tmaLoad's destination or a tmaStore's source holds exactly the map's declared box, in the layout its swizzle
// gives shared memory: sw128 rows of 128 bytes, chunk c of row r at c ^ (r % 8), a K-major tile's k128B or one MN
// atom of a tile whose atoms lie outermost (mn128BBoxes).
static void requireBoxTile(const std::string& kernel, const char* op, const TensorMap& map, const SharedTile& tile) {
  const abi::TensorMapBox& box = map.box();
  const abi::Elem elem = abiElem(tile.elem());
  const std::string declared = std::string("a ") + op + " of a declared " + std::to_string(box.cols) + " x " +
                               std::to_string(box.rows) + " " + abi::elemName(box.elem) + " " +
                               abi::swizzleName(box.swizzle) + " box with shared tile '" + tile.name() + "'";
  if (box.elem != elem || box.bytes() != tile.bytes())
    throw std::logic_error(kernel + ": " + declared + " of " + std::to_string(tile.bytes()) + " bytes");
  const bool boxLayout = box.swizzle == abi::Swizzle::k128B && box.cols * abi::elemBytes(box.elem) == 128 &&
                         (tile.layout() == Layout::k128B || tile.layout() == Layout::mn128BBoxes);
  if (!boxLayout)
    throw std::logic_error(kernel + ": " + declared + ", which holds the " + layoutName(tile.layout()) +
                           " layout; the box is 128-byte swizzled rows (k128B, or mn128BBoxes for K x MN tiles)");
}
static SmallVector<Value> coordValues(const std::vector<I32>& coords) {
  SmallVector<Value> c;
  for (const I32& v : coords) c.push_back(v.value());
  return c;
}
void Kernel::tmaLoad(const TensorMap& map, const std::vector<I32>& coords, const SharedTile& dst, const SharedTile& bars,
                     const I32& i, int64_t multicast) {
  requireBoxTile(name_, "tmaLoad", map, dst);
  TmaLoadOp::create(b_, loc_, map.value(), dst.value(), mbarrierAt(bars, i), coordValues(coords), multicast);
}
void Kernel::tmaStore(const TensorMap& map, const std::vector<I32>& coords, const SharedTile& src) {
  requireBoxTile(name_, "tmaStore", map, src);
  TmaStoreOp::create(b_, loc_, map.value(), src.value(), coordValues(coords));
}
void Kernel::mbarrierArrivePeer(const SharedTile& bars, const I32& i, const I32& cta, bool clusterRelease) {
  auto op = MbarrierArrivePeerOp::create(b_, loc_, mbarrierAt(bars, i), cta.value());
  if (clusterRelease) op.setCluster(true);
}
void Kernel::sharedCopyPeer(const SharedTile& src, const SharedTile& bars, const I32& i, const I32& cta) {
  const int64_t bytes = src.rows() * src.pitch() * elemBytes(src.elem());
  SharedCopyPeerOp::create(b_, loc_, src.value(), mbarrierAt(bars, i), cta.value(), bytes);
}
void Kernel::setClusterX(int64_t x) {
  if (x < 1 || x > 8) throw std::invalid_argument("cluster: 1..8 blocks");
  func_->setAttr("megamoe.cluster_x", b_.getI64IntegerAttr(x));
}
void Kernel::clusterSync() { ClusterSyncOp::create(b_, loc_); }
void Kernel::setMaxRegisters(int64_t count, bool increase) {
  auto op = SetMaxRegistersOp::create(b_, loc_, count);
  if (increase) op.setIncrease(true);
}

void Threads::copyTile(const GlobalPtr& src, const I32& srcLd, const SharedTile& dst, const I32& rowsValid,
                       Copy mode) const {
  k_->checkView(*this, "copyTile");
  const Swizzle swizzle = copySwizzle(k_->name(), dst, "a copyTile into", /*mnAllowed=*/true);
  createTileCopy(k_->builder(), k_->loc(), first_, count_, src.value(), srcLd.value(), dst.value(),
                 k_->i32(dst.cols()).value(), rowsValid.value(), dst, k_->type(dst.elem()), swizzle,
                 mode == Copy::async);
}
void Threads::copyTileGather(const GlobalPtr& src, const I32& srcLd, const SharedTile& rowIndex,
                             const SharedTile& dst, const I32& rowsValid, Copy mode) const {
  k_->checkView(*this, "copyTileGather");
  if (rowIndex.elem() != Elem::i32 || rowIndex.rows() * rowIndex.cols() < dst.rows())
    throw std::invalid_argument("copyTileGather: rowIndex must be an i32 table with an entry per row of dst");
  const Swizzle swizzle = copySwizzle(k_->name(), dst, "a copyTileGather into", /*mnAllowed=*/false);
  createTileCopy(k_->builder(), k_->loc(), first_, count_, src.value(), srcLd.value(), dst.value(),
                 k_->i32(dst.cols()).value(), rowsValid.value(), dst, k_->type(dst.elem()), swizzle,
                 mode == Copy::async, rowIndex.value());
}
void Threads::copyTile(const SharedTile& src, const GlobalPtr& dst, const I32& dstLd, const I32& rowsValid) const {
  k_->checkView(*this, "copyTile");
  const Swizzle swizzle = copySwizzle(k_->name(), src, "a copyTile out of", /*mnAllowed=*/false);
  createTileCopy(k_->builder(), k_->loc(), first_, count_, src.value(), k_->i32(src.pitch()).value(), dst.value(),
                 dstLd.value(), rowsValid.value(), src, k_->type(src.elem()), swizzle, /*async=*/false);
}

// The MMA atoms place warpgroup g's rows by thread index / 128: threads that run MMA tiles start at a warpgroup.
static void requireMmaGroup(int64_t first) {
  if (first % 128 != 0) throw std::logic_error("MMA tiles and accumulator stores need whole warpgroups");
}
Acc Threads::zeroAcc(int64_t m, int64_t n) const {
  k_->checkView(*this, "zeroAcc");
  requireMmaGroup(first_);
  int64_t perThread = m * n / count_;
  return {k_->zeros(int(perThread), Elem::f32).value(), m, n};
}
Acc Threads::mma(const Acc& acc, const SharedTile& a, const SharedTile& b, int64_t pending, bool aFirstRows,
                 const std::optional<I32>& k16) const {
  k_->checkView(*this, "mma");
  const std::string& kernel = k_->name();
  for (const auto& [operand, tile] : {std::pair<const char*, const SharedTile*>{"A", &a}, {"B", &b}})
    if (tile->layout() == Layout::rowMajor)
      throw std::logic_error(kernel + ": mma operand " + operand + ", shared tile '" + tile->name() +
                             "', holds the " + layoutName(tile->layout()) +
                             " layout; the MMA reads k128B, mn128B or mn128BBoxes tiles");
  const bool aMnMajor = mnMajor(a.layout()), bMnMajor = mnMajor(b.layout());
  if (aMnMajor && bMnMajor && a.layout() != b.layout())
    throw std::logic_error(kernel + ": mma operands in two MN-major placements, shared tile '" + a.name() + "' " +
                           layoutName(a.layout()) + " and '" + b.name() + "' " + layoutName(b.layout()) +
                           ": one MMA reads its MN-major operands in one");
  const bool mnAtomsOuter = a.layout() == Layout::mn128BBoxes || b.layout() == Layout::mn128BBoxes;
  const bool fp8 = a.elem() == Elem::e4m3;
  if (fp8 != (b.elem() == Elem::e4m3) || (!fp8 && (a.elem() != Elem::bf16 || b.elem() != Elem::bf16)))
    throw std::logic_error(kernel + ": mma operands '" + a.name() + "' and '" + b.name() +
                           "' must both be bf16 or both be e4m3");
  if (fp8 && (aMnMajor || bMnMajor || k16))
    throw std::logic_error(kernel + ": e4m3 mma operands are K-major k128B tiles (the FP8 MMAs do not transpose) "
                           "and take no k16 slice");
  int64_t k = aMnMajor ? a.rows() : a.cols();
  requireMmaGroup(first_);
  auto op = MmaTileOp::create(k_->builder(), k_->loc(), acc.value.getType(), acc.value, a.value(), b.value(),
                              k16 ? k16->value() : mlir::Value(), acc.m,
                              acc.n, k, count_, pending);
  if (aMnMajor) op.setAMnMajor(true);
  if (bMnMajor) op.setBMnMajor(true);
  if (mnAtomsOuter) op.setMnAtomsOuter(true);
  if (aFirstRows) op.setAFirstRows(true);
  if (fp8) op.setE4m3(true);
  return {op.getResult(), acc.m, acc.n};
}
Acc Kernel::drain(const Acc& acc, int64_t pending) {
  return {MmaDrainOp::create(b_, loc_, acc.value.getType(), acc.value, pending).getResult(), acc.m, acc.n};
}
Acc Threads::mmaFresh(const Acc& registers, const SharedTile& a, const SharedTile& b, int64_t pending) const {
  Acc out = mma(registers, a, b, pending);
  out.value.getDefiningOp<MmaTileOp>().setFresh(true);
  return out;
}
void Threads::storeAcc(const Acc& acc, const GlobalPtr& dst, const I32& ld, const I32& rowsValid) const {
  k_->checkView(*this, "storeAcc");
  requireMmaGroup(first_);
  AccStoreOp::create(k_->builder(), k_->loc(), acc.value, dst.value(), ld.value(), rowsValid.value(), acc.m, acc.n,
                     count_, k_->type(dst.elem()));
}

Vec Threads::rowScales(const Acc& like, int64_t rows, const GlobalPtr& rowScales, const I32& ld,
                       const I32& rowsValid, const std::vector<Vec>& factors) const {
  k_->checkView(*this, "rowScales");
  requireMmaGroup(first_);
  if (rowScales.elem() != Elem::f32) throw std::logic_error(k_->name() + ": the row scales are f32");
  if (rows < 1 || rows > like.m * like.n / count_)
    throw std::logic_error(k_->name() + ": rowScales of " + std::to_string(rows) + " rows per thread");
  if (factors.empty() || like.n % int64_t(factors.size()))
    throw std::logic_error(k_->name() + ": rowScales with " + std::to_string(factors.size()) +
                           " factors: one per equal column group of the " + std::to_string(like.n) + " columns");
  llvm::SmallVector<mlir::Value> f;
  for (const Vec& factor : factors)
    f.push_back(mlir::vector::ExtractOp::create(k_->builder(), k_->loc(), factor.value(), llvm::ArrayRef<int64_t>{0}));
  auto type = mlir::VectorType::get({rows * int64_t(factors.size())}, k_->builder().getF32Type());
  auto op = AccRowScalesOp::create(k_->builder(), k_->loc(), type, rowScales.value(), ld.value(), rowsValid.value(), f,
                                   like.m, like.n, count_);
  return {k_, op.getResult()};
}
Acc Threads::scaleAdd(const Acc& acc, const Acc& partial, const Vec& scales) const {
  k_->checkView(*this, "scaleAdd");
  requireMmaGroup(first_);
  if (acc.m != partial.m || acc.n != partial.n)
    throw std::logic_error(k_->name() + ": scaleAdd of a " + std::to_string(partial.m) + " x " +
                           std::to_string(partial.n) + " partial into a " + std::to_string(acc.m) + " x " +
                           std::to_string(acc.n) + " accumulator");
  auto op = AccScaleAddOp::create(k_->builder(), k_->loc(), acc.value.getType(), acc.value, partial.value,
                                  scales.value(), acc.m, acc.n, count_);
  return {op.getResult(), acc.m, acc.n};
}

void Threads::storeAcc(const Acc& acc, const SharedTile& dst) const {
  k_->checkView(*this, "storeAcc");
  requireMmaGroup(first_);
  // Every row (a group of a later warpgroup writes rows from 64g on: see SharedTile::asRowsOf); into TMA's boxes
  // (mn128BBoxes: 64-column atoms outermost), fragment row r at row r % rows() of its box.
  const bool boxes = dst.layout() == Layout::mn128BBoxes;
  if (!boxes) requireRowMajor(k_->name(), dst, "a storeAcc into");
  if (boxes && (dst.elem() != Elem::bf16 || acc.n != dst.cols() || dst.rows() < 64 || dst.rows() % 64 != 0))
    throw std::logic_error(k_->name() + ": a storeAcc into TMA boxes ('" + dst.name() +
                           "'): bf16, the accumulator's columns, whole warpgroups' 64 rows");
  AccStoreOp::create(k_->builder(), k_->loc(), acc.value, dst.value(), k_->i32(dst.pitch()).value(),
                     k_->i32(INT32_MAX).value(), acc.m, acc.n, count_, k_->type(dst.elem()), boxes ? dst.rows() : 0);
}

// Grid and rank barriers start with the block's own barrier: a group's threads alone would never meet the rest.
static void requireWholeBlock(bool inGroup, const std::string& kernel, const char* op) {
  if (inGroup) throw std::logic_error(kernel + ": " + op + " inside a group: every thread of the block takes part");
}
Bool Kernel::gridBarrier(const Context& ctx, const GlobalPtr& counter, const I64& expected) {
  requireWholeBlock(inGroup_, name_, "gridBarrier");
  return {this, GridBarrierOp::create(b_, loc_, b_.getI1Type(), counter.value(), expected.value(), ctx.timeoutNs().value(),
                                      ctx.error().value(), ctx.rank().value())};
}
Bool Kernel::rankBarrier(const Context& ctx, const GlobalPtr& flags, const I64& value) {
  requireWholeBlock(inGroup_, name_, "rankBarrier");
  return {this, RankBarrierOp::create(b_, loc_, b_.getI1Type(), flags.value(), ctx.peerOffsets().value(),
                                      ctx.rank().value(), ctx.nranks().value(), value.value(), ctx.timeoutNs().value(),
                                      ctx.error().value())};
}

GlobalPtr Kernel::peer(const Context& ctx, const GlobalPtr& local, const I32& peerRank) {
  return {this, PeerPtrOp::create(b_, loc_, local.value().getType(), local.value(), ctx.peerOffsets().value(), peerRank.value()),
          local.elem()};
}

static MemScope toScope(Scope s) {
  return s == Scope::cta ? MemScope::cta : s == Scope::gpu ? MemScope::gpu : MemScope::system;
}
void Kernel::signal(const GlobalPtr& flag, const I64& value, Scope scope, bool add) {
  SignalOp::create(b_, loc_, flag.value(), value.value(), toScope(scope), add ? SignalKind::add : SignalKind::store);
}
Bool Kernel::waitAtLeast(const Context& ctx, const GlobalPtr& flag, const I64& expected, const I64& flagId, Scope scope) {
  return {this, WaitOp::create(b_, loc_, b_.getI1Type(), flag.value(), expected.value(), ctx.timeoutNs().value(),
                               ctx.error().value(), ctx.rank().value(), flagId.value(), toScope(scope))};
}

Bool Kernel::errorClear(const Context& ctx) {
  Value code = LLVM::LoadOp::create(b_, loc_, b_.getI64Type(), ctx.error().value(), 8, false, false, false, false,
                                    LLVM::AtomicOrdering::acquire, "");
  return {this, arith::CmpIOp::create(b_, loc_, arith::CmpIPredicate::eq, code, i64(0).value())};
}

void Kernel::reportError(const Context& ctx, uint64_t code, const I64& flag, const I64& seen, const I64& expected) {
  GlobalPtr rec = ctx.error();
  Value claim = LLVM::AtomicCmpXchgOp::create(b_, loc_, rec.value(), i64(0).value(), i64(int64_t(code)).value(),
                                              LLVM::AtomicOrdering::acq_rel, LLVM::AtomicOrdering::monotonic, "");
  Bool claimed(this, LLVM::ExtractValueOp::create(b_, loc_, claim, ArrayRef<int64_t>{1}));
  ifThen(claimed, [&] {
    (rec + i64(abi::kErrorWordRank)).storeI64(widen(ctx.rank()));
    (rec + i64(abi::kErrorWordFlag)).storeI64(flag);
    (rec + i64(abi::kErrorWordSeen)).storeI64(seen);
    (rec + i64(abi::kErrorWordExpected)).storeI64(expected);
    (rec + i64(abi::kErrorWordBlock)).storeI64(widen(blockIdx()));
  });
}

OwningOpRef<ModuleOp> Kernel::finish() {
  LLVM::ReturnOp::create(b_, loc_, ValueRange{});
  return std::move(module_);
}

}  // namespace megamoe::dsl
