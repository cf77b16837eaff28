// megamoe-opt: parse, verify, print and run passes on IR with the megamoe dialect (drives the lit tests).
#include "megamoe/Dialect/Registration.h"
#include "megamoe/Target/Pipeline.h"
#include "megamoe/Transforms/Passes.h"
#include "megamoe/Version.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char** argv) {
  // Replaces LLVM's --version text (MlirOptMain keeps LLVM's option and printer) with ours, as megamoe-cache prints it.
  llvm::cl::SetVersionPrinter([](llvm::raw_ostream& os) {
    os << "megamoe-opt " << MEGAMOE_VERSION_STRING << " (LLVM " << LLVM_VERSION_STRING << ")\n";
  });
  mlir::DialectRegistry registry;
  megamoe::registerAllDialects(registry);
  megamoe::registerMegaMoePasses();
  mlir::registerTransformsPasses();
  mlir::registerConversionPasses();
  // The code generator's own pipelines (compiler/lib/Target/Pipeline.cpp), so that tests/lit/Pipeline runs them and
  // not a copy of their pass lists.
  for (const std::string& target : megamoe::TargetOptions::supported()) {
    mlir::PassPipelineRegistration<>("megamoe-" + target + "-pipeline",
                                     "the " + target + " lowering pipeline of megamoe's code generator",
                                     [target](mlir::OpPassManager& pm) {
                                       megamoe::buildPipeline(pm, *megamoe::TargetOptions::parse(target, nullptr));
                                     });
  }
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "megamoe IR driver\n", registry));
}
