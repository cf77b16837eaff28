// GPU tier for the communication kernels over the symmetric heap, on two GPUs: ping_pong and a2a_rows in mode A
// (one process drives both GPUs) and mode B (one process per GPU, re-executing this binary), epochs across calls
// and across 10,000 CUDA-graph replays, a bounded wait that times out into a device error, and peer-store bandwidth
// against the copy engine. Skips, saying why, without two CUDA devices.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "GpuTestSupport.h"
#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Rendezvous.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {
namespace {

using namespace gputest;

constexpr int kRanks = 2;
// Shapes of the specs in kernels/Kernels.h (not included: it pulls in MLIR) and of this test.
constexpr int64_t kRounds = 64, kGraphRounds = 2;
constexpr int64_t kA2aHidden = 7168, kA2aRows = 256, kA2aBlocksPerPeer = 16;
constexpr int kCalls = 3;
constexpr uint16_t kSentinel = 0xFFFF;  // bf16 NaN: never drawn from a normal distribution

std::string hex16(uint16_t v) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%04x", v);
  return text;
}

// ---- one rank: its runtime (device), heap, stream and kernels; the launches of the comm kernels ----

struct Rank {
  std::unique_ptr<Runtime> runtime;
  SymmetricHeap* heap = nullptr;  // mode A: owned by the test's vector; mode B: by `ownHeap`
  std::unique_ptr<SymmetricHeap> ownHeap;
  StreamHandle stream = nullptr;
  std::shared_ptr<const Kernel> pingPong, epochAdvance, a2a, peerStore;

  Device& device() const { return *runtime->device(); }
  ~Rank() {
    if (stream) {
      try {
        runtime->device()->destroyStream(stream);
      } catch (...) {
      }
    }
  }

  void launch(const Kernel& kernel, uint32_t grid, void** params) {
    gputest::launch1d(*runtime, kernel, grid, stream, params, heap);
  }
  // ping_pong(ctx, flag, log) on the "flag" and "log" regions.
  void launchPingPong() {
    uint64_t ctx = heap->contextAddress(), flag = heap->regionAddress("flag"), log = heap->regionAddress("log");
    void* params[] = {&ctx, &flag, &log};
    launch(*pingPong, 1, params);
  }
  void launchEpochAdvance() {
    uint64_t ctx = heap->contextAddress();
    void* params[] = {&ctx};
    launch(*epochAdvance, 1, params);
  }
  // a2a_rows(ctx, send, recv, flags, rows): one block group of kA2aBlocksPerPeer per peer.
  void launchA2a(DevicePtr send) {
    uint64_t ctx = heap->contextAddress(), sendArg = send, recv = heap->regionAddress("recv"),
             flags = heap->regionAddress("flags");
    int32_t rows = static_cast<int32_t>(kA2aRows);
    void* params[] = {&ctx, &sendArg, &recv, &flags, &rows};
    launch(*a2a, static_cast<uint32_t>(heap->nranks() * kA2aBlocksPerPeer), params);
  }

  uint64_t readEpoch() const { return gputest::readEpoch(*heap); }
  std::vector<int64_t> readI64(const std::string& region, size_t count) const {
    std::vector<int64_t> out(count);
    device().copyDeviceToHost(out.data(), heap->regionAddress(region), count * sizeof(int64_t));
    return out;
  }
};

void openRank(Rank& rank, int ordinal, const RuntimeEnv& env) {
  rank.runtime = std::make_unique<Runtime>(BackendKind::kCuda, ordinal, env);
  rank.stream = rank.device().createStream();
}

void loadCommKernels(Rank& rank, int64_t rounds) {
  rank.pingPong = loadKernel(*rank.runtime, "ping_pong", {{"rounds", rounds}});
  rank.epochAdvance = loadKernel(*rank.runtime, "epoch_advance", {});
}
void loadA2a(Rank& rank) { rank.a2a = loadKernel(*rank.runtime, "a2a_rows", {{"H", kA2aHidden}}); }

