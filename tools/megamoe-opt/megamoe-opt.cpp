// megamoe-opt: parse, verify, print and run passes on IR with the megamoe dialect (drives the lit tests).
#include "megamoe/Dialect/Registration.h"
#include "megamoe/Transforms/Passes.h"
#include "mlir/Conversion/Passes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char** argv) {
  mlir::DialectRegistry registry;
  megamoe::registerAllDialects(registry);
  megamoe::registerMegaMoePasses();
  mlir::registerTransformsPasses();
  mlir::registerConversionPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(argc, argv, "megamoe IR driver\n", registry));
}
