// KernelLoader over a temp cache (MEGAMOE_CACHE_DIR): hits, the miss message, the JIT hook, metadata errors and the
// per-(device, digest) module cache, with modules loaded on the fake HIP device.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/GeneratorHash.h"
#include "megamoe/KernelLoader.h"

namespace megamoe {
namespace {

cache::KernelKey swigluKey() {
  cache::KernelKey key;
  key.kernel = "swiglu_fwd";
  key.spec = {{"I", 2048}, {"clamp", 0}};
  key.target = "gfx950";
  key.options = "waves=8";
  return key;
}

const std::string kMetadata = R"({"symbol":"swiglu_fwd_kernel","block_threads":256,"shared_bytes":65536,
                            "compile":{"ms":12,"passes":["a","b"]})" + test::signatureMembers("swiglu_fwd") + "}";

// Unregisters the JIT hook however the test ends.
struct JitGuard {
  ~JitGuard() { KernelLoader::setJitCompiler(nullptr); }
};

class KernelLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { device = openBackend(BackendKind::kHip, test::FakeHip::path())->device(0); }
  test::TempDir dir;
  test::ScopedEnv cacheEnv{"MEGAMOE_CACHE_DIR", dir.path().c_str()};
  std::shared_ptr<Device> device;
};

TEST_F(KernelLoaderTest, UsesMegamoeCacheDirAndFindsAnyFingerprint) {
  KernelLoader loader;
  EXPECT_EQ(loader.cacheRoot(), dir.path());
  cache::KernelKey stored = swigluKey();
  stored.fingerprint = test::ourFingerprint("megamoe-0.1+llvm-22+gen-abc");
  cache::KernelCache(dir.path()).store(stored, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);

  const cache::CacheEntry entry = loader.find(swigluKey(), "unused");
  EXPECT_EQ(entry.key.fingerprint, stored.fingerprint);

  auto kernel = loader.load(device, swigluKey(), "unused");
  EXPECT_EQ(kernel->metadata().symbol, "swiglu_fwd_kernel");
  EXPECT_EQ(kernel->metadata().blockThreads, 256);
  EXPECT_EQ(kernel->metadata().sharedBytes, 65536);
  EXPECT_EQ(kernel->digest(), stored.digest());
}

