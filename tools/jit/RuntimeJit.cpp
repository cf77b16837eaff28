// See RuntimeJit.h.
#include "tools/jit/RuntimeJit.h"

#include <stdexcept>

#include "kernels/Jit.h"
#include "megamoe/KernelLoader.h"

namespace megamoe {

void installRuntimeJit(const std::string& cacheRoot) {
  std::string root = cacheRoot.empty() ? cache::KernelCache::defaultRoot() : cacheRoot;
  KernelLoader::setJitCompiler([root](const cache::KernelKey& key) -> std::optional<cache::CacheEntry> {
    std::string error;
    auto target = TargetOptions::parse(key.target, &error);
    if (!target) throw std::invalid_argument(error);
    if (!key.options.empty() && key.options != target->canonical())
      throw std::invalid_argument("options '" + key.options + "' are not what this compiler uses for " +
                                  key.target + " ('" + target->canonical() + "')");
    cache::KernelCache cache(root);
    return kernels::getKernel(kernels::KernelSpec{key.kernel, key.spec}, *target, cache).entry;
  });
}

}  // namespace megamoe