std::vector<RegionSpec> pingPongRegions(int64_t rounds) {
  return {{"flag", 8, 256}, {"log", uint64_t(rounds) * 8, 256}};
}
std::vector<RegionSpec> a2aRegions(int nranks) {
  return {{"recv", uint64_t(nranks * kA2aRows * kA2aHidden) * 2, 256}, {"flags", uint64_t(nranks) * 8, 256}};
}

// Ping-pong postconditions on `rank` after the call at `epoch`: the peer's rounds hold epoch * rounds + i + 1, our
// own rounds' slots were never written (they went to the peer), and the flag holds the peer's last value.
// "" when they hold, else what differs.
std::string checkPingPong(const Rank& rank, uint64_t epoch, int64_t rounds) {
  const int me = rank.heap->rank(), peer = 1 - me;
  const std::vector<int64_t> log = rank.readI64("log", size_t(rounds));
  const int64_t flag = rank.readI64("flag", 1)[0];
  std::string why;
  int64_t lastFromPeer = 0;
  for (int64_t i = 0; i < rounds; ++i) {
    const int64_t expected = i % 2 == peer ? int64_t(epoch) * rounds + i + 1 : 0;
    if (i % 2 == peer) lastFromPeer = expected;
    if (log[size_t(i)] != expected && why.size() < 400)
      why += " log[" + std::to_string(i) + "]=" + std::to_string(log[size_t(i)]) + " (expected " +
             std::to_string(expected) + ")";
  }
  if (flag != lastFromPeer)
    why += " flag=" + std::to_string(flag) + " (expected " + std::to_string(lastFromPeer) + ")";
  return why.empty() ? "" : "rank " + std::to_string(me) + " after the call at epoch " + std::to_string(epoch) + ":" + why;
}

// What rank `src` sends in call `call`: [nranks][rows][H] random normal bf16, the same on every process.
std::vector<uint16_t> a2aSendData(uint64_t seed, int call, int src, int nranks) {
  std::mt19937 rng = rngFrom(seed + 1000003ull * uint64_t(call) + uint64_t(src));
  return randomBf16(rng, size_t(nranks * kA2aRows * kA2aHidden));
}

// recv on `rank` after a call: slab [src] must equal what src put in send[rank], bit for bit; flags[src] must be
// (epoch + 1) * blocks. "" when they hold; `mismatches` counts differing elements.
std::string checkA2a(const Rank& rank, uint64_t seed, int call, uint64_t epoch, size_t* mismatches) {
  const int me = rank.heap->rank(), nranks = rank.heap->nranks();
  const size_t slab = size_t(kA2aRows * kA2aHidden);
  std::vector<uint16_t> recv(nranks * slab);
  rank.device().copyDeviceToHost(recv.data(), rank.heap->regionAddress("recv"), recv.size() * 2);
  const std::vector<int64_t> flags = rank.readI64("flags", size_t(nranks));
  std::string why;
  *mismatches = 0;
  for (int src = 0; src < nranks; ++src) {
    const std::vector<uint16_t> sent = a2aSendData(seed, call, src, nranks);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < slab; ++i)
      if (recv[src * slab + i] != sent[me * slab + i] && bad++ == 0) first = i;
    *mismatches += bad;
    if (bad)
      why += " recv[" + std::to_string(src) + "]: " + std::to_string(bad) + " elements differ, first at " +
             std::to_string(first) + " (got " + hex16(recv[src * slab + first]) + ", sent " +
             hex16(sent[me * slab + first]) + ")";
    const int64_t expectedFlag = int64_t(epoch + 1) * kA2aBlocksPerPeer;
    if (flags[size_t(src)] != expectedFlag)
      why += " flags[" + std::to_string(src) + "]=" + std::to_string(flags[size_t(src)]) + " (expected " +
             std::to_string(expectedFlag) + ")";
  }
  return why.empty() ? "" : "rank " + std::to_string(me) + " call " + std::to_string(call) + ":" + why;
}

