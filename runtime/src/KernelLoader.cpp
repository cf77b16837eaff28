// Cache lookup, JIT fallback and module loading for kernels (see KernelLoader.h).
#include "megamoe/KernelLoader.h"

#include <chrono>

#include "megamoe/Error.h"
#include "megamoe/GeneratorHash.h"
#include "megamoe/Log.h"

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

// The megamoe-cache command that builds the entry of `key`.
std::string generateCommand(const cache::KernelKey& key) {
  std::string spec;
  for (const auto& [name, value] : key.spec) spec += (spec.empty() ? "" : ",") + name + "=" + std::to_string(value);
  return "megamoe-cache generate --kernel " + key.kernel + (spec.empty() ? "" : " --spec " + spec) + " --targets " +
         key.target;
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

KernelLoader::KernelLoader(const std::string& cacheRoot, bool anyGenerator)
    : cache_(cacheRoot.empty() ? cache::KernelCache::defaultRoot() : cacheRoot), anyGenerator_(anyGenerator) {
  // Lookups remove an invalid entry and count it as a miss; the log says which and why.
  cache_.setProblemReporter([](const std::string& dir, const std::string& problem) {
    MEGAMOE_LOG(kWarn, "kernel cache: invalid entry " + dir + " (" + problem + "), removing it; counted as a miss");
  });
}

cache::CacheEntry KernelLoader::find(const cache::KernelKey& key, const std::string& generateHint) const {
  const bool exact = !key.fingerprint.empty();
  // Cache-only: an entry of another generator (older or newer kernel sources, at the same kernel ABI) would load
  // silently, e.g. a kernel from before a fix; only this library's generator is taken unless asked otherwise.
  const std::string generator = anyGenerator_ ? "" : MEGAMOE_GENERATOR_HASH;
  std::optional<cache::CacheEntry> entry = exact ? cache_.lookup(key) : cache_.lookupAnyFingerprint(key, generator);
  if (entry) {
    const std::string& fingerprint = entry->key.fingerprint;
    const std::string built = cache::generatorOf(fingerprint);
    const bool foreign = built != MEGAMOE_GENERATOR_HASH;
    MEGAMOE_LOG_AT(foreign ? LogLevel::kWarn : LogLevel::kInfo,
                   "kernel cache hit: " + key.describe() + " digest " + entry->key.digest() +
                       (fingerprint.empty() ? std::string() : " (fingerprint " + fingerprint + ")") + " in " +
                       cache_.root() +
                       (foreign ? std::string("; another generator than this library's ") + MEGAMOE_GENERATOR_HASH
                                : std::string()));
    return *entry;
  }

  JitCompiler jit;
  {
    std::lock_guard<std::mutex> lock(jitMutex());
    jit = jitCompiler();
  }
  const std::string digests =
      "lookup digest " + key.lookupDigest() + (exact ? ", exact digest " + key.digest() : std::string());
  const std::string what =
      "kernel " + key.describe() + " is not in the kernel cache at " + cache_.root() + " (" + digests + ")";
  MEGAMOE_LOG(kInfo, "kernel cache miss: " + key.describe() + " " + digests + " in " + cache_.root() +
                     (jit ? "; building it with the JIT" : "; no JIT compiler is linked in"));
  if (jit) {
    const auto start = std::chrono::steady_clock::now();
    auto took = [&] {
      return formatDuration(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    };
    try {
      entry = jit(key);
    } catch (const std::exception& e) {
      MEGAMOE_LOG(kInfo, "JIT failed to build " + key.describe() + " after " + took());
      throw Error(ErrorCode::kKernelNotFound, what + " and the JIT compiler failed to build it: " + e.what());
    }
    if (entry) {
      MEGAMOE_LOG(kInfo, "JIT built " + key.describe() + " digest " + entry->key.digest() + " in " + took() +
                         " (stored in " + cache_.root() + ")");
      return *entry;
    }
    MEGAMOE_LOG(kInfo, "JIT could not build " + key.describe() + " (" + took() + ")");
    throw Error(ErrorCode::kKernelNotFound, what + " and the JIT compiler could not build it");
  }
  const std::string command = generateHint.empty() ? generateCommand(key) : generateHint;
  if (!exact && !anyGenerator_) {
    if (std::optional<cache::CacheEntry> other = cache_.lookupAnyFingerprint(key)) {
      const std::string built = cache::generatorOf(other->key.fingerprint);
      throw Error(ErrorCode::kStaleKernel,
                  "kernel " + key.describe() + " in the kernel cache at " + cache_.root() + " was built by " +
                  (built.empty() ? std::string("a kernel generator its fingerprint does not name")
                                 : "kernel generator " + built) +
                  ", and this library by generator " +
                  MEGAMOE_GENERATOR_HASH + " (other kernel sources: it could differ from what this library "
                  "expects); generate it again with: " + command +
                  " (or set MEGAMOE_CACHE_ANY_GENERATOR=1 to load it anyway)");
    }
  }
  throw Error(ErrorCode::kKernelNotFound,
              what + " and no JIT compiler is linked into this process; generate it with: " + command);
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

  // Checked before the lock is taken, so that the warnings are logged with no lock of the loader held.
  KernelMetadata metadata;
  try {
    metadata = parseKernelMetadata(entry.metadata);
  } catch (const Error& e) {
    const Error bad(ErrorCode::kBadMetadata,
                    "cache entry " + entry.dir + " for " + resolved.describe() + ": " + e.what());
    MEGAMOE_LOG(kWarn, std::string("kernel cache: invalid metadata: ") + bad.what());
    throw bad;
  }
  if (const abi::KernelDecl* decl = abi::findKernelDecl(resolved.kernel)) {
    const std::string want = abi::signatureHash(*decl);
    if (metadata.signature != want || metadata.abiVersion != abi::kKernelAbiVersion) {
      const Error stale(
          ErrorCode::kStaleKernel,
          "cache entry " + entry.dir + " for " + resolved.describe() + " was built for argument signature " +
              (metadata.signature.empty() ? std::string("(none recorded)") : metadata.signature) + " at kernel ABI " +
              std::to_string(metadata.abiVersion) + ", this runtime declares " + want + " at kernel ABI " +
              std::to_string(abi::kKernelAbiVersion) + " (" + abi::signatureText(*decl) +
              "); regenerate it with: " + generateCommand(resolved) + " --force");
      MEGAMOE_LOG(kWarn, std::string("kernel cache: stale entry: ") + stale.what());
      throw stale;
    }
  }

  std::shared_ptr<const Kernel> kernel;
  bool reused = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = loaded_.find({deviceId, digest});
    if (it != loaded_.end()) {
      kernel = it->second;
      reused = true;
    } else {
      ModuleHandle module = device->loadModule(entry.binary.data(), entry.binary.size());
      FunctionHandle function = nullptr;
      try {
        function = device->getFunction(module, metadata.symbol);
      } catch (...) {
        device->unloadModule(module);
        throw;
      }
      kernel = std::make_shared<const Kernel>(device, entry.key, digest, metadata, module, function);
      loaded_.emplace(std::make_pair(deviceId, digest), kernel);
    }
  }
  // Logged with the loader's lock released: a log callback may load kernels itself.
  if (reused)
    MEGAMOE_LOG(kDebug, "module of " + resolved.describe() + " (digest " + digest + ") already loaded on " + deviceId);
  else
    MEGAMOE_LOG(kDebug, "loaded module of " + resolved.describe() + " (digest " + digest + ", " +
                        std::to_string(entry.binary.size()) + " bytes, symbol " + metadata.symbol + ") on " + deviceId);
  return kernel;
}

}  // namespace megamoe
