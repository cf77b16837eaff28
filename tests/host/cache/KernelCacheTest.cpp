// KernelCache in one process: round trips, fingerprint-less lookup, corruption handling, errors, maintenance.
// Every test gets a fresh temporary root and random payloads.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compiler/cache/Json.h"
#include "compiler/cache/KernelCache.h"

namespace megamoe::cache {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
std::string readText(const std::string& path) {
  std::vector<uint8_t> bytes = readBytes(path);
  return {bytes.begin(), bytes.end()};
}
void writeBytes(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), std::streamsize(data.size()));
  ASSERT_TRUE(out.good()) << path;
}
std::vector<std::string> namesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) names.push_back(entry.path().filename().string());
  return names;
}

// Runs `body` in a forked child that alarm() kills after `seconds`, so a hang fails the test instead of stalling
// the suite. Returns "" when the body returned "" (success), else its text or why the child did not finish.
std::string inBoundedChild(unsigned seconds, const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid < 0) return "fork failed";
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(seconds);
    std::string text;
    try {
      text = body();
    } catch (const std::exception& e) {
      text = std::string("exception: ") + e.what();
    }
    if (!text.empty() && ::write(fds[1], text.data(), text.size()) < 0) ::_exit(3);
    ::_exit(text.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buffer, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return WTERMSIG(status) == SIGALRM ? "hung: still running after " + std::to_string(seconds) + " s"
                                       : "killed by signal " + std::to_string(WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return text.empty() ? "child failed" : text;
  return "";
}

class KernelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/megamoe-cache-test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    scratch_ = pattern;
    root_ = scratch_ + "/cache";
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(scratch_, ec);
  }

  // Random bytes of a random length in [minSize, maxSize]; the seed is printed on failure.
  std::vector<uint8_t> randomBytes(size_t minSize = 100, size_t maxSize = 5000) {
    size_t size = std::uniform_int_distribution<size_t>(minSize, maxSize)(rng_);
    std::vector<uint8_t> bytes(size);
    for (uint8_t& b : bytes) b = uint8_t(rng_());
    return bytes;
  }

  static KernelKey key(const std::string& kernel = "swiglu_fwd", const std::string& fingerprint = "fp-1") {
    KernelKey k;
    k.kernel = kernel;
    k.spec = {{"I", 2048}, {"clamp", 0}};
    k.target = "sm_90a";
    k.options = "num_warps=4";
    k.fingerprint = fingerprint;
    return k;
  }

  std::string entryDir(const KernelKey& k) const { return root_ + "/entries/" + k.digest(); }

  std::string scratch_;
  std::string root_;
  uint32_t seed_ = 0;
  std::mt19937_64 rng_;
};

#define TRACE_SEED() SCOPED_TRACE("random seed " + std::to_string(seed_))

void expectSameKey(const KernelKey& a, const KernelKey& b) {
  EXPECT_EQ(a.kernel, b.kernel);
  EXPECT_EQ(a.spec, b.spec);
  EXPECT_EQ(a.target, b.target);
  EXPECT_EQ(a.options, b.options);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
}

TEST_F(KernelCacheTest, MissThenStoreThenHitRoundTripsExactly) {
  TRACE_SEED();
  KernelCache cache(root_);
  EXPECT_EQ(cache.root(), root_);
  KernelKey k = key();
  k.spec.push_back({"neg", INT64_MIN});
  k.spec.push_back({"big", INT64_MAX});
  EXPECT_FALSE(cache.lookup(k).has_value());

  std::vector<uint8_t> binary = randomBytes();
  // Metadata exercising every escaping path: quotes, backslashes, controls, NUL, DEL, UTF-8 and a stray byte.
  std::string metadata = "{\"compile_ms\": 12, \"note\": \"q\\\"b\\\\\"}\n\t\r\b\f\x01\x1f\x7f";
  metadata += std::string(1, '\0') + "\xc2\xb5s \xe2\x82\xac \xf0\x9f\x98\x80 \xff/";

  CacheEntry stored = cache.store(k, binary, metadata);
  EXPECT_EQ(stored.dir, entryDir(k));
  EXPECT_EQ(stored.binary, binary);
  EXPECT_EQ(stored.metadata, metadata);
  EXPECT_EQ(readBytes(stored.dir + "/code.bin"), binary);
  EXPECT_NE(readText(stored.dir + "/manifest.json").find(sha256Hex(binary.data(), binary.size())), std::string::npos);
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty());

  // A fresh object on the same root (another process, in effect) sees the entry.
  KernelCache reopened(root_);
  std::optional<CacheEntry> hit = reopened.lookup(k);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->binary, binary);
  EXPECT_EQ(hit->metadata, metadata);
  EXPECT_EQ(hit->dir, entryDir(k));
  expectSameKey(hit->key, k);
}

TEST_F(KernelCacheTest, EmptyBinaryAndMetadataRoundTrip) {
  KernelCache cache(root_);
  KernelKey k = key();
  k.spec.clear();
  k.options.clear();
  cache.store(k, {}, "");
  std::optional<CacheEntry> hit = cache.lookup(k);
  ASSERT_TRUE(hit.has_value());
  EXPECT_TRUE(hit->binary.empty());
  EXPECT_TRUE(hit->metadata.empty());
  expectSameKey(hit->key, k);
}

TEST_F(KernelCacheTest, LookupAnyFingerprintFindsTheNewestEntryOfAnyFingerprint) {
  TRACE_SEED();
  KernelCache cache(root_);
  std::vector<uint8_t> oldBinary = randomBytes();
  cache.store(key("swiglu_fwd", "fp-old"), oldBinary, "old");

  KernelKey current = key("swiglu_fwd", "fp-new");
  EXPECT_FALSE(cache.lookup(current).has_value());
  EXPECT_TRUE(fs::exists(entryDir(key("swiglu_fwd", "fp-old")))) << "an exact miss must not touch other entries";

  std::optional<CacheEntry> any = cache.lookupAnyFingerprint(current);
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->binary, oldBinary);
  EXPECT_EQ(any->key.fingerprint, "fp-old");
  EXPECT_EQ(any->dir, entryDir(key("swiglu_fwd", "fp-old")));

  std::vector<uint8_t> newerBinary = randomBytes();
  cache.store(key("swiglu_fwd", "fp-newer"), newerBinary, "newer");
  any = cache.lookupAnyFingerprint(current);
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->key.fingerprint, "fp-newer");
  EXPECT_EQ(any->binary, newerBinary);

  KernelKey otherSpec = current;
  otherSpec.spec[0].second = 4096;
  EXPECT_FALSE(cache.lookupAnyFingerprint(otherSpec).has_value());
  KernelKey otherTarget = current;
  otherTarget.target = "gfx950";
  EXPECT_FALSE(cache.lookupAnyFingerprint(otherTarget).has_value());
}

TEST_F(KernelCacheTest, LookupAnyFingerprintRejectsBadIndexFiles) {
  KernelCache cache(root_);
  KernelKey mine = key("mine");
  KernelKey other = key("other");
  cache.store(other, {1, 2, 3}, "");
  std::string indexFile = root_ + "/index/" + mine.lookupDigest();

  writeBytes(indexFile, "../entries/" + other.digest());
  EXPECT_FALSE(cache.lookupAnyFingerprint(mine).has_value());
  writeBytes(indexFile, std::string(64, 'a') + "\n");
  EXPECT_FALSE(cache.lookupAnyFingerprint(mine).has_value());
  // Points at a valid entry of another kernel: a miss, and that entry is left alone.
  writeBytes(indexFile, other.digest() + "\n");
  EXPECT_FALSE(cache.lookupAnyFingerprint(mine).has_value());
  EXPECT_TRUE(cache.lookup(other).has_value());
}

