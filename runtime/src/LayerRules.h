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
// FP8 rows carry one fp32 scale per 128 channels.
inline constexpr int64_t kFp8ScaleGroup = 128;

inline bool isFp8(const MoeLayerConfig& c) { return c.dtype == DType::kFp8E4m3; }
// The dtype's name in messages and in the ranks' rendezvous agreement.
inline const char* dtypeName(DType d) {
  return d == DType::kBf16 ? "bf16" : d == DType::kFp8E4m3 ? "fp8_e4m3" : "unknown";
}
// Bytes of one element of the rows the dispatch pushes and the receive pool holds: bf16, or e4m3 codes.
inline int64_t rowElemBytes(const MoeLayerConfig& c) { return isFp8(c) ? 1 : kBf16; }

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
