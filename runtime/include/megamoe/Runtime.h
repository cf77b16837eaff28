// The runtime for one device: its backend, a kernel loader over the cache, launches that respect the heap's
// usability, and heap creation. The C ABI (megamoe.h) is a thin shell over this class.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "megamoe/Backend.h"
#include "megamoe/KernelArgs.h"
#include "megamoe/KernelLoader.h"
#include "megamoe/SymmetricHeap.h"
#include "megamoe/env.h"

namespace megamoe {

class Runtime {
 public:
  // Opens the backend (library path from `env`) and device `ordinal`.
  Runtime(BackendKind kind, int ordinal, const RuntimeEnv& env);
  // "auto" tries CUDA, then HIP; the error lists why each failed.
  Runtime(const std::string& backendName, int ordinal, const RuntimeEnv& env);

  const std::shared_ptr<Device>& device() const { return device_; }
  const RuntimeEnv& env() const { return env_; }
  KernelLoader& loader() { return loader_; }

  std::shared_ptr<const Kernel> loadKernel(const cache::KernelKey& key, const std::string& generateHint);

  // Launches `kernel` on this runtime's device. dims.block must hold the kernel's block_threads; dynamic shared
  // memory is at least the kernel's shared_bytes. With a heap, refuses (Error(kHeapUnusable)) once the heap has
  // seen a device error.
  void launch(const Kernel& kernel, const LaunchDims& dims, StreamHandle stream, void** params,
              const SymmetricHeap* heap = nullptr);
  // The same with arguments by name: `args` must be the kernel's declaration's (Error(kInvalidArgument) otherwise,
  // or when an argument was not set).
  void launch(const Kernel& kernel, const LaunchDims& dims, StreamHandle stream, KernelArgs& args,
              const SymmetricHeap* heap = nullptr);

  // Mode B heap on this runtime's device (see SymmetricHeap::createMultiProcess, also for `agreement`).
  std::unique_ptr<SymmetricHeap> createHeap(const std::vector<RegionSpec>& regions, int rank, int nranks,
                                            const std::string& rendezvousPath,
                                            const RendezvousAgreement& agreement = {});

 private:
  RuntimeEnv env_;
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<Device> device_;
  KernelLoader loader_;
};

}  // namespace megamoe
