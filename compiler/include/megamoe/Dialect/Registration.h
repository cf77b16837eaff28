// Every dialect, interface and translation that megamoe's pipelines need, registered in one place.
#pragma once
namespace mlir {
class DialectRegistry;
}
namespace megamoe {
// Dialects (megamoe, LLVM, NVVM, ROCDL, GPU, SCF, arith, cf, func, vector, math), the *ToLLVM conversion
// interfaces that convert-to-llvm silently needs, and the LLVM IR translations.
void registerAllDialects(mlir::DialectRegistry& registry);
}  // namespace megamoe
