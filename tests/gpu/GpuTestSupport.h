// Shared by every GPU-tier test: open the CUDA backend or skip with the reason (so that a machine without a GPU skips
// them all the same way), ranks placed on the visible GPUs (rank r on device r % deviceCount: ranks share a GPU when
// there are fewer GPUs than ranks), the rank counts the multi-rank tests run at, bf16 on the host, per-test seeds,
// kernels from the test cache (scripts/gen-gpu-test-cache.sh) and their launches with arguments by name, device fills
// and comparisons, a host parallel loop, and worker processes that re-execute the test binary.
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Backend.h"
#include "megamoe/Error.h"
#include "megamoe/KernelArgs.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"
#include "megamoe/env.h"

extern char** environ;

namespace megamoe::gputest {

// The CUDA backend with at least one device, or nullptr and why not.
inline std::shared_ptr<Backend> cudaBackendOrReason(std::string* reason) {
  try {
    auto backend = openBackend(BackendKind::kCuda);
    if (backend->deviceCount() > 0) return backend;
    *reason = "the driver reports 0 devices";
  } catch (const Error& e) {
    *reason = e.what();
  }
  return nullptr;
}

// ---- ranks on devices ----

// The rank counts every multi-rank test runs at (value-parameterised: Suite.Test/Ranks2, Suite.Test/Ranks8). 8 is a
// whole node (abi::kMaxRanks); on one GPU both run with the ranks sharing it.
inline const std::vector<int> kRankCounts = {2, 8};
inline std::string rankCountName(const ::testing::TestParamInfo<int>& info) {
  return "Ranks" + std::to_string(info.param);
}

// Rank r's device: its own GPU when there are enough, else ranks share them round-robin (the single-process heap
// then uses plain device pointers between ranks of one device, SymmetricHeap::createSingleProcess).
inline int rankOrdinal(int rank, int deviceCount) { return rank % deviceCount; }

// "" when every device ranks [0, ranks) run on is sm_90a (the test cache holds sm_90a code only), else which is not.
inline std::string deviceNotSm90a(Backend& backend, int ranks) {
  const int devices = backend.deviceCount();
  for (int ordinal = 0; ordinal < std::min(ranks, devices); ++ordinal)
    if (backend.device(ordinal)->target() != "sm_90a")
      return "the test cache holds sm_90a code; device " + std::to_string(ordinal) + " is " +
             backend.device(ordinal)->target();
  return "";
}

// "8 ranks on 1 GPU(s)" for the tests' summaries.
inline std::string placement(Backend& backend, int ranks) {
  return std::to_string(ranks) + " ranks on " + std::to_string(std::min(ranks, backend.deviceCount())) + " GPU(s)";
}

// The runtime's environment with MEGAMOE_WAIT_TIMEOUT_MS replaced (the failure tests bound the waits tightly).
inline RuntimeEnv envWithWaitTimeout(uint64_t milliseconds) {
  const std::string value = std::to_string(milliseconds);
  return parseEnv([&](const char* name) -> const char* {
    return std::strcmp(name, "MEGAMOE_WAIT_TIMEOUT_MS") == 0 ? value.c_str() : std::getenv(name);
  });
}

// Before the first CUDA context of the process: ranks sharing a GPU each have a stream whose kernels wait for the
// other ranks' kernels. The driver maps a context's streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues
// (default 8), and a queue starts its kernels in submission order: a waiting kernel of one rank queued ahead of the
// kernel it waits for (another rank's, on a stream sharing that queue) holds it back until the wait times out. 32
// (the most) keeps 8 ranks' streams and the runtime's own on separate queues. overwrite=0: a caller's value stays.
inline void initGpuTestProcess() { ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0); }

// ---- host parallelism ----

// body(i) for i in [0, n) over the host's cores (at most 32 threads), in no particular order.
inline void parallelFor(int64_t n, const std::function<void(int64_t)>& body) {
  const int64_t workers =
      std::min<int64_t>(n, std::clamp<int64_t>(int64_t(std::thread::hardware_concurrency()), 1, 32));
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w)
    threads.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) body(i);
    });
  for (auto& t : threads) t.join();
}

