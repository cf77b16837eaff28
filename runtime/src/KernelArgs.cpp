// Launch arguments by name (see KernelArgs.h).
#include "megamoe/KernelArgs.h"

#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "megamoe/Error.h"
#include "megamoe/KernelLoader.h"

namespace megamoe {
namespace {

const abi::KernelDecl& declared(std::string_view kernel) {
  if (const abi::KernelDecl* d = abi::findKernelDecl(kernel)) return *d;
  throw Error(ErrorCode::kInvalidArgument,
              "kernel '" + std::string(kernel) + "' has no declaration (compiler/abi/Kernels.def)");
}

}  // namespace

KernelArgs::KernelArgs(const abi::KernelDecl& decl) : decl_(decl), slots_(decl.args.size()) {
  for (Slot& s : slots_) {
    std::memset(s.bytes, 0, sizeof s.bytes);
    s.set = false;
  }
}

KernelArgs::KernelArgs(std::string_view kernel) : KernelArgs(declared(kernel)) {}

KernelArgs::Slot& KernelArgs::slot(std::string_view name, abi::ArgKind kind) {
  const int i = decl_.indexOf(name);
  if (i < 0)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(decl_.name) + " has no argument '" + std::string(name) + "' (" + abi::signatureText(decl_) +
                    ")");
  const abi::ArgDecl& a = decl_.args[size_t(i)];
  if (a.kind != kind)
    throw Error(ErrorCode::kInvalidArgument, std::string(decl_.name) + "'s argument '" + std::string(name) +
                                                 "' is a " + abi::argKindName(a.kind) + ", set as a " +
                                                 abi::argKindName(kind));
  Slot& s = slots_[size_t(i)];
  s.set = true;
  return s;
}

KernelArgs& KernelArgs::ptr(std::string_view name, DevicePtr value) {
  std::memcpy(slot(name, abi::ArgKind::kPtr).bytes, &value, sizeof value);
  return *this;
}

KernelArgs& KernelArgs::context(DevicePtr value) {
  std::memcpy(slot("ctx", abi::ArgKind::kContext).bytes, &value, sizeof value);
  return *this;
}

KernelArgs& KernelArgs::i32(std::string_view name, int64_t value) {
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
    throw Error(ErrorCode::kInvalidArgument, std::string(decl_.name) + "'s argument '" + std::string(name) + "' = " +
                                                 std::to_string(value) + " does not fit an i32");
  const int32_t v = int32_t(value);
  std::memcpy(slot(name, abi::ArgKind::kI32).bytes, &v, sizeof v);
  return *this;
}

KernelArgs& KernelArgs::i64(std::string_view name, int64_t value) {
  std::memcpy(slot(name, abi::ArgKind::kI64).bytes, &value, sizeof value);
  return *this;
}

KernelArgs& KernelArgs::tensorMap(std::string_view name, const TensorMapBytes& map) {
  std::memcpy(slot(name, abi::ArgKind::kTensorMap).bytes, map.data(), map.size());
  return *this;
}

void** KernelArgs::params() {
  pointers_.clear();
  for (size_t i = 0; i < slots_.size(); ++i) {
    if (!slots_[i].set)
      throw Error(ErrorCode::kInvalidArgument, std::string(decl_.name) + "'s argument '" +
                                                   std::string(decl_.args[i].name) + "' was not set");
    pointers_.push_back(slots_[i].bytes);
  }
  return pointers_.data();
}

TensorMapBytes encodeTensorMap(const Kernel& kernel, std::string_view arg, DevicePtr base, int64_t rows,
                               int64_t cols) {
  const abi::KernelDecl& decl = declared(kernel.key().kernel);
  abi::TensorMapBox box{};
  try {
    box = abi::tensorMapBox(decl, arg, kernel.key().spec);
  } catch (const std::invalid_argument& e) {
    throw Error(ErrorCode::kInvalidArgument, e.what());
  }
  if (rows < 1 || cols < 1)
    throw Error(ErrorCode::kInvalidArgument, std::string(decl.name) + "." + std::string(arg) + ": a [" +
                                                 std::to_string(rows) + ", " + std::to_string(cols) +
                                                 "] matrix (rows and cols must be positive)");
  if (kernel.device().kind() != BackendKind::kCuda) return TensorMapBytes{};
  if ((box.elem != abi::Elem::kBf16 && box.elem != abi::Elem::kE4m3) || box.swizzle != abi::Swizzle::k128B)
    throw Error(ErrorCode::kUnsupported, std::string(decl.name) + "." + std::string(arg) +
                                             ": the device encodes bf16 and e4m3 maps with the 128-byte swizzle only");
  const uint64_t dims[2] = {uint64_t(cols), uint64_t(rows)};
  const uint64_t strides[1] = {uint64_t(cols) * uint64_t(abi::elemBytes(box.elem))};
  const uint32_t boxDims[2] = {uint32_t(box.cols), uint32_t(box.rows)};
  const Device::MapElem elem = box.elem == abi::Elem::kE4m3 ? Device::MapElem::kU8 : Device::MapElem::kBf16;
  return kernel.device().encodeTensorMap(elem, base, 2, dims, strides, boxDims);
}

}  // namespace megamoe
