// The megamoe dialect: ops, enums and verifiers generated from MegaMoeOps.td.
#pragma once
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMTypes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Dialect.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "megamoe/Dialect/MegaMoeOpsDialect.h.inc"
#include "megamoe/Dialect/MegaMoeOpsEnums.h.inc"
#define GET_OP_CLASSES
#include "megamoe/Dialect/MegaMoeOps.h.inc"

namespace megamoe {
// Address spaces used by the dialect (the same numbers on NVPTX and AMDGPU).
inline constexpr unsigned kGenericSpace = 0, kGlobalSpace = 1, kSharedSpace = 3;
}  // namespace megamoe
