// megamoe passes and the pattern sets behind them.
#pragma once
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/LLVMIR/ROCDLDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Pass/Pass.h"

namespace megamoe {

class TargetHooks;

#define GEN_PASS_DECL
#include "megamoe/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "megamoe/Transforms/Passes.h.inc"

// grid_barrier and rank_barrier -> primitive ops (target-neutral).
void populateExpandBarriersPatterns(mlir::RewritePatternSet& patterns);
// tile_copy, peer_ptr, signal, wait: shared by both targets, parameterised by the target's hooks.
void populateCommonLoweringPatterns(mlir::RewritePatternSet& patterns, const TargetHooks& hooks);

}  // namespace megamoe
