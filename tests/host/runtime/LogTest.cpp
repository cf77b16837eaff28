// The runtime's log: the level gate (a message of a disabled level is never built), the sink and its rules,
// MEGAMOE_LOG_LEVEL's strict parsing, and what the kernel loader, the heap and the rendezvous say (fake HIP
// backend, temp cache, fork()ed ranks).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/KernelLoader.h"
#include "megamoe/Log.h"
#include "megamoe/Rendezvous.h"
#include "megamoe/SymmetricHeap.h"
#include "megamoe/env.h"

namespace megamoe {
namespace {

using test::LogCapture;

// Forgets the level, so that the next message reads MEGAMOE_LOG_LEVEL again (as at process start).
struct FreshLevel {
  FreshLevel() : saved(logLevel()) { detail::logLevelState.store(-1); }
  ~FreshLevel() { setLogLevel(saved); }
  LogLevel saved;
};

TEST(Log, DisabledLevelsAreNeverBuilt) {
  LogCapture capture(LogLevel::kWarn);
  int built = 0;
  auto message = [&](const char* text) {
    ++built;
    return std::string(text);
  };
  MEGAMOE_LOG(kDebug, message("debug"));
  MEGAMOE_LOG(kInfo, message("info"));
  EXPECT_EQ(built, 0) << "a message below the level was built";
  MEGAMOE_LOG(kWarn, message("warn"));
  MEGAMOE_LOG(kError, message("error"));
  EXPECT_EQ(built, 2);
  ASSERT_EQ(capture.lines().size(), 2u) << capture.dump();
  EXPECT_FALSE(logEnabled(LogLevel::kDebug));
  EXPECT_TRUE(logEnabled(LogLevel::kWarn));

  setLogLevel(LogLevel::kOff);
  MEGAMOE_LOG(kError, message("error"));
  EXPECT_EQ(built, 2) << "level off builds nothing, not even errors";
  EXPECT_FALSE(logEnabled(LogLevel::kError));
  EXPECT_FALSE(logEnabled(LogLevel::kOff)) << "kOff is a level, never a message's";

  setLogLevel(LogLevel::kDebug);
  MEGAMOE_LOG(kDebug, message("debug"));
  EXPECT_EQ(built, 3);
  EXPECT_EQ(capture.lines().back().text, "debug");
}

TEST(Log, SinkReceivesLevelAndText) {
  LogCapture capture(LogLevel::kDebug);
  MEGAMOE_LOG(kError, "e " + std::to_string(1));
  MEGAMOE_LOG(kWarn, std::string("w"));
  MEGAMOE_LOG(kInfo, std::string("i"));
  MEGAMOE_LOG(kDebug, std::string("d\nsecond line"));
  const auto lines = capture.lines();
  ASSERT_EQ(lines.size(), 4u) << capture.dump();
  EXPECT_EQ(lines[0].level, LogLevel::kError);
  EXPECT_EQ(lines[0].text, "e 1");
  EXPECT_EQ(lines[1].level, LogLevel::kWarn);
  EXPECT_EQ(lines[2].level, LogLevel::kInfo);
  EXPECT_EQ(lines[3].level, LogLevel::kDebug);
  EXPECT_EQ(lines[3].text, "d\nsecond line") << "a sink gets the text as logged";
}

TEST(Log, EmptySinkRestoresTheDefaultStderrLine) {
  const LogLevel saved = logLevel();
  setLogLevel(LogLevel::kInfo);
  int calls = 0;
  setLogSink([&](LogLevel, const std::string&) { ++calls; });
  MEGAMOE_LOG(kInfo, std::string("to the sink"));
  setLogSink(nullptr);
  testing::internal::CaptureStderr();
  MEGAMOE_LOG(kInfo, std::string("kernel cache hit: x"));
  MEGAMOE_LOG(kWarn, std::string("two\nlines"));
  MEGAMOE_LOG(kDebug, std::string("not shown"));
  const std::string err = testing::internal::GetCapturedStderr();
  setLogLevel(saved);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(err, "megamoe [info] kernel cache hit: x\nmegamoe [warn] two lines\n");
}

TEST(Log, SinkMayCallTheLoggerAndReplaceItself) {
  LogCapture capture(LogLevel::kInfo);
  int outer = 0;
  std::vector<std::string> seen;
  setLogSink([&](LogLevel, const std::string& text) {
    seen.push_back(text);
    if (outer++ == 0) {
      MEGAMOE_LOG(kInfo, std::string("from inside the sink"));  // delivered to this sink, on this thread
      setLogLevel(LogLevel::kDebug);
      setLogSink(nullptr);  // its own replacement: must not wait for itself
    }
  });
  MEGAMOE_LOG(kInfo, std::string("first"));
  EXPECT_EQ(seen, (std::vector<std::string>{"first", "from inside the sink"}));
  EXPECT_EQ(logLevel(), LogLevel::kDebug);
  testing::internal::CaptureStderr();
  MEGAMOE_LOG(kInfo, std::string("after"));
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "megamoe [info] after\n");
}

TEST(Log, ReplacingTheSinkWaitsForOtherThreadsInsideIt) {
  LogCapture capture(LogLevel::kInfo);
  std::atomic<bool> inside{false}, release{false}, returned{false};
  setLogSink([&](LogLevel, const std::string&) {
    inside = true;
    while (!release) std::this_thread::yield();
    returned = true;
  });
  std::thread logger([] { MEGAMOE_LOG(kInfo, std::string("slow")); });
  while (!inside) std::this_thread::yield();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    release = true;
  });
  setLogSink(nullptr);
  EXPECT_TRUE(returned) << "setLogSink returned while another thread was still inside the old sink";
  logger.join();
  releaser.join();
}

