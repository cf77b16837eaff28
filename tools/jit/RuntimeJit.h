// Glue at the top layer: lets the runtime's kernel loader compile a missing kernel in process. The runtime links
// no LLVM/MLIR, so it only holds a hook; a process that also links the compiler installs it with this call.
#pragma once
#include <string>

namespace megamoe {
// Registers the JIT with runtime::KernelLoader: on a cache miss the kernel is built for the key's target and
// stored in `cacheRoot` (empty: the default cache root). A key whose options differ from the target's canonical
// options is refused (it names options this compiler would not produce).
void installRuntimeJit(const std::string& cacheRoot = "");
}  // namespace megamoe