// What can happen to index/<lookupDigest> of a stored entry: deleted, garbage, naming a removed entry, naming a
// valid entry of another key, or never written (store renames the entry into place before it writes the index).
enum class IndexDamage { kMissing, kGarbage, kDangling, kOtherKey };

class KernelCacheIndexTest : public KernelCacheTest, public ::testing::WithParamInterface<IndexDamage> {
 protected:
  // Stores key() and one other kernel, then damages key()'s index.
  void storeAndDamage(KernelCache& cache) {
    cache.store(key(), {1, 2, 3}, "mine");
    cache.store(key("other"), {4, 5, 6}, "other");
    switch (GetParam()) {
      case IndexDamage::kMissing: ASSERT_EQ(::unlink(indexFile().c_str()), 0); break;
      case IndexDamage::kGarbage: writeBytes(indexFile(), "\x01garbage\n"); break;
      case IndexDamage::kDangling: writeBytes(indexFile(), std::string(64, 'a') + "\n"); break;
      case IndexDamage::kOtherKey: writeBytes(indexFile(), key("other").digest() + "\n"); break;
    }
  }
  std::string indexFile() const { return root_ + "/index/" + key().lookupDigest(); }
  bool indexIsRepaired() const { return readText(indexFile()) == key().digest() + "\n"; }
};

TEST_P(KernelCacheIndexTest, LookupAnyFingerprintFindsTheEntryAndRepairsTheIndex) {
  KernelCache cache(root_);
  storeAndDamage(cache);
  if (HasFatalFailure()) return;
  std::optional<CacheEntry> any = cache.lookupAnyFingerprint(key("swiglu_fwd", "runtime"));
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->dir, entryDir(key()));
  EXPECT_EQ(any->metadata, "mine");
  EXPECT_TRUE(indexIsRepaired()) << readText(indexFile());
  EXPECT_TRUE(cache.lookup(key("other")).has_value()) << "the other key's entry must be left alone";
}

TEST_P(KernelCacheIndexTest, ExactHitRepairsTheIndex) {
  KernelCache cache(root_);
  storeAndDamage(cache);
  if (HasFatalFailure()) return;
  ASSERT_TRUE(cache.lookup(key()).has_value());
  // An index naming a valid entry is left to lookupAnyFingerprint, which checks the key.
  if (GetParam() != IndexDamage::kOtherKey) {
    EXPECT_TRUE(indexIsRepaired()) << readText(indexFile());
  }
}

TEST_P(KernelCacheIndexTest, VerifyReportsAndPruneRepairs) {
  KernelCache cache(root_);
  storeAndDamage(cache);
  if (HasFatalFailure()) return;
  std::vector<EntryInfo> checked = cache.verify();
  ASSERT_EQ(checked.size(), 2u);
  for (const EntryInfo& info : checked) {
    EXPECT_TRUE(info.valid) << info.problem;
    if (info.digest == key().digest()) {
      EXPECT_NE(info.indexProblem.find("index/" + key().lookupDigest()), std::string::npos) << info.indexProblem;
    } else {
      EXPECT_EQ(info.indexProblem, "") << info.description;
    }
  }
  EXPECT_EQ(cache.prune(""), 0);
  EXPECT_TRUE(indexIsRepaired()) << readText(indexFile());
  for (const EntryInfo& info : cache.verify()) EXPECT_EQ(info.indexProblem, "") << info.description;
}

INSTANTIATE_TEST_SUITE_P(Damage, KernelCacheIndexTest,
                         ::testing::Values(IndexDamage::kMissing, IndexDamage::kGarbage, IndexDamage::kDangling,
                                           IndexDamage::kOtherKey),
                         [](const ::testing::TestParamInfo<IndexDamage>& info) {
                           switch (info.param) {
                             case IndexDamage::kMissing: return "Missing";
                             case IndexDamage::kGarbage: return "Garbage";
                             case IndexDamage::kDangling: return "Dangling";
                             case IndexDamage::kOtherKey: return "OtherKey";
                           }
                           return "Unknown";
                         });

// Without an index, the newest entry of the key (by its manifest's created time) is the one found.
TEST_F(KernelCacheTest, LookupAnyFingerprintWithoutIndexPrefersTheNewestValidEntry) {
  KernelCache cache(root_);
  cache.store(key("swiglu_fwd", "fp-a"), {1}, "a");
  cache.store(key("swiglu_fwd", "fp-b"), {2}, "b");
  cache.store(key("swiglu_fwd", "fp-c"), {3}, "c");
  // created is whole seconds: make "b" the newest by rewriting it with a later time through the public path.
  fs::remove_all(entryDir(key("swiglu_fwd", "fp-b")));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  cache.store(key("swiglu_fwd", "fp-b"), {2}, "b");
  ASSERT_EQ(::unlink((root_ + "/index/" + key().lookupDigest()).c_str()), 0);
  std::optional<CacheEntry> any = cache.lookupAnyFingerprint(key("swiglu_fwd", "runtime"));
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->metadata, "b");

  // A newest entry that turns out corrupt is removed and the next one served.
  ASSERT_EQ(::unlink((root_ + "/index/" + key().lookupDigest()).c_str()), 0);
  writeBytes(entryDir(key("swiglu_fwd", "fp-b")) + "/code.bin", "X");  // same size, other bytes
  any = cache.lookupAnyFingerprint(key("swiglu_fwd", "runtime"));
  ASSERT_TRUE(any.has_value());
  EXPECT_NE(any->metadata, "b");
  EXPECT_FALSE(fs::exists(entryDir(key("swiglu_fwd", "fp-b"))));
}