void poisonRecv(const Rank& rank) {
  const std::vector<uint16_t> sentinel(size_t(rank.heap->nranks() * kA2aRows * kA2aHidden), kSentinel);
  uploadAndWait(rank.device(), rank.heap->regionAddress("recv"), sentinel.data(), sentinel.size() * 2);
}

// ---- mode A: both ranks in this process ----

struct ModeA {
  std::vector<std::unique_ptr<SymmetricHeap>> heaps;
  Rank ranks[kRanks];
};

// Opens devices 0 and 1 and a heap over them with `regions`; loads the comm kernels.
void openModeA(ModeA& a, const std::vector<RegionSpec>& regions, const RuntimeEnv& env, int64_t rounds) {
  for (int r = 0; r < kRanks; ++r) openRank(a.ranks[r], r, env);
  a.heaps = SymmetricHeap::createSingleProcess({a.ranks[0].runtime->device(), a.ranks[1].runtime->device()},
                                               regions, env);
  for (int r = 0; r < kRanks; ++r) {
    a.ranks[r].heap = a.heaps[size_t(r)].get();
    loadCommKernels(a.ranks[r], rounds);
  }
}

#define MEGAMOE_REQUIRE_TWO_SM90A_GPUS()                                                                      \
  MEGAMOE_REQUIRE_CUDA(backend_);                                                                             \
  if (backend_->deviceCount() < kRanks)                                                                       \
    GTEST_SKIP() << "needs " << kRanks << " GPUs, " << backend_->deviceCount() << " visible";                \
  for (int ordinal = 0; ordinal < kRanks; ++ordinal)                                                          \
    if (backend_->device(ordinal)->target() != kTarget)                                                       \
      GTEST_SKIP() << "the test cache holds sm_90a code; device " << ordinal << " is "                        \
                   << backend_->device(ordinal)->target()

// ---- mode B: this binary re-executed once per rank ----

constexpr const char* kWorkerFlag = "--comm-worker";

