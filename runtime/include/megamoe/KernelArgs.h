// The arguments of one launch, filled by name from the kernel's declaration (compiler/abi/KernelAbi.h): each setter
// checks that the kernel declares the argument with that kind, and params() that every argument was set, giving the
// driver's parameter array in declaration order. Nothing positional is written at a launch site, and no tensor-map
// box either: encodeTensorMap takes it from the declaration.
#pragma once
#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "compiler/abi/KernelAbi.h"
#include "megamoe/Backend.h"

namespace megamoe {

using TensorMapBytes = std::array<uint8_t, 128>;  // a CUtensorMap (Device::encodeTensorMap); zeros off CUDA

class Kernel;  // megamoe/KernelLoader.h

// The CUtensorMap of tensor-map argument `arg` of `kernel` over a row-major [rows, cols] matrix at `base`, in the
// box the kernel's declaration gives for its constants (abi::tensorMapBox: the box the kernel loads). Zeros where
// the kernel's device has no TMA (off CUDA the argument is an unused pointer). Error(kInvalidArgument) for an
// argument that is no tensor map of the kernel, or a shape that is not positive.
TensorMapBytes encodeTensorMap(const Kernel& kernel, std::string_view arg, DevicePtr base, int64_t rows,
                               int64_t cols);

class KernelArgs {
 public:
  explicit KernelArgs(const abi::KernelDecl& decl);
  // The declared kernel of that name (Error(kInvalidArgument) when none is).
  explicit KernelArgs(std::string_view kernel);
  KernelArgs(const KernelArgs&) = delete;
  KernelArgs& operator=(const KernelArgs&) = delete;
  KernelArgs(KernelArgs&&) = default;  // params() rebuilds its pointers, so a moved-from set stays valid

  KernelArgs& ptr(std::string_view name, DevicePtr value);
  KernelArgs& context(DevicePtr value);  // "ctx"
  KernelArgs& i32(std::string_view name, int64_t value);  // Error(kInvalidArgument) outside int32
  KernelArgs& i64(std::string_view name, int64_t value);
  KernelArgs& tensorMap(std::string_view name, const TensorMapBytes& map);

  const abi::KernelDecl& decl() const { return decl_; }
  // Error(kInvalidArgument) naming the first argument not set.
  void** params();

 private:
  struct alignas(64) Slot {
    uint8_t bytes[128];
    bool set;
  };
  Slot& slot(std::string_view name, abi::ArgKind kind);
  const abi::KernelDecl& decl_;
  std::vector<Slot> slots_;
  std::vector<void*> pointers_;
};

}  // namespace megamoe
