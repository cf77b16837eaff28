// The rules that the MoE layer (MoeLayer.cpp) and its workspace (Workspace.cpp) both apply: the element size, the
// receive pool's rows and the prologue's scratch. Internal to the runtime (not installed).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"

namespace megamoe {

inline constexpr int64_t kBf16 = 2;

[[noreturn]] inline void invalid(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

// dispatch_prologue's blocks (each counts 1/16 of the picks; all resident, they meet once) and its scratch
// (compiler/abi/DeviceAbi.h prologueScratchBytes).
inline constexpr int32_t kPrologueBlocks = 16;
inline int64_t prologueScratchBytes(int64_t experts) { return abi::prologueScratchBytes(kPrologueBlocks, experts); }

// Rows of the receive pool: every rank may send every pick to one owner, unless the receive capacity is smaller.
inline int64_t poolRows(const MoeLayerConfig& c, int ranks) {
  const int64_t worst = int64_t(ranks) * c.maxTokens * c.topk;
  return c.receiveCapacity > 0 ? std::min(c.receiveCapacity, worst) : worst;
}

}  // namespace megamoe