TEST_F(KernelCacheTest, GetOrBuildBuildsOnceThenHits) {
  TRACE_SEED();
  KernelCache cache(root_);
  std::vector<uint8_t> binary = randomBytes();
  int builds = 0;
  auto build = [&] {
    ++builds;
    return KernelCache::Built{binary, "{\"built\":true}"};
  };
  bool hit = true;
  CacheEntry first = cache.getOrBuild(key(), build, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(first.binary, binary);
  CacheEntry second = cache.getOrBuild(key(), build, &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(second.binary, binary);
  EXPECT_EQ(second.metadata, "{\"built\":true}");
  cache.getOrBuild(key(), build);  // `hit` is optional
  EXPECT_EQ(builds, 1);
}

TEST_F(KernelCacheTest, StoreKeepsTheEntryAlreadyThere) {
  TRACE_SEED();
  KernelCache cache(root_);
  std::vector<uint8_t> first = randomBytes(), second = randomBytes();
  cache.store(key(), first, "first");
  CacheEntry result = cache.store(key(), second, "second");
  EXPECT_EQ(result.binary, first);
  EXPECT_EQ(result.metadata, "first");
  EXPECT_EQ(cache.lookup(key())->binary, first);
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty());
}

// ---------------------------------------------------------------------------------------------------------------
// Corruption

enum class Corruption {
  kTruncateBinary,
  kAppendToBinary,
  kFlipBinaryByte,
  kDeleteBinary,
  kGarbageManifest,
  kEmptyManifest,
  kDeleteManifest,
  kManifestSizeLies,
  kManifestKeyEdited,
  kEntryIsAFile,
  kBinaryIsASymlink,
};

const char* corruptionName(Corruption c) {
  switch (c) {
    case Corruption::kTruncateBinary: return "TruncateBinary";
    case Corruption::kAppendToBinary: return "AppendToBinary";
    case Corruption::kFlipBinaryByte: return "FlipBinaryByte";
    case Corruption::kDeleteBinary: return "DeleteBinary";
    case Corruption::kGarbageManifest: return "GarbageManifest";
    case Corruption::kEmptyManifest: return "EmptyManifest";
    case Corruption::kDeleteManifest: return "DeleteManifest";
    case Corruption::kManifestSizeLies: return "ManifestSizeLies";
    case Corruption::kManifestKeyEdited: return "ManifestKeyEdited";
    case Corruption::kEntryIsAFile: return "EntryIsAFile";
    case Corruption::kBinaryIsASymlink: return "BinaryIsASymlink";
  }
  return "?";
}

// Damages the stored entry in `dir` the way `kind` says; `rng` picks positions.
void corrupt(const std::string& dir, Corruption kind, std::mt19937_64& rng) {
  std::string binaryPath = dir + "/code.bin", manifestPath = dir + "/manifest.json";
  std::string binary = readText(binaryPath), manifest = readText(manifestPath);
  ASSERT_FALSE(binary.empty());
  switch (kind) {
    case Corruption::kTruncateBinary:
      ASSERT_EQ(::truncate(binaryPath.c_str(), off_t(binary.size() / 2)), 0);
      break;
    case Corruption::kAppendToBinary:
      writeBytes(binaryPath, binary + "x");
      break;
    case Corruption::kFlipBinaryByte: {
      size_t at = std::uniform_int_distribution<size_t>(0, binary.size() - 1)(rng);
      binary[at] = char(binary[at] ^ (1 << (rng() % 8)));
      writeBytes(binaryPath, binary);
      break;
    }
    case Corruption::kDeleteBinary:
      ASSERT_EQ(::unlink(binaryPath.c_str()), 0);
      break;
    case Corruption::kGarbageManifest:
      writeBytes(manifestPath, "{\"format\": 1, \"kernel\": \x01\x02 garbage");
      break;
    case Corruption::kEmptyManifest:
      writeBytes(manifestPath, "");
      break;
    case Corruption::kDeleteManifest:
      ASSERT_EQ(::unlink(manifestPath.c_str()), 0);
      break;
    case Corruption::kManifestSizeLies: {
      // Claim the truncated size, so only the hash can tell.
      ASSERT_EQ(::truncate(binaryPath.c_str(), off_t(binary.size() - 1)), 0);
      std::string field = "\"binary_size\": " + std::to_string(binary.size());
      size_t at = manifest.find(field);
      ASSERT_NE(at, std::string::npos) << manifest;
      manifest.replace(at, field.size(), "\"binary_size\": " + std::to_string(binary.size() - 1));
      writeBytes(manifestPath, manifest);
      break;
    }
    case Corruption::kManifestKeyEdited: {
      size_t at = manifest.find("swiglu_fwd");
      ASSERT_NE(at, std::string::npos) << manifest;
      manifest.replace(at, 10, "swiglu_bwd");
      writeBytes(manifestPath, manifest);
      break;
    }
    case Corruption::kEntryIsAFile:
      fs::remove_all(dir);
      writeBytes(dir, "not a directory");
      break;
    case Corruption::kBinaryIsASymlink:
      // Same bytes, but behind a link: entries only ever hold files written by store(), so a link is tampering.
      writeBytes(dir + "/../../code.bin.elsewhere", binary);  // the cache root, outside entries/
      ASSERT_EQ(::unlink(binaryPath.c_str()), 0);
      ASSERT_EQ(::symlink("../../code.bin.elsewhere", binaryPath.c_str()), 0);
      break;
  }
}

class KernelCacheCorruptionTest : public KernelCacheTest, public ::testing::WithParamInterface<Corruption> {};

TEST_P(KernelCacheCorruptionTest, CorruptEntryIsAMissIsRemovedAndIsRebuilt) {
  TRACE_SEED();
  KernelCache cache(root_);
  std::vector<uint8_t> binary = randomBytes();
  cache.store(key(), binary, "meta");
  corrupt(entryDir(key()), GetParam(), rng_);
  if (HasFatalFailure()) return;

  EXPECT_FALSE(cache.lookup(key()).has_value());
  EXPECT_FALSE(fs::exists(entryDir(key()))) << "a corrupt entry must be removed";
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty()) << "the removed entry must not linger in tmp/";

  int builds = 0;
  bool hit = true;
  CacheEntry rebuilt = cache.getOrBuild(
      key(), [&] { return ++builds, KernelCache::Built{binary, "meta"}; }, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(builds, 1);
  EXPECT_EQ(rebuilt.binary, binary);
  std::optional<CacheEntry> again = cache.lookup(key());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->binary, binary);
  cache.getOrBuild(key(), [&] { return ++builds, KernelCache::Built{binary, "meta"}; }, &hit);
  EXPECT_TRUE(hit);
  EXPECT_EQ(builds, 1);
}

TEST_P(KernelCacheCorruptionTest, LookupAnyFingerprintMissesAndRemoves) {
  TRACE_SEED();
  KernelCache cache(root_);
  cache.store(key("swiglu_fwd", "fp-old"), randomBytes(), "meta");
  corrupt(entryDir(key("swiglu_fwd", "fp-old")), GetParam(), rng_);
  if (HasFatalFailure()) return;
  EXPECT_FALSE(cache.lookupAnyFingerprint(key("swiglu_fwd", "fp-new")).has_value());
  EXPECT_FALSE(fs::exists(entryDir(key("swiglu_fwd", "fp-old"))));
}

// store() over a corrupt entry replaces it instead of returning it.
TEST_P(KernelCacheCorruptionTest, StoreReplacesCorruptEntry) {
  TRACE_SEED();
  KernelCache cache(root_);
  cache.store(key(), randomBytes(), "old");
  corrupt(entryDir(key()), GetParam(), rng_);
  if (HasFatalFailure()) return;
  std::vector<uint8_t> fresh = randomBytes();
  CacheEntry stored = cache.store(key(), fresh, "fresh");
  EXPECT_EQ(stored.binary, fresh);
  EXPECT_EQ(stored.metadata, "fresh");
  std::optional<CacheEntry> hit = cache.lookup(key());
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->binary, fresh);
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty());
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, KernelCacheCorruptionTest,
    ::testing::Values(Corruption::kTruncateBinary, Corruption::kAppendToBinary, Corruption::kFlipBinaryByte,
                      Corruption::kDeleteBinary, Corruption::kGarbageManifest, Corruption::kEmptyManifest,
                      Corruption::kDeleteManifest, Corruption::kManifestSizeLies, Corruption::kManifestKeyEdited,
                      Corruption::kEntryIsAFile, Corruption::kBinaryIsASymlink),
    [](const ::testing::TestParamInfo<Corruption>& info) { return std::string(corruptionName(info.param)); });

// The metadata the runtime launches with (symbol, block_threads, shared_bytes) is covered by a checksum like the
// code: an edited value must not pass verify() or be returned by a lookup.
TEST_F(KernelCacheTest, EditedMetadataIsInvalid) {
  KernelCache cache(root_);
  const std::string metadata = R"({"symbol":"swiglu_fwd_kernel","block_threads":256,"shared_bytes":0})";
  cache.store(key(), randomBytes(), metadata);
  std::string manifestPath = entryDir(key()) + "/manifest.json";
  std::string manifest = readText(manifestPath);
  const std::string stored = R"(block_threads\":256)";
  size_t at = manifest.find(stored);
  ASSERT_NE(at, std::string::npos) << manifest;
  manifest.replace(at, stored.size(), R"(block_threads\":512)");
  writeBytes(manifestPath, manifest);

  for (const std::vector<EntryInfo>& infos : {cache.list(), cache.verify()}) {
    ASSERT_EQ(infos.size(), 1u);
    EXPECT_FALSE(infos[0].valid);
    EXPECT_NE(infos[0].problem.find("entry_sha256"), std::string::npos) << infos[0].problem;
  }
  EXPECT_FALSE(cache.lookupAnyFingerprint(key("swiglu_fwd", "other")).has_value());
  EXPECT_FALSE(cache.lookup(key()).has_value());
  EXPECT_FALSE(fs::exists(entryDir(key())));
}