TEST(Log, ThrowingSinkDoesNotFailTheCaller) {
  LogCapture capture(LogLevel::kInfo);
  setLogSink([](LogLevel, const std::string&) { throw std::runtime_error("sink broke"); });
  EXPECT_NO_THROW(MEGAMOE_LOG(kInfo, std::string("x")));
}

TEST(Log, ManyThreadsLogConcurrently) {
  LogCapture capture(LogLevel::kInfo);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) MEGAMOE_LOG(kInfo, std::to_string(t) + ":" + std::to_string(i));
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(capture.lines().size(), 800u);
}

TEST(Log, SetLogLevelRefusesUnknownValues) {
  EXPECT_THROW(setLogLevel(static_cast<LogLevel>(5)), Error);
  EXPECT_THROW(setLogLevel(static_cast<LogLevel>(-1)), Error);
}

TEST(Log, FormatDuration) {
  EXPECT_EQ(formatDuration(0.0123), "12.3 ms");
  EXPECT_EQ(formatDuration(1.5), "1.5 s");
  EXPECT_EQ(formatDuration(42.25), "42.2 s");
}

// ---- MEGAMOE_LOG_LEVEL

LogLevel levelFrom(const char* value) {
  return parseLogLevelEnv([&](const char* name) -> const char* {
    return std::string(name) == "MEGAMOE_LOG_LEVEL" ? value : nullptr;
  });
}

TEST(LogEnv, RegistryDocumentsTheNewVariables) {
  std::map<std::string, std::string> defaults;
  for (const EnvVar& v : envRegistry()) defaults[v.name] = v.defaultValue;
  ASSERT_EQ(defaults.count("MEGAMOE_LOG_LEVEL"), 1u);
  EXPECT_EQ(defaults["MEGAMOE_LOG_LEVEL"], "warn");
  ASSERT_EQ(defaults.count("MEGAMOE_NVTX"), 1u);
  EXPECT_EQ(defaults["MEGAMOE_NVTX"], "0");
  ASSERT_EQ(defaults.count("MEGAMOE_NVTX_LIBRARY"), 1u);
  EXPECT_EQ(defaults["MEGAMOE_NVTX_LIBRARY"], "libnvToolsExt.so.1");
  const RuntimeEnv env = parseEnv([](const char*) -> const char* { return nullptr; });
  EXPECT_EQ(env.logLevel, LogLevel::kWarn);
  EXPECT_FALSE(env.nvtx);
  EXPECT_EQ(env.nvtxLibrary, "libnvToolsExt.so.1");
}