// Runs `test` ("ping_pong" | "a2a") as rank `rank` of kRanks: device `rank`, heap over IPC through `path`, a
// second rendezvous at `path`.sync for the host barriers between calls. Returns the process exit status.
int runWorker(const std::string& test, int rank, const std::string& path, uint64_t seed) {
  try {
    const RuntimeEnv env = parseEnv();
    Rank self;
    openRank(self, rank, env);
    self.ownHeap = self.runtime->createHeap(test == "a2a" ? a2aRegions(kRanks) : pingPongRegions(kRounds), rank,
                                            kRanks, path);
    self.heap = self.ownHeap.get();
    loadCommKernels(self, kRounds);
    if (test == "a2a") loadA2a(self);
    // Host barriers: a peer must not write call c + 1's data into our heap before we have read call c's.
    Rendezvous sync({path + ".sync", rank, kRanks, 0, env.rendezvousTimeoutS}, {});
    DevicePtr send = 0;
    if (test == "a2a") send = self.device().allocate(size_t(kRanks * kA2aRows * kA2aHidden) * 2);
    std::string failure;
    for (int call = 0; call < kCalls && failure.empty(); ++call) {
      const uint64_t epoch = self.readEpoch();
      if (epoch != uint64_t(call)) failure = "epoch " + std::to_string(epoch) + " before call " + std::to_string(call);
      size_t mismatches = 0;
      if (test == "a2a") {
        const std::vector<uint16_t> data = a2aSendData(seed, call, rank, kRanks);
        uploadAndWait(self.device(), send, data.data(), data.size() * 2);
        poisonRecv(self);
        sync.barrier("a2a call " + std::to_string(call) + ": recv poisoned");
        self.launchA2a(send);
      } else {
        self.launchPingPong();
      }
      self.launchEpochAdvance();
      self.heap->checkErrors(self.stream);
      if (failure.empty())
        failure = test == "a2a" ? checkA2a(self, seed, call, epoch, &mismatches) : checkPingPong(self, epoch, kRounds);
      if (failure.empty() && self.readEpoch() != epoch + 1) failure = "the epoch did not advance";
      std::printf("mode B rank %d %s call %d at epoch %llu: %s\n", rank, test.c_str(), call,
                  static_cast<unsigned long long>(epoch), failure.empty() ? "ok" : failure.c_str());
      sync.barrier(test + " call " + std::to_string(call) + ": checked");
    }
    if (send) self.device().free(send);
    if (!failure.empty()) {
      sync.abandon(failure);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mode B rank %d %s: %s\n", rank, test.c_str(), e.what());
    return 1;
  }
}

// Spawns kRanks workers for `test` and waits for them (bounded); fails the test for a worker that fails or hangs.
void runModeB(const std::string& test, uint64_t seed) {
  const std::string path = "/tmp/megamoe-comm-" + std::to_string(::getpid()) + "-" + test + ".sock";
  std::vector<std::vector<std::string>> workers;
  for (int r = 0; r < kRanks; ++r)
    workers.push_back({kWorkerFlag, test, std::to_string(r), path, std::to_string(seed)});
  std::vector<WorkerExit> exits;
  if (!runSelfWorkers(workers, std::chrono::seconds(180), std::chrono::milliseconds(20), &exits)) return;
  int failed = 0;
  for (size_t r = 0; r < exits.size(); ++r) {
    if (exits[r].hung) ADD_FAILURE() << "mode B rank " << r << " hung";
    else EXPECT_TRUE(exits[r].succeeded()) << "mode B rank " << r << " failed (see its output above)";
    failed += !exits[r].succeeded();
  }
  std::printf("SUMMARY %s mode B: %d ranks x %d calls, %s\n", test.c_str(), kRanks, kCalls,
              failed ? "FAILED" : "every check held on every rank");
}

// ---------------------------------------------------------------------------------------------------- tests

TEST(GpuComm, PingPongModeA) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  ModeA a;
  openModeA(a, pingPongRegions(kRounds), parseEnv(), kRounds);
  std::string values;
  for (int call = 0; call < kCalls; ++call) {
    const uint64_t epoch = a.ranks[0].readEpoch();
    ASSERT_EQ(epoch, uint64_t(call));
    ASSERT_EQ(a.ranks[1].readEpoch(), uint64_t(call));
    // Both ranks launched before either is synchronised: each kernel needs the other running.
    for (Rank& rank : a.ranks) rank.launchPingPong();
    for (Rank& rank : a.ranks) rank.launchEpochAdvance();
    for (Rank& rank : a.ranks) rank.heap->checkErrors(rank.stream);
    for (Rank& rank : a.ranks) {
      EXPECT_EQ(checkPingPong(rank, epoch, kRounds), "");
      EXPECT_EQ(rank.readEpoch(), epoch + 1);
    }
    values += " call" + std::to_string(call) + ":rank0.log[63]=" + std::to_string(a.ranks[0].readI64("log", 64)[63]) +
              ",rank1.log[62]=" + std::to_string(a.ranks[1].readI64("log", 64)[62]);
  }
  std::printf("SUMMARY ping_pong mode A rounds=%lld calls=%d:%s epochs=%llu,%llu\n", (long long)kRounds, kCalls,
              values.c_str(), (unsigned long long)a.ranks[0].readEpoch(), (unsigned long long)a.ranks[1].readEpoch());
}

TEST(GpuComm, PingPongModeB) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  runModeB("ping_pong", testSeed());
}