// Entries written before the checksum existed (format 1) are not trusted: invalid, and rebuilt.
TEST_F(KernelCacheTest, FormatOneEntryIsInvalidAndRebuilt) {
  KernelCache cache(root_);
  cache.store(key(), {1, 2, 3}, "old");
  std::string manifestPath = entryDir(key()) + "/manifest.json";
  std::string manifest = readText(manifestPath);
  size_t field = manifest.find("  \"entry_sha256\": ");
  ASSERT_NE(field, std::string::npos) << manifest;
  manifest.erase(field, manifest.find('\n', field) + 1 - field);
  size_t format = manifest.find("\"format\": 2");
  ASSERT_NE(format, std::string::npos) << manifest;
  manifest.replace(format, 11, "\"format\": 1");
  writeBytes(manifestPath, manifest);

  std::vector<EntryInfo> checked = cache.verify();
  ASSERT_EQ(checked.size(), 1u);
  EXPECT_FALSE(checked[0].valid);
  EXPECT_NE(checked[0].problem.find("format 1"), std::string::npos) << checked[0].problem;
  bool hit = true;
  CacheEntry rebuilt = cache.getOrBuild(key(), [] { return KernelCache::Built{{4, 5}, "new"}; }, &hit);
  EXPECT_FALSE(hit);
  EXPECT_EQ(rebuilt.metadata, "new");
  EXPECT_TRUE(cache.verify().at(0).valid);
}

// ---------------------------------------------------------------------------------------------------------------
// Non-regular files: a FIFO in place of a file must not block any operation (opening one for reading waits for a
// writer), and is reported as what it is.

class KernelCacheFifoTest : public KernelCacheTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(KernelCacheFifoTest, FifoInAnEntryIsReportedAndRemovedWithoutBlocking) {
  KernelCache cache(root_);
  cache.store(key(), {1, 2, 3}, "meta");
  std::string path = entryDir(key()) + "/" + GetParam();
  ASSERT_EQ(::unlink(path.c_str()), 0);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);

  std::string failure = inBoundedChild(10, [&]() -> std::string {
    std::string problems;
    for (const EntryInfo& info : cache.list())
      if (info.valid || info.problem.find(GetParam() + " is not a regular file") == std::string::npos)
        problems += "list: " + info.problem + "\n";
    std::vector<EntryInfo> checked = cache.verify();
    if (checked.size() != 1 || checked[0].valid ||
        checked[0].problem.find(GetParam() + " is not a regular file (a FIFO)") == std::string::npos)
      problems += "verify: " + (checked.empty() ? std::string("no entry") : checked[0].problem) + "\n";
    if (cache.lookupAnyFingerprint(key("swiglu_fwd", "other"))) problems += "lookupAnyFingerprint: a hit\n";
    if (cache.lookup(key())) problems += "lookup: a hit\n";
    if (fs::exists(entryDir(key()))) problems += "lookup: the entry is still there\n";
    if (cache.store(key(), {4, 5}, "new").binary != std::vector<uint8_t>{4, 5}) problems += "store: wrong entry\n";
    return problems;
  });
  EXPECT_EQ(failure, "");
}

INSTANTIATE_TEST_SUITE_P(Files, KernelCacheFifoTest, ::testing::Values("code.bin", "manifest.json"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "code.bin" ? std::string("Binary") : std::string("Manifest");
                         });

TEST_F(KernelCacheTest, FifoAsIndexFileIsAMissWithoutBlocking) {
  KernelCache cache(root_);
  cache.store(key("other"), {1}, "");  // creates the layout
  KernelKey k = key();
  std::string indexFile = root_ + "/index/" + k.lookupDigest();
  ASSERT_EQ(::mkfifo(indexFile.c_str(), 0644), 0);
  std::string failure = inBoundedChild(10, [&]() -> std::string {
    if (cache.lookupAnyFingerprint(k)) return "lookupAnyFingerprint: a hit";
    cache.prune("");
    return "";
  });
  EXPECT_EQ(failure, "");
}

// ---------------------------------------------------------------------------------------------------------------
// Errors and the default root

void expectUnusableRootError(const std::string& root, const std::string& why) {
  try {
    KernelCache cache(root);
    ADD_FAILURE() << "no CacheError for " << root;
  } catch (const CacheError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("'" + root + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(why), std::string::npos) << message;
    EXPECT_NE(message.find("MEGAMOE_CACHE_DIR"), std::string::npos) << message;
  }
}

TEST_F(KernelCacheTest, UnusableRootThrowsNamingThePath) {
  std::string file = scratch_ + "/regular-file";
  writeBytes(file, "x");
  expectUnusableRootError(file + "/cache", "'" + file + "' is not a directory");         // parent is a file
  expectUnusableRootError(file + "/deeper/cache", "'" + file + "' is not a directory");  // ... further up
  expectUnusableRootError(file, "is not a directory");                                   // the root itself
  EXPECT_THROW(KernelCache(""), CacheError);
}

// Item 17: a MEGAMOE_CACHE_DIR that is a dangling link says so, naming the link's target.
TEST_F(KernelCacheTest, DanglingSymlinkRootIsNamedAsSuch) {
  std::string target = scratch_ + "/unmounted/cache";
  std::string link = scratch_ + "/link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  expectUnusableRootError(link, "'" + link + "' is a dangling symbolic link to '" + target + "'");
  // A dangling link further up the path is named too.
  expectUnusableRootError(link + "/megamoe", "'" + link + "' is a dangling symbolic link to '" + target + "'");
  // Once the target exists, the link is an ordinary root.
  fs::create_directories(target);
  KernelCache cache(link);
  cache.store(key(), {1, 2}, "");
  EXPECT_TRUE(cache.lookup(key()).has_value());
}

