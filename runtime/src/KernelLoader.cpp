// Cache lookup, JIT fallback and module loading for kernels (see KernelLoader.h).
#include "megamoe/KernelLoader.h"

#include "megamoe/Error.h"

namespace megamoe {
namespace {

std::mutex& jitMutex() {
  static std::mutex* m = new std::mutex;
  return *m;
}
KernelLoader::JitCompiler& jitCompiler() {
  static auto* jit = new KernelLoader::JitCompiler;
  return *jit;
}

// The megamoe-cache command that rebuilds the entry of `key` in place.
std::string regenerateCommand(const cache::KernelKey& key) {
  std::string spec;
  for (const auto& [name, value] : key.spec) spec += (spec.empty() ? "" : ",") + name + "=" + std::to_string(value);
  return "megamoe-cache generate --kernel " + key.kernel + (spec.empty() ? "" : " --spec " + spec) + " --targets " +
         key.target + " --force";
}

}  // namespace

Kernel::Kernel(std::shared_ptr<Device> device, cache::KernelKey key, std::string digest, KernelMetadata metadata,
               ModuleHandle module, FunctionHandle function)
    : device_(std::move(device)),
      key_(std::move(key)),
      digest_(std::move(digest)),
      metadata_(std::move(metadata)),
      module_(module),
      function_(function) {}

Kernel::~Kernel() {
  try {
    device_->unloadModule(module_);
  } catch (...) {
    // A dead context cannot unload; nothing useful to do in a destructor.
  }
}

void KernelLoader::setJitCompiler(JitCompiler jit) {
  std::lock_guard<std::mutex> lock(jitMutex());
  jitCompiler() = std::move(jit);
}

bool KernelLoader::hasJitCompiler() {
  std::lock_guard<std::mutex> lock(jitMutex());
  return static_cast<bool>(jitCompiler());
}

KernelLoader::KernelLoader(const std::string& cacheRoot)
    : cache_(cacheRoot.empty() ? cache::KernelCache::defaultRoot() : cacheRoot) {}

cache::CacheEntry KernelLoader::find(const cache::KernelKey& key, const std::string& generateHint) const {
  const bool exact = !key.fingerprint.empty();
  std::optional<cache::CacheEntry> entry = exact ? cache_.lookup(key) : cache_.lookupAnyFingerprint(key);
  if (entry) return *entry;

  JitCompiler jit;
  {
    std::lock_guard<std::mutex> lock(jitMutex());
    jit = jitCompiler();
  }
  const std::string what = "kernel " + key.describe() + " is not in the kernel cache at " + cache_.root() +
                           " (lookup digest " + key.lookupDigest() +
                           (exact ? ", exact digest " + key.digest() : std::string()) + ")";
  if (jit) {
    try {
      entry = jit(key);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kKernelNotFound, what + " and the JIT compiler failed to build it: " + e.what());
    }
    if (entry) return *entry;
    throw Error(ErrorCode::kKernelNotFound, what + " and the JIT compiler could not build it");
  }
  throw Error(ErrorCode::kKernelNotFound,
              what + " and no JIT compiler is linked into this process; generate it with: " +
                  (generateHint.empty() ? std::string("megamoe-cache (see tools/)") : generateHint));
}

std::string defaultTargetOptions(const std::string& target) {
  if (target == "sm_90a") return "target=sm_90a;O=3;ptx=80";
  if (target == "gfx950") return "target=gfx950;O=3;abi=500";
  return "";
}

std::shared_ptr<const Kernel> KernelLoader::load(const std::shared_ptr<Device>& device, const cache::KernelKey& key,
                                                 const std::string& generateHint) {
  if (!device) throw Error(ErrorCode::kInvalidArgument, "KernelLoader::load needs a device");
  cache::KernelKey resolved = key;
  if (resolved.target.empty()) resolved.target = device->target();
  if (resolved.target != device->target())
    throw Error(ErrorCode::kInvalidArgument, "kernel " + resolved.describe() + " targets " + resolved.target +
                                                 " but " + backendKindName(device->kind()) + " device " +
                                                 std::to_string(device->ordinal()) + " runs " + device->target());
  const cache::CacheEntry entry = find(resolved, generateHint);
  const std::string digest = entry.key.digest();
  const std::string deviceId = std::string(backendKindName(device->kind())) + ":" + std::to_string(device->ordinal());

  std::lock_guard<std::mutex> lock(mutex_);
  auto it = loaded_.find({deviceId, digest});
  if (it != loaded_.end()) return it->second;

  KernelMetadata metadata;
  try {
    metadata = parseKernelMetadata(entry.metadata);
  } catch (const Error& e) {
    throw Error(ErrorCode::kBadMetadata, "cache entry " + entry.dir + " for " + resolved.describe() + ": " + e.what());
  }
  if (const abi::KernelDecl* decl = abi::findKernelDecl(resolved.kernel)) {
    const std::string want = abi::signatureHash(*decl);
    if (metadata.signature != want || metadata.abiVersion != abi::kKernelAbiVersion)
      throw Error(ErrorCode::kStaleKernel,
                  "cache entry " + entry.dir + " for " + resolved.describe() + " was built for argument signature " +
                      (metadata.signature.empty() ? std::string("(none recorded)") : metadata.signature) +
                      " at kernel ABI " + std::to_string(metadata.abiVersion) + ", this runtime declares " + want +
                      " at kernel ABI " + std::to_string(abi::kKernelAbiVersion) + " (" + abi::signatureText(*decl) +
                      "); regenerate it with: " + regenerateCommand(resolved));
  }
  ModuleHandle module = device->loadModule(entry.binary.data(), entry.binary.size());
  FunctionHandle function = nullptr;
  try {
    function = device->getFunction(module, metadata.symbol);
  } catch (...) {
    device->unloadModule(module);
    throw;
  }
  auto kernel = std::make_shared<const Kernel>(device, entry.key, digest, metadata, module, function);
  loaded_.emplace(std::make_pair(deviceId, digest), kernel);
  return kernel;
}

}  // namespace megamoe