TEST(GpuComm, AllToAllRowsModeA) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  const uint64_t seed = testSeed();
  ModeA a;
  openModeA(a, a2aRegions(kRanks), parseEnv(), kRounds);
  for (Rank& rank : a.ranks) loadA2a(rank);
  DevicePtr send[kRanks];
  for (int r = 0; r < kRanks; ++r) send[r] = a.ranks[r].device().allocate(size_t(kRanks * kA2aRows * kA2aHidden) * 2);
  size_t total = 0;
  for (int call = 0; call < kCalls; ++call) {
    const uint64_t epoch = a.ranks[0].readEpoch();
    ASSERT_EQ(epoch, uint64_t(call));
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<uint16_t> data = a2aSendData(seed, call, r, kRanks);  // fresh data every call
      uploadAndWait(a.ranks[r].device(), send[r], data.data(), data.size() * 2);
      poisonRecv(a.ranks[r]);
    }
    for (int r = 0; r < kRanks; ++r) a.ranks[r].launchA2a(send[r]);
    for (Rank& rank : a.ranks) rank.launchEpochAdvance();
    for (Rank& rank : a.ranks) rank.heap->checkErrors(rank.stream);
    for (Rank& rank : a.ranks) {
      size_t mismatches = 0;
      EXPECT_EQ(checkA2a(rank, seed, call, epoch, &mismatches), "");
      total += mismatches;
      EXPECT_EQ(rank.readEpoch(), epoch + 1);
    }
  }
  for (int r = 0; r < kRanks; ++r) a.ranks[r].device().free(send[r]);
  std::printf("SUMMARY a2a_rows mode A H=%lld rows=%lld ranks=%d calls=%d: mismatched_elements=%zu of %lld\n",
              (long long)kA2aHidden, (long long)kA2aRows, kRanks, kCalls, total,
              (long long)(kCalls * kRanks * kRanks * kA2aRows * kA2aHidden));
}

TEST(GpuComm, AllToAllRowsModeB) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  runModeB("a2a", testSeed());
}

// Each GPU captures one call [ping_pong rounds=2, epoch_advance] into a graph; the host then replays the two graphs
// alternately 10,000 times without synchronising. Epochs alone keep the calls apart.
TEST(GpuComm, GraphReplayAdvancesEpochs) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  constexpr int kReplays = 10000;
  ModeA a;
  openModeA(a, pingPongRegions(kGraphRounds), parseEnv(), kGraphRounds);
  const uint64_t epoch0 = a.ranks[0].readEpoch();
  ASSERT_EQ(a.ranks[1].readEpoch(), epoch0);
  GraphHandle graphs[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    Rank& rank = a.ranks[r];
    rank.device().beginCapture(rank.stream);
    rank.launchPingPong();
    rank.launchEpochAdvance();
    graphs[r] = rank.device().endCapture(rank.stream);
  }
  // Capture ran nothing.
  EXPECT_EQ(a.ranks[0].readEpoch(), epoch0);
  EXPECT_EQ(a.ranks[0].readI64("flag", 1)[0], 0);

  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kReplays; ++i)
    for (int r = 0; r < kRanks; ++r) a.ranks[r].device().launchGraph(graphs[r], a.ranks[r].stream);
  const auto enqueued = std::chrono::steady_clock::now();
  for (Rank& rank : a.ranks) rank.heap->checkErrors(rank.stream);
  const auto end = std::chrono::steady_clock::now();

  // The last replay ran at epoch epoch0 + kReplays - 1: rank 0 sent round 0, rank 1 round 1.
  const uint64_t last = epoch0 + kReplays - 1;
  uint64_t epochs[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    epochs[r] = a.ranks[r].readEpoch();
    EXPECT_EQ(epochs[r], epoch0 + kReplays) << "rank " << r;
    EXPECT_EQ(checkPingPong(a.ranks[r], last, kGraphRounds), "");
  }
  for (int r = 0; r < kRanks; ++r) a.ranks[r].device().destroyGraph(graphs[r]);
  const double wallMs = std::chrono::duration<double, std::milli>(end - start).count();
  const double enqueueMs = std::chrono::duration<double, std::milli>(enqueued - start).count();
  std::printf("SUMMARY graph replay ping_pong(rounds=2)+epoch_advance x %d per GPU: epochs=%llu,%llu (start %llu) "
              "rank0.flag=%lld rank1.flag=%lld wall_ms=%.1f enqueue_ms=%.1f us_per_call=%.2f\n",
              kReplays, (unsigned long long)epochs[0], (unsigned long long)epochs[1], (unsigned long long)epoch0,
              (long long)a.ranks[0].readI64("flag", 1)[0], (long long)a.ranks[1].readI64("flag", 1)[0], wallMs,
              enqueueMs, wallMs * 1e3 / kReplays);
}

