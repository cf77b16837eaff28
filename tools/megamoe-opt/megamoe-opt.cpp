// megamoe-opt: parse, verify, print and run passes on IR with the megamoe dialect (drives the lit tests).
#include "megamoe/Dialect/Registration.h"
#include "megamoe/Transforms/Passes.h"
#include "megamoe/Version.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/IR/DialectRegistry.h"
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
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "megamoe IR driver\n", registry));
}
