// Parsing and validation of the MEGAMOE_* environment variables (registry in env.h).
#include "megamoe/env.h"

#include <charconv>
#include <cstdlib>

#include "megamoe/Error.h"

namespace megamoe {

const std::vector<EnvVar>& envRegistry() {
  static const std::vector<EnvVar> registry = {
      {"MEGAMOE_CACHE_DIR", "",
       "kernel cache root; unset: $XDG_CACHE_HOME/megamoe, else $HOME/.cache/megamoe"},
      {"MEGAMOE_CACHE_ANY_GENERATOR", "0",
       "1: cache-only lookups also load entries that another kernel generator built (A/B runs of older kernels, at "
       "one kernel ABI; logged at warn); 0: such entries are refused as stale"},
      {"MEGAMOE_BACKEND", "auto", "device backend for the C ABI's default: auto (CUDA, then HIP) | cuda | hip"},
      {"MEGAMOE_CUDA_LIBRARY", "libcuda.so.1", "CUDA driver library to dlopen"},
      {"MEGAMOE_HIP_LIBRARY", "libamdhip64.so", "HIP runtime library to dlopen (tests point it at a fake)"},
      {"MEGAMOE_RENDEZVOUS_TIMEOUT_S", "30",
       "seconds a rank waits for the others to join the heap rendezvous: 0.001 to 86400, digits with an optional "
       "'.' and fraction digits (no sign, exponent or blanks)"},
      {"MEGAMOE_RENDEZVOUS_SECRET", "",
       "shared by the ranks of one job (set by the launcher): the heap rendezvous admits only ranks holding the "
       "same value, so that two jobs of one user never join each other; unset: no secret. Never printed"},
      {"MEGAMOE_WAIT_TIMEOUT_MS", "10000",
       "bound of every cross-rank wait on the device, written into DeviceContext.timeout_ns (an integer from 1 to "
       "10^12)"},
      {"MEGAMOE_PUSH_BLOCKS", "32",
       "blocks of dispatch_grouped_gemm that push token rows to the owners before taking GEMM tiles (an integer from "
       "1 to 1024)"},
      {"MEGAMOE_SM_BUDGET", "",
       "SMs a layer's kernels use when its config leaves sm_budget 0 (an even integer from 2 to 1024); unset: every "
       "SM, shared by the ranks of one process on a device"},
      {"MEGAMOE_LOG_LEVEL", "warn",
       "the runtime's log level: off | error | warn | info | debug, lower case (info: kernel cache hits and misses, "
       "heap sizes, rendezvous progress; debug: module loads and more); lines go to stderr prefixed "
       "'megamoe [level]', or to megamoe_set_log_callback's function. Read once, at the first message; "
       "megamoe_set_log_level overrides it. A bad value fails runtime creation like any variable here, and the "
       "logger itself then logs at warn, saying so once (docs/decisions/logging.md)"},
      {"MEGAMOE_NVTX", "0",
       "1: the runtime opens the NVTX library (MEGAMOE_NVTX_LIBRARY) with dlopen at its first profiler range and "
       "names its stages in Nsight Systems' timeline; 0: ranges are no-ops. A missing library leaves them no-ops "
       "(said once at debug level)"},
      {"MEGAMOE_NVTX_LIBRARY", "libnvToolsExt.so.1",
       "NVTX library to dlopen when MEGAMOE_NVTX=1: any library exporting nvtxRangePushA and nvtxRangePop (tests "
       "point it at a fake)"},
  };
  return registry;
}

namespace {

std::string defaultOf(const char* name) {
  for (const EnvVar& var : envRegistry())
    if (std::string(var.name) == name) return var.defaultValue;
  throw Error(ErrorCode::kInternal, std::string("environment variable ") + name + " is not in the registry");
}

[[noreturn]] void badValue(const char* name, const std::string& value, const std::string& expected) {
  throw Error(ErrorCode::kInvalidEnv, std::string(name) + "='" + value + "' is invalid: expected " + expected +
                                          " (default " + (defaultOf(name).empty() ? "unset" : defaultOf(name)) +
                                          ")");
}

// Digits, optionally '.' and digits: no sign, exponent, hex, inf/nan or blanks, and the same in every locale
// (from_chars never consults it). False for anything else.
bool parseDecimal(const std::string& text, double* value) {
  auto digits = [](const std::string& s) {
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
  };
  const size_t dot = text.find('.');
  const bool wellFormed = text.size() <= 32 && digits(text.substr(0, dot)) &&
                          (dot == std::string::npos || digits(text.substr(dot + 1)));
  if (!wellFormed) return false;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), *value, std::chars_format::fixed);
  return result.ec == std::errc() && result.ptr == text.data() + text.size();
}

// The one grammar of the integer variables: decimal digits only (leading zeros allowed; no blanks, sign, hex,
// fraction or exponent: from_chars reads none of them and never consults the locale), from `min` to `max` (`even`:
// even values only). Anything else is badValue naming the variable, the value and the range, then `unit`.
uint64_t parseInteger(const char* name, const std::string& text, uint64_t min, uint64_t max, bool even = false,
                      const std::string& unit = "") {
  uint64_t value = 0;
  const bool digitsOnly = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
  const char* end = text.data() + text.size();
  const bool parsed = digitsOnly && [&] {
    const auto result = std::from_chars(text.data(), end, value);
    return result.ec == std::errc() && result.ptr == end;
  }();
  if (!parsed || value < min || value > max || (even && value % 2 != 0))
    badValue(name, text, std::string(even ? "an even integer" : "an integer") + " from " + std::to_string(min) +
                             " to " + std::to_string(max) + unit);
  return value;
}

