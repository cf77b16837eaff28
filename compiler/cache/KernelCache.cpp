// On-disk kernel cache: entries/<digest>/{manifest.json,code.bin}, index/<lookupDigest>, tmp/. Every entry appears
// by one atomic directory rename, so readers never see a half-written entry; see docs/decisions/cache-layout.md.
#include "compiler/cache/KernelCache.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <system_error>
#include <tuple>

#include "compiler/cache/Json.h"
#include "compiler/cache/KernelCacheTestHooks.h"

namespace megamoe::cache {
namespace {

// 2: entry_sha256 covers the metadata. Format 1 entries are invalid (rebuilt), since nothing vouches for theirs.
constexpr int kManifestFormat = 2;
constexpr size_t kMaxManifestBytes = size_t(64) << 20;   // far above any real manifest; bounds reads of garbage
constexpr size_t kMaxIndexBytes = 4096;
// Far above any real code object (a few MiB). A manifest may claim no more, so that a crafted one cannot make a
// reader allocate what a sparse code.bin pretends to hold.
constexpr uint64_t kMaxBinaryBytes = uint64_t(512) << 20;
constexpr int64_t kStaleTempSeconds = 3600;
constexpr const char* kManifestName = "manifest.json";
constexpr const char* kBinaryName = "code.bin";
// Manifests are written by renderManifest below: integers only, no repeated keys, nesting two deep.
constexpr json::ParseOptions kManifestJson = {/*maxDepth=*/32, /*integersOnly=*/true, /*allowDuplicateKeys=*/false};

std::string joinPath(const std::string& a, const std::string& b) { return a + "/" + b; }

testhooks::Hook& testHook() {
  static testhooks::Hook* hook = new testhooks::Hook;
  return *hook;
}
void atTestPoint(testhooks::Point point, const std::string& dir) {
  if (const testhooks::Hook& hook = testHook()) hook(point, dir);
}

[[noreturn]] void throwIo(const std::string& what, const std::string& path, int err) {
  throw CacheError(what + " '" + path + "': " + std::strerror(err));
}

bool isHexDigest(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// ---------------------------------------------------------------------------------------------------------------
// Files

// Returned by readFileAt for anything but a regular file, and for a file failing trusted(); never errno values.
constexpr int kNotRegularFile = -1;
constexpr int kUntrusted = -2;

struct FileRead {
  int err = 0;          // 0, an errno value, kNotRegularFile or kUntrusted
  mode_t type = 0;      // st_mode of what is there (for kNotRegularFile and kUntrusted)
  uint64_t size = 0;    // the size fstat reported
  uid_t uid = 0;        // its owner (for kUntrusted)
};

const char* fileTypeName(mode_t type) {
  switch (type & S_IFMT) {
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    default: return "not a plain file";
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Trust. The checksums prove that an entry is consistent, not who wrote it: anyone who can write a folder or file
// of the cache can plant code that the runtime loads onto the GPU. So everything in it must be owned by this user
// or by root (a root-owned read-only shared cache is fine) and writable by no one else.

bool trusted(uid_t uid, mode_t mode) {
  return (uid == ::geteuid() || uid == 0) && (mode & (S_IWGRP | S_IWOTH)) == 0;
}

std::string userText(uid_t uid) {
  std::string text = "uid " + std::to_string(uid);
  if (const passwd* user = ::getpwuid(uid); user && user->pw_name && *user->pw_name)
    text += " (" + std::string(user->pw_name) + ")";
  return text;
}

// `path` failed trusted(): what it is, the rule, and how to fix it. `resolved`: where a symbolic link root leads.
[[noreturn]] void throwUntrusted(const std::string& path, uid_t uid, mode_t mode, const std::string& resolved = "") {
  char octal[16];
  std::snprintf(octal, sizeof octal, "%04o", unsigned(mode & 07777));
  const bool foreignOwner = uid != ::geteuid() && uid != 0;
  throw CacheError("refusing the kernel cache: '" + path + "'" +
                   (resolved.empty() || resolved == path ? "" : " (resolving to '" + resolved + "')") +
                   " is owned by " + userText(uid) + " with mode " + octal + "; it must be owned by you (uid " +
                   std::to_string(::geteuid()) + ") or root and writable by no one else, or another user could plant "
                   "code that is loaded onto the GPU (fix: " +
                   (foreignOwner ? "" : "chmod go-w '" + path + "', or ") +
                   "set MEGAMOE_CACHE_DIR to a directory of your own)");
}

[[noreturn]] void throwLinkedFolder(const std::string& path) {
  throw CacheError("refusing the kernel cache: '" + path +
                   "' is a symbolic link (only the root may be one), so whoever controls its target could plant code "
                   "that is loaded onto the GPU (fix: make it a directory, or set MEGAMOE_CACHE_DIR to a directory "
                   "of your own)");
}

// Whether a failed read says something about an entry's content (missing, not a regular file, too large: the
// entry is invalid and may be removed). Anything else (EMFILE, ENFILE, EACCES, EIO, ENOMEM, ...) is about this
// process or machine: nothing can be concluded from it, and nothing is removed.
bool isContentProblem(int err) { return err == ENOENT || err == kNotRegularFile || err == EFBIG; }

// Why `name` could not be read, for an entry's problem text.
std::string readProblem(const std::string& name, const FileRead& r) {
  if (r.err == ENOENT) return name + " is missing";
  if (r.err == kNotRegularFile) return name + " is not a regular file (" + fileTypeName(r.type) + ")";
  if (r.err == EFBIG) return name + " is too large (" + std::to_string(r.size) + " bytes)";
  return "cannot read " + name + ": " + std::strerror(r.err);
}

// Reads a whole regular file, `path` relative to the directory `dirFd` (or AT_FDCWD). err is EFBIG when the file is
// larger than maxBytes (nothing is read then). Anything but a regular file is refused unopened where possible, and
// the open itself neither follows a symbolic link nor waits (a FIFO blocks a plain open until a writer comes).
FileRead readFileAt(int dirFd, const std::string& path, std::vector<uint8_t>& out, size_t maxBytes) {
  FileRead r;
  out.clear();
  struct stat st;
  if (::fstatat(dirFd, path.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    r.err = errno;
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    r.err = kNotRegularFile;
    r.type = st.st_mode;
    return r;
  }
  int fd = ::openat(dirFd, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) {
    r.err = errno;
    if (r.err == ELOOP) {  // replaced by a symbolic link since the fstatat
      r.err = kNotRegularFile;
      r.type = S_IFLNK;
    }
    return r;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0) {
    r.err = errno;
    return r;
  }
  r.size = uint64_t(st.st_size);
  if (!S_ISREG(st.st_mode)) {  // replaced since the fstatat
    r.err = kNotRegularFile;
    r.type = st.st_mode;
    return r;
  }
  if (!trusted(st.st_uid, st.st_mode)) {
    r.err = kUntrusted;
    r.type = st.st_mode;
    r.uid = st.st_uid;
    return r;
  }
  if (r.size > maxBytes) {
    r.err = EFBIG;
    return r;
  }
  out.resize(size_t(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      r.err = errno;
      out.clear();
      return r;
    }
    if (n == 0) break;  // shrank since fstat: the caller's size checks see the short result
    done += size_t(n);
  }
  out.resize(done);
  return r;
}

FileRead readTextFileAt(int dirFd, const std::string& path, std::string& out, size_t maxBytes) {
  std::vector<uint8_t> bytes;
  FileRead r = readFileAt(dirFd, path, bytes, maxBytes);
  out.assign(bytes.begin(), bytes.end());
  return r;
}

// Creates `path` (which must not exist) holding exactly `data`; throws CacheError naming the path.
void writeNewFile(const std::string& path, const void* data, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throwIo("cannot create", path, errno);
  const auto* bytes = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(path.c_str());
      throwIo("cannot write", path, err);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(path.c_str());
    throwIo("cannot write", path, err);
  }
}

void removeTree(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

// mkdir that tolerates an existing directory. Returns 0 or an errno value (ENOTDIR when a non-directory is there).
int makeDirectory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return 0;
  int err = errno;
  struct stat st;
  if (err == EEXIST) return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  return err;
}

// mkdir -p. On failure returns the errno value and sets `failedAt` to the component that could not be made.
int makeDirectories(const std::string& path, std::string& failedAt) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string prefix = path.substr(0, slash);
    if (!prefix.empty() && prefix.back() != '/') {
      if (int err = makeDirectory(prefix)) {
        failedAt = prefix;
        return err;
      }
    }
    if (slash == std::string::npos) return 0;
  }
}

// The target of `path` when it is a symbolic link to nothing, else "".
std::string danglingLinkTarget(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return "";
  if (::stat(path.c_str(), &st) == 0 || errno != ENOENT) return "";
  std::error_code ec;
  std::string target = std::filesystem::read_symlink(path, ec).string();
  return ec || target.empty() ? "?" : target;
}

// Why `root` cannot be a cache directory, as the rest of a sentence starting with the root's name ("is not a
// directory", "cannot be used: ..."), or "" when it can: a directory, or absent (store() creates it). Reading
// needs nothing more, so write access is left to store() to find out.
std::string rootProblem(const std::string& root) {
  struct stat st;
  if (::stat(root.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? "" : "is not a directory";
  // Walk down from the top to name the component at fault.
  for (size_t slash = root.find('/', 1);; slash = root.find('/', slash + 1)) {
    const std::string prefix = root.substr(0, slash);
    const bool isRoot = slash == std::string::npos;
    if (::stat(prefix.c_str(), &st) != 0) {
      const int err = errno;
      if (std::string target = danglingLinkTarget(prefix); !target.empty())
        return (isRoot ? "is" : "cannot be used: '" + prefix + "' is") + " a dangling symbolic link to '" + target +
               "'";
      if (err == ENOENT) return "";
      return "cannot be used: cannot access '" + prefix + "': " + std::strerror(err);
    }
    if (!S_ISDIR(st.st_mode))
      return isRoot ? "is not a directory" : "cannot be used: '" + prefix + "' is not a directory";
    if (isRoot) return "";  // it appeared since the first stat
  }
}

// The names in the folder `path`, sorted; none when it is absent. Throws CacheError naming it when it cannot be
// listed (not a directory, no permission, out of descriptors, ...): an unreadable folder is not an empty one.
std::vector<std::string> listDirectory(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = ::opendir(path.c_str());
  if (!dir) {
    if (errno == ENOENT) return names;
    throwIo("cannot list the kernel cache folder", path, errno);
  }
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (!entry) {
      const int err = errno;
      ::closedir(dir);
      if (err) throwIo("cannot list the kernel cache folder", path, err);
      break;
    }
    std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// "<pid>.<counter>.<random>": unique across processes (pid), threads and calls (counter), and pid reuse (random).
std::string uniqueSuffix() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng([] {
    uint64_t seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) ^ uint64_t(::getpid());
    try {
      std::random_device device;
      seed ^= (uint64_t(device()) << 32) ^ device();
    } catch (...) {
      // No entropy source: the pid and counter still make the name unique.
    }
    return seed;
  }());
  char buffer[80];
  std::snprintf(buffer, sizeof buffer, "%ld.%" PRIu64 ".%016" PRIx64, long(::getpid()), counter.fetch_add(1),
                uint64_t(rng()));
  return buffer;
}

// Whether `name` in tmp/ is one the cache makes: "<digest>.<suffix>" (an entry being stored), "trash.<digest>.
// <suffix>" (one being deleted), "index.<lookupDigest>.<suffix>" (an index update), with uniqueSuffix()'s
// "<pid>.<counter>.<hex>". prune() deletes nothing else there: the folder may hold other programs' files.
bool isOwnTempName(std::string name) {
  for (const char* prefix : {"trash.", "index."}) {
    if (name.rfind(prefix, 0) == 0) {
      name.erase(0, std::strlen(prefix));
      break;
    }
  }
  if (name.size() < 66 || name[64] != '.' || !isHexDigest(name.substr(0, 64))) return false;
  const std::string suffix = name.substr(65);
  const size_t first = suffix.find('.'), second = first == std::string::npos ? first : suffix.find('.', first + 1);
  if (second == std::string::npos) return false;
  auto only = [](const std::string& s, const char* chars) {
    return !s.empty() && s.find_first_not_of(chars) == std::string::npos;
  };
  return only(suffix.substr(0, first), "0123456789") &&
         only(suffix.substr(first + 1, second - first - 1), "0123456789") &&
         only(suffix.substr(second + 1), "0123456789abcdef");
}

// Removes a temp directory unless release() is called.
class TempDirGuard {
 public:
  explicit TempDirGuard(std::string path) : path_(std::move(path)) {}
  ~TempDirGuard() {
    if (!path_.empty()) removeTree(path_);
  }
  TempDirGuard(const TempDirGuard&) = delete;
  TempDirGuard& operator=(const TempDirGuard&) = delete;
  void release() { path_.clear(); }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------------------------------
// Manifest

// "<bytes>:<text>": length-prefixed, so no two different field lists serialise alike.
void appendField(std::string& out, const std::string& text) {
  out += std::to_string(text.size());
  out += ':';
  out += text;
}

// The leading tag keeps digest and lookupDigest apart and versions the scheme.
std::string serialiseKey(const KernelKey& key, bool withFingerprint) {
  std::string out;
  appendField(out, withFingerprint ? "megamoe.kernel-key.v1" : "megamoe.kernel-lookup-key.v1");
  appendField(out, key.kernel);
  appendField(out, std::to_string(key.spec.size()));
  for (const auto& [name, value] : key.spec) {
    appendField(out, name);
    appendField(out, std::to_string(value));
  }
  appendField(out, key.target);
  appendField(out, key.options);
  if (withFingerprint) appendField(out, key.fingerprint);
  return out;
}

struct Manifest {
  KernelKey key;
  std::string digest;
  std::string lookupDigest;
  uint64_t binarySize = 0;
  std::string binarySha256;
  int64_t created = 0;
  std::string metadata;
  std::string entrySha256;
};

// SHA-256 over every other manifest field, so that an edit of any of them, the launch metadata (symbol,
// block_threads, shared_bytes, ...) included, makes the entry invalid; code.bin is covered through binary_sha256.
std::string computeEntrySha256(const Manifest& m) {
  std::string out;
  appendField(out, "megamoe.cache-entry.v2");
  appendField(out, serialiseKey(m.key, true));
  appendField(out, m.digest);
  appendField(out, m.lookupDigest);
  appendField(out, std::to_string(m.binarySize));
  appendField(out, m.binarySha256);
  appendField(out, std::to_string(m.created));
  appendField(out, m.metadata);
  return sha256Hex(out);
}

std::string renderManifest(const Manifest& m) {
  std::string out = "{\n";
  auto stringField = [&](const char* name, const std::string& value) {
    out += "  \"";
    out += name;
    out += "\": ";
    json::appendQuoted(out, value);
    out += ",\n";
  };
  auto integerField = [&](const char* name, const std::string& value) {
    out += "  \"";
    out += name;
    out += "\": " + value + ",\n";
  };
  integerField("format", std::to_string(kManifestFormat));
  stringField("entry_sha256", m.entrySha256);
  stringField("digest", m.digest);
  stringField("lookup_digest", m.lookupDigest);
  stringField("kernel", m.key.kernel);
  out += "  \"spec\": [";
  for (size_t i = 0; i < m.key.spec.size(); ++i) {
    out += i ? ", [" : "[";
    json::appendQuoted(out, m.key.spec[i].first);
    out += ", " + std::to_string(m.key.spec[i].second) + "]";
  }
  out += "],\n";
  stringField("target", m.key.target);
  stringField("options", m.key.options);
  stringField("fingerprint", m.key.fingerprint);
  integerField("binary_size", std::to_string(m.binarySize));
  stringField("binary_sha256", m.binarySha256);
  integerField("created", std::to_string(m.created));
  out += "  \"metadata\": ";
  json::appendQuoted(out, m.metadata);
  out += "\n}\n";
  return out;
}

bool parseManifest(const std::string& text, Manifest& m, std::string& problem) {
  json::Value root;
  json::ParseError error;
  if (!json::parse(text, root, error, kManifestJson)) {
    problem = "manifest.json is not valid JSON: " + error.reason + " at offset " + std::to_string(error.offset);
    return false;
  }
  if (root.kind != json::Value::Kind::kObject) {
    problem = "manifest.json is not a JSON object";
    return false;
  }
  auto field = [&](const char* name, json::Value::Kind kind) -> const json::Value* {
    const json::Value* value = root.find(name);
    if (!value || value->kind != kind) {
      problem = std::string("manifest.json field '") + name + "' is missing or has the wrong type";
      return nullptr;
    }
    return value;
  };
  using K = json::Value::Kind;
  const json::Value* format = field("format", K::kInteger);
  if (!format) return false;
  if (format->integer != kManifestFormat) {
    problem = "manifest.json has format " + std::to_string(format->integer) + ", expected " +
              std::to_string(kManifestFormat);
    if (format->integer < kManifestFormat) problem += " (from an older megamoe, without a checksum over its metadata)";
    return false;
  }
  const json::Value *entrySha256, *digest, *lookupDigest, *kernel, *spec, *target, *options, *fingerprint, *size,
      *sha, *created, *metadata;
  if (!(entrySha256 = field("entry_sha256", K::kString)) || !(digest = field("digest", K::kString)) ||
      !(lookupDigest = field("lookup_digest", K::kString)) ||
      !(kernel = field("kernel", K::kString)) || !(spec = field("spec", K::kArray)) ||
      !(target = field("target", K::kString)) || !(options = field("options", K::kString)) ||
      !(fingerprint = field("fingerprint", K::kString)) || !(size = field("binary_size", K::kInteger)) ||
      !(sha = field("binary_sha256", K::kString)) || !(created = field("created", K::kInteger)) ||
      !(metadata = field("metadata", K::kString)))
    return false;
  if (size->integer < 0) {
    problem = "manifest.json has a negative binary_size";
    return false;
  }
  if (uint64_t(size->integer) > kMaxBinaryBytes) {
    problem = "manifest.json binary_size " + std::to_string(size->integer) + " is over the limit of " +
              std::to_string(kMaxBinaryBytes) + " bytes";
    return false;
  }
  m.key.spec.clear();
  for (const json::Value& pair : spec->array) {
    if (pair.kind != K::kArray || pair.array.size() != 2 || pair.array[0].kind != K::kString ||
        pair.array[1].kind != K::kInteger) {
      problem = "manifest.json field 'spec' is not a list of [name, integer] pairs";
      return false;
    }
    m.key.spec.emplace_back(pair.array[0].text, pair.array[1].integer);
  }
  m.key.kernel = kernel->text;
  m.key.target = target->text;
  m.key.options = options->text;
  m.key.fingerprint = fingerprint->text;
  m.digest = digest->text;
  m.lookupDigest = lookupDigest->text;
  m.binarySize = uint64_t(size->integer);
  m.binarySha256 = sha->text;
  m.created = created->integer;
  m.metadata = metadata->text;
  m.entrySha256 = entrySha256->text;
  return true;
}

// ---------------------------------------------------------------------------------------------------------------
// Entries

// Whether an entry of `fingerprint` may serve a lookup for `generator` ("": any). A fingerprint that names no
// generator (hand-made, or from before fingerprints named one) is foreign to every generator.
bool fromGenerator(const std::string& fingerprint, const std::string& generator) {
  return generator.empty() || generatorOf(fingerprint) == generator;
}

bool sameKeyIgnoringFingerprint(const KernelKey& a, const KernelKey& b) {
  return a.kernel == b.kernel && a.spec == b.spec && a.target == b.target && a.options == b.options;
}
bool sameKey(const KernelKey& a, const KernelKey& b) {
  return sameKeyIgnoringFingerprint(a, b) && a.fingerprint == b.fingerprint;
}

enum class Check {
  kCheap,  // manifest and binary size only (list)
  kFull,   // also reads the binary and checks its SHA-256 (lookup, verify)
};

struct LoadedEntry {
  bool missing = false;       // the directory does not exist (not an error: a miss)
  bool replaced = false;      // another entry took the folder's place while it was read (loadEntry reads it again)
  std::string problem;        // non-empty: the entry is invalid (its content says so); it may be removed
  std::string error;          // non-empty: it could not be read (EMFILE, EACCES, EIO, ...); validity unknown
  bool haveManifest = false;  // `manifest` parsed (it may still be inconsistent)
  Manifest manifest;
  uint64_t binaryBytes = 0;
  std::vector<uint8_t> binary;  // kFull only

  bool valid() const { return !missing && !replaced && problem.empty() && error.empty(); }
  bool invalid() const { return !missing && !replaced && !problem.empty(); }
};

// How often loadEntry reads an entry that keeps being replaced under it before it gives up (an error, not a verdict).
constexpr int kReadsOfAReplacedEntry = 4;

// One read of the entry in `dir` (see loadEntry). Both files are read through one directory descriptor: if another
// process swaps the entry meanwhile (store --force renames a new folder over it, prune or a repair moves it aside),
// we still see one generation's manifest and binary, never a mix; and a file gone from that folder says nothing of
// what is at `dir` now: the entry is `missing` if nothing is there, `replaced` if another folder is.
LoadedEntry loadEntryOnce(const std::string& dir, const std::string& digest, Check check) {
  LoadedEntry e;
  int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dirFd < 0) {
    const int err = errno;
    if (err == ENOENT) e.missing = true;
    else if (err == ENOTDIR) e.problem = "not a directory";
    else if (err == ELOOP) e.problem = "a symbolic link, not a directory";
    else e.error = "cannot open '" + dir + "': " + std::strerror(err);
    return e;
  }
  struct DirCloser {
    int fd;
    ~DirCloser() { ::close(fd); }
  } closer{dirFd};
  struct stat dirStat;
  if (::fstat(dirFd, &dirStat) != 0) {
    e.error = "cannot stat '" + dir + "': " + std::strerror(errno);
    return e;
  }
  if (!trusted(dirStat.st_uid, dirStat.st_mode)) throwUntrusted(dir, dirStat.st_uid, dirStat.st_mode);
  atTestPoint(testhooks::Point::kEntryOpened, dir);
  // A content problem makes the entry invalid; any other failure only says that it could not be read.
  auto readFailed = [&](const char* name, const FileRead& r) {
    if (r.err == kUntrusted) throwUntrusted(joinPath(dir, name), r.uid, r.type);
    if (r.err == ENOENT) {
      struct stat now;
      if (::lstat(dir.c_str(), &now) != 0) {
        const int err = errno;
        if (err == ENOENT) e.missing = true;
        else e.error = "cannot access '" + dir + "': " + std::strerror(err);
        return;
      }
      // The folder we read is still open, so its inode number cannot have gone to another yet.
      if (now.st_dev != dirStat.st_dev || now.st_ino != dirStat.st_ino) {
        e.replaced = true;
        return;
      }
    }
    if (isContentProblem(r.err)) e.problem = readProblem(name, r);
    else e.error = "cannot read '" + joinPath(dir, name) + "': " + std::strerror(r.err);
  };

  std::string text;
  if (FileRead r = readTextFileAt(dirFd, kManifestName, text, kMaxManifestBytes); r.err) {
    readFailed(kManifestName, r);
    return e;
  }
  if (!parseManifest(text, e.manifest, e.problem)) return e;
  e.haveManifest = true;
  const Manifest& m = e.manifest;
  if (m.digest != digest) {
    e.problem = "manifest digest " + m.digest + " does not match the directory name";
    return e;
  }
  if (m.key.digest() != digest) {
    e.problem = "manifest key fields do not hash to the directory name";
    return e;
  }
  if (m.lookupDigest != m.key.lookupDigest()) {
    e.problem = "manifest lookup_digest does not match its key fields";
    return e;
  }
  if (m.entrySha256 != computeEntrySha256(m)) {
    e.problem = "manifest entry_sha256 does not match its fields (the manifest was edited or corrupted)";
    return e;
  }

  auto sizeProblem = [&](uint64_t actual) {
    return "code.bin has " + std::to_string(actual) + " bytes, the manifest records " +
           std::to_string(m.binarySize);
  };
  if (check == Check::kCheap) {
    struct stat binaryStat;
    if (::fstatat(dirFd, kBinaryName, &binaryStat, AT_SYMLINK_NOFOLLOW) != 0) {
      readFailed(kBinaryName, FileRead{errno, 0, 0, 0});
      return e;
    }
    if (!S_ISREG(binaryStat.st_mode)) {
      e.problem = readProblem(kBinaryName, FileRead{kNotRegularFile, binaryStat.st_mode, 0, 0});
      return e;
    }
    if (!trusted(binaryStat.st_uid, binaryStat.st_mode))
      throwUntrusted(joinPath(dir, kBinaryName), binaryStat.st_uid, binaryStat.st_mode);
    e.binaryBytes = uint64_t(binaryStat.st_size);
    if (e.binaryBytes != m.binarySize) e.problem = sizeProblem(e.binaryBytes);
    return e;
  }

  // parseManifest capped binarySize at kMaxBinaryBytes, so this allocates at most that much.
  FileRead r = readFileAt(dirFd, kBinaryName, e.binary, size_t(std::min<uint64_t>(m.binarySize, SIZE_MAX)));
  e.binaryBytes = r.size;
  if (r.err == EFBIG) {
    e.problem = sizeProblem(r.size);
  } else if (r.err) {
    readFailed(kBinaryName, r);
  } else if (e.binary.size() != m.binarySize) {
    e.problem = sizeProblem(e.binary.size());
  } else if (sha256Hex(e.binary.data(), e.binary.size()) != m.binarySha256) {
    e.problem = "code.bin SHA-256 does not match the manifest (contents corrupted)";
  }
  if (!e.valid()) e.binary.clear();
  return e;
}

// Loads and validates the entry in `dir`, which must be the entry for `digest`. One replaced while it was read is
// read again, up to kReadsOfAReplacedEntry times; then it is unreadable (`error`), so nothing removes it. Throws
// CacheError when the folder or a file fails trusted().
LoadedEntry loadEntry(const std::string& dir, const std::string& digest, Check check) {
  for (int read = 1;; ++read) {
    LoadedEntry e = loadEntryOnce(dir, digest, check);
    if (!e.replaced) return e;
    if (read == kReadsOfAReplacedEntry) {
      e.replaced = false;
      e.error = "'" + dir + "' was replaced by other processes under each of " + std::to_string(read) +
                " reads of it";
      return e;
    }
  }
}

struct Layout {
  std::string root;
  std::string entries() const { return joinPath(root, "entries"); }
  std::string index() const { return joinPath(root, "index"); }
  std::string tmp() const { return joinPath(root, "tmp"); }
  std::string entry(const std::string& digest) const { return joinPath(entries(), digest); }
  std::string indexFile(const std::string& lookupDigest) const { return joinPath(index(), lookupDigest); }

  // Refuses (CacheError, naming the path) a root or subfolder that another user could write: see trusted(). The
  // root is stat'ed (it may be a link the user made), the subfolders lstat'ed (the cache never makes them links).
  // Returns false when the root is absent (an empty cache). Every operation starts here: four stat calls.
  bool checkTrust() const {
    struct stat st;
    if (::stat(root.c_str(), &st) != 0) {
      if (errno == ENOENT) return false;
      throwIo("cannot access the kernel cache directory", root, errno);
    }
    if (!S_ISDIR(st.st_mode))
      throw CacheError("kernel cache directory '" + root +
                       "' is not a directory (set MEGAMOE_CACHE_DIR to a usable directory)");
    if (!trusted(st.st_uid, st.st_mode)) {
      std::error_code ec;
      throwUntrusted(root, st.st_uid, st.st_mode, std::filesystem::canonical(root, ec).string());
    }
    for (const std::string& dir : {entries(), index(), tmp()}) {
      if (::lstat(dir.c_str(), &st) != 0) {
        if (errno == ENOENT) continue;
        throwIo("cannot access the kernel cache folder", dir, errno);
      }
      if (S_ISLNK(st.st_mode)) throwLinkedFolder(dir);
      // A non-directory is left to the operation: a lookup misses, a listing or a store reports it.
      if (S_ISDIR(st.st_mode) && !trusted(st.st_uid, st.st_mode)) throwUntrusted(dir, st.st_uid, st.st_mode);
    }
    return true;
  }

  // Creates the root (mkdir -p) and its three subdirectories, 0755 or tighter (the umask can only take bits away);
  // returns 0 or an errno value with the failing path.
  int create(std::string& failedAt) const {
    if (int err = makeDirectories(root, failedAt)) return err;
    for (const std::string& dir : {entries(), index(), tmp()}) {
      if (int err = makeDirectory(dir)) {
        failedAt = dir;
        return err;
      }
    }
    return 0;
  }

  // Removes entries/<name> without racing readers or writers: rename it into tmp/ first, so a concurrent store
  // of the same digest can land at once. With `keepIfValid`, an entry that turns out valid once moved (another
  // process replaced the corrupt one we saw) is put back instead. Returns whether an entry was removed.
  bool removeEntry(const std::string& name, bool keepIfValid) const {
    makeDirectory(tmp());
    std::string from = entry(name);
    atTestPoint(testhooks::Point::kEntryRemoving, from);
    std::string aside = joinPath(tmp(), "trash." + name + "." + uniqueSuffix());
    if (::rename(from.c_str(), aside.c_str()) != 0) return false;  // already gone, or beyond repair by us
    // Put back unless it is still invalid: valid, or unreadable now (EMFILE, ...), which proves nothing.
    if (keepIfValid && isHexDigest(name) && !loadEntry(aside, name, Check::kFull).invalid() &&
        ::rename(aside.c_str(), from.c_str()) == 0)
      return false;
    removeTree(aside);
    return true;
  }

  // Points index/<lookupDigest> at `digest`: temp file + rename, so readers see the old or the new one.
  void writeIndex(const std::string& lookupDigest, const std::string& digest) const {
    std::string temp = joinPath(tmp(), "index." + lookupDigest + "." + uniqueSuffix());
    std::string content = digest + "\n";
    writeNewFile(temp, content.data(), content.size());
    std::string target = indexFile(lookupDigest);
    if (::rename(temp.c_str(), target.c_str()) != 0) {
      int err = errno;
      ::unlink(temp.c_str());
      throwIo("cannot update the cache index", target, err);
    }
  }

  // writeIndex for callers that can do without the index: lookups scan entries/ when it misses, so failing to
  // write it (a read-only cache, a full disk) costs only speed. Returns whether the index was written.
  bool tryWriteIndex(const std::string& lookupDigest, const std::string& digest) const {
    try {
      writeIndex(lookupDigest, digest);
      return true;
    } catch (const CacheError&) {
      return false;
    }
  }

  // The digest index/<lookupDigest> names, or "" when absent or malformed; then `problem`, if given, says why.
  std::string readIndex(const std::string& lookupDigest, std::string* problem = nullptr) const {
    const std::string name = "index/" + lookupDigest;
    std::string text;
    if (FileRead r = readTextFileAt(AT_FDCWD, indexFile(lookupDigest), text, kMaxIndexBytes); r.err) {
      if (r.err == kUntrusted) throwUntrusted(indexFile(lookupDigest), r.uid, r.type);
      if (problem) *problem = readProblem(name, r);
      return "";
    }
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
    if (isHexDigest(text)) return text;
    if (problem) *problem = name + " does not hold an entry digest";
    return "";
  }
};

// Ordering of entries of one lookup key: later `created` first, then the larger digest, so that every process
// (and prune) picks the same "newest" entry.
bool newerThan(int64_t created, const std::string& digest, int64_t otherCreated, const std::string& otherDigest) {
  return std::tie(created, digest) > std::tie(otherCreated, otherDigest);
}

// A lookup of `key` met an entry it could not read (EMFILE, EACCES, ...): an error, and the entry stays.
CacheError unreadableEntry(const KernelKey& key, const std::string& error) {
  return CacheError("cannot look up " + key.describe() + " in the kernel cache: " + error +
                    " (the entry is left in place)");
}

// The entries whose manifests claim `key` (fingerprint aside), newest first. Manifests only: the caller still
// checks the binary of the one it takes.
std::vector<std::string> entriesForLookupKey(const Layout& layout, const KernelKey& key,
                                             const std::string& lookupDigest) {
  std::vector<std::pair<int64_t, std::string>> found;
  for (const std::string& name : listDirectory(layout.entries())) {
    if (!isHexDigest(name)) continue;
    LoadedEntry e = loadEntry(layout.entry(name), name, Check::kCheap);
    if (!e.error.empty()) throw unreadableEntry(key, e.error);
    if (e.valid() && e.manifest.lookupDigest == lookupDigest && sameKeyIgnoringFingerprint(e.manifest.key, key))
      found.emplace_back(e.manifest.created, name);
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return newerThan(a.first, a.second, b.first, b.second);
  });
  std::vector<std::string> digests;
  for (auto& [created, digest] : found) digests.push_back(std::move(digest));
  return digests;
}

CacheEntry toCacheEntry(LoadedEntry&& loaded, std::string dir) {
  CacheEntry entry;
  entry.key = std::move(loaded.manifest.key);
  entry.dir = std::move(dir);
  entry.binary = std::move(loaded.binary);
  entry.metadata = std::move(loaded.manifest.metadata);
  return entry;
}

std::string nonEmptyEnv(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : "";
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// KernelKey

std::string KernelKey::digest() const { return sha256Hex(serialiseKey(*this, true)); }

std::string KernelKey::lookupDigest() const { return sha256Hex(serialiseKey(*this, false)); }

std::string KernelKey::describe() const {
  std::string out = kernel;
  if (!spec.empty()) {
    out += '[';
    for (size_t i = 0; i < spec.size(); ++i) {
      if (i) out += ',';
      out += spec[i].first + "=" + std::to_string(spec[i].second);
    }
    out += ']';
  }
  return out + "@" + target;
}

// ---------------------------------------------------------------------------------------------------------------
// KernelCache

std::string KernelCache::defaultRoot() {
  std::string dir = nonEmptyEnv("MEGAMOE_CACHE_DIR");
  if (!dir.empty()) return dir;
  dir = nonEmptyEnv("XDG_CACHE_HOME");
  if (!dir.empty() && dir[0] == '/') return joinPath(dir, "megamoe");  // XDG: relative values are ignored
  dir = nonEmptyEnv("HOME");
  if (dir.empty()) {
    if (const passwd* user = ::getpwuid(::getuid()); user && user->pw_dir && *user->pw_dir) dir = user->pw_dir;
  }
  if (dir.empty())
    throw CacheError("cannot choose a kernel cache directory: HOME is not set (set MEGAMOE_CACHE_DIR)");
  return joinPath(joinPath(dir, ".cache"), "megamoe");
}

KernelCache::KernelCache(std::string root) : root_(std::move(root)) {
  auto unusable = [this](const std::string& problem) {
    return CacheError("kernel cache directory '" + root_ + "' " + problem +
                      " (set MEGAMOE_CACHE_DIR to a usable directory)");
  };
  if (root_.empty()) throw unusable("cannot be used: the path is empty");
  if (root_[0] != '/') {
    std::error_code ec;
    std::filesystem::path cwd = std::filesystem::current_path(ec);
    if (ec) throw unusable("cannot be used: cannot resolve the relative path: " + ec.message());
    root_ = joinPath(cwd.string(), root_);
  }
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
  // Nothing is created here: a read-only cache (a read-only mount, another user's cache) must serve lookups.
  if (std::string problem = rootProblem(root_); !problem.empty()) throw unusable(problem);
}

std::optional<CacheEntry> KernelCache::lookup(const KernelKey& key) const {
  Layout layout{root_};
  if (!layout.checkTrust()) return std::nullopt;  // no root: an empty cache
  std::string digest = key.digest();
  std::string dir = layout.entry(digest);
  LoadedEntry loaded = loadEntry(dir, digest, Check::kFull);
  if (loaded.missing) return std::nullopt;
  if (!loaded.error.empty()) throw unreadableEntry(key, loaded.error);
  if (!loaded.valid() || !sameKey(loaded.manifest.key, key)) {
    if (!loaded.valid()) report(dir, loaded.problem);
    layout.removeEntry(digest, /*keepIfValid=*/true);
    return std::nullopt;
  }
  // Repair an index that leads nowhere (missing, garbage, dangling), so that cache-only lookups take the shortcut
  // again. One naming an existing entry is left alone: lookupAnyFingerprint checks that entry's key itself.
  const std::string lookupDigest = key.lookupDigest();
  const std::string indexed = layout.readIndex(lookupDigest);
  struct stat st;
  if (indexed != digest && (indexed.empty() || ::stat(layout.entry(indexed).c_str(), &st) != 0))
    layout.tryWriteIndex(lookupDigest, digest);
  return toCacheEntry(std::move(loaded), std::move(dir));
}

std::optional<CacheEntry> KernelCache::lookupAnyFingerprint(const KernelKey& key, const std::string& generator) const {
  Layout layout{root_};
  if (!layout.checkTrust()) return std::nullopt;  // no root: an empty cache
  const std::string lookupDigest = key.lookupDigest();
  const std::string indexed = layout.readIndex(lookupDigest);
  if (!indexed.empty()) {
    std::string dir = layout.entry(indexed);
    LoadedEntry loaded = loadEntry(dir, indexed, Check::kFull);
    if (!loaded.error.empty()) throw unreadableEntry(key, loaded.error);
    if (loaded.valid() && sameKeyIgnoringFingerprint(loaded.manifest.key, key) &&
        fromGenerator(loaded.manifest.key.fingerprint, generator))
      return toCacheEntry(std::move(loaded), std::move(dir));
    // A valid entry for another key (a hand-edited index) is not ours to delete.
    if (loaded.invalid()) {
      report(dir, loaded.problem);
      layout.removeEntry(indexed, /*keepIfValid=*/true);
    }
  }
  // The index is a shortcut, not the record: it can be missing, garbage or stale (store() renames the entry into
  // place before it writes the index, and that write can fail), so the entries themselves decide.
  for (const std::string& digest : entriesForLookupKey(layout, key, lookupDigest)) {
    if (digest == indexed) continue;  // tried above
    std::string dir = layout.entry(digest);
    LoadedEntry loaded = loadEntry(dir, digest, Check::kFull);
    if (loaded.missing) continue;
    if (!loaded.error.empty()) throw unreadableEntry(key, loaded.error);
    if (!loaded.valid() || !sameKeyIgnoringFingerprint(loaded.manifest.key, key) ||
        !fromGenerator(loaded.manifest.key.fingerprint, generator)) {
      if (!loaded.valid()) {
        report(dir, loaded.problem);
        layout.removeEntry(digest, /*keepIfValid=*/true);
      }
      continue;
    }
    layout.tryWriteIndex(lookupDigest, digest);
    return toCacheEntry(std::move(loaded), std::move(dir));
  }
  return std::nullopt;
}

CacheEntry KernelCache::store(const KernelKey& key, const std::vector<uint8_t>& binary,
                              const std::string& metadata, StoreMode mode) const {
  Layout layout{root_};
  if (binary.size() > kMaxBinaryBytes)
    throw CacheError("cannot store " + key.describe() + ": its code object has " + std::to_string(binary.size()) +
                     " bytes, over the kernel cache's limit of " + std::to_string(kMaxBinaryBytes));
  // The only place that needs write access, so the only one that says it lacks it.
  auto cannotCreate = [&](const std::string& path, int err) {
    const bool denied = err == EACCES || err == EPERM || err == EROFS;
    std::string target = danglingLinkTarget(path);
    return CacheError("cannot store " + key.describe() + ": kernel cache directory '" + root_ + "' " +
                      (denied ? "is not writable" : "cannot be written") + ": " +
                      (target.empty() ? "cannot create '" + path + "': " + std::strerror(err)
                                      : "'" + path + "' is a dangling symbolic link to '" + target + "'") +
                      (denied ? " (a store needs write access; set MEGAMOE_CACHE_DIR to a writable directory)" : ""));
  };
  std::string failedAt;
  layout.checkTrust();  // before writing into what is there
  if (int err = layout.create(failedAt)) throw cannotCreate(failedAt, err);
  layout.checkTrust();  // and what was just made: nobody else could have made it first

  Manifest manifest;
  manifest.key = key;
  manifest.digest = key.digest();
  manifest.lookupDigest = key.lookupDigest();
  manifest.binarySize = binary.size();
  manifest.binarySha256 = sha256Hex(binary.data(), binary.size());
  manifest.created = int64_t(std::time(nullptr));
  manifest.metadata = metadata;
  manifest.entrySha256 = computeEntrySha256(manifest);
  const std::string& digest = manifest.digest;
  std::string dir = layout.entry(digest);

  std::string temp;
  for (int attempt = 0;; ++attempt) {
    temp = joinPath(layout.tmp(), digest + "." + uniqueSuffix());
    if (::mkdir(temp.c_str(), 0755) == 0) break;
    const int err = errno;
    if (err != EEXIST || attempt == 8) throw cannotCreate(temp, err);
  }
  TempDirGuard guard(temp);
  writeNewFile(joinPath(temp, kBinaryName), binary.data(), binary.size());
  std::string manifestText = renderManifest(manifest);
  writeNewFile(joinPath(temp, kManifestName), manifestText.data(), manifestText.size());

  // The entry is published; lookups find it without the index, so a failed index write is not a failed store.
  // A store succeeds (and the JIT says it built a kernel) only when a lookup then finds the entry: one that another
  // process removed at once (a prune for another compiler fingerprint, ...) would be reported stored, yet missed.
  auto published = [&] {
    atTestPoint(testhooks::Point::kStorePublished, dir);
    layout.tryWriteIndex(manifest.lookupDigest, digest);
    std::optional<CacheEntry> found = lookup(key);
    if (!found)
      throw CacheError("cannot store " + key.describe() + ": its entry " + digest + " was moved into place at '" +
                       dir + "', but a lookup right after did not find it (another process removed it: a prune for "
                       "another compiler fingerprint?)");
    return std::move(*found);
  };

  // The rename either publishes our entry or finds one already there. A valid one wins (another process stored
  // the same key first) unless `mode` is kReplace; a corrupt one is removed once and the rename retried. A third
  // attempt only covers an entry that vanished between a failed rename and our look at it.
  bool removedCorrupt = false;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (::rename(temp.c_str(), dir.c_str()) == 0) {
      guard.release();
      return published();
    }
    int err = errno;
    // EEXIST/ENOTEMPTY: a directory is there; ENOTDIR: a file is (corrupt, handled like any invalid entry).
    if (err != EEXIST && err != ENOTEMPTY && err != ENOTDIR)
      throwIo("cannot move the new entry into place at", dir, err);
    if (mode == StoreMode::kReplace) {
      // One atomic swap: readers see the old entry or ours, never none. `temp` then holds the old one, which the
      // guard deletes.
      if (::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) return published();
      err = errno;
      if (err == ENOENT) continue;  // it went meanwhile: a plain rename again
      if (err != EINVAL && err != ENOSYS && err != EOPNOTSUPP)
        throwIo("cannot move the new entry into place at", dir, err);
      // No exchange on this file system: move the old entry aside, then rename ours in (the next attempt). A
      // lookup in between misses.
      const std::string aside = joinPath(layout.tmp(), "trash." + digest + "." + uniqueSuffix());
      if (::rename(dir.c_str(), aside.c_str()) == 0) removeTree(aside);
      continue;
    }
    LoadedEntry existing = loadEntry(dir, digest, Check::kFull);
    if (existing.missing) continue;
    if (!existing.error.empty())
      throw CacheError("cannot store " + key.describe() + ": cannot tell whether the entry already there is valid: " +
                       existing.error + " (it is left in place)");
    if (existing.valid() && sameKey(existing.manifest.key, key)) {
      layout.tryWriteIndex(manifest.lookupDigest, digest);
      return toCacheEntry(std::move(existing), dir);
    }
    if (removedCorrupt) break;
    layout.removeEntry(digest, /*keepIfValid=*/true);
    removedCorrupt = true;
  }
  throw CacheError("cannot store " + key.describe() + ": the entry at '" + dir + "' " +
                   (mode == StoreMode::kReplace ? "kept being replaced by other processes"
                                                : "stayed invalid after it was replaced"));
}

CacheEntry KernelCache::getOrBuild(const KernelKey& key, const std::function<Built()>& build, bool* hit) const {
  if (std::optional<CacheEntry> cached = lookup(key)) {
    if (hit) *hit = true;
    return std::move(*cached);
  }
  if (hit) *hit = false;
  Built built = build();
  return store(key, built.binary, built.metadata);
}

namespace {

struct ScannedEntry {
  EntryInfo info;
  std::string fingerprint;  // empty unless the manifest parsed
  std::string lookupDigest;
  int64_t created = 0;
  bool foreign = false;     // not a name the cache makes: reported, never deleted
  bool unreadable = false;  // could not be read (EMFILE, EACCES, ...): validity unknown, never deleted
};

std::vector<ScannedEntry> scanEntries(const Layout& layout, Check check) {
  std::vector<ScannedEntry> scanned;
  if (!layout.checkTrust()) return scanned;  // no root: an empty cache
  for (const std::string& name : listDirectory(layout.entries())) {
    ScannedEntry s;
    s.info.digest = name;
    std::string path = layout.entry(name);
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) s.info.mtime = int64_t(st.st_mtime);
    if (!isHexDigest(name)) {
      s.info.problem = "not a cache entry (unexpected name in entries/)";
      s.foreign = true;
    } else {
      LoadedEntry loaded = loadEntry(path, name, check);
      if (loaded.missing) continue;  // removed while we looked
      s.info.problem = loaded.error.empty() ? loaded.problem : loaded.error;
      s.unreadable = !loaded.error.empty();
      s.info.bytes = loaded.binaryBytes;
      if (loaded.haveManifest) {
        s.info.description = loaded.manifest.key.describe();
        s.info.target = loaded.manifest.key.target;
        s.fingerprint = loaded.manifest.key.fingerprint;
        s.lookupDigest = loaded.manifest.lookupDigest;
        s.created = loaded.manifest.created;
      }
    }
    s.info.valid = s.info.problem.empty();
    scanned.push_back(std::move(s));
  }
  std::sort(scanned.begin(), scanned.end(), [](const ScannedEntry& a, const ScannedEntry& b) {
    return std::tie(a.info.description, a.info.digest) < std::tie(b.info.description, b.info.digest);
  });
  return scanned;
}

std::vector<EntryInfo> infos(std::vector<ScannedEntry>&& scanned) {
  std::vector<EntryInfo> out;
  out.reserve(scanned.size());
  for (ScannedEntry& s : scanned) out.push_back(std::move(s.info));
  return out;
}

}  // namespace

std::vector<EntryInfo> KernelCache::list() const { return infos(scanEntries(Layout{root_}, Check::kCheap)); }

std::vector<EntryInfo> KernelCache::verify() const {
  Layout layout{root_};
  std::vector<ScannedEntry> scanned = scanEntries(layout, Check::kFull);
  std::map<std::string, const ScannedEntry*> byDigest;
  std::map<std::string, std::set<std::string>> validByLookupDigest;
  for (const ScannedEntry& s : scanned) {
    byDigest[s.info.digest] = &s;
    if (s.info.valid) validByLookupDigest[s.lookupDigest].insert(s.info.digest);
  }
  // Each key with a valid entry should have an index naming one of them.
  std::map<std::string, std::string> indexProblems;
  for (const auto& [lookupDigest, digests] : validByLookupDigest) {
    std::string problem;
    const std::string indexed = layout.readIndex(lookupDigest, &problem);
    if (!indexed.empty() && !digests.count(indexed)) {
      auto target = byDigest.find(indexed);
      problem = "index/" + lookupDigest + " names " + indexed +
                (target == byDigest.end()        ? ", which does not exist"
                 : !target->second->info.valid ? ", which is invalid"
                                                 : ", an entry of another kernel key");
    }
    if (!problem.empty()) indexProblems[lookupDigest] = problem + " (lookups scan the entries; prune repairs it)";
  }
  for (ScannedEntry& s : scanned) {
    auto problem = s.info.valid ? indexProblems.find(s.lookupDigest) : indexProblems.end();
    if (problem != indexProblems.end()) s.info.indexProblem = problem->second;
  }
  return infos(std::move(scanned));
}

int KernelCache::prune(const std::function<bool(const std::string&)>& keep,
                       std::vector<std::string>* leftAlone) const {
  Layout layout{root_};
  int removed = 0;
  auto leave = [&](const std::string& path, const std::string& why) {
    if (leftAlone) leftAlone->push_back("'" + path + "': " + why + "; left in place");
  };
  struct Survivors {
    int64_t newestCreated = 0;
    std::string newest;           // what the index names when it has to change
    std::set<std::string> all;
    bool indexed = false;         // the index names one of `all` (now)
  };
  std::map<std::string, Survivors> survivors;  // by lookup digest
  std::set<std::string> scannedDigests;
  for (const ScannedEntry& s : scanEntries(layout, Check::kFull)) {
    scannedDigests.insert(s.info.digest);
    if (s.foreign || s.unreadable) {
      leave(layout.entry(s.info.digest), s.info.problem);
    } else if (!s.info.valid) {
      removed += layout.removeEntry(s.info.digest, /*keepIfValid=*/true);
    } else if (!keep(s.fingerprint)) {
      removed += layout.removeEntry(s.info.digest, /*keepIfValid=*/false);
    } else {
      Survivors& key = survivors[s.lookupDigest];
      if (key.newest.empty() || newerThan(s.created, s.info.digest, key.newestCreated, key.newest))
        key.newestCreated = s.created, key.newest = s.info.digest;
      key.all.insert(s.info.digest);
    }
  }

  // Only names the cache makes there, and only stale ones: a fresh one may belong to a store in progress.
  int64_t now = int64_t(std::time(nullptr));
  for (const std::string& name : listDirectory(layout.tmp())) {
    std::string path = joinPath(layout.tmp(), name);
    if (!isOwnTempName(name)) {
      leave(path, "not a name the kernel cache makes in tmp/");
      continue;
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0 && now - int64_t(st.st_mtime) > kStaleTempSeconds) removeTree(path);
  }

  // Every index names a surviving entry of its key (re-pointed at the newest when it does not), or goes. An entry
  // stored since the scan above is left named: its store just wrote that index.
  for (const std::string& name : listDirectory(layout.index())) {
    if (!isHexDigest(name)) {
      leave(layout.indexFile(name), "not a name the kernel cache makes in index/");
      continue;
    }
    const std::string target = layout.readIndex(name);
    struct stat st;
    const bool storedSinceScan =
        !target.empty() && !scannedDigests.count(target) && ::stat(layout.entry(target).c_str(), &st) == 0;
    auto key = survivors.find(name);
    if (key != survivors.end()) {
      if (storedSinceScan || key->second.all.count(target) || layout.tryWriteIndex(name, key->second.newest)) {
        key->second.indexed = true;
        continue;
      }
    } else if (storedSinceScan) {
      continue;
    }
    ::unlink(layout.indexFile(name).c_str());  // a dangling index is worse than none
  }
  for (const auto& [lookupDigest, key] : survivors)
    if (!key.indexed) layout.tryWriteIndex(lookupDigest, key.newest);
  return removed;
}

void testhooks::setHook(Hook hook) { testHook() = std::move(hook); }

std::string generatorOf(const std::string& fingerprint) {
  static const std::string kField = "generator ";
  const size_t at = fingerprint.rfind(kField);
  if (at == std::string::npos || (at != 0 && (at < 2 || fingerprint.compare(at - 2, 2, "; ") != 0))) return "";
  const size_t start = at + kField.size(), end = fingerprint.find(';', start);
  return fingerprint.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace megamoe::cache