// The index is a shortcut only: an entry whose index file is gone (or was never written) is still found.
TEST_F(KernelLoaderTest, FindsAnyFingerprintWithoutTheIndex) {
  cache::KernelKey stored = swigluKey();
  stored.fingerprint = test::ourFingerprint("megamoe-0.1+llvm-22+gen-abc");
  cache::KernelCache(dir.path()).store(stored, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  std::filesystem::remove_all(dir.path() + "/index");
  KernelLoader loader;
  auto kernel = loader.load(device, swigluKey(), "unused");
  EXPECT_EQ(kernel->digest(), stored.digest());
}

TEST_F(KernelLoaderTest, ModulesAreCachedPerDeviceAndDigest) {
  cache::KernelKey stored = swigluKey();
  stored.fingerprint = test::ourFingerprint("fp");
  cache::KernelCache(dir.path()).store(stored, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  auto& fake = test::FakeHip::get();
  const int before = fake.modulesLoaded();
  {
    KernelLoader loader(dir.path());
    auto a = loader.load(device, swigluKey(), "");
    auto b = loader.load(device, swigluKey(), "");
    EXPECT_EQ(a.get(), b.get());
    EXPECT_EQ(fake.modulesLoaded(), before + 1);
    auto other = openBackend(BackendKind::kHip, test::FakeHip::path())->device(1);
    auto c = loader.load(other, swigluKey(), "");
    EXPECT_NE(a.get(), c.get());
    EXPECT_EQ(&c->device(), other.get());
    EXPECT_EQ(fake.modulesLoaded(), before + 2);
  }
  EXPECT_EQ(fake.modulesLoaded(), before) << "modules must be unloaded with the loader's last reference";
}

TEST_F(KernelLoaderTest, MissNamesKeyDigestRootAndHint) {
  KernelLoader loader;
  const std::string hint = "megamoe-cache generate --kernel swiglu_fwd --spec I=2048,clamp=0 --target gfx950";
  try {
    loader.load(device, swigluKey(), hint);
    FAIL() << "expected a miss";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kKernelNotFound);
    EXPECT_NE(what.find(swigluKey().describe()), std::string::npos) << what;
    EXPECT_NE(what.find(swigluKey().lookupDigest()), std::string::npos) << what;
    EXPECT_NE(what.find(dir.path()), std::string::npos) << what;
    EXPECT_NE(what.find(hint), std::string::npos) << what;
    EXPECT_NE(what.find("no JIT compiler"), std::string::npos) << what;
  }
}

// The message of the kStaleKernel that a cache-only find of swigluKey() in `root` throws; a failure naming `loaded`
// (and "") when it loads something or throws another error.
std::string staleMiss(const std::string& root, const std::string& loaded) {
  try {
    KernelLoader(root).find(swigluKey(), "the generate command");
    ADD_FAILURE() << loaded << " was loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kStaleKernel) << e.what();
    EXPECT_NE(std::string(e.what()).find("the generate command"), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

// Cache-only lookups take entries of this library's kernel generator only, never one another generator built (other
// kernel sources at the same ABI: e.g. a kernel from before a fix), however new; with only such an entry the miss
// says so, unless MEGAMOE_CACHE_ANY_GENERATOR asks for it.
TEST_F(KernelLoaderTest, CacheOnlyLookupsTakeThisLibrarysGeneratorOnly) {
  const std::string other = std::string(MEGAMOE_GENERATOR_HASH) == "0123456789abcdef" ? "fedcba9876543210"
                                                                                      : "0123456789abcdef";
  cache::KernelKey foreign = swigluKey(), ours = swigluKey();
  foreign.fingerprint = "megamoe 0.1.0; LLVM 22.1.8; generator " + other;
  ours.fingerprint = std::string("megamoe 0.1.0; LLVM 22.1.8; generator ") + MEGAMOE_GENERATOR_HASH;
  cache::KernelCache cache(dir.path());
  cache.store(foreign, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  const std::string what = staleMiss(dir.path(), "a kernel of another generator");
  EXPECT_NE(what.find("built by kernel generator " + other), std::string::npos) << what;
  EXPECT_NE(what.find(std::string("this library by generator ") + MEGAMOE_GENERATOR_HASH), std::string::npos) << what;
  EXPECT_NE(what.find("MEGAMOE_CACHE_ANY_GENERATOR=1"), std::string::npos) << what;
  EXPECT_EQ(KernelLoader(dir.path(), /*anyGenerator=*/true).find(swigluKey(), "").key.fingerprint, foreign.fingerprint);
  cache.store(ours, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  cache.store(foreign, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata, cache::KernelCache::StoreMode::kReplace);
  EXPECT_EQ(KernelLoader(dir.path()).find(swigluKey(), "").key.fingerprint, ours.fingerprint);  // though older
  EXPECT_EQ(cache::generatorOf(ours.fingerprint), MEGAMOE_GENERATOR_HASH);
  EXPECT_EQ(cache::generatorOf("megamoe-0.1+llvm-22+gen-abc"), "");
  EXPECT_EQ(cache::generatorOf("x; notgenerator abc"), "");
  EXPECT_EQ(cache::generatorOf("generator abc; LLVM 22"), "abc");
}

// An entry whose fingerprint names no generator (hand-made, or from before fingerprints named one) is as foreign as
// one of another generator: a cache-only lookup refuses it as stale, saying so, unless asked for any generator.
TEST_F(KernelLoaderTest, AnEntryNamingNoGeneratorIsForeign) {
  cache::KernelKey unnamed = swigluKey();
  unnamed.fingerprint = "megamoe 0.1.0; LLVM 22.1.8";
  ASSERT_EQ(cache::generatorOf(unnamed.fingerprint), "");
  cache::KernelCache(dir.path()).store(unnamed, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  const std::string what = staleMiss(dir.path(), "an entry naming no generator");
  EXPECT_NE(what.find("built by a kernel generator its fingerprint does not name"), std::string::npos) << what;
  EXPECT_EQ(KernelLoader(dir.path(), /*anyGenerator=*/true).find(swigluKey(), "").key.fingerprint, unnamed.fingerprint);
}

TEST_F(KernelLoaderTest, ExactFingerprintMissesAnOlderCompilersEntry) {
  cache::KernelKey old = swigluKey();
  old.fingerprint = test::ourFingerprint("old");
  cache::KernelCache(dir.path()).store(old, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  cache::KernelKey wanted = swigluKey();
  wanted.fingerprint = test::ourFingerprint("new");
  KernelLoader loader;
  try {
    loader.find(wanted, "regenerate");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exact digest " + wanted.digest()), std::string::npos) << e.what();
  }
}

TEST_F(KernelLoaderTest, JitHookBuildsOnMiss) {
  JitGuard guard;
  int calls = 0;
  cache::KernelKey seen;
  KernelLoader::setJitCompiler([&](const cache::KernelKey& key) -> std::optional<cache::CacheEntry> {
    ++calls;
    seen = key;
    cache::KernelKey withFingerprint = key;
    withFingerprint.fingerprint = test::ourFingerprint("jit");
    return cache::KernelCache(dir.path()).store(withFingerprint, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"),
                                                kMetadata);
  });
  EXPECT_TRUE(KernelLoader::hasJitCompiler());
  KernelLoader loader;
  auto kernel = loader.load(device, swigluKey(), "hint");
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen.describe(), swigluKey().describe());
  EXPECT_EQ(kernel->metadata().symbol, "swiglu_fwd_kernel");
  loader.load(device, swigluKey(), "hint");  // now a cache hit
  EXPECT_EQ(calls, 1);
}

TEST_F(KernelLoaderTest, JitHookThatCannotBuildIsReported) {
  JitGuard guard;
  KernelLoader::setJitCompiler([](const cache::KernelKey&) { return std::optional<cache::CacheEntry>(); });
  KernelLoader loader;
  try {
    loader.find(swigluKey(), "hint");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kKernelNotFound);
    EXPECT_NE(std::string(e.what()).find("JIT compiler could not build it"), std::string::npos) << e.what();
  }
  KernelLoader::setJitCompiler([](const cache::KernelKey&) -> std::optional<cache::CacheEntry> {
    throw std::runtime_error("ptxas exploded");
  });
  try {
    loader.find(swigluKey(), "hint");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ptxas exploded"), std::string::npos) << e.what();
  }
}

TEST_F(KernelLoaderTest, BadMetadataNamesTheEntry) {
  cache::KernelKey stored = swigluKey();
  stored.fingerprint = test::ourFingerprint("fp");
  const auto entry =
      cache::KernelCache(dir.path()).store(stored, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), R"({"symbol":"x"})");
  KernelLoader loader;
  try {
    loader.load(device, swigluKey(), "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBadMetadata);
    EXPECT_NE(std::string(e.what()).find(entry.dir), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("block_threads"), std::string::npos) << e.what();
  }
}

// A manifest edited after the store (here the launch's block size) must not be launched with: the entry fails its
// checksum, so the loader misses.
TEST_F(KernelLoaderTest, EditedMetadataIsNotLoaded) {
  cache::KernelKey stored = swigluKey();
  stored.fingerprint = test::ourFingerprint("fp");
  const auto entry =
      cache::KernelCache(dir.path()).store(stored, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  const std::string path = entry.dir + "/manifest.json";
  std::string manifest;
  {
    std::ifstream in(path, std::ios::binary);
    manifest.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string field = R"(block_threads\":256)";
  const size_t at = manifest.find(field);
  ASSERT_NE(at, std::string::npos) << manifest;
  manifest.replace(at, field.size(), R"(block_threads\":512)");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << manifest;

  KernelLoader loader;
  try {
    auto kernel = loader.load(device, swigluKey(), "regenerate");
    FAIL() << "loaded with block_threads " << kernel->metadata().blockThreads;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kKernelNotFound) << e.what();
  }
}

TEST_F(KernelLoaderTest, MissingSymbolInTheCodeObjectIsADriverError) {
  cache::KernelKey stored = swigluKey();
  stored.fingerprint = test::ourFingerprint("fp");
  cache::KernelCache(dir.path()).store(stored, test::fakeImage("FAKEHIP\nother_kernel 1\n"), kMetadata);
  auto& fake = test::FakeHip::get();
  const int before = fake.modulesLoaded();
  KernelLoader loader;
  try {
    loader.load(device, swigluKey(), "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDriverError);
    EXPECT_NE(std::string(e.what()).find("hipModuleGetFunction(swiglu_fwd_kernel)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("hipErrorNotFound"), std::string::npos) << e.what();
  }
  EXPECT_EQ(fake.modulesLoaded(), before) << "the module of a failed load must be unloaded";
}

TEST_F(KernelLoaderTest, TargetMismatchIsRejected) {
  cache::KernelKey key = swigluKey();
  key.target = "sm_90a";
  KernelLoader loader;
  try {
    loader.load(device, key, "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("targets sm_90a but hip device 0 runs gfx950"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace megamoe
