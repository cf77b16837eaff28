// Flag identities the communicating kernels report in the device error record (compiler/abi/DeviceAbi.h).
#pragma once
#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"

namespace megamoe::kernels {

// DeviceError::flag of a kernel's own flag `index` (a peer, a round, or source rank * 65536 + expert).
inline dsl::I64 userFlagId(dsl::Kernel& k, const dsl::I32& index) {
  return k.widen(index) + int64_t(abi::flagId(abi::FlagKind::kUser, 0));
}

}  // namespace megamoe::kernels
