// An embedding program built against an installed megamoe only (scripts/test-install.sh runs it): the C ABI's
// version and error codes, a runtime through both the C ABI and the C++ API on the fake HIP library given as argv[1],
// and the layer config's struct_size rule. Prints where libmegamoe was loaded from; exits non-zero on any mismatch.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"
#include "megamoe/Version.h"
#include "megamoe/megamoe.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "consumer: FAILED: %s (last error: %s)\n", what.c_str(), megamoe_last_error());
  ++failures;
}

void checkStatus(int status, int expected, const std::string& what) {
  check(status == expected, what + " returned " + std::to_string(status) + " (" + megamoe_status_name(status) +
                                "), expected " + std::to_string(expected));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer FAKE_HIP_LIBRARY\n");
    return 2;
  }
  Dl_info where{};
  check(dladdr(reinterpret_cast<void*>(&megamoe_version), &where) != 0 && where.dli_fname, "dladdr(megamoe_version)");
  std::printf("libmegamoe: %s\n", where.dli_fname ? where.dli_fname : "?");

  check(std::string(megamoe_version()) == CONSUMER_EXPECTED_VERSION,
        std::string("megamoe_version() is ") + megamoe_version() + ", expected " + CONSUMER_EXPECTED_VERSION);
  check(std::string(MEGAMOE_VERSION_STRING) == CONSUMER_EXPECTED_VERSION, "MEGAMOE_VERSION_STRING");
  check(std::to_string(MEGAMOE_VERSION_MAJOR) + "." + std::to_string(MEGAMOE_VERSION_MINOR) + "." +
                std::to_string(MEGAMOE_VERSION_PATCH) == CONSUMER_EXPECTED_VERSION,
        "MEGAMOE_VERSION_MAJOR/MINOR/PATCH");

  char cacheDir[] = "/tmp/megamoe-consumer-XXXXXX";
  if (!mkdtemp(cacheDir)) return 2;
  setenv("MEGAMOE_CACHE_DIR", cacheDir, 1);
  setenv("MEGAMOE_CUDA_LIBRARY", "/nonexistent/libcuda.so.1", 1);
  setenv("MEGAMOE_HIP_LIBRARY", argv[1], 1);

  // The C ABI.
  megamoe_runtime* runtime = nullptr;
  checkStatus(megamoe_runtime_create("cuda", 0, &runtime), MEGAMOE_ERROR_DRIVER_NOT_FOUND, "runtime_create(cuda)");
  checkStatus(megamoe_runtime_create("hip", 0, &runtime), MEGAMOE_OK, "runtime_create(hip)");
  if (runtime) {
    megamoe_layer_config config = MEGAMOE_LAYER_CONFIG_INIT;
    config.hidden = 512;
    config.intermediate = 256;
    config.experts = 16;
    config.topk = 4;
    config.max_tokens = 64;
    megamoe_layer* layer = nullptr;
    checkStatus(megamoe_layer_create(runtime, &config, 0, 1, nullptr, &layer), MEGAMOE_ERROR_KERNEL_NOT_FOUND,
                "layer_create on an empty cache");
    config.struct_size = 0;
    checkStatus(megamoe_layer_create(runtime, &config, 0, 1, nullptr, &layer), MEGAMOE_ERROR_INVALID_ARGUMENT,
                "layer_create with struct_size 0");
    check(std::string(megamoe_last_error()).find("struct_size") != std::string::npos, "the error names struct_size");
    checkStatus(megamoe_runtime_destroy(runtime), MEGAMOE_OK, "runtime_destroy");
  }

  // The C++ API: the same fake device through the static runtime.
  try {
    megamoe::Runtime cxx("hip", 0, megamoe::parseEnv());
    check(cxx.device()->target() == "gfx950", "Runtime::device()->target() is " + cxx.device()->target());
    megamoe::MoeLayerConfig config;
    config.hidden = 7100;
    config.intermediate = 2048;
    config.experts = 256;
    config.topk = 8;
    config.maxTokens = 8192;
    check(megamoe::MoeLayer::validate(config, 1).find("hidden=7100") != std::string::npos,
          "MoeLayer::validate names hidden");
  } catch (const std::exception& e) {
    check(false, std::string("megamoe::Runtime: ") + e.what());
  }

  std::string rm = std::string("rm -rf '") + cacheDir + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "consumer: could not remove %s\n", cacheDir);
  if (failures) return 1;
  std::printf("consumer: all checks passed (megamoe %s)\n", megamoe_version());
  return 0;
}