// ---- bf16 on the host ----

inline uint16_t toBf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float fromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// n draws from N(0, scale²), rounded to bf16.
inline std::vector<uint16_t> randomBf16(std::mt19937& rng, size_t n, float scale = 1.f) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<uint16_t> out(n);
  for (auto& v : out) v = toBf16(normal(rng));
  return out;
}

// ---- FP8 e4m3 on the host ----

// OCP E4M3FN: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 15 with mantissa 7 is NaN.
inline double fromE4m3(uint8_t code) {
  const int exp = (code >> 3) & 15, man = code & 7;
  const double magnitude = exp == 0 ? man / 8.0 * std::ldexp(1.0, -6) : (1 + man / 8.0) * std::ldexp(1.0, exp - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

// Random finite e4m3 codes (every byte but the NaNs 0x7F / 0xFF), eight from each 64-bit draw (the large shapes'
// weights are a billion codes).
inline std::vector<uint8_t> randomE4m3(std::mt19937& rng, size_t count) {
  std::mt19937_64 wide(rng());
  std::vector<uint8_t> out(count);
  for (size_t i = 0; i < count; i += 8) {
    uint64_t bits = wide();
    for (size_t j = i; j < std::min(count, i + 8); ++j, bits >>= 8) {
      const uint8_t v = uint8_t(bits);
      out[j] = (v & 0x7F) == 0x7F ? uint8_t(v ^ 1) : v;
    }
  }
  return out;
}
// The value of every e4m3 code.
inline const std::vector<double>& e4m3Values() {
  static const std::vector<double> table = [] {
    std::vector<double> t(256);
    for (int c = 0; c < 256; ++c) t[size_t(c)] = fromE4m3(uint8_t(c));
    return t;
  }();
  return table;
}

// The e4m3 code of a float: nearest value, ties to the even code, magnitudes past 448 saturated (the host half of
// python/megamoe/fp8.py float_to_e4m3).
inline uint8_t toE4m3(float v) {
  const std::vector<double>& value = e4m3Values();
  const double a = std::min(std::fabs(double(v)), 448.0);
  int best = 0;
  for (int c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(value[size_t(c)] - a), bd = std::fabs(value[size_t(best)] - a);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  return uint8_t(best | (std::signbit(v) ? 0x80 : 0));
}

inline uint64_t splitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// n draws uniform in [-scale * sqrt(3), scale * sqrt(3)) (variance scale²), rounded to bf16, generated in parallel:
// for the expert weights of the large shapes (billions of values, where randomBf16 would take minutes). Chunk c
// of 2^16 values comes from `seed` and c alone, so the values do not depend on the host's thread count.
inline std::vector<uint16_t> uniformBf16(uint64_t seed, size_t n, float scale) {
  constexpr size_t kChunk = size_t(1) << 16;
  std::vector<uint16_t> out(n);
  const double half = std::sqrt(3.0) * double(scale);
  parallelFor(int64_t((n + kChunk - 1) / kChunk), [&](int64_t c) {
    uint64_t state = seed ^ (uint64_t(c) * 0xd1b54a32d192ed03ull);
    const size_t end = std::min(n, size_t(c + 1) * kChunk);
    for (size_t i = size_t(c) * kChunk; i < end; ++i) {
      const double u = double(splitMix64(state) >> 11) * (1.0 / 9007199254740992.0);  // [0, 1) in 53 bits
      out[i] = toBf16(float((2 * u - 1) * half));
    }
  });
  return out;
}

// ---- seeds ----

// The run's seed: --seed=N, else fresh from std::random_device; set by initBaseSeed() in main().
inline uint64_t gBaseSeed = 0;

inline void initBaseSeed(int argc, char** argv) {
  gBaseSeed = (uint64_t(std::random_device{}()) << 32) | std::random_device{}();
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--seed=", 7) == 0) gBaseSeed = std::strtoull(argv[i] + 7, nullptr, 10);
}

inline std::mt19937 rngFrom(uint64_t seed) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  return std::mt19937(seq);
}

// The running test's seed, from the run's seed and the test's name, so that a test reproduces alone.
inline uint64_t testSeed() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string name = std::string(info->test_suite_name()) + "." + info->name();
  uint64_t seed = gBaseSeed;
  for (char c : name) seed = (seed ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  std::printf("seed %llu (reproduce: --seed=%llu --gtest_filter=%s)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(gBaseSeed), name.c_str());
  return seed;
}

// A generator for the running test (see testSeed).
inline std::mt19937 testRng() { return rngFrom(testSeed()); }

// ---- kernels from the test cache ----

// The generated entries the tests load (see scripts/gen-gpu-test-cache.sh).
constexpr const char* kTarget = "sm_90a";
constexpr const char* kTargetOptions = "target=sm_90a;O=3;ptx=80";

// "A=1,B=2", as megamoe-cache --spec takes it.
inline std::string specText(const std::vector<std::pair<std::string, int64_t>>& spec) {
  std::string text;
  for (const auto& [name, value] : spec) text += (text.empty() ? "" : ",") + name + "=" + std::to_string(value);
  return text;
}

// The generated sm_90a entry for `name` and `spec`, whatever compiler fingerprint made it.
inline std::shared_ptr<const Kernel> loadKernel(Runtime& runtime, const std::string& name,
                                                const std::vector<std::pair<std::string, int64_t>>& spec) {
  cache::KernelKey key{name, spec, kTarget, kTargetOptions, /*fingerprint: any*/ ""};
  const std::string hint = "scripts/gen-gpu-test-cache.sh DIR and MEGAMOE_CACHE_DIR=DIR (or: megamoe-cache generate "
                           "--kernel " + name + (spec.empty() ? "" : " --spec " + specText(spec)) +
                           " --targets " + kTarget + ")";
  return runtime.loadKernel(key, hint);
}

// ---- device helpers ----

// A 1-D launch of `kernel` with its own block size on `stream`, its arguments by name (`args` must be the kernel's
// declaration's), checked against `heap`'s usability.
inline void launch1d(Runtime& runtime, const Kernel& kernel, uint32_t grid, StreamHandle stream, KernelArgs& args,
                     const SymmetricHeap* heap) {
  LaunchDims dims;
  dims.grid.x = grid;
  dims.block.x = static_cast<uint32_t>(kernel.metadata().blockThreads);
  runtime.launch(kernel, dims, stream, args, heap);
}

// main() of every GPU test binary without worker modes: gtest plus the --seed option.
inline int runGpuTests(int argc, char** argv) {
  initGpuTestProcess();
  ::testing::InitGoogleTest(&argc, argv);
  initBaseSeed(argc, argv);
  return RUN_ALL_TESTS();
}

// cuMemcpyHtoD from pageable memory may return before its DMA has landed, and the tests' non-blocking streams do not
// wait for the legacy stream it runs on: wait for the device before a kernel reads what was uploaded.
inline void uploadAndWait(Device& device, DevicePtr dst, const void* src, size_t bytes) {
  device.copyHostToDevice(dst, src, bytes);
  device.synchronizeDevice();
}

// `count` elements of T from device memory.
template <typename T>
std::vector<T> readBack(Device& device, DevicePtr at, size_t count) {
  std::vector<T> out(count);
  if (count) device.copyDeviceToHost(out.data(), at, count * sizeof(T));
  return out;
}

// `count` elements of T at `at` set to `value`: a block uploaded once, then doubled by device-to-device copies (the
// large shapes' outputs are gigabytes), all on the legacy stream and waited for like uploadAndWait.
template <typename T>
void fillDevice(Device& device, DevicePtr at, size_t count, T value) {
  if (count == 0) return;
  const size_t first = std::min(count, (size_t(1) << 20) / sizeof(T));
  const std::vector<T> values(first, value);
  device.copyHostToDevice(at, values.data(), first * sizeof(T));
  for (size_t done = first; done < count;) {
    const size_t n = std::min(done, count - done);
    device.copyDeviceToDevice(at + done * sizeof(T), at, n * sizeof(T));
    done += n;
  }
  device.synchronizeDevice();
}

// Elements of T that differ between `count` at `a` and at `b` (same device), read back in chunks of 64 MiB.
template <typename T>
size_t countDifferingOnDevice(Device& device, DevicePtr a, DevicePtr b, size_t count) {
  const size_t chunk = (size_t(64) << 20) / sizeof(T);
  std::vector<T> x(std::min(count, chunk)), y(x.size());
  size_t differing = 0;
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    device.copyDeviceToHost(x.data(), a + at * sizeof(T), n * sizeof(T));
    device.copyDeviceToHost(y.data(), b + at * sizeof(T), n * sizeof(T));
    for (size_t i = 0; i < n; ++i) differing += x[i] != y[i];
  }
  return differing;
}

// The epoch the device has advanced the heap's context to.
inline uint64_t readEpoch(const SymmetricHeap& heap) {
  return readBack<uint64_t>(heap.device(), heap.contextAddress() + offsetof(abi::DeviceContext, epoch), 1)[0];
}

inline float medianMs(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// ---- worker processes: this binary re-executed ----

// How one worker ended.
struct WorkerExit {
  bool hung = false;  // still running at the deadline, and killed
  int status = 0;     // its waitpid status otherwise
  bool succeeded() const { return !hung && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
};

// Starts this binary once per entry of `workerArgs` (the arguments after argv[0]) by posix_spawn of /proc/self/exe:
// fork+exec, since a process that has initialised CUDA must not use it in a plain fork()ed child. Then waits for
// them in order until `timeout` from the last start, polling every `poll`, and kills those still running; `exits`
// gets one entry per worker. Returns false, having failed the test, when a worker cannot be started (the ones
// already started are killed).
inline bool runSelfWorkers(const std::vector<std::vector<std::string>>& workerArgs, std::chrono::seconds timeout,
                           std::chrono::milliseconds poll, std::vector<WorkerExit>* exits) {
  exits->clear();
  std::vector<pid_t> pids;
  std::fflush(stdout);  // our lines before the workers'
  for (const auto& args : workerArgs) {
    std::vector<std::string> all = {"/proc/self/exe"};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& arg : all) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int err = ::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ);
    if (err != 0) {
      ADD_FAILURE() << "cannot start worker " << pids.size() << ": posix_spawn: " << std::strerror(err);
      for (pid_t started : pids) {
        ::kill(started, SIGKILL);
        ::waitpid(started, nullptr, 0);
      }
      return false;
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (pid_t pid : pids) {
    WorkerExit exit;
    pid_t done = 0;
    while ((done = ::waitpid(pid, &exit.status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(poll);
    if (done == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &exit.status, 0);
      exit.hung = true;
    }
    exits->push_back(exit);
  }
  return true;
}

}  // namespace megamoe::gputest

// Declares `backend` (std::shared_ptr<megamoe::Backend>) or skips the test.
#define MEGAMOE_REQUIRE_CUDA(backend)                                            \
  std::string megamoe_skip_reason_;                                              \
  auto backend = ::megamoe::gputest::cudaBackendOrReason(&megamoe_skip_reason_); \
  if (!backend) GTEST_SKIP() << "no CUDA device: " << megamoe_skip_reason_

// Declares `backend` or skips the test: without a CUDA device, or when a device that one of `ranks` ranks runs on
// (rank r on device r % deviceCount) is not sm_90a. Never for too few GPUs: the ranks share the GPUs there are.
#define MEGAMOE_REQUIRE_SM90A_RANKS(backend, ranks)                                                      \
  MEGAMOE_REQUIRE_CUDA(backend);                                                                         \
  if (const std::string megamoe_not_sm90a_ = ::megamoe::gputest::deviceNotSm90a(*backend, (ranks));      \
      !megamoe_not_sm90a_.empty())                                                                       \
  GTEST_SKIP() << megamoe_not_sm90a_
