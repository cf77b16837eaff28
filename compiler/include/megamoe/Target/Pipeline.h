// The lowering pipeline of each target, as one readable function each.
#pragma once
#include "megamoe/Target/Target.h"

namespace mlir {
class OpPassManager;
}

namespace megamoe {
// megamoe + gpu + scf + arith + vector inside gpu.module -> LLVM + NVVM (inline PTX for wgmma).
void buildSm90aPipeline(mlir::OpPassManager& pm, const TargetOptions& options);
// megamoe + gpu + scf + arith + vector inside gpu.module -> LLVM + ROCDL.
void buildGfx950Pipeline(mlir::OpPassManager& pm, const TargetOptions& options);
// Dispatches on options.arch().
void buildPipeline(mlir::OpPassManager& pm, const TargetOptions& options);
}  // namespace megamoe
