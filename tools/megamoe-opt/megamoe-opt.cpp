// megamoe-opt: parse, verify, print and run passes on IR with the megamoe dialect (drives the lit tests).
#include "megamoe/Dialect/MegaMoe.h"
#include "megamoe/Transforms/Passes.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/LLVMIR/ROCDLDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  registry.insert<megamoe::MegaMoeDialect, mlir::LLVM::LLVMDialect, mlir::NVVM::NVVMDialect, mlir::ROCDL::ROCDLDialect,
                  mlir::gpu::GPUDialect, mlir::scf::SCFDialect, mlir::arith::ArithDialect, mlir::cf::ControlFlowDialect,
                  mlir::func::FuncDialect, mlir::vector::VectorDialect>();
  megamoe::registerMegaMoePasses();
  mlir::registerTransformsPasses();
  mlir::registerConversionPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "megamoe IR driver\n", registry));
}
