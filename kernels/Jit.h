// The JIT front: a kernel spec and a target in, a cache entry out (built in process on a miss).
#pragma once
#include <optional>
#include <string>

#include "compiler/cache/KernelCache.h"
#include "kernels/Kernels.h"
#include "megamoe/Target/Codegen.h"
#include "megamoe/Target/Target.h"

namespace megamoe::kernels {

// The cache key of a kernel spec compiled for a target by this compiler.
cache::KernelKey keyFor(const KernelSpec& spec, const TargetOptions& target);

struct JitResult {
  cache::CacheEntry entry;
  bool hit = false;
  double ms = 0;                          // wall time of this call (lookup + load, or compile + store)
  std::optional<CompiledKernel> compiled;  // set on a miss
};

// Validates the spec (std::invalid_argument naming the constraint), then looks the key up in `cache` and compiles
// on a miss (std::runtime_error naming the stage on failure). `force` recompiles even on a hit.
JitResult getKernel(const KernelSpec& spec, const TargetOptions& target, const cache::KernelCache& cache,
                    bool force = false);

}  // namespace megamoe::kernels
