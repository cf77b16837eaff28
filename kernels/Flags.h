// Flag identities the communicating kernels report in the device error record (compiler/abi/DeviceAbi.h), and the
// end of the counters a kernel's blocks share within a launch.
#pragma once
#include <functional>

#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"

namespace megamoe::kernels {

// DeviceError::flag of a kernel's own flag `index` (a peer, a round, or source rank * 65536 + expert).
inline dsl::I64 userFlagId(dsl::Kernel& k, const dsl::I32& index) {
  return k.widen(index) + int64_t(abi::flagId(abi::FlagKind::kUser, 0));
}

// The calling thread, one per block, once its block is done with the counters the blocks share: counts the block in
// `done` (global i32, zero at launch); the last of `blocks` runs `reset`, which zeroes those counters (`done`
// included) for the next launch (a kernel boundary separates the two).
inline void resetIfLastBlock(dsl::Kernel& k, const dsl::GlobalPtr& done, const dsl::I32& blocks,
                             const std::function<void()>& reset) {
  dsl::I32 past = done.atomicAddI32(k.i32(1));
  k.ifThen(past == blocks - 1, reset);
}

}  // namespace megamoe::kernels