TEST_F(KernelCacheTest, StoreIntoBrokenLayoutThrowsNamingThePath) {
  KernelCache cache(root_);
  fs::create_directories(root_ + "/tmp");
  writeBytes(root_ + "/entries", "in the way");
  try {
    cache.store(key(), {1, 2, 3}, "");
    ADD_FAILURE() << "store succeeded";
  } catch (const CacheError& e) {
    EXPECT_NE(std::string(e.what()).find(root_ + "/entries"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty());
  EXPECT_FALSE(cache.lookup(key()).has_value());
}

TEST_F(KernelCacheTest, RecreatesRemovedLayout) {
  KernelCache cache(root_);
  fs::remove_all(root_);
  EXPECT_FALSE(cache.lookup(key()).has_value());
  EXPECT_FALSE(cache.lookupAnyFingerprint(key()).has_value());
  cache.store(key(), {4, 5, 6}, "m");
  EXPECT_TRUE(cache.lookupAnyFingerprint(key("swiglu_fwd", "other")).has_value());
}

TEST_F(KernelCacheTest, RelativeRootBecomesAbsolute) {
  std::string previous = fs::current_path().string();
  ASSERT_EQ(::chdir(scratch_.c_str()), 0);
  std::string expected = fs::current_path().string() + "/relative/cache";
  std::optional<KernelCache> cache;
  EXPECT_NO_THROW(cache.emplace("relative/cache/"));
  ASSERT_EQ(::chdir(previous.c_str()), 0);
  ASSERT_TRUE(cache.has_value());
  EXPECT_EQ(cache->root(), expected);
  CacheEntry stored = cache->store(key(), {7}, "");
  EXPECT_EQ(stored.dir.rfind(expected + "/entries/", 0), 0u) << stored.dir;
}

// ---------------------------------------------------------------------------------------------------------------
// Read-only caches (item 6): lookups, list and verify need no write access; a store says it does.

// chmod -R: read-only (a-w) or back to writable for the owner; readable and searchable by everyone either way, so
// that the unprivileged child below can read the tree.
void setTreeWritable(const std::string& top, bool writable) {
  auto apply = [writable](const fs::path& path) {
    const bool dir = fs::is_directory(fs::symlink_status(path));
    ::chmod(path.c_str(), writable ? (dir ? 0755 : 0644) : (dir ? 0555 : 0444));
  };
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(top, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    apply(it->path());
  apply(top);
}

// In a forked child: leaves the process unable to write to a read-only tree. Root ignores file modes, so it drops
// to uid/gid 65534 (nobody). Returns "" or "SKIP: why" when no such condition can be made here.
std::string loseWriteAccess(const std::string& probeDir) {
  if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0))
    return std::string("SKIP: cannot drop root privileges to uid 65534: ") + std::strerror(errno);
  std::string probe = probeDir + "/write-probe";
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
    return "SKIP: the read-only tree is still writable here";
  }
  return "";
}

TEST_F(KernelCacheTest, ReadOnlyCacheServesLookupsListAndVerify) {
  KernelCache writer(root_);
  writer.store(key(), {1, 2, 3}, "indexed");
  writer.store(key("unindexed"), {4, 5}, "scanned");
  ASSERT_EQ(::unlink((root_ + "/index/" + key("unindexed").lookupDigest()).c_str()), 0);
  ::chmod(scratch_.c_str(), 0755);  // mkdtemp made it 0700
  setTreeWritable(root_, false);

  std::string failure = inBoundedChild(20, [&]() -> std::string {
    if (std::string skip = loseWriteAccess(root_); !skip.empty()) return skip;
    std::string problems;
    try {
      KernelCache cache(root_);
      if (!cache.lookup(key())) problems += "lookup missed\n";
      std::optional<CacheEntry> any = cache.lookupAnyFingerprint(key("swiglu_fwd", "other"));
      if (!any || any->metadata != "indexed") problems += "lookupAnyFingerprint missed\n";
      any = cache.lookupAnyFingerprint(key("unindexed", "other"));
      if (!any || any->metadata != "scanned") problems += "lookupAnyFingerprint without an index missed\n";
      if (cache.list().size() != 2) problems += "list: not 2 entries\n";
      for (const EntryInfo& info : cache.verify())
        if (!info.valid) problems += "verify: " + info.problem + "\n";
      try {
        cache.store(key("new"), {6}, "");
        problems += "store into a read-only cache succeeded\n";
      } catch (const CacheError& e) {
        std::string message = e.what();
        for (const std::string& part : {"'" + root_ + "'", std::string("not writable"),
                                        std::string(std::strerror(EACCES)), std::string("new[I=2048,clamp=0]")})
          if (message.find(part) == std::string::npos) problems += "store error lacks " + part + ": " + message + "\n";
      }
      // A root that does not exist yet (below a read-only directory) is an empty cache, not an error.
      KernelCache missing(root_ + "/entries/../absent");
      if (missing.lookup(key()) || !missing.list().empty()) problems += "absent root: not empty\n";
    } catch (const std::exception& e) {
      problems += std::string("threw: ") + e.what() + "\n";
    }
    return problems;
  });
  setTreeWritable(root_, true);
  if (failure.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << failure.substr(6);
  EXPECT_EQ(failure, "");
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty());
}

// Sets or unsets environment variables for one scope.
class EnvGuard {
 public:
  explicit EnvGuard(std::vector<std::string> names) : names_(std::move(names)) {
    for (const std::string& name : names_) {
      const char* value = std::getenv(name.c_str());
      saved_.push_back(value ? std::optional<std::string>(value) : std::nullopt);
    }
  }
  ~EnvGuard() {
    for (size_t i = 0; i < names_.size(); ++i) set(names_[i], saved_[i]);
  }
  static void set(const std::string& name, const std::optional<std::string>& value) {
    if (value) ::setenv(name.c_str(), value->c_str(), 1);
    else ::unsetenv(name.c_str());
  }

 private:
  std::vector<std::string> names_;
  std::vector<std::optional<std::string>> saved_;
};

TEST_F(KernelCacheTest, DefaultRootFollowsTheEnvironment) {
  EnvGuard guard({"MEGAMOE_CACHE_DIR", "XDG_CACHE_HOME", "HOME"});
  std::string explicitDir = scratch_ + "/explicit", xdg = scratch_ + "/xdg", home = scratch_ + "/home";
  EnvGuard::set("MEGAMOE_CACHE_DIR", explicitDir);
  EnvGuard::set("XDG_CACHE_HOME", xdg);
  EnvGuard::set("HOME", home);
  EXPECT_EQ(KernelCache::defaultRoot(), explicitDir);

  EnvGuard::set("MEGAMOE_CACHE_DIR", std::nullopt);
  EXPECT_EQ(KernelCache::defaultRoot(), xdg + "/megamoe");
  EnvGuard::set("MEGAMOE_CACHE_DIR", std::string());  // empty counts as unset
  EXPECT_EQ(KernelCache::defaultRoot(), xdg + "/megamoe");

  EnvGuard::set("XDG_CACHE_HOME", std::nullopt);
  EXPECT_EQ(KernelCache::defaultRoot(), home + "/.cache/megamoe");
  EnvGuard::set("XDG_CACHE_HOME", std::string("relative/xdg"));  // the XDG spec says to ignore relative paths
  EXPECT_EQ(KernelCache::defaultRoot(), home + "/.cache/megamoe");

  // The default is usable as a root.
  EnvGuard::set("MEGAMOE_CACHE_DIR", explicitDir);
  KernelCache cache(KernelCache::defaultRoot());
  cache.store(key(), {1}, "");
  EXPECT_TRUE(fs::exists(explicitDir + "/entries/" + key().digest()));
}

// ---------------------------------------------------------------------------------------------------------------
// list / verify / prune

