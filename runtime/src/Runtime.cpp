// Runtime: one device, its kernels and launches (see Runtime.h).
#include "megamoe/Runtime.h"

#include "megamoe/Error.h"
#include "megamoe/Log.h"

namespace megamoe {
namespace {

std::shared_ptr<Backend> openNamed(const std::string& name, const RuntimeEnv& env) {
  if (name == "cuda") return openBackend(BackendKind::kCuda, env.cudaLibrary);
  if (name == "hip") return openBackend(BackendKind::kHip, env.hipLibrary);
  if (name != "auto" && !name.empty())
    throw Error(ErrorCode::kInvalidArgument, "unknown backend '" + name + "' (expected auto, cuda or hip)");
  std::string why;
  for (const char* candidate : {"cuda", "hip"}) {
    try {
      auto backend = openNamed(candidate, env);
      if (backend->deviceCount() > 0) return backend;
      why += std::string(why.empty() ? "" : "; ") + candidate + ": no devices";
      MEGAMOE_LOG(kDebug, std::string("runtime: backend auto: ") + candidate + " has no devices");
    } catch (const Error& e) {
      why += std::string(why.empty() ? "" : "; ") + e.what();
      MEGAMOE_LOG(kDebug, std::string("runtime: backend auto: ") + candidate + " is not usable: " + e.what());
    }
  }
  throw Error(ErrorCode::kDriverNotFound, "no GPU backend is usable: " + why);
}

std::shared_ptr<Device> openDevice(const std::shared_ptr<Backend>& backend, int ordinal) {
  return backend->device(ordinal);
}

void logOpened(const Backend& backend, const Device& device, const KernelLoader& loader) {
  MEGAMOE_LOG(kInfo, "runtime: " + std::string(backendKindName(device.kind())) + " device " +
                     std::to_string(device.ordinal()) + " (" + device.name() + ", " + device.target() + ", " +
                     std::to_string(device.multiprocessors()) + " SMs) through " + backend.libraryPath() +
                     ", kernel cache " + loader.cacheRoot());
}

}  // namespace

Runtime::Runtime(BackendKind kind, int ordinal, const RuntimeEnv& env)
    : env_(env),
      backend_(openBackend(kind, kind == BackendKind::kCuda ? env.cudaLibrary : env.hipLibrary)),
      device_(openDevice(backend_, ordinal)),
      loader_(env.cacheDir, env.cacheAnyGenerator) {
  logOpened(*backend_, *device_, loader_);
}

Runtime::Runtime(const std::string& backendName, int ordinal, const RuntimeEnv& env)
    : env_(env),
      backend_(openNamed(backendName == "auto" || backendName.empty() ? env.backend : backendName, env)),
      device_(openDevice(backend_, ordinal)),
      loader_(env.cacheDir, env.cacheAnyGenerator) {
  logOpened(*backend_, *device_, loader_);
}

std::shared_ptr<const Kernel> Runtime::loadKernel(const cache::KernelKey& key, const std::string& generateHint) {
  return loader_.load(device_, key, generateHint);
}

void Runtime::launch(const Kernel& kernel, const LaunchDims& dims, StreamHandle stream, void** params,
                     const SymmetricHeap* heap) {
  if (&kernel.device() != device_.get())
    throw Error(ErrorCode::kInvalidArgument, "kernel " + kernel.key().describe() + " was loaded on device " +
                                                 std::to_string(kernel.device().ordinal()) +
                                                 ", not on this runtime's device " +
                                                 std::to_string(device_->ordinal()));
  if (heap) {
    heap->requireUsable();
    if (&heap->device() != device_.get())
      throw Error(ErrorCode::kInvalidArgument, "the heap lives on device " + std::to_string(heap->device().ordinal()) +
                                                   ", not on this runtime's device " +
                                                   std::to_string(device_->ordinal()));
  }
  const uint64_t threads = static_cast<uint64_t>(dims.block.x) * dims.block.y * dims.block.z;
  if (threads != static_cast<uint64_t>(kernel.metadata().blockThreads))
    throw Error(ErrorCode::kInvalidArgument, "kernel " + kernel.key().describe() + " was compiled for " +
                                                 std::to_string(kernel.metadata().blockThreads) +
                                                 " threads per block, launched with " + std::to_string(threads));
  if (const abi::KernelDecl* decl = kernel.decl())
    for (size_t i = 0; i < decl->args.size(); ++i)
      if (!params || !params[i])
        throw Error(ErrorCode::kInvalidArgument, "kernel " + kernel.key().describe() + ": params[" +
                                                     std::to_string(i) + "] (argument " +
                                                     std::string(decl->args[i].name) +
                                                     ") is NULL; every declared argument needs the address of its "
                                                     "value");
  LaunchDims effective = dims;
  if (effective.sharedBytes < static_cast<uint32_t>(kernel.metadata().sharedBytes))
    effective.sharedBytes = static_cast<uint32_t>(kernel.metadata().sharedBytes);
  device_->launch(kernel.function(), effective, stream, params);
}

void Runtime::launch(const Kernel& kernel, const LaunchDims& dims, StreamHandle stream, KernelArgs& args,
                     const SymmetricHeap* heap) {
  if (kernel.decl() != &args.decl())
    throw Error(ErrorCode::kInvalidArgument, "kernel " + kernel.key().describe() + " launched with the arguments of " +
                                                 std::string(args.decl().name));
  launch(kernel, dims, stream, args.params(), heap);
}

std::unique_ptr<SymmetricHeap> Runtime::createHeap(const std::vector<RegionSpec>& regions, int rank, int nranks,
                                                   const std::string& rendezvousPath,
                                                   const RendezvousAgreement& agreement) {
  return SymmetricHeap::createMultiProcess(device_, regions, rank, nranks, rendezvousPath, env_, agreement);
}

}  // namespace megamoe
