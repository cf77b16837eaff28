// The flat JSON object the compiler attaches to each cache entry, read with the project's JSON reader
// (compiler/cache/Json.h). Top-level scalar members are kept; nested objects and arrays are recorded as such.
#pragma once
#include <map>
#include <string>

namespace megamoe {

struct JsonScalar {
  enum class Kind { kString, kNumber, kBool, kNull, kComposite } kind = Kind::kNull;
  std::string text;  // string value (unescaped), or the number's literal text; empty otherwise
  bool boolean = false;
};

// Throws Error(kBadMetadata) with the byte offset of the problem. Duplicate keys: the last one wins.
std::map<std::string, JsonScalar> parseFlatJsonObject(const std::string& json);

// What the runtime needs from a kernel's metadata.
struct KernelMetadata {
  std::string symbol;    // kernel function name in the code object
  int blockThreads = 0;  // threads per block (> 0)
  int sharedBytes = 0;   // dynamic shared memory bytes per block (>= 0)
  std::string signature;  // the declaration's signature hash the kernel was built from ("" when absent)
  int abiVersion = 0;     // abi::kKernelAbiVersion at build time (0 when absent)
};

// Requires "symbol" (non-empty string), "block_threads" (integer > 0), "shared_bytes" (integer >= 0); reads
// "signature" (string) and "abi_version" (integer) when present; other members are ignored. Throws
// Error(kBadMetadata) naming the field.
KernelMetadata parseKernelMetadata(const std::string& json);

}  // namespace megamoe