TEST_F(KernelCacheTest, VerifyReportsCorruptEntriesWithoutRemovingThem) {
  TRACE_SEED();
  KernelCache cache(root_);
  KernelKey good = key("good"), flipped = key("flipped"), truncated = key("truncated");
  std::vector<uint8_t> goodBinary = randomBytes(), flippedBinary = randomBytes(), truncatedBinary = randomBytes();
  cache.store(good, goodBinary, "");
  cache.store(flipped, flippedBinary, "");
  cache.store(truncated, truncatedBinary, "");
  corrupt(entryDir(flipped), Corruption::kFlipBinaryByte, rng_);
  corrupt(entryDir(truncated), Corruption::kTruncateBinary, rng_);
  if (HasFatalFailure()) return;

  std::vector<EntryInfo> checked = cache.verify();
  ASSERT_EQ(checked.size(), 3u);
  for (const EntryInfo& info : checked) {
    EXPECT_EQ(info.target, "sm_90a");
    EXPECT_GT(info.mtime, 0);
    if (info.digest == good.digest()) {
      EXPECT_TRUE(info.valid) << info.problem;
      EXPECT_TRUE(info.problem.empty());
      EXPECT_EQ(info.description, good.describe());
      EXPECT_EQ(info.bytes, goodBinary.size());
    } else if (info.digest == flipped.digest()) {
      EXPECT_FALSE(info.valid);
      EXPECT_NE(info.problem.find("SHA-256"), std::string::npos) << info.problem;
      EXPECT_EQ(info.description, flipped.describe());
    } else {
      EXPECT_EQ(info.digest, truncated.digest());
      EXPECT_FALSE(info.valid);
      EXPECT_NE(info.problem.find("bytes"), std::string::npos) << info.problem;
    }
  }
  EXPECT_TRUE(fs::exists(entryDir(flipped)));
  EXPECT_TRUE(fs::exists(entryDir(truncated)));

  // list() is the cheap check: it sees the size change but does not hash.
  std::vector<EntryInfo> listed = cache.list();
  ASSERT_EQ(listed.size(), 3u);
  for (const EntryInfo& info : listed) EXPECT_EQ(info.valid, info.digest != truncated.digest()) << info.description;
}

// A stray name in entries/ is reported by verify and prune but not deleted: it is not the cache's to delete.
TEST_F(KernelCacheTest, VerifyReportsStrayNamesAndGarbageManifests) {
  KernelCache cache(root_);
  fs::create_directories(root_ + "/entries/not-a-digest");
  fs::create_directories(root_ + "/entries/" + std::string(64, 'b'));
  writeBytes(root_ + "/entries/" + std::string(64, 'b') + "/manifest.json", "[1, 2");
  std::vector<EntryInfo> checked = cache.verify();
  ASSERT_EQ(checked.size(), 2u);
  for (const EntryInfo& info : checked) {
    EXPECT_FALSE(info.valid) << info.digest;
    EXPECT_FALSE(info.problem.empty()) << info.digest;
  }
  std::vector<std::string> leftAlone;
  EXPECT_EQ(cache.prune("", &leftAlone), 1);
  EXPECT_EQ(namesIn(root_ + "/entries"), std::vector<std::string>{"not-a-digest"});
  ASSERT_EQ(leftAlone.size(), 1u);
  EXPECT_NE(leftAlone[0].find(root_ + "/entries/not-a-digest"), std::string::npos) << leftAlone[0];
}

TEST_F(KernelCacheTest, PruneRemovesInvalidEntriesOtherFingerprintsStaleTempsAndDanglingIndexes) {
  TRACE_SEED();
  KernelCache cache(root_);
  KernelKey keptA = key("a", "keep"), keptB = key("b", "keep"), oldC = key("c", "old"), corruptD = key("d", "keep");
  for (const KernelKey& k : {keptA, keptB, oldC, corruptD}) cache.store(k, randomBytes(), k.kernel);
  corrupt(entryDir(corruptD), Corruption::kFlipBinaryByte, rng_);
  if (HasFatalFailure()) return;

  // Index for "b" points at an older fingerprint's entry, which prune removes: it must be re-pointed at "keep".
  KernelKey oldB = key("b", "old");
  cache.store(oldB, randomBytes(), "old b");
  ASSERT_EQ(cache.lookupAnyFingerprint(keptB)->key.fingerprint, "old");

  std::string stale = root_ + "/tmp/" + std::string(64, 'e') + ".1.2.3";
  std::string fresh = root_ + "/tmp/" + std::string(64, 'f') + ".1.2.3";
  fs::create_directories(stale + "/inner");
  fs::create_directories(fresh);
  struct timeval twoHoursAgo[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ASSERT_EQ(::utimes(stale.c_str(), twoHoursAgo), 0);
  std::string dangling = root_ + "/index/" + std::string(64, 'c');
  writeBytes(dangling, std::string(64, 'd') + "\n");

  EXPECT_EQ(cache.prune("keep"), 3);  // oldC, oldB, corruptD

  EXPECT_TRUE(cache.lookup(keptA).has_value());
  EXPECT_TRUE(cache.lookup(keptB).has_value());
  for (const KernelKey& k : {oldC, oldB, corruptD}) EXPECT_FALSE(fs::exists(entryDir(k))) << k.describe();
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_FALSE(fs::exists(dangling));
  std::optional<CacheEntry> any = cache.lookupAnyFingerprint(key("b", "new"));
  ASSERT_TRUE(any.has_value());
  EXPECT_EQ(any->key.fingerprint, "keep");
  EXPECT_FALSE(cache.lookupAnyFingerprint(oldC).has_value());
  EXPECT_FALSE(fs::exists(root_ + "/index/" + oldC.lookupDigest()));
  for (const EntryInfo& info : cache.verify()) EXPECT_TRUE(info.valid) << info.description << ": " << info.problem;
}

TEST_F(KernelCacheTest, PruneWithoutFingerprintKeepsEveryValidEntry) {
  TRACE_SEED();
  KernelCache cache(root_);
  KernelKey one = key("k", "fp-1"), two = key("k", "fp-2"), broken = key("broken", "fp-1");
  for (const KernelKey& k : {one, two, broken}) cache.store(k, randomBytes(), "");
  corrupt(entryDir(broken), Corruption::kGarbageManifest, rng_);
  if (HasFatalFailure()) return;
  EXPECT_EQ(cache.prune(""), 1);
  EXPECT_TRUE(cache.lookup(one).has_value());
  EXPECT_TRUE(cache.lookup(two).has_value());
  EXPECT_EQ(cache.list().size(), 2u);
  EXPECT_EQ(cache.prune(""), 0);
}

// ---------------------------------------------------------------------------------------------------------------
// Trust: a folder or file that another user can write lets them plant code that the runtime loads onto the GPU.

class KernelCacheTrustTest : public KernelCacheTest {
 protected:
  // Expects `op` to throw a CacheError naming `path`, with `why` and how to fix it.
  static void expectRefused(const std::function<void()>& op, const std::string& path, const std::string& why,
                            const std::string& what) {
    SCOPED_TRACE(what);
    try {
      op();
      ADD_FAILURE() << "no CacheError for " << path;
    } catch (const CacheError& e) {
      std::string message = e.what();
      for (const std::string& part : {"'" + path + "'", why, std::string("MEGAMOE_CACHE_DIR")})
        EXPECT_NE(message.find(part), std::string::npos) << "lacks " << part << ": " << message;
    }
  }
  // Every operation that reads or writes the cache refuses it, naming `path`.
  void expectEveryOperationRefused(const std::string& root, const std::string& path, const std::string& why) {
    KernelCache cache(root);
    expectRefused([&] { cache.lookup(key()); }, path, why, "lookup");
    expectRefused([&] { cache.lookupAnyFingerprint(key("swiglu_fwd", "other")); }, path, why, "lookupAny");
    expectRefused([&] { cache.store(key(), {9}, "planted?"); }, path, why, "store");
    expectRefused([&] { cache.list(); }, path, why, "list");
    expectRefused([&] { cache.verify(); }, path, why, "verify");
    expectRefused([&] { cache.prune(""); }, path, why, "prune");
  }
  void expectUsable(const std::string& root) {
    KernelCache cache(root);
    std::optional<CacheEntry> hit = cache.lookup(key());
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->metadata, "mine");
    EXPECT_TRUE(cache.lookupAnyFingerprint(key("swiglu_fwd", "other")).has_value());
  }
};

