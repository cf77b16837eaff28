// Races between processes of one cache, made to happen every time: a test hook (KernelCacheTestHooks.h) replaces or
// removes an entry between a reader's opening of its folder and the reads of its files, or between a store's
// publishing of an entry and its check that a lookup finds it.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "compiler/cache/KernelCache.h"
#include "compiler/cache/KernelCacheTestHooks.h"

namespace megamoe::cache {
namespace {

namespace fs = std::filesystem;
using testhooks::Point;

KernelKey key(const std::string& fingerprint = "fp-1") {
  return {"swiglu_fwd", {{"I", 2048}, {"clamp", 0}}, "sm_90a", "num_warps=4", fingerprint};
}

class KernelCacheHookTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/megamoe-cache-hook-test.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    scratch_ = pattern;
    root_ = scratch_ + "/cache";
    rng_.seed(std::random_device{}());
  }
  void TearDown() override {
    testhooks::setHook(nullptr);
    std::error_code ec;
    fs::remove_all(scratch_, ec);
  }

  std::vector<uint8_t> randomBytes() {
    std::vector<uint8_t> bytes(std::uniform_int_distribution<size_t>(100, 5000)(rng_));
    for (uint8_t& b : bytes) b = uint8_t(rng_());
    return bytes;
  }

  // A cache whose reporter records every entry a lookup calls invalid.
  KernelCache cache() {
    KernelCache c(root_);
    c.setProblemReporter([this](const std::string& dir, const std::string& problem) {
      reported_.push_back(dir + ": " + problem);
    });
    return c;
  }

  // Runs `act` at the first `times` arrivals at `point` (not at those its own cache calls make), and records every
  // entry moved aside.
  void onPoint(Point point, std::function<void()> act, int times = 1) {
    testhooks::setHook([this, point, act = std::move(act), times, inside = false](Point p,
                                                                                   const std::string& dir) mutable {
      if (p == Point::kEntryRemoving) movedAside_.push_back(dir);
      if (p != point || inside || acted_ >= times) return;
      inside = true;
      ++acted_;
      act();
      inside = false;
    });
  }

  std::string scratch_, root_;
  std::mt19937_64 rng_;
  std::vector<std::string> reported_, movedAside_;
  int acted_ = 0;
};

// How a reader gets to an entry: exact lookup, the cache-only lookup through the index, and the cache-only lookup
// that scans entries/ (no index).
struct Reader {
  const char* name;
  std::function<std::optional<CacheEntry>(const KernelCache&)> lookup;
  bool dropIndex;
};

std::vector<Reader> readers() {
  return {
      {"lookup", [](const KernelCache& c) { return c.lookup(key()); }, false},
      {"lookupAnyFingerprint via the index",
       [](const KernelCache& c) { return c.lookupAnyFingerprint(key("other")); }, false},
      {"lookupAnyFingerprint scanning entries/",
       [](const KernelCache& c) { return c.lookupAnyFingerprint(key("other")); }, true},
  };
}

// A writer swaps a new entry in (store --force: rename over the old one, which is then deleted) after the reader
// opened the old folder: its files vanish under the reader. That says nothing about the entry now in place, which
// the reader must find, without calling anything invalid or moving it aside.
TEST_F(KernelCacheHookTest, ReaderOfAnEntryReplacedUnderItFindsTheNewOne) {
  for (const Reader& reader : readers()) {
    SCOPED_TRACE(reader.name);
    fs::remove_all(root_);
    reported_.clear(), movedAside_.clear(), acted_ = 0;
    const KernelCache c = cache();
    const std::vector<uint8_t> before = randomBytes(), after = randomBytes();
    c.store(key(), before, "before");
    if (reader.dropIndex) fs::remove_all(root_ + "/index");
    onPoint(Point::kEntryOpened, [&] { KernelCache(root_).store(key(), after, "after", KernelCache::StoreMode::kReplace); });
    std::optional<CacheEntry> found = reader.lookup(c);
    testhooks::setHook(nullptr);
    EXPECT_EQ(acted_, 1) << "the hook did not run";
    if (!found) {
      ADD_FAILURE() << "the new entry was not found" << (reported_.empty() ? "" : "; reported: " + reported_.front());
      continue;
    }
    EXPECT_EQ(found->metadata, "after");
    EXPECT_EQ(found->binary, after);
    EXPECT_TRUE(reported_.empty()) << reported_.front();
    EXPECT_TRUE(movedAside_.empty()) << movedAside_.front();
    std::optional<CacheEntry> again = KernelCache(root_).lookup(key());
    ASSERT_TRUE(again.has_value());
    EXPECT_EQ(again->binary, after);
  }
}

