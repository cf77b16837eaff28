// The one registry of MEGAMOE_* environment variables the runtime reads: name, default, one line of doc, and a
// validating parser. Nothing else in runtime/ calls getenv for a MEGAMOE_* name.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "megamoe/Log.h"

namespace megamoe {

struct EnvVar {
  const char* name;
  const char* defaultValue;  // as text; "" means "unset" (the doc says what that means)
  const char* doc;
};

// Every variable, in documentation order.
const std::vector<EnvVar>& envRegistry();

struct RuntimeEnv {
  std::string cacheDir;              // MEGAMOE_CACHE_DIR (empty: the cache's default root)
  bool cacheAnyGenerator = false;    // MEGAMOE_CACHE_ANY_GENERATOR
  std::string cudaLibrary;           // MEGAMOE_CUDA_LIBRARY
  std::string hipLibrary;            // MEGAMOE_HIP_LIBRARY
  std::string backend;               // MEGAMOE_BACKEND: "auto" | "cuda" | "hip"
  double rendezvousTimeoutS = 30.0;  // MEGAMOE_RENDEZVOUS_TIMEOUT_S
  std::string rendezvousSecret;      // MEGAMOE_RENDEZVOUS_SECRET (empty: none)
  uint64_t waitTimeoutMs = 10000;    // MEGAMOE_WAIT_TIMEOUT_MS
  int pushBlocks = 32;               // MEGAMOE_PUSH_BLOCKS
  int smBudget = 0;                  // MEGAMOE_SM_BUDGET (0: unset, every SM)
  LogLevel logLevel = LogLevel::kWarn;  // MEGAMOE_LOG_LEVEL (the logger reads it itself: parseLogLevelEnv)
  bool nvtx = false;                  // MEGAMOE_NVTX
  std::string nvtxLibrary;            // MEGAMOE_NVTX_LIBRARY
};

// Reads through `lookup` (returns nullptr for unset). Throws Error(kInvalidEnv) naming the variable, the bad
// value and what is expected.
RuntimeEnv parseEnv(const std::function<const char*(const char*)>& lookup);
// The process environment.
RuntimeEnv parseEnv();

// One variable's parser each, for the process-wide settings read before (or without) any runtime: the logger's
// level at its first message (Log.cpp) and the profiler ranges at their first use (Profile.cpp). parseEnv uses the
// same parsers, so the values and the errors are the same. No lookup: the process environment.
LogLevel parseLogLevelEnv(const std::function<const char*(const char*)>& lookup);
LogLevel parseLogLevelEnv();
struct ProfileEnv {
  bool nvtx = false;        // MEGAMOE_NVTX
  std::string nvtxLibrary;  // MEGAMOE_NVTX_LIBRARY
};
ProfileEnv parseProfileEnv(const std::function<const char*(const char*)>& lookup);
ProfileEnv parseProfileEnv();

}  // namespace megamoe