// Only rank 1 runs ping_pong; its first wait (round 0, sent by the absent rank 0) must time out into a device error
// naming rank 1 and the flag of peer 0, well within the timeout plus 2 s, after which the heap refuses launches.
TEST(GpuComm, WaitTimeoutBecomesDeviceError) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  constexpr uint64_t kTimeoutMs = 300;
  const RuntimeEnv env = parseEnv([](const char* name) -> const char* {
    return std::strcmp(name, "MEGAMOE_WAIT_TIMEOUT_MS") == 0 ? "300" : std::getenv(name);
  });
  ASSERT_EQ(env.waitTimeoutMs, kTimeoutMs);
  ModeA a;
  openModeA(a, pingPongRegions(kRounds), env, kRounds);
  Rank& waiter = a.ranks[1];

  const auto start = std::chrono::steady_clock::now();
  waiter.launchPingPong();
  std::string message;
  ErrorCode code = ErrorCode::kOk;
  try {
    waiter.heap->checkErrors(waiter.stream);
  } catch (const Error& e) {
    message = e.what();
    code = e.code();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(code, ErrorCode::kDeviceError) << message;
  EXPECT_LE(seconds, kTimeoutMs / 1000.0 + 2.0);
  EXPECT_GE(seconds, kTimeoutMs / 1000.0 * 0.9) << "the wait gave up before its timeout";
  const std::string peerFlag = "flag " + std::to_string(abi::flagId(abi::FlagKind::kUser, 0));
  EXPECT_NE(message.find("rank 1:"), std::string::npos) << message;
  EXPECT_NE(message.find("timed out on " + peerFlag + " "), std::string::npos) << message;
  EXPECT_NE(message.find("(seen 0, expected 1)"), std::string::npos) << message;
  EXPECT_FALSE(waiter.heap->usable());

  ErrorCode refused = ErrorCode::kOk;
  try {
    waiter.launchPingPong();
  } catch (const Error& e) {
    refused = e.code();
  }
  EXPECT_EQ(refused, ErrorCode::kHeapUnusable);
  std::printf("SUMMARY wait timeout (MEGAMOE_WAIT_TIMEOUT_MS=%llu): error after %.3f s: \"%s\"; next launch: %s\n",
              (unsigned long long)kTimeoutMs, seconds, message.c_str(), errorCodeName(refused));
}

