// The jit component from an installed megamoe: with the JIT hook installed, a cache miss compiles the kernel in
// process (gfx950: no CUDA needed) and stores it; a second lookup without the hook finds the stored entry.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "megamoe/KernelLoader.h"
#include "tools/jit/RuntimeJit.h"

int main() {
  char cacheDir[] = "/tmp/megamoe-jit-consumer-XXXXXX";
  if (!mkdtemp(cacheDir)) return 2;
  int failures = 0;
  try {
    // The options the compiler stores its entries under, so that the lookup without the JIT finds this one.
    const megamoe::cache::KernelKey key{"epoch_advance", {}, "gfx950", megamoe::defaultTargetOptions("gfx950"), ""};
    megamoe::installRuntimeJit(cacheDir);
    const megamoe::cache::CacheEntry built = megamoe::KernelLoader(cacheDir).find(key, "");
    std::printf("jit_consumer: built %s (%zu bytes)\n", key.describe().c_str(), built.binary.size());
    if (built.binary.size() < 4 || built.binary[0] != 0x7f || built.binary[1] != 'E') {
      std::fprintf(stderr, "jit_consumer: the JIT's gfx950 object is not an ELF file (%zu bytes)\n", built.binary.size());
      ++failures;
    }
    megamoe::KernelLoader::setJitCompiler({});
    if (megamoe::KernelLoader(cacheDir).find(key, "").binary != built.binary) {
      std::fprintf(stderr, "jit_consumer: the stored entry differs from the one built\n");
      ++failures;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "jit_consumer: %s\n", e.what());
    ++failures;
  }
  std::string rm = std::string("rm -rf '") + cacheDir + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "jit_consumer: could not remove %s\n", cacheDir);
  if (failures) return 1;
  std::printf("jit_consumer: all checks passed\n");
  return 0;
}
