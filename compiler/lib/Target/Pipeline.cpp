// Target options and the per-target lowering pipelines.
#include "megamoe/Target/Pipeline.h"

#include "megamoe/Transforms/Passes.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

namespace megamoe {

std::optional<TargetOptions> TargetOptions::parse(std::string_view target, std::string* error, int optLevel) {
  if (optLevel < 0 || optLevel > 3) {
    if (error) *error = "optimisation level must be 0..3, got " + std::to_string(optLevel);
    return std::nullopt;
  }
  if (target == "sm_90a") return TargetOptions(Arch::sm_90a, optLevel);
  if (target == "gfx950") return TargetOptions(Arch::gfx950, optLevel);
  if (error) *error = "unknown target '" + std::string(target) + "': supported targets are sm_90a, gfx950";
  return std::nullopt;
}

std::string TargetOptions::name() const { return arch_ == Arch::sm_90a ? "sm_90a" : "gfx950"; }
std::string TargetOptions::triple() const {
  return arch_ == Arch::sm_90a ? "nvptx64-nvidia-cuda" : "amdgcn-amd-amdhsa";
}
std::string TargetOptions::cpu() const { return name(); }
// sm_90a needs PTX ISA 8.0 (wgmma, setmaxnreg); gfx950 uses the backend's defaults.
std::string TargetOptions::features() const { return arch_ == Arch::sm_90a ? "+ptx80" : ""; }
std::string TargetOptions::canonical() const {
  std::string s = "target=" + name() + ";O=" + std::to_string(optLevel_);
  if (arch_ == Arch::sm_90a) s += ";ptx=80";
  if (arch_ == Arch::gfx950) s += ";abi=500";
  return s;
}

void buildSm90aPipeline(mlir::OpPassManager& pm, const TargetOptions&) {
  mlir::OpPassManager& gpu = pm.nest<mlir::gpu::GPUModuleOp>();
  gpu.addPass(createMegaMoeLowerToNVVM());       // megamoe ops -> NVVM/LLVM (wgmma, scoped atomics)
  gpu.addPass(mlir::createSCFToControlFlowPass());
  gpu.addPass(mlir::createConvertGpuOpsToNVVMOps());  // gpu.thread_id, gpu.barrier, ...
  gpu.addPass(mlir::createConvertToLLVMPass());  // arith, cf, vector, math
  gpu.addPass(mlir::createConvertNVVMToLLVMPass());  // PTX-builder ops (wgmma) -> inline asm
  gpu.addPass(mlir::createCanonicalizerPass());
  gpu.addPass(mlir::createCSEPass());
  pm.addPass(mlir::createReconcileUnrealizedCastsPass());
}

void buildGfx950Pipeline(mlir::OpPassManager& pm, const TargetOptions&) {
  mlir::OpPassManager& gpu = pm.nest<mlir::gpu::GPUModuleOp>();
  gpu.addPass(createMegaMoeLowerToROCDL());      // megamoe ops -> ROCDL/LLVM (MFMA, scoped atomics)
  gpu.addPass(mlir::createSCFToControlFlowPass());
  mlir::ConvertGpuOpsToROCDLOpsOptions rocdl;
  rocdl.chipset = "gfx950";
  gpu.addPass(mlir::createConvertGpuOpsToROCDLOps(rocdl));
  gpu.addPass(mlir::createConvertToLLVMPass());
  gpu.addPass(mlir::createCanonicalizerPass());
  gpu.addPass(mlir::createCSEPass());
  pm.addPass(mlir::createReconcileUnrealizedCastsPass());
}

void buildPipeline(mlir::OpPassManager& pm, const TargetOptions& options) {
  if (options.arch() == Arch::sm_90a)
    buildSm90aPipeline(pm, options);
  else
    buildGfx950Pipeline(pm, options);
}

}  // namespace megamoe