// 1 GiB from GPU 0 into GPU 1's heap: peer_store at two grid sizes against the copy engine (cuMemcpyDtoDAsync to
// the peer's UVA address). Only the copies' correctness is asserted; the numbers are information.
TEST(GpuComm, PeerStoreBandwidth) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  constexpr size_t kBytes = size_t(1) << 30, kChunk = 16;
  constexpr int kSms = 132;  // H200; the grid sizes asked for are 2 and 4 blocks per SM
  const uint64_t seed = testSeed();
  ModeA a;
  openModeA(a, {{"bw", kBytes, 256}}, parseEnv(), kRounds);
  Rank& from = a.ranks[0];
  Rank& to = a.ranks[1];
  from.peerStore = loadKernel(*from.runtime, "peer_store", {});

  // Random 64-bit words: the values only need to be fresh and distinguishable from the zeroed destination.
  std::vector<uint64_t> host(kBytes / 8);
  std::mt19937_64 rng(seed);
  for (auto& w : host) w = rng() | 1;  // odd: never zero
  const DevicePtr src = from.device().allocate(kBytes);
  uploadAndWait(from.device(), src, host.data(), kBytes);
  const DevicePtr dstLocal = from.heap->regionAddress("bw");           // as rank 0 names it
  const DevicePtr dstOnPeer = from.heap->peerAddress(1, dstLocal);    // GPU 1's memory, UVA address
  const DevicePtr dstAtPeer = to.heap->regionAddress("bw");           // the same memory, as rank 1 names it

  // Samples of 4 KiB: the first, the last and 254 random ones. Returns how many differ from the source.
  std::vector<size_t> samples = {0, kBytes / 4096 - 1};
  std::uniform_int_distribution<size_t> pick(0, kBytes / 4096 - 1);
  for (int i = 0; i < 254; ++i) samples.push_back(pick(rng));
  auto badSamples = [&] {
    int bad = 0;
    std::vector<uint64_t> page(512);
    for (size_t s : samples) {
      to.device().copyDeviceToHost(page.data(), dstAtPeer + s * 4096, 4096);
      bad += std::memcmp(page.data(), &host[s * 512], 4096) != 0;
    }
    return bad;
  };

  EventHandle start = from.device().createEvent(), end = from.device().createEvent();
  auto measure = [&](const char* what, const std::function<void()>& copy) {
    to.device().memsetZero(dstAtPeer, kBytes, to.stream);
    to.device().synchronize(to.stream);
    for (int i = 0; i < 2; ++i) copy();
    std::vector<float> ms;
    for (int i = 0; i < 5; ++i) {
      from.device().recordEvent(start, from.stream);
      copy();
      from.device().recordEvent(end, from.stream);
      from.device().synchronizeEvent(end);
      ms.push_back(from.device().elapsedMilliseconds(start, end));
    }
    from.heap->checkErrors(from.stream);
    const int bad = badSamples();
    EXPECT_EQ(bad, 0) << what << ": sampled 4 KiB pages differ from the source";
    const double gbps = double(kBytes) / (medianMs(ms) * 1e-3) / 1e9;
    std::printf("%s: median %.3f ms, %.1f GB/s, %d of %zu sampled pages wrong\n", what, medianMs(ms), gbps, bad,
                samples.size());
    return gbps;
  };
  auto peerStore = [&](uint32_t blocks) {
    return [&, blocks] {
      uint64_t ctx = from.heap->contextAddress(), srcArg = src, dstArg = dstLocal;
      int32_t chunks = static_cast<int32_t>(kBytes / kChunk), peer = 1, grid = static_cast<int32_t>(blocks);
      void* params[] = {&ctx, &srcArg, &dstArg, &chunks, &peer, &grid};
      from.launch(*from.peerStore, blocks, params);
    };
  };
  const double store2 = measure("peer_store grid=264", peerStore(kSms * 2));
  const double store4 = measure("peer_store grid=528", peerStore(kSms * 4));
  const double engine = measure("copy engine (cuMemcpyDtoDAsync to the peer)",
                                [&] { from.device().copyDeviceToDeviceAsync(dstOnPeer, src, kBytes, from.stream); });
  from.device().destroyEvent(start);
  from.device().destroyEvent(end);
  from.device().free(src);
  std::printf("BANDWIDTH gpu0->gpu1 bytes=%zu peer_store_grid264_GBps=%.1f peer_store_grid528_GBps=%.1f "
              "copy_engine_GBps=%.1f ratio_best_peer_store_over_copy_engine=%.3f\n",
              kBytes, store2, store4, engine, std::max(store2, store4) / engine);
}

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) {
  // A mode B worker: --comm-worker TEST RANK PATH SEED.
  if (argc == 6 && std::strcmp(argv[1], megamoe::kWorkerFlag) == 0)
    return megamoe::runWorker(argv[2], std::atoi(argv[3]), argv[4], std::strtoull(argv[5], nullptr, 10));
  ::testing::InitGoogleTest(&argc, argv);
  megamoe::gputest::initBaseSeed(argc, argv);
  return RUN_ALL_TESTS();
}
