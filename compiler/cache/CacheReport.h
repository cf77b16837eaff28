// What megamoe-cache reports, kept LLVM-free so that host tests cover it: the facts it reads from a kernel's
// metadata, and the JSON it writes for `generate --json` and `list --json`, through the project's JSON reader and
// writer (Json.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "compiler/cache/Json.h"
#include "compiler/cache/KernelCache.h"

namespace megamoe::cache {

// A kernel's metadata as megamoe-cache shows it. The compiler attaches it to each entry
// (CompiledKernel::metadataJson(): symbol, block_threads, shared_bytes, compile_ms, static = StaticFacts::json()).
struct KernelFacts {
  int64_t dynamicSharedBytes = 0;                 // top-level shared_bytes (0 when absent)
  json::Value staticFacts = json::objectValue();  // the "static" object (empty when absent)

  // An integer of `staticFacts` as a table cell ("?" when absent).
  std::string column(const std::string& name) const;
  // Static + dynamic shared memory (LDS on gfx950) per block ("?" when the static figure is absent).
  std::string sharedColumn() const;
  // The compiler's static checks ran and found nothing: "violations" is there and empty.
  bool staticChecksPassed() const;
};

// Reads `metadata` into `facts`. Returns false with `problem` set (and `facts` untouched) when it is not a JSON
// object or a field megamoe-cache shows has the wrong type: a shared_bytes or register count that is not an
// integer, a "static" that is not an object, "violations" that is not a list of strings. Never throws for bad
// input.
bool readKernelFacts(const std::string& metadata, KernelFacts& facts, std::string& problem);

// One kernel x target of `megamoe-cache generate`.
struct GenerateRow {
  std::string kernel;  // KernelSpec::describe()
  std::string target;
  std::string ranks;   // the EP rank counts it serves ("2,8"), "-" for --kernel
  std::string status;  // "ok" | "FAIL"
  std::string error;
  bool hit = false;
  double ms = 0;       // getKernel: lookup on a hit, compile + store on a miss
  double loadMs = 0;   // the runtime's load path: lookup + read of the stored entry
  KernelFacts facts;
};

struct GenerateSummary {
  std::string shape;
  std::string cacheRoot;
  std::string fingerprint;
  double totalMs = 0;
  int failures = 0;
};

// `generate --json`: {"shape", "cache", "fingerprint", "total_ms", "failures", "kernels": [{"kernel", "target",
// "ep", "hit", "ms", "load_ms", "dynamic_shared_bytes", "status", "error", "static"}]}, one line.
std::string generateJson(const GenerateSummary& summary, const std::vector<GenerateRow>& rows);

// `list --json` and `verify --json`: [{"digest", "kernel", "bytes", "valid", "problem", "index_problem"}], one line.
std::string entriesJson(const std::vector<EntryInfo>& entries);

}  // namespace megamoe::cache
