// What one block may use on each target: the budgets codegen checks, the dialect verifier's largest tile and the
// GEMM engines' ring sizing read these, and nothing else states them. LLVM-free on purpose.
#pragma once
#include <algorithm>
#include <cstdint>

namespace megamoe {

struct TargetLimits {
  int64_t sharedBytesPerBlock;   // shared memory / LDS one block (work-group) may allocate
  int64_t registersPerThread;    // sm_90a: 255; gfx950: VGPRs + AGPRs
  int64_t registersPerBlock;     // sm_90a's register file (64K 32-bit registers); gfx950: none beyond per thread
};

// sm_90a (H100 / H200): 227 KB of the 228 KB shared memory per SM to one block, 255 registers a thread, 64K a block.
inline constexpr TargetLimits kSm90aLimits{227 * 1024, 255, 65536};
// gfx950 (MI355X): 160 KB LDS per work-group, 512 VGPRs + AGPRs a lane. Never run here: no AMD GPU exists.
inline constexpr TargetLimits kGfx950Limits{160 * 1024, 512, 0};
// The largest shared tile either target can hold.
inline constexpr int64_t kMaxSharedBytesAnyTarget =
    std::max(kSm90aLimits.sharedBytesPerBlock, kGfx950Limits.sharedBytesPerBlock);

}  // namespace megamoe
