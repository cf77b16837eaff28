// Processes racing on one key: each child has its own KernelCache (as separate programs would) and they are
// released together through a pipe. Afterwards the cache must hold exactly one valid entry, tmp/ must be empty,
// and every child must have received the winner's entry.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compiler/cache/KernelCache.h"

namespace megamoe::cache {
namespace {

namespace fs = std::filesystem;

constexpr int kChildren = 8;
constexpr int kRounds = 3;

enum class Race { kGetOrBuild, kStore, kGetOrBuildOverCorruptEntry };

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> namesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) names.push_back(entry.path().filename().string());
  return names;
}

class KernelCacheRaceTest : public ::testing::TestWithParam<Race> {
 protected:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/megamoe-cache-race.XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    scratch_ = pattern;
    seed_ = std::random_device{}();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(scratch_, ec);
  }

  static KernelKey key() {
    KernelKey k;
    k.kernel = "moe_dispatch";
    k.spec = {{"E", 64}, {"K", 7168}};
    k.target = "gfx950";
    k.options = "waves_per_eu=2";
    k.fingerprint = "fp-race";
    return k;
  }

  // What a child does once released. Writes "ok\n<metadata it got>" or "error: ..." to `report`; exit status
  // 0 only when it received exactly `expected`.
  [[noreturn]] static void child(int index, Race race, const std::string& root, const std::vector<uint8_t>& expected,
                                 const std::string& report, int gate) {
    char byte;
    while (::read(gate, &byte, 1) > 0) {
    }
    int status = 2;
    std::string text;
    try {
      KernelCache cache(root);  // constructed after the gate: the children also race creating the root
      std::string metadata = "{\"child\": " + std::to_string(index) + "}";
      CacheEntry entry;
      if (race == Race::kStore) {
        entry = cache.store(key(), expected, metadata);
      } else {
        entry = cache.getOrBuild(key(), [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          return KernelCache::Built{expected, metadata};
        });
      }
      status = entry.binary == expected ? 0 : 1;
      text = (status == 0 ? "ok\n" : "error: wrong bytes\n") + entry.metadata;
    } catch (const std::exception& e) {
      text = std::string("error: ") + e.what();
    } catch (...) {
      text = "error: unknown exception";
    }
    std::ofstream(report) << text;
    ::_exit(status);
  }

  std::string scratch_;
  uint32_t seed_ = 0;
};

TEST_P(KernelCacheRaceTest, EightProcessesOneKey) {
  SCOPED_TRACE("random seed " + std::to_string(seed_));
  std::mt19937_64 rng(seed_);
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::string root = scratch_ + "/cache" + std::to_string(round);
    std::vector<uint8_t> expected(std::uniform_int_distribution<size_t>(1000, 200000)(rng));
    for (uint8_t& b : expected) b = uint8_t(rng());

    if (GetParam() == Race::kGetOrBuildOverCorruptEntry) {
      KernelCache setup(root);
      CacheEntry planted = setup.store(key(), expected, "planted");
      std::ofstream(planted.dir + "/code.bin", std::ios::binary | std::ios::app) << "trailing garbage";
    }

    int gate[2];
    ASSERT_EQ(::pipe(gate), 0);
    std::vector<pid_t> pids;
    for (int i = 0; i < kChildren; ++i) {
      pid_t pid = ::fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        ::close(gate[1]);
        child(i, GetParam(), root, expected, scratch_ + "/report." + std::to_string(i), gate[0]);
      }
      pids.push_back(pid);
    }
    ::close(gate[0]);
    ::close(gate[1]);  // releases every child at once

    for (int i = 0; i < kChildren; ++i) {
      int status = 0;
      ASSERT_EQ(::waitpid(pids[i], &status, 0), pids[i]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "child " << i << ": " << readText(scratch_ + "/report." + std::to_string(i));
    }

    KernelCache cache(root);
    std::vector<std::string> entries = namesIn(root + "/entries");
    ASSERT_EQ(entries.size(), 1u);
    EXPECT_EQ(entries[0], key().digest());
    std::vector<EntryInfo> checked = cache.verify();
    ASSERT_EQ(checked.size(), 1u);
    EXPECT_TRUE(checked[0].valid) << checked[0].problem;
    EXPECT_TRUE(namesIn(root + "/tmp").empty()) << "leftovers in tmp/";

    std::optional<CacheEntry> stored = cache.lookup(key());
    ASSERT_TRUE(stored.has_value());
    EXPECT_EQ(stored->binary, expected);
    std::optional<CacheEntry> any = cache.lookupAnyFingerprint(key());
    ASSERT_TRUE(any.has_value());
    EXPECT_EQ(any->dir, stored->dir);
    for (int i = 0; i < kChildren; ++i) {
      std::string report = readText(scratch_ + "/report." + std::to_string(i));
      if (GetParam() == Race::kGetOrBuildOverCorruptEntry) {
        // Removing the corrupt entry leaves a window (rename aside, check, rename back) in which a second valid
        // entry can replace a first one; all that is promised is a valid entry built by some child, never the
        // corrupt planted one.
        EXPECT_EQ(report.rfind("ok\n{\"child\": ", 0), 0u) << "child " << i << ": " << report;
      } else {
        // Nothing is ever removed here: losers return the winner's entry, which is the one on disk.
        EXPECT_EQ(report, "ok\n" + stored->metadata) << "child " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Races, KernelCacheRaceTest,
                         ::testing::Values(Race::kGetOrBuild, Race::kStore, Race::kGetOrBuildOverCorruptEntry),
                         [](const ::testing::TestParamInfo<Race>& info) {
                           switch (info.param) {
                             case Race::kGetOrBuild: return "GetOrBuild";
                             case Race::kStore: return "Store";
                             case Race::kGetOrBuildOverCorruptEntry: return "GetOrBuildOverCorruptEntry";
                           }
                           return "Unknown";
                         });

}  // namespace
}  // namespace megamoe::cache
