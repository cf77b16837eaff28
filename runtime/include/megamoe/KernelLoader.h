// Finds a kernel's code object in the on-disk cache, loads it on a device and resolves its entry point. On a miss
// it asks the JIT compiler when one is linked into the process, and otherwise fails with an error naming the
// kernel, the lookup digest, the cache root and the command that generates the entry.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "compiler/abi/KernelAbi.h"
#include "compiler/cache/KernelCache.h"
#include "megamoe/Backend.h"
#include "megamoe/Json.h"

namespace megamoe {

// A kernel loaded on one device. The module is unloaded when the last reference goes.
class Kernel {
 public:
  Kernel(std::shared_ptr<Device> device, cache::KernelKey key, std::string digest, KernelMetadata metadata,
         ModuleHandle module, FunctionHandle function);
  ~Kernel();
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  Device& device() const { return *device_; }
  const cache::KernelKey& key() const { return key_; }
  const std::string& digest() const { return digest_; }  // the entry's full digest (with fingerprint)
  const KernelMetadata& metadata() const { return metadata_; }
  FunctionHandle function() const { return function_; }
  // The kernel's declaration (compiler/abi/KernelAbi.h); nullptr for a kernel no declaration names (test stand-ins).
  const abi::KernelDecl* decl() const { return abi::findKernelDecl(key_.kernel); }

 private:
  std::shared_ptr<Device> device_;
  cache::KernelKey key_;
  std::string digest_;
  KernelMetadata metadata_;
  ModuleHandle module_;
  FunctionHandle function_;
};

// The options text megamoe-cache generates a target's kernels with by default (compiler/ TargetOptions::canonical()
// at the default optimisation level; the codegen tier checks they agree). "" for a target it does not know.
std::string defaultTargetOptions(const std::string& target);

class KernelLoader {
 public:
  // Builds (and stores) an entry for a key, or returns nullopt when it cannot. Registered by the compiler library
  // when it is linked in; absent in cache-only processes.
  using JitCompiler = std::function<std::optional<cache::CacheEntry>(const cache::KernelKey&)>;
  static void setJitCompiler(JitCompiler jit);  // an empty function unregisters
  static bool hasJitCompiler();

  // `cacheRoot` empty: cache::KernelCache::defaultRoot() (MEGAMOE_CACHE_DIR, ...). Cache-only lookups load only
  // entries of this library's kernel generator (the hash of the sources it was built from), unless `anyGenerator`
  // (MEGAMOE_CACHE_ANY_GENERATOR).
  explicit KernelLoader(const std::string& cacheRoot = "", bool anyGenerator = false);
  const std::string& cacheRoot() const { return cache_.root(); }

  // The cache entry for `key`: exact lookup when key.fingerprint is set, else the newest entry for any
  // fingerprint of this library's generator; on a miss the JIT, else Error(kKernelNotFound) with `generateHint`
  // (the command that builds it; empty: the megamoe-cache command for `key`), or Error(kStaleKernel) when the
  // cache holds the kernel from another generator only.
  cache::CacheEntry find(const cache::KernelKey& key, const std::string& generateHint) const;

  // find() + load on `device`, cached per (device, digest). An empty key.target means the device's target; a
  // target the device cannot run is an Error(kInvalidArgument). An entry of a declared kernel whose signature (or
  // kernel-ABI version) differs from the declaration's is refused: Error(kStaleKernel) naming the kernel, both
  // hashes and the megamoe-cache command that rebuilds it.
  std::shared_ptr<const Kernel> load(const std::shared_ptr<Device>& device, const cache::KernelKey& key,
                                     const std::string& generateHint);

 private:
  cache::KernelCache cache_;
  bool anyGenerator_;
  std::mutex mutex_;
  std::map<std::pair<std::string, std::string>, std::shared_ptr<const Kernel>> loaded_;  // (device id, digest)
};

}  // namespace megamoe
