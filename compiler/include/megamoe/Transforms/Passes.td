// megamoe passes: one target-neutral expansion, one lowering per target.
#ifndef MEGAMOE_PASSES_TD
#define MEGAMOE_PASSES_TD

include "mlir/Pass/PassBase.td"

def MegaMoeExpandBarriers : Pass<"megamoe-expand-barriers"> {
  let summary = "Expand grid and cross-rank barriers into signals, bounded waits and block barriers";
  let description = [{
    Target-neutral. `megamoe.grid_barrier` and `megamoe.rank_barrier` become `megamoe.signal`,
    `megamoe.wait`, `megamoe.peer_ptr`, `gpu.barrier` and `scf` control flow, so that the per-target lowerings only
    know the primitive ops. Every wait keeps its bound.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::scf::SCFDialect", "::mlir::arith::ArithDialect",
                           "::mlir::LLVM::LLVMDialect"];
}

def MegaMoeLowerToNVVM : Pass<"megamoe-lower-to-nvvm"> {
  let summary = "Lower megamoe ops to the LLVM and NVVM dialects for sm_90a";
  let description = [{
    Tile copies become 16-byte vector moves (plus fence.proxy.async after shared-memory writes, so that wgmma
    sees them); mma_tile becomes wgmma.mma_async m64nNk16 bf16 over shared-memory descriptors (128B swizzle);
    acc_store walks the wgmma accumulator fragment; signals and waits become scoped atomics with system,
    gpu or cta syncscope and a %globaltimer bound. Kernel functions marked `megamoe.kernel` get nvvm.kernel and
    nvvm.reqntid.
  }];
  let dependentDialects = ["::mlir::NVVM::NVVMDialect", "::mlir::LLVM::LLVMDialect", "::mlir::scf::SCFDialect",
                           "::mlir::arith::ArithDialect", "::mlir::vector::VectorDialect"];
}

def MegaMoeLowerToROCDL : Pass<"megamoe-lower-to-rocdl"> {
  let summary = "Lower megamoe ops to the LLVM and ROCDL dialects for gfx950";
  let description = [{
    Tile copies become 16-byte vector moves; mma_tile becomes v_mfma_f32_32x32x16_bf16 over LDS fragments read with
    the same swizzle (one wave per 32 rows); acc_store walks the MFMA accumulator fragment; signals and waits
    become scoped atomics (agent / system / workgroup) with an s_memrealtime bound. Kernel functions marked
    `megamoe.kernel` get rocdl.kernel and their fixed work-group size.
  }];
  let dependentDialects = ["::mlir::ROCDL::ROCDLDialect", "::mlir::LLVM::LLVMDialect", "::mlir::scf::SCFDialect",
                           "::mlir::arith::ArithDialect", "::mlir::vector::VectorDialect"];
}

#endif // MEGAMOE_PASSES_TD
