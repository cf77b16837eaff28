// On-disk cache of compiled code objects, keyed by kernel name, specialisation, target, options and the
// compiler fingerprint. LLVM-free: the runtime (no LLVM) reads it, the compiler writes it.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace megamoe::cache {

// Thrown for cache errors that must not be silently ignored (unusable root, a store into an unwritable one, ...).
class CacheError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Everything that decides a code object's bytes.
struct KernelKey {
  std::string kernel;                                   // e.g. "swiglu_fwd"
  std::vector<std::pair<std::string, int64_t>> spec;    // compile-time constants, in the kernel's declared order
  std::string target;                                   // "sm_90a" | "gfx950"
  std::string options;                                  // canonical text of the target options struct
  std::string fingerprint;                              // project version + LLVM version + generator hash

  // Hex SHA-256 of all fields (the entry's directory name).
  std::string digest() const;
  // Hex SHA-256 of all fields but the fingerprint: how a JIT-less runtime finds the generated entry.
  std::string lookupDigest() const;
  // "swiglu_fwd[I=2048,clamp=0]@sm_90a"
  std::string describe() const;
};

struct CacheEntry {
  KernelKey key;
  std::string dir;                  // absolute path of the entry directory
  std::vector<uint8_t> binary;      // the code object (cubin or HSACO)
  std::string metadata;             // JSON text the compiler attached (static facts, compile time, ...)
};

struct EntryInfo {
  std::string digest;
  std::string description;          // KernelKey::describe()
  std::string target;
  uint64_t bytes = 0;
  int64_t mtime = 0;                // seconds since epoch
  bool valid = false;
  std::string problem;              // why it is invalid (empty when valid)
  // verify() only, valid entries: why index/<lookupDigest> does not lead to a valid entry of this key (missing,
  // garbage, dangling, another key's entry). Lookups still find the entry; prune() repairs the index.
  std::string indexProblem;
};

// The generator hash a compiler fingerprint names ("...; generator <hash>"), or "" when it names none.
std::string generatorOf(const std::string& fingerprint);

class KernelCache {
 public:
  // $MEGAMOE_CACHE_DIR, else $XDG_CACHE_HOME/megamoe, else $HOME/.cache/megamoe.
  static std::string defaultRoot();

  // Makes `root` absolute and creates nothing: lookups, list() and verify() need only read access (a read-only
  // mount, a root-owned shared cache); store() creates the layout and is the one that reports an unwritable cache.
  // Throws CacheError naming the path when it cannot be a cache at all (a non-directory or a dangling symbolic link
  // on the path, ...). An absent root is an empty cache.
  //
  // Every operation below first refuses (CacheError naming the path, its owner and mode, and the fix) a root or
  // subfolder (entries/, index/, tmp/, an entry's folder) or entry file that is not owned by the effective user or
  // root, or that is group- or other-writable, or a subfolder that is a symbolic link: whoever can write there can
  // plant code that is loaded onto the GPU. The root may be a link; what it resolves to is checked.
  explicit KernelCache(std::string root);
  const std::string& root() const { return root_; }

  // Called by lookups with an invalid entry's directory and what is wrong with it, before the entry is removed and
  // counted as a miss (the runtime logs it). Empty, the default: nothing is reported.
  using ProblemReporter = std::function<void(const std::string& dir, const std::string& problem)>;
  void setProblemReporter(ProblemReporter reporter) { reporter_ = std::move(reporter); }

  // Exact lookup. A corrupt or truncated entry counts as a miss and is removed. An entry that cannot be read
  // (EMFILE, EACCES, EIO, ...) proves nothing: CacheError saying why, and nothing is removed.
  std::optional<CacheEntry> lookup(const KernelKey& key) const;
  // Lookup by everything but the fingerprint (the newest entry stored for it): the runtime's cache-only mode. With
  // `generator` given, an entry whose fingerprint names another generator (generatorOf) is passed over, not removed.
  std::optional<CacheEntry> lookupAnyFingerprint(const KernelKey& key, const std::string& generator = "") const;

  // Writes into a temp dir under the root, then renames it into place. If a valid entry of the key is there
  // already (another process stored it first), kKeepValid keeps and returns it; kReplace (megamoe-cache generate
  // --force) swaps the new one in atomically. Throws CacheError on I/O failure, naming the directory and the errno
  // text ("... is not writable ..." when write access is what is missing).
  enum class StoreMode { kKeepValid, kReplace };
  CacheEntry store(const KernelKey& key, const std::vector<uint8_t>& binary, const std::string& metadata,
                   StoreMode mode = StoreMode::kKeepValid) const;

  struct Built {
    std::vector<uint8_t> binary;
    std::string metadata;
  };
  // lookup, else build + store. `hit` reports which happened.
  CacheEntry getOrBuild(const KernelKey& key, const std::function<Built()>& build, bool* hit = nullptr) const;

  // list() and verify() throw CacheError when entries/ exists but cannot be listed.
  std::vector<EntryInfo> list() const;
  // Every entry checked (manifest parse, size, SHA-256 of the binary); invalid ones reported, not removed.
  std::vector<EntryInfo> verify() const;
  // Removes invalid entries, the cache's own stale temp names in tmp/, and entries whose fingerprint differs from
  // `keepFingerprint` (when non-empty). Returns how many entries were removed. Names the cache does not make (in
  // entries/, index/, tmp/) and entries it cannot read are left in place and, if `leftAlone` is given, appended
  // to it as "'<path>': why; left in place".
  int prune(const std::string& keepFingerprint, std::vector<std::string>* leftAlone = nullptr) const {
    return prune([&](const std::string& f) { return keepFingerprint.empty() || f == keepFingerprint; }, leftAlone);
  }
  // The same, keeping the valid entries whose fingerprint `keep` accepts (one fingerprint per target, say).
  int prune(const std::function<bool(const std::string& fingerprint)>& keep,
            std::vector<std::string>* leftAlone = nullptr) const;

 private:
  void report(const std::string& dir, const std::string& problem) const {
    if (reporter_) reporter_(dir, problem);
  }
  std::string root_;
  ProblemReporter reporter_;
};

// Hex SHA-256 of bytes (used for keys and integrity checks).
std::string sha256Hex(const void* data, size_t size);
inline std::string sha256Hex(const std::string& s) { return sha256Hex(s.data(), s.size()); }

}  // namespace megamoe::cache