std::string textOr(const std::function<const char*(const char*)>& lookup, const char* name) {
  const char* value = lookup(name);
  return value ? std::string(value) : defaultOf(name);
}

const char* processLookup(const char* name) { return std::getenv(name); }

}  // namespace

LogLevel parseLogLevelEnv(const std::function<const char*(const char*)>& lookup) {
  const std::string text = textOr(lookup, "MEGAMOE_LOG_LEVEL");
  for (LogLevel level : {LogLevel::kOff, LogLevel::kError, LogLevel::kWarn, LogLevel::kInfo, LogLevel::kDebug})
    if (text == logLevelName(level)) return level;
  badValue("MEGAMOE_LOG_LEVEL", text, "one of off, error, warn, info, debug (lower case)");
}

LogLevel parseLogLevelEnv() { return parseLogLevelEnv(processLookup); }

ProfileEnv parseProfileEnv(const std::function<const char*(const char*)>& lookup) {
  ProfileEnv env;
  const std::string text = textOr(lookup, "MEGAMOE_NVTX");
  if (text != "0" && text != "1") badValue("MEGAMOE_NVTX", text, "0 or 1");
  env.nvtx = text == "1";
  env.nvtxLibrary = textOr(lookup, "MEGAMOE_NVTX_LIBRARY");
  if (env.nvtxLibrary.empty()) badValue("MEGAMOE_NVTX_LIBRARY", env.nvtxLibrary, "a library name or path");
  return env;
}

ProfileEnv parseProfileEnv() { return parseProfileEnv(processLookup); }

RuntimeEnv parseEnv(const std::function<const char*(const char*)>& lookup) {
  RuntimeEnv env;
  env.cacheDir = textOr(lookup, "MEGAMOE_CACHE_DIR");
  {
    const std::string text = textOr(lookup, "MEGAMOE_CACHE_ANY_GENERATOR");
    if (text != "0" && text != "1") badValue("MEGAMOE_CACHE_ANY_GENERATOR", text, "0 or 1");
    env.cacheAnyGenerator = text == "1";
  }

  env.cudaLibrary = textOr(lookup, "MEGAMOE_CUDA_LIBRARY");
  if (env.cudaLibrary.empty()) badValue("MEGAMOE_CUDA_LIBRARY", env.cudaLibrary, "a library name or path");
  env.hipLibrary = textOr(lookup, "MEGAMOE_HIP_LIBRARY");
  if (env.hipLibrary.empty()) badValue("MEGAMOE_HIP_LIBRARY", env.hipLibrary, "a library name or path");

  env.backend = textOr(lookup, "MEGAMOE_BACKEND");
  if (env.backend != "auto" && env.backend != "cuda" && env.backend != "hip")
    badValue("MEGAMOE_BACKEND", env.backend, "one of auto, cuda, hip");

  {
    const std::string text = textOr(lookup, "MEGAMOE_RENDEZVOUS_TIMEOUT_S");
    double value = 0;
    // At least a millisecond: the waits count in milliseconds, so less would be a zero timeout.
    if (!parseDecimal(text, &value) || value < 0.001 || value > 86400)
      badValue("MEGAMOE_RENDEZVOUS_TIMEOUT_S", text,
               "a number of seconds from 0.001 to 86400 written as digits with an optional '.' and fraction digits");
    env.rendezvousTimeoutS = value;
  }
  env.rendezvousSecret = textOr(lookup, "MEGAMOE_RENDEZVOUS_SECRET");
  // At most 1e12 ms, so that the timeout in nanoseconds still fits in 64 bits.
  env.waitTimeoutMs = parseInteger("MEGAMOE_WAIT_TIMEOUT_MS", textOr(lookup, "MEGAMOE_WAIT_TIMEOUT_MS"), 1,
                                   1000ull * 1000 * 1000 * 1000, false, " (milliseconds)");
  env.pushBlocks = int(parseInteger("MEGAMOE_PUSH_BLOCKS", textOr(lookup, "MEGAMOE_PUSH_BLOCKS"), 1, 1024));
  // Unset (the default): every SM, so no text to parse.
  if (const char* text = lookup("MEGAMOE_SM_BUDGET"))
    env.smBudget = int(parseInteger("MEGAMOE_SM_BUDGET", text, 2, 1024, /*even=*/true,
                                    " (SMs; the cluster-pair kernels launch whole pairs)"));
  env.logLevel = parseLogLevelEnv(lookup);
  const ProfileEnv profile = parseProfileEnv(lookup);
  env.nvtx = profile.nvtx;
  env.nvtxLibrary = profile.nvtxLibrary;
  return env;
}

RuntimeEnv parseEnv() { return parseEnv(processLookup); }

}  // namespace megamoe