TEST(LogEnv, LevelNamesParse) {
  EXPECT_EQ(levelFrom(nullptr), LogLevel::kWarn);
  EXPECT_EQ(levelFrom("off"), LogLevel::kOff);
  EXPECT_EQ(levelFrom("error"), LogLevel::kError);
  EXPECT_EQ(levelFrom("warn"), LogLevel::kWarn);
  EXPECT_EQ(levelFrom("info"), LogLevel::kInfo);
  EXPECT_EQ(levelFrom("debug"), LogLevel::kDebug);
}

TEST(LogEnv, BadLevelsAreRefusedNamingTheVariable) {
  for (const char* bad : {"", "INFO", "Info", " info", "info ", "verbose", "3", "warning", "trace"}) {
    try {
      levelFrom(bad);
      ADD_FAILURE() << "MEGAMOE_LOG_LEVEL='" << bad << "' accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInvalidEnv);
      EXPECT_NE(what.find(std::string("MEGAMOE_LOG_LEVEL='") + bad + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("off, error, warn, info, debug"), std::string::npos) << what;
      EXPECT_NE(what.find("(default warn)"), std::string::npos) << what;
    }
  }
  // The whole registry parse refuses it too (so runtime creation fails, as for every variable).
  EXPECT_THROW(parseEnv([](const char* name) -> const char* {
                 return std::string(name) == "MEGAMOE_LOG_LEVEL" ? "loud" : nullptr;
               }),
               Error);
}

TEST(LogEnv, NvtxVariablesAreStrict) {
  auto with = [](const char* nvtx, const char* library) {
    return parseProfileEnv([=](const char* name) -> const char* {
      if (std::string(name) == "MEGAMOE_NVTX") return nvtx;
      if (std::string(name) == "MEGAMOE_NVTX_LIBRARY") return library;
      return nullptr;
    });
  };
  EXPECT_FALSE(with(nullptr, nullptr).nvtx);
  EXPECT_EQ(with(nullptr, nullptr).nvtxLibrary, "libnvToolsExt.so.1");
  EXPECT_TRUE(with("1", "/x/libfake.so").nvtx);
  EXPECT_EQ(with("1", "/x/libfake.so").nvtxLibrary, "/x/libfake.so");
  for (const char* bad : {"", "2", "yes", "on", "true", " 1"}) {
    try {
      with(bad, nullptr);
      ADD_FAILURE() << "MEGAMOE_NVTX='" << bad << "' accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidEnv);
      EXPECT_NE(std::string(e.what()).find(std::string("MEGAMOE_NVTX='") + bad + "'"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(with("1", ""), Error);
}

TEST(LogEnv, TheLevelIsReadAtTheFirstMessage) {
  LogCapture capture(LogLevel::kWarn);
  test::ScopedEnv env("MEGAMOE_LOG_LEVEL", "debug");
  FreshLevel fresh;
  EXPECT_TRUE(logEnabled(LogLevel::kDebug));
  EXPECT_EQ(logLevel(), LogLevel::kDebug);
  EXPECT_TRUE(capture.lines().empty()) << capture.dump();
}

TEST(LogEnv, SetLogLevelWinsOverTheVariable) {
  test::ScopedEnv env("MEGAMOE_LOG_LEVEL", "debug");
  FreshLevel fresh;
  setLogLevel(LogLevel::kError);
  EXPECT_EQ(logLevel(), LogLevel::kError);
}

TEST(LogEnv, ABadVariableLogsAtWarnOnceAndSaysWhy) {
  LogCapture capture(LogLevel::kWarn);
  test::ScopedEnv env("MEGAMOE_LOG_LEVEL", "loud");
  FreshLevel fresh;
  EXPECT_EQ(logLevel(), LogLevel::kWarn);
  EXPECT_EQ(logLevel(), LogLevel::kWarn);
  const auto lines = capture.lines();
  ASSERT_EQ(lines.size(), 1u) << capture.dump();
  EXPECT_EQ(lines[0].level, LogLevel::kWarn);
  EXPECT_NE(lines[0].text.find("MEGAMOE_LOG_LEVEL='loud' is invalid"), std::string::npos) << lines[0].text;
  EXPECT_NE(lines[0].text.find("logging at warn"), std::string::npos) << lines[0].text;
}

// ---- what the kernel loader says

cache::KernelKey swigluKey() {
  cache::KernelKey key;
  key.kernel = "swiglu_fwd";
  key.spec = {{"I", 2048}, {"clamp", 0}};
  key.target = "gfx950";
  key.options = "waves=8";
  return key;
}

const std::string kMetadata = R"({"symbol":"swiglu_fwd_kernel","block_threads":256,"shared_bytes":0)" +
                              test::signatureMembers("swiglu_fwd") + "}";

struct JitGuard {
  ~JitGuard() { KernelLoader::setJitCompiler(nullptr); }
};

class LoaderLog : public ::testing::Test {
 protected:
  void SetUp() override { device = openBackend(BackendKind::kHip, test::FakeHip::path())->device(0); }
  test::TempDir dir;
  std::shared_ptr<Device> device;
  cache::CacheEntry store(const std::string& metadata = kMetadata) {
    cache::KernelKey stored = swigluKey();
    stored.fingerprint = test::ourFingerprint("fp");
    return cache::KernelCache(dir.path()).store(stored, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), metadata);
  }
};

TEST_F(LoaderLog, MissThenHitSayWhichKernelDigestAndCache) {
  LogCapture capture(LogLevel::kDebug);
  KernelLoader loader(dir.path());
  const std::string name = swigluKey().describe();
  EXPECT_THROW(loader.load(device, swigluKey(), "hint"), Error);
  const std::string miss = capture.find(LogLevel::kInfo, {"kernel cache miss: "});
  EXPECT_EQ(miss, "kernel cache miss: " + name + " lookup digest " + swigluKey().lookupDigest() + " in " + dir.path() +
                      "; no JIT compiler is linked in")
      << capture.dump();

  const cache::CacheEntry entry = store();
  loader.load(device, swigluKey(), "hint");
  EXPECT_EQ(capture.find(LogLevel::kInfo, {"kernel cache hit: "}),
            "kernel cache hit: " + name + " digest " + entry.key.digest() + " (fingerprint " + entry.key.fingerprint + ") in " + dir.path())
      << capture.dump();
  EXPECT_NE(capture.find(LogLevel::kDebug, {"loaded module of " + name, entry.key.digest(), "symbol swiglu_fwd_kernel",
                                            "on hip:0"}),
            "")
      << capture.dump();
  loader.load(device, swigluKey(), "hint");
  EXPECT_NE(capture.find(LogLevel::kDebug, {"module of " + name, "already loaded on hip:0"}), "") << capture.dump();
}

TEST_F(LoaderLog, AtWarnTheLoaderBuildsNoLine) {
  LogCapture capture(LogLevel::kWarn);
  store();
  KernelLoader loader(dir.path());
  loader.load(device, swigluKey(), "hint");
  EXPECT_TRUE(capture.lines().empty()) << capture.dump();
}

TEST_F(LoaderLog, JitMissSaysHowLongItTook) {
  JitGuard guard;
  LogCapture capture(LogLevel::kInfo);
  KernelLoader::setJitCompiler([&](const cache::KernelKey& key) -> std::optional<cache::CacheEntry> {
    cache::KernelKey withFingerprint = key;
    withFingerprint.fingerprint = test::ourFingerprint("jit");
    return cache::KernelCache(dir.path())
        .store(withFingerprint, test::fakeImage("FAKEHIP\nswiglu_fwd_kernel 2\n"), kMetadata);
  });
  KernelLoader loader(dir.path());
  auto kernel = loader.load(device, swigluKey(), "hint");
  const std::string name = swigluKey().describe();
  EXPECT_NE(capture.find(LogLevel::kInfo, {"kernel cache miss: " + name, "; building it with the JIT"}), "")
      << capture.dump();
  const std::string built =
      capture.find(LogLevel::kInfo, {"JIT built " + name + " digest " + kernel->digest() + " in "});
  EXPECT_NE(built, "") << capture.dump();
  EXPECT_NE(built.find(" ms (stored in " + dir.path() + ")"), std::string::npos) << built;
}

TEST_F(LoaderLog, InvalidEntryIsAWarning) {
  const cache::CacheEntry entry = store();
  std::ofstream(entry.dir + "/code.bin", std::ios::binary | std::ios::trunc) << "garbage";
  LogCapture capture(LogLevel::kWarn);
  KernelLoader loader(dir.path());
  EXPECT_THROW(loader.load(device, swigluKey(), "hint"), Error);
  EXPECT_NE(capture.find(LogLevel::kWarn, {"kernel cache: invalid entry " + entry.dir, "code.bin", "removing it"}), "")
      << capture.dump();
}

TEST_F(LoaderLog, StaleEntryIsAWarning) {
  store(R"({"symbol":"swiglu_fwd_kernel","block_threads":256,"shared_bytes":0})");  // no signature recorded
  LogCapture capture(LogLevel::kWarn);
  KernelLoader loader(dir.path());
  try {
    loader.load(device, swigluKey(), "hint");
    FAIL() << "a stale entry loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kStaleKernel);
    EXPECT_EQ(capture.find(LogLevel::kWarn, {"kernel cache: stale entry: "}),
              std::string("kernel cache: stale entry: ") + e.what())
        << capture.dump();
  }
}

TEST_F(LoaderLog, BadMetadataIsAWarning) {
  store(R"({"block_threads":256})");
  LogCapture capture(LogLevel::kWarn);
  KernelLoader loader(dir.path());
  EXPECT_THROW(loader.load(device, swigluKey(), "hint"), Error);
  EXPECT_NE(capture.find(LogLevel::kWarn, {"kernel cache: invalid metadata: cache entry "}), "") << capture.dump();
}

// A log sink may load kernels itself: the loader logs with its lock released.
TEST_F(LoaderLog, SinkThatLoadsAKernelDoesNotDeadlock) {
  store();
  KernelLoader loader(dir.path());
  LogCapture capture(LogLevel::kDebug);
  bool nested = false;
  setLogSink([&](LogLevel, const std::string& text) {
    if (!nested && text.rfind("loaded module of", 0) == 0) {
      nested = true;
      loader.load(device, swigluKey(), "hint");
    }
  });
  loader.load(device, swigluKey(), "hint");
  EXPECT_TRUE(nested);
}

// ---- the heap

RuntimeEnv fakeEnv() {
  RuntimeEnv env = parseEnv();
  env.hipLibrary = test::FakeHip::path();
  env.waitTimeoutMs = 2500;
  env.rendezvousTimeoutS = 10;
  return env;
}

std::shared_ptr<Device> fakeDevice(int ordinal) {
  return openBackend(BackendKind::kHip, test::FakeHip::path())->device(ordinal);
}

TEST(HeapLog, SizesAndModeAreInfoAndDeviceErrorsAreErrors) {
  LogCapture capture(LogLevel::kDebug);
  auto heaps = SymmetricHeap::createSingleProcess({fakeDevice(0), fakeDevice(1)}, {{"pool", 1 << 20, 128}}, fakeEnv());
  const uint64_t bytes = heaps[0]->layout().totalBytes();
  EXPECT_EQ(capture.find(LogLevel::kInfo, {"symmetric heap: "}),
            "symmetric heap: single process (mode A), 2 ranks on hip devices 0,1: " + std::to_string(bytes) +
                " bytes (1.00 MiB) per rank, 3 regions, device wait timeout 2500 ms")
      << capture.dump();
  EXPECT_NE(capture.find(LogLevel::kDebug, {"symmetric heap regions: megamoe.context@0+", "pool@"}), "")
      << capture.dump();

  auto single = SymmetricHeap::createMultiProcess(fakeDevice(2), {{"pool", 4096, 128}}, 0, 1, "", fakeEnv());
  EXPECT_NE(
      capture.find(LogLevel::kInfo, {"symmetric heap: rank 0 of 1, one process per GPU (mode B), hip device 2: "}), "")
      << capture.dump();

  const abi::DeviceError e{static_cast<uint64_t>(abi::ErrorCode::kWaitTimeout), 1, 7, 3, 4, 12};
  heaps[1]->device().copyHostToDevice(heaps[1]->errorAddress(), &e, sizeof e);
  EXPECT_THROW(heaps[1]->checkErrors(), Error);
  EXPECT_EQ(capture.find(LogLevel::kError, {}),
            "device error: rank 1: cross-rank wait timed out on flag 7 (seen 3, expected 4) in block 12; the "
            "symmetric heap is now marked unusable")
      << capture.dump();
  EXPECT_THROW(heaps[1]->checkErrors(), Error);  // unusable: refused, not logged again
  int errors = 0;
  for (const auto& l : capture.lines()) errors += l.level == LogLevel::kError;
  EXPECT_EQ(errors, 1) << capture.dump();
}

// ---- the rendezvous

int connectTo(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A rank in a child process, logging at info into a capture; reports what it logged.
std::unique_ptr<test::Child> loggingRank(const std::string& path, int rank, int nranks) {
  return std::make_unique<test::Child>([=] {
    LogCapture capture(LogLevel::kDebug);
    RendezvousOptions o;
    o.path = path;
    o.rank = rank;
    o.nranks = nranks;
    o.layoutHash = 9;
    o.timeoutS = 10;
    Rendezvous rv(o, std::vector<uint8_t>(static_cast<size_t>(rank) + 1, 7));
    rv.barrier("log test");
    return capture.dump();
  });
}

TEST(RendezvousLog, ProgressIsInfoAndStrangersAreWarnings) {
  test::TempDir dir;
  const std::string path = dir.file("rv.sock");
  auto rank0 = loggingRank(path, 0, 3);
  // A stranger: 48 bytes that are no hello, once rank 0 listens (connect succeeds only then).
  int stranger = -1;
  for (int i = 0; i < 500 && stranger < 0; ++i) {
    stranger = connectTo(path);
    if (stranger < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GE(stranger, 0) << "rank 0 never listened";
  const std::vector<uint8_t> noise(100, 0x5a);
  ASSERT_EQ(::send(stranger, noise.data(), noise.size(), MSG_NOSIGNAL), ssize_t(noise.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 reads it before the real ranks come
  auto rank1 = loggingRank(path, 1, 3);
  auto rank2 = loggingRank(path, 2, 3);
  const test::ChildOutcome o0 = rank0->wait(30), o1 = rank1->wait(30), o2 = rank2->wait(30);
  ::close(stranger);
  ASSERT_TRUE(o0.finished && o0.ok) << o0.text;
  ASSERT_TRUE(o1.finished && o1.ok) << o1.text;
  ASSERT_TRUE(o2.finished && o2.ok) << o2.text;

  const std::string at = "rendezvous at " + path + ": ";
  const std::string& zero = o0.text;
  EXPECT_NE(zero.find("[info] " + at + "rank 0 waiting for 2 ranks to join within 10 s\n"), std::string::npos) << zero;
  EXPECT_NE(zero.find("[warn] " + at + "rank 0 dropped 48 bytes that are not a megamoe hello (pid "), std::string::npos)
      << zero;
  EXPECT_NE(zero.find("[info] " + at + "rank 1 joined (pid "), std::string::npos) << zero;
  EXPECT_NE(zero.find("[info] " + at + "rank 2 joined (pid "), std::string::npos) << zero;
  EXPECT_NE(zero.find(" of 2 after "), std::string::npos) << zero;
  EXPECT_NE(zero.find("[info] " + at + "all 3 ranks met; done in "), std::string::npos) << zero;
  EXPECT_NE(zero.find(" (1 stranger dropped)\n"), std::string::npos) << zero;
  EXPECT_NE(zero.find("[debug] " + at + "rank 0 passed log test in "), std::string::npos) << zero;

  const std::string& one = o1.text;
  EXPECT_NE(one.find("[info] " + at + "rank 1 waiting for rank 0 within 10 s\n"), std::string::npos) << one;
  EXPECT_NE(one.find("[info] " + at + "rank 1 joined rank 0 (pid "), std::string::npos) << one;
  EXPECT_NE(one.find("[info] " + at + "rank 1 received the payloads of all 3 ranks; done in "), std::string::npos)
      << one;
  EXPECT_NE(one.find("[debug] " + at + "rank 1 passed log test in "), std::string::npos) << one;
  EXPECT_EQ(one.find("[warn]"), std::string::npos) << one;
}

}  // namespace
}  // namespace megamoe