// The root itself, mode 0777: refused by every operation; 0755 works.
TEST_F(KernelCacheTrustTest, WritableRootIsRefused) {
  KernelCache(root_).store(key(), {1, 2, 3}, "mine");
  ASSERT_EQ(::chmod(root_.c_str(), 0777), 0);
  expectEveryOperationRefused(root_, root_, "mode 0777");
  expectEveryOperationRefused(root_, root_, "chmod go-w");
  ASSERT_EQ(::chmod(root_.c_str(), 0775), 0);  // group-writable is refused too
  expectEveryOperationRefused(root_, root_, "mode 0775");
  ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);
  expectUsable(root_);
}

// Each subfolder (entries/, index/, tmp/, an entry's folder), mode 0777: refused by name.
TEST_F(KernelCacheTrustTest, WritableSubfolderIsRefusedByName) {
  KernelCache(root_).store(key(), {1, 2, 3}, "mine");
  for (const std::string& sub : {std::string("entries"), std::string("index"), std::string("tmp"),
                                 "entries/" + key().digest()}) {
    const std::string path = root_ + "/" + sub;
    ASSERT_EQ(::chmod(path.c_str(), 0777), 0) << path;
    expectEveryOperationRefused(root_, path, "mode 0777");
    ASSERT_EQ(::chmod(path.c_str(), 0755), 0) << path;
    expectUsable(root_);
  }
}

// A file in an entry that others can write is refused too (they could rewrite code.bin and the manifest).
TEST_F(KernelCacheTrustTest, WritableFileInAnEntryIsRefused) {
  KernelCache(root_).store(key(), {1, 2, 3}, "mine");
  const std::string binary = entryDir(key()) + "/code.bin";
  ASSERT_EQ(::chmod(binary.c_str(), 0666), 0);
  KernelCache cache(root_);
  expectRefused([&] { cache.lookup(key()); }, binary, "mode 0666", "lookup");
  expectRefused([&] { cache.list(); }, binary, "mode 0666", "list");
  EXPECT_TRUE(fs::exists(binary)) << "a refused entry must not be removed";
  ASSERT_EQ(::chmod(binary.c_str(), 0644), 0);
  expectUsable(root_);
}

// Owned by another user (mode 0755 or 0700): refused, naming the owner. Needs root to chown.
TEST_F(KernelCacheTrustTest, FolderOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown to another user needs root";
  KernelCache(root_).store(key(), {1, 2, 3}, "mine");
  for (const std::string& path : {root_, root_ + "/entries"}) {
    for (mode_t mode : {mode_t(0755), mode_t(0700)}) {
      ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0) << path;
      ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
      expectEveryOperationRefused(root_, path, "owned by uid 65534");
      ASSERT_EQ(::chown(path.c_str(), 0, 0), 0) << path;
      ASSERT_EQ(::chmod(path.c_str(), 0755), 0) << path;
    }
  }
  expectUsable(root_);
}

// A subfolder that is a symbolic link is refused (the cache never makes one); the root may be a link, and what it
// resolves to is what is checked.
TEST_F(KernelCacheTrustTest, SymlinkedSubfolderIsRefusedAndALinkedRootIsChecked) {
  KernelCache(root_).store(key(), {1, 2, 3}, "mine");
  const std::string elsewhere = scratch_ + "/elsewhere";
  ASSERT_EQ(::rename((root_ + "/entries").c_str(), elsewhere.c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (root_ + "/entries").c_str()), 0);
  expectEveryOperationRefused(root_, root_ + "/entries", "symbolic link");
  ASSERT_EQ(::unlink((root_ + "/entries").c_str()), 0);
  ASSERT_EQ(::rename(elsewhere.c_str(), (root_ + "/entries").c_str()), 0);

  const std::string link = scratch_ + "/link";
  ASSERT_EQ(::symlink(root_.c_str(), link.c_str()), 0);
  expectUsable(link);
  ASSERT_EQ(::chmod(root_.c_str(), 0777), 0);
  expectEveryOperationRefused(link, link, "mode 0777");
}

// What store() creates is writable by its owner only, whatever the umask.
TEST_F(KernelCacheTrustTest, CreatedFoldersAndFilesAreNotWritableByOthers) {
  const mode_t previous = ::umask(0);
  KernelCache(root_).store(key(), {1, 2, 3}, "mine");
  ::umask(previous);
  for (const std::string& path : {root_, root_ + "/entries", root_ + "/index", root_ + "/tmp", entryDir(key()),
                                   entryDir(key()) + "/code.bin", entryDir(key()) + "/manifest.json",
                                   root_ + "/index/" + key().lookupDigest()}) {
    struct stat st;
    ASSERT_EQ(::lstat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 022, 0u) << path << " mode " << std::oct << (st.st_mode & 07777);
  }
  expectUsable(root_);
}

// ---------------------------------------------------------------------------------------------------------------
// Read errors that say nothing about an entry (EMFILE, EACCES, EIO, ...) must not get a valid entry deleted.

// In a child short of file descriptors (none left, or one: the entry's folder opens, its files do not), lookups
// are a miss or an error; the entry stays, valid, and nothing is reported as invalid.
TEST_F(KernelCacheTest, TransientReadErrorKeepsTheEntry) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under the sanitizers: their runtimes need file descriptors of their own (UBSan's type checks "
                  "fail in a process without any)";
#endif
  KernelCache(root_).store(key(), {1, 2, 3}, "mine");
  for (int spare : {0, 1}) {
    for (bool exact : {true, false}) {
      SCOPED_TRACE(std::string(exact ? "lookup" : "lookupAnyFingerprint") + " with " + std::to_string(spare) +
                   " spare descriptors");
      std::string failure = inBoundedChild(20, [&]() -> std::string {
        KernelCache cache(root_);
        std::string problems;
        cache.setProblemReporter([&](const std::string& dir, const std::string& problem) {
          problems += "reported invalid: " + dir + ": " + problem + "\n";
        });
        int lowest = ::dup(0);  // the lowest free descriptor
        if (lowest < 0) return "dup failed";
        ::close(lowest);
        struct rlimit limit;
        if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return "getrlimit failed";
        limit.rlim_cur = rlim_t(lowest + spare);
        if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) return "setrlimit failed";
        try {
          if (exact ? cache.lookup(key()) : cache.lookupAnyFingerprint(key("swiglu_fwd", "other")))
            problems += "a hit without file descriptors\n";
        } catch (const CacheError& e) {
          if (std::string(e.what()).find(std::strerror(EMFILE)) == std::string::npos)
            problems += std::string("error does not say why: ") + e.what() + "\n";
        }
        return problems;
      });
      EXPECT_EQ(failure, "");
      KernelCache cache(root_);
      std::optional<CacheEntry> hit = cache.lookup(key());
      ASSERT_TRUE(hit.has_value()) << "the entry was removed";
      EXPECT_EQ(hit->metadata, "mine");
      EXPECT_TRUE(namesIn(root_ + "/tmp").empty());
    }
  }
}

// ---------------------------------------------------------------------------------------------------------------
// prune removes only what the cache made