// An entry removed (prune, another reader's repair) after the reader opened it is a miss, not an invalid entry.
TEST_F(KernelCacheHookTest, ReaderOfAnEntryRemovedUnderItMissesQuietly) {
  for (const Reader& reader : readers()) {
    SCOPED_TRACE(reader.name);
    fs::remove_all(root_);
    reported_.clear(), movedAside_.clear(), acted_ = 0;
    const KernelCache c = cache();
    c.store(key(), randomBytes(), "gone soon");
    if (reader.dropIndex) fs::remove_all(root_ + "/index");
    const std::string dir = root_ + "/entries/" + key().digest();
    onPoint(Point::kEntryOpened, [&] { fs::remove_all(dir); });
    EXPECT_FALSE(reader.lookup(c).has_value());
    testhooks::setHook(nullptr);
    EXPECT_EQ(acted_, 1) << "the hook did not run";
    EXPECT_TRUE(reported_.empty()) << reported_.front();
    EXPECT_TRUE(movedAside_.empty()) << movedAside_.front();
  }
}

// The retries are bounded: an entry replaced under every read is an error saying so, and nothing is removed.
TEST_F(KernelCacheHookTest, EntryReplacedUnderEveryReadIsAnErrorNotALoop) {
  const KernelCache c = cache();
  c.store(key(), randomBytes(), "first");
  onPoint(Point::kEntryOpened, [&] {
    KernelCache(root_).store(key(), randomBytes(), "next", KernelCache::StoreMode::kReplace);
  }, /*times=*/1000);
  try {
    c.lookup(key());
    ADD_FAILURE() << "a lookup returned while its entry was replaced under each of its reads";
  } catch (const CacheError& e) {
    EXPECT_NE(std::string(e.what()).find("replaced"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(key().describe()), std::string::npos) << e.what();
  }
  testhooks::setHook(nullptr);
  EXPECT_LT(acted_, 1000) << "no bound on the retries";
  EXPECT_TRUE(reported_.empty()) << reported_.front();
  EXPECT_TRUE(movedAside_.empty()) << movedAside_.front();
  EXPECT_TRUE(KernelCache(root_).lookup(key()).has_value());
}

// store() returns (and the JIT reports a kernel built) only when a lookup then finds the entry it published; an
// entry removed at once (a concurrent prune for another compiler) is an error naming the key and its digest.
TEST_F(KernelCacheHookTest, StoreWhoseEntryALookupCannotFindFails) {
  for (KernelCache::StoreMode mode : {KernelCache::StoreMode::kKeepValid, KernelCache::StoreMode::kReplace}) {
    SCOPED_TRACE(mode == KernelCache::StoreMode::kReplace ? "replace" : "keep valid");
    fs::remove_all(root_);
    acted_ = 0;
    const KernelCache c = cache();
    if (mode == KernelCache::StoreMode::kReplace) c.store(key(), randomBytes(), "old");
    const std::string dir = root_ + "/entries/" + key().digest();
    onPoint(Point::kStorePublished, [&] { fs::remove_all(dir); });
    try {
      c.store(key(), randomBytes(), "new", mode);
      ADD_FAILURE() << "store() returned an entry that no lookup finds";
    } catch (const CacheError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(key().describe()), std::string::npos) << what;
      EXPECT_NE(what.find(key().digest()), std::string::npos) << what;
    }
    testhooks::setHook(nullptr);
    EXPECT_EQ(acted_, 1) << "the hook did not run";
  }
  // Undisturbed, a store returns what a lookup then finds.
  const std::vector<uint8_t> bytes = randomBytes();
  EXPECT_EQ(cache().store(key(), bytes, "kept").binary, bytes);
  EXPECT_EQ(KernelCache(root_).lookup(key())->binary, bytes);
}

}  // namespace
}  // namespace megamoe::cache
