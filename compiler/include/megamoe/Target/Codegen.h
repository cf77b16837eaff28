// Code objects in process: sm_90a cubin (NVPTX -> PTX -> nvJitLink) and gfx950 HSACO (AMDGPU -> object -> lld),
// with the static facts checked on every object.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megamoe/Target/Target.h"

namespace mlir {
class ModuleOp;
}

namespace megamoe {

// Resource and instruction facts read off the compiled code, and the budget checks over them.
struct StaticFacts {
  std::string target;
  int64_t registers = -1;        // sm_90a: registers per thread; gfx950: arch VGPRs
  int64_t agprs = 0;             // gfx950 accumulation VGPRs
  int64_t sgprs = 0;             // gfx950 scalar registers
  int64_t scratchBytes = 0;      // gfx950 private segment / sm_90a stack frame
  int64_t spillBytes = 0;        // sm_90a spill stores + loads
  int64_t sharedBytes = 0;       // static shared memory / LDS per block
  int64_t mmaInstructions = 0;   // wgmma.mma_async in the PTX / v_mfma_* in the gfx950 code
  std::string mmaMnemonic;       // the instruction counted
  bool expectsMma = false;       // the kernel used megamoe.mma_tile
  std::string wgmmaSerialized;   // sm_90a: ptxas's reason for serializing every wgmma (C7520); empty when pipelined
  std::vector<std::string> violations;  // empty when every check passed
  bool ok() const { return violations.empty(); }
  std::string json() const;
};

struct CompiledKernel {
  std::string name;              // kernel name (DSL), also the code object's symbol
  int64_t blockThreads = 0;
  int64_t dynamicSharedBytes = 0;
  std::string signature;         // the declaration's signature hash (compiler/abi/KernelAbi.h)
  std::vector<uint8_t> binary;   // cubin or HSACO
  std::string assembly;          // PTX or AMDGCN assembly (for static checks and lit-style inspection)
  StaticFacts facts;
  double lowerMs = 0, optimizeMs = 0, codegenMs = 0, linkMs = 0;
  double totalMs() const { return lowerMs + optimizeMs + codegenMs + linkMs; }
  // JSON the cache stores beside the binary; the runtime reads symbol, block_threads, shared_bytes and checks
  // signature and abi_version against its own declaration of the kernel.
  std::string metadataJson() const;
};

// Lowers a clone of the target-neutral kernel module through the target's pipeline and emits the code object.
// On failure returns nullopt and sets *error, naming the stage and the diagnostics.
std::optional<CompiledKernel> compileKernel(mlir::ModuleOp module, const TargetOptions& options, std::string* error);

// Registers, stack frame, spills, shared memory and wgmma serialization from a ptxas -v log (also nvJitLink's
// info log) into f; false with *error when the log has no register count.
bool readPtxasLog(const std::string& log, StaticFacts& f, std::string* error);

// What built a target's code, in its cache key: project version + LLVM version + hash of the generator sources
// (compiler/, dsl/, kernels/); for sm_90a also the toolkit that turned PTX into a cubin (toolkitFingerprint()).
// Without a target: the part common to every target.
std::string compilerFingerprint(const std::string& target = "");

// "nvJitLink <major.minor>; ptxas <version>" of the nvJitLink and ptxas sm_90a code would use now ("none" for one
// not found, "unknown" for one that does not say).
std::string toolkitFingerprint();

}  // namespace megamoe