// Foreign names in tmp/ (however old), entries/ and index/ survive prune; the cache's own stale temp dirs, trash
// and index temp files go, its fresh ones stay.
TEST_F(KernelCacheTest, PruneSweepsOnlyTheCachesOwnStaleTempNames) {
  KernelCache cache(root_);
  cache.store(key(), {1, 2, 3}, "mine");
  const std::string tmp = root_ + "/tmp/";
  const std::string suffix = ".4242.7.0123456789abcdef";
  const std::vector<std::string> ownStale = {tmp + std::string(64, 'e') + suffix,
                                             tmp + "trash." + std::string(64, 'a') + suffix,
                                             tmp + "index." + std::string(64, 'c') + suffix};
  const std::string ownFresh = tmp + std::string(64, 'f') + suffix;
  const std::vector<std::string> foreign = {tmp + "notes.txt", tmp + "build", tmp + std::string(64, 'e'),
                                            tmp + std::string(64, 'e') + ".x.y.z", root_ + "/entries/README",
                                            root_ + "/index/notes"};
  fs::create_directories(ownStale[0] + "/inner");
  fs::create_directories(ownStale[1]);
  writeBytes(ownStale[2], std::string(64, 'd') + "\n");
  fs::create_directories(ownFresh);
  for (const std::string& path : foreign) {
    if (path == tmp + "build") fs::create_directories(path + "/obj");
    else writeBytes(path, "not the cache's");
  }
  struct timeval twoHoursAgo[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  for (const std::vector<std::string>& paths : {ownStale, foreign})
    for (const std::string& path : paths) ASSERT_EQ(::utimes(path.c_str(), twoHoursAgo), 0) << path;

  EXPECT_EQ(cache.prune(""), 0);
  for (const std::string& path : ownStale) EXPECT_FALSE(fs::exists(path)) << path;
  EXPECT_TRUE(fs::exists(ownFresh));
  for (const std::string& path : foreign) EXPECT_TRUE(fs::exists(path)) << path;
  EXPECT_TRUE(fs::exists(tmp + "build/obj"));
  EXPECT_TRUE(cache.lookup(key()).has_value());
}

// ---------------------------------------------------------------------------------------------------------------
// store(..., kReplace): what `megamoe-cache generate --force` uses to replace a stale code object.

TEST_F(KernelCacheTest, StoreWithReplacePublishesTheNewEntry) {
  TRACE_SEED();
  KernelCache cache(root_);
  std::vector<uint8_t> a = randomBytes(), b = randomBytes(), c = randomBytes();
  cache.store(key(), a, "a");
  CacheEntry replaced = cache.store(key(), b, "b", KernelCache::StoreMode::kReplace);
  EXPECT_EQ(replaced.binary, b);
  EXPECT_EQ(replaced.metadata, "b");
  std::optional<CacheEntry> hit = KernelCache(root_).lookup(key());
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->binary, b);
  EXPECT_EQ(hit->metadata, "b");
  EXPECT_EQ(cache.lookupAnyFingerprint(key("swiglu_fwd", "other"))->metadata, "b");
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty()) << "the replaced entry must not linger";

  // Without replace, the entry there (now b) stays.
  EXPECT_EQ(cache.store(key(), c, "c").metadata, "b");
  EXPECT_EQ(cache.lookup(key())->binary, b);

  // Replacing where nothing is stored just stores; so does replacing an entry that is a file.
  EXPECT_EQ(cache.store(key("fresh"), a, "a", KernelCache::StoreMode::kReplace).binary, a);
  fs::remove_all(entryDir(key("other")));
  writeBytes(entryDir(key("other")), "a file");
  EXPECT_EQ(cache.store(key("other"), c, "c", KernelCache::StoreMode::kReplace).binary, c);
  EXPECT_EQ(cache.lookup(key("other"))->binary, c);
  for (const EntryInfo& info : cache.verify()) EXPECT_TRUE(info.valid) << info.description << ": " << info.problem;
  EXPECT_TRUE(namesIn(root_ + "/tmp").empty());
}

// ---------------------------------------------------------------------------------------------------------------
// An entries/ that cannot be listed is an error, not an empty cache.

TEST_F(KernelCacheTest, UnlistableEntriesFolderIsAnError) {
  KernelCache cache(root_);
  EXPECT_TRUE(cache.list().empty()) << "an absent root is an empty cache";
  fs::create_directories(root_ + "/index");
  EXPECT_TRUE(cache.verify().empty()) << "an absent entries/ is an empty cache";
  writeBytes(root_ + "/entries", "not a folder");
  const std::string entries = root_ + "/entries";
  for (const auto& [what, op] : std::vector<std::pair<std::string, std::function<void()>>>{
           {"list", [&] { cache.list(); }},
           {"verify", [&] { cache.verify(); }},
           {"prune", [&] { cache.prune(""); }},
           {"lookupAnyFingerprint", [&] { cache.lookupAnyFingerprint(key()); }}}) {
    SCOPED_TRACE(what);
    try {
      op();
      ADD_FAILURE() << "no CacheError";
    } catch (const CacheError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + entries + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::strerror(ENOTDIR)), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(fs::is_regular_file(entries));
}

// ---------------------------------------------------------------------------------------------------------------
// Sizes read from a manifest are bounded.

// entry_sha256 as the cache computes it (docs/decisions/cache-layout.md): anyone can recompute it, so it proves
// nothing about who wrote the manifest.
std::string entrySha256Of(const json::Value& m, const std::string& binarySize) {
  auto field = [](std::string& out, const std::string& text) { out += std::to_string(text.size()) + ":" + text; };
  auto text = [&](const char* name) { return m.find(name)->text; };
  std::string key;
  field(key, "megamoe.kernel-key.v1");
  field(key, text("kernel"));
  field(key, std::to_string(m.find("spec")->array.size()));
  for (const json::Value& pair : m.find("spec")->array) {
    field(key, pair.array[0].text);
    field(key, std::to_string(pair.array[1].integer));
  }
  for (const char* name : {"target", "options", "fingerprint"}) field(key, text(name));
  std::string out;
  field(out, "megamoe.cache-entry.v2");
  field(out, key);
  field(out, text("digest"));
  field(out, text("lookup_digest"));
  field(out, binarySize);
  field(out, text("binary_sha256"));
  field(out, std::to_string(m.find("created")->integer));
  field(out, text("metadata"));
  return sha256Hex(out);
}

// A self-consistent manifest claiming a 1 TiB code.bin (a sparse file) is invalid, not a std::bad_alloc.
TEST_F(KernelCacheTest, HugeBinarySizeInAManifestIsInvalid) {
  KernelCache cache(root_);
  cache.store(key(), {1, 2, 3}, "mine");
  const std::string manifestPath = entryDir(key()) + "/manifest.json";
  std::string manifest = readText(manifestPath);
  json::Value parsed;
  json::ParseError error;
  ASSERT_TRUE(json::parse(manifest, parsed, error)) << error.reason;
  const std::string stored = parsed.find("entry_sha256")->text;
  ASSERT_EQ(entrySha256Of(parsed, "3"), stored) << "the test's checksum must match the cache's";

  const std::string huge = std::to_string(uint64_t(1) << 40);
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"\"binary_size\": 3,", "\"binary_size\": " + huge + ","},
                                 {stored, entrySha256Of(parsed, huge)}}) {
    size_t at = manifest.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << manifest;
    manifest.replace(at, from.size(), to);
  }
  writeBytes(manifestPath, manifest);
  ASSERT_EQ(::truncate((entryDir(key()) + "/code.bin").c_str(), off_t(uint64_t(1) << 40)), 0);

  for (const std::vector<EntryInfo>& infos : {cache.list(), cache.verify()}) {
    ASSERT_EQ(infos.size(), 1u);
    EXPECT_FALSE(infos[0].valid);
    EXPECT_NE(infos[0].problem.find("binary_size"), std::string::npos) << infos[0].problem;
  }
  EXPECT_FALSE(cache.lookup(key()).has_value());
  EXPECT_FALSE(fs::exists(entryDir(key()))) << "an invalid entry is removed";
}

}  // namespace
}  // namespace megamoe::cache
