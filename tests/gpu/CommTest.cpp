// GPU tier for the communication kernels over the symmetric heap at 2 and at 8 ranks (GpuComm.*/Ranks2, /Ranks8),
// rank r on GPU r % deviceCount (on one GPU every rank shares it, each with its own stream): ping_pong and a2a_rows in
// mode A (one process drives every rank), epochs across calls and across 10,000 CUDA-graph replays, a bounded wait
// that times out into a device error, and peer_store bandwidth against the copy engine. ping_pong is written for
// ranks 0 and 1 of a heap (peer = 1 - rank), so its 8-rank cases run 4 pairs of ranks, each pair its own heap, side
// by side. Mode B (one process per rank, re-executing this binary, heaps over CUDA IPC): ping_pong with 2 processes
// (GpuCommModeB.PingPong), a2a_rows with 2 and 8. Processes sharing a GPU time-slice their kernels unless MPS runs
// (the tests do not depend on it): their waits are bounded at 60 s instead of 10 s (runModeB). Skips, saying why,
// without a CUDA device or when a device the ranks run on is not sm_90a; never for too few GPUs.
// Residency on one GPU: every rank's kernels must be resident at once. ping_pong and epoch_advance are one block;
// a2a_rows launches nranks x kBlocksPerPeer (16) blocks of 256 threads a rank, 1024 blocks at 8 ranks, which fit an
// H200 together (132 SMs x 8 blocks of 256 threads), and only block (p, 0) of each group ever waits (nranks² = 64
// blocks), so the copying blocks always finish and free their SMs even where fewer fit. kBlocksPerPeer is a constant
// of the kernel (its block index decides the peer), not something a launch could reduce.
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
#include "megamoe/KernelArgs.h"
#include "megamoe/Rendezvous.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {
namespace {

using namespace gputest;

// Shapes of the specs in kernels/Kernels.h (not included: it pulls in MLIR) and of this test.
constexpr int64_t kRounds = 64, kGraphRounds = 2;
constexpr int64_t kA2aHidden = 7168, kA2aRows = 256, kA2aBlocksPerPeer = 16;
constexpr int kCalls = 3;
constexpr uint16_t kSentinel = 0xFFFF;  // bf16 NaN: never drawn (the send data is finite)

std::string hex16(uint16_t v) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%04x", v);
  return text;
}

// ---- one rank: its runtime (device), heap, stream and kernels; the launches of the comm kernels ----

struct Rank {
  std::unique_ptr<Runtime> runtime;
  SymmetricHeap* heap = nullptr;  // mode A: owned by ModeA::heaps; mode B: by `ownHeap`
  std::unique_ptr<SymmetricHeap> ownHeap;
  StreamHandle stream = nullptr;
  std::shared_ptr<const Kernel> pingPong, epochAdvance, a2a, peerStore;

  Device& device() const { return *runtime->device(); }
  ~Rank() {
    if (stream) {
      try {
        runtime->device()->synchronize(stream);
        runtime->device()->destroyStream(stream);
      } catch (...) {
      }
    }
  }

  // The arguments of `kernel`, by name (compiler/abi/KernelAbi.h), with this rank's context set.
  KernelArgs args(const Kernel& kernel) const {
    KernelArgs a(kernel.key().kernel);
    a.context(heap->contextAddress());
    return a;
  }
  void launch(const Kernel& kernel, uint32_t grid, KernelArgs& args) {
    gputest::launch1d(*runtime, kernel, grid, stream, args, heap);
  }
  // ping_pong on the "flag" and "log" regions.
  void launchPingPong() {
    KernelArgs a = args(*pingPong);
    a.ptr("flag", heap->regionAddress("flag")).ptr("log", heap->regionAddress("log"));
    launch(*pingPong, 1, a);
  }
  void launchEpochAdvance() {
    KernelArgs a = args(*epochAdvance);
    launch(*epochAdvance, 1, a);
  }
  // a2a_rows: one block group of kA2aBlocksPerPeer per peer.
  void launchA2a(DevicePtr send) {
    KernelArgs a = args(*a2a);
    a.ptr("send", send).ptr("recv", heap->regionAddress("recv")).ptr("flags", heap->regionAddress("flags"));
    a.i32("rows", kA2aRows);
    launch(*a2a, static_cast<uint32_t>(heap->nranks() * kA2aBlocksPerPeer), a);
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

// What rank `src` sends in call `call`: [nranks][rows][H] bf16, uniform in [-1.7, 1.7) (never the NaN sentinel), the
// same on every process; generated in parallel (14.7M values per rank at 8 ranks).
std::vector<uint16_t> a2aSendData(uint64_t seed, int call, int src, int nranks) {
  return uniformBf16(seed + 1000003ull * uint64_t(call) + uint64_t(src), size_t(nranks * kA2aRows * kA2aHidden), 1.f);
}
// Every rank's send data of call `call`.
std::vector<std::vector<uint16_t>> a2aAllSendData(uint64_t seed, int call, int nranks) {
  std::vector<std::vector<uint16_t>> sends;
  for (int src = 0; src < nranks; ++src) sends.push_back(a2aSendData(seed, call, src, nranks));
  return sends;
}

// recv on `rank` after a call: slab [src] must equal what src put in send[rank] (sends[src]), bit for bit; flags[src]
// must be (epoch + 1) * blocks. "" when they hold; `mismatches` counts differing elements.
std::string checkA2a(const Rank& rank, const std::vector<std::vector<uint16_t>>& sends, int call, uint64_t epoch,
                     size_t* mismatches) {
  const int me = rank.heap->rank(), nranks = rank.heap->nranks();
  const size_t slab = size_t(kA2aRows * kA2aHidden);
  std::vector<uint16_t> recv(size_t(nranks) * slab);
  rank.device().copyDeviceToHost(recv.data(), rank.heap->regionAddress("recv"), recv.size() * 2);
  const std::vector<int64_t> flags = rank.readI64("flags", size_t(nranks));
  std::string why;
  *mismatches = 0;
  for (int src = 0; src < nranks; ++src) {
    const std::vector<uint16_t>& sent = sends[size_t(src)];
    const size_t from = size_t(src) * slab, at = size_t(me) * slab;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < slab; ++i)
      if (recv[from + i] != sent[at + i] && bad++ == 0) first = i;
    *mismatches += bad;
    if (bad)
      why += " recv[" + std::to_string(src) + "]: " + std::to_string(bad) + " elements differ, first at " +
             std::to_string(first) + " (got " + hex16(recv[from + first]) + ", sent " + hex16(sent[at + first]) + ")";
    const int64_t expectedFlag = int64_t(epoch + 1) * kA2aBlocksPerPeer;
    if (flags[size_t(src)] != expectedFlag)
      why += " flags[" + std::to_string(src) + "]=" + std::to_string(flags[size_t(src)]) + " (expected " +
             std::to_string(expectedFlag) + ")";
  }
  return why.empty() ? "" : "rank " + std::to_string(me) + " call " + std::to_string(call) + ":" + why;
}

void poisonRecv(const Rank& rank) {
  fillDevice(rank.device(), rank.heap->regionAddress("recv"), size_t(rank.heap->nranks() * kA2aRows * kA2aHidden),
             kSentinel);
}

// ---- mode A: every rank in this process ----

// `ranks` ranks (rank r on device r % deviceCount) in heaps of `heapRanks` consecutive ranks each: one heap of all
// of them, or pairs for ping_pong.
struct ModeA {
  std::vector<std::unique_ptr<Rank>> ranks;
  std::vector<std::unique_ptr<SymmetricHeap>> heaps;  // heaps[r] is rank r's
  int size() const { return int(ranks.size()); }
  Rank& operator[](int r) { return *ranks[size_t(r)]; }
  const Rank& operator[](int r) const { return *ranks[size_t(r)]; }
  ~ModeA() {
    // The streams are drained (Rank's destructor) before the heaps go.
    ranks.clear();
  }
};

// Opens the ranks and their heaps with `regions`; loads the comm kernels.
void openModeA(ModeA& a, int ranks, int heapRanks, const std::vector<RegionSpec>& regions, const RuntimeEnv& env,
               int64_t rounds) {
  const int devices = openBackend(BackendKind::kCuda)->deviceCount();
  for (int r = 0; r < ranks; ++r) {
    a.ranks.push_back(std::make_unique<Rank>());
    openRank(a[r], rankOrdinal(r, devices), env);
  }
  for (int first = 0; first < ranks; first += heapRanks) {
    std::vector<std::shared_ptr<Device>> group;
    for (int r = first; r < first + heapRanks; ++r) group.push_back(a[r].runtime->device());
    for (auto& heap : SymmetricHeap::createSingleProcess(group, regions, env)) a.heaps.push_back(std::move(heap));
  }
  for (int r = 0; r < ranks; ++r) {
    a[r].heap = a.heaps[size_t(r)].get();
    loadCommKernels(a[r], rounds);
  }
}

// ---- mode B: this binary re-executed once per rank ----

constexpr const char* kWorkerFlag = "--comm-worker";

// Runs `test` ("ping_pong" | "a2a") as rank `rank` of `nranks`: device rank % deviceCount, heap over IPC through
// `path`, a second rendezvous at `path`.sync for the host barriers between calls, every cross-rank wait bounded at
// `waitTimeoutMs`. Returns the process exit status.
int runWorker(const std::string& test, int rank, int nranks, const std::string& path, uint64_t seed,
              uint64_t waitTimeoutMs) {
  try {
    const RuntimeEnv env = envWithWaitTimeout(waitTimeoutMs);
    Rank self;
    openRank(self, rankOrdinal(rank, openBackend(BackendKind::kCuda)->deviceCount()), env);
    self.ownHeap = self.runtime->createHeap(test == "a2a" ? a2aRegions(nranks) : pingPongRegions(kRounds), rank,
                                            nranks, path);
    self.heap = self.ownHeap.get();
    loadCommKernels(self, kRounds);
    if (test == "a2a") loadA2a(self);
    // Host barriers: a peer must not write call c + 1's data into our heap before we have read call c's.
    Rendezvous sync({path + ".sync", rank, nranks, 0, env.rendezvousTimeoutS, /*secret*/ "", /*agreement*/ {}}, {});
    DevicePtr send = 0;
    if (test == "a2a") send = self.device().allocate(size_t(nranks * kA2aRows * kA2aHidden) * 2);
    std::string failure;
    for (int call = 0; call < kCalls && failure.empty(); ++call) {
      const uint64_t epoch = self.readEpoch();
      if (epoch != uint64_t(call)) failure = "epoch " + std::to_string(epoch) + " before call " + std::to_string(call);
      size_t mismatches = 0;
      std::vector<std::vector<uint16_t>> sends;
      if (test == "a2a") {
        sends = a2aAllSendData(seed, call, nranks);
        uploadAndWait(self.device(), send, sends[size_t(rank)].data(), sends[size_t(rank)].size() * 2);
        poisonRecv(self);
        sync.barrier("a2a call " + std::to_string(call) + ": recv poisoned");
        self.launchA2a(send);
      } else {
        self.launchPingPong();
      }
      self.launchEpochAdvance();
      self.heap->checkErrors(self.stream);
      if (failure.empty())
        failure = test == "a2a" ? checkA2a(self, sends, call, epoch, &mismatches) : checkPingPong(self, epoch, kRounds);
      if (failure.empty() && self.readEpoch() != epoch + 1) failure = "the epoch did not advance";
      std::printf("mode B rank %d of %d %s call %d at epoch %llu: %s\n", rank, nranks, test.c_str(), call,
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
    std::fprintf(stderr, "mode B rank %d of %d %s: %s\n", rank, nranks, test.c_str(), e.what());
    return 1;
  }
}

// Spawns `nranks` workers for `test` and waits for them (bounded); fails the test for a worker that fails or hangs.
// Workers that share a GPU are separate processes: without MPS their kernels time-slice instead of running side by
// side, so each wait may last as long as the other processes' time slices; the waits are bounded at 60 s instead of
// the default 10 s there.
void runModeB(const std::string& test, int nranks, uint64_t seed, Backend& backend) {
  const bool shared = backend.deviceCount() < nranks;
  const uint64_t waitTimeoutMs = shared ? 60000 : parseEnv().waitTimeoutMs;
  const std::string path =
      "/tmp/megamoe-comm-" + std::to_string(::getpid()) + "-" + test + "-" + std::to_string(nranks) + ".sock";
  std::vector<std::vector<std::string>> workers;
  for (int r = 0; r < nranks; ++r)
    workers.push_back({kWorkerFlag, test, std::to_string(r), std::to_string(nranks), path, std::to_string(seed),
                       std::to_string(waitTimeoutMs)});
  std::vector<WorkerExit> exits;
  if (!runSelfWorkers(workers, std::chrono::seconds(240), std::chrono::milliseconds(20), &exits)) return;
  int failed = 0;
  for (size_t r = 0; r < exits.size(); ++r) {
    if (exits[r].hung) ADD_FAILURE() << "mode B rank " << r << " hung";
    else EXPECT_TRUE(exits[r].succeeded()) << "mode B rank " << r << " failed (see its output above)";
    failed += !exits[r].succeeded();
  }
  std::printf("SUMMARY %s mode B: %d ranks (%s, processes%s) x %d calls, %s\n", test.c_str(), nranks,
              placement(backend, nranks).c_str(), shared ? " sharing a GPU, wait timeout 60 s" : "", kCalls,
              failed ? "FAILED" : "every check held on every rank");
}

// ---------------------------------------------------------------------------------------------------- tests

// The comm tests, at every count of kRankCounts.
class GpuComm : public ::testing::TestWithParam<int> {
 protected:
  int ranks() const { return GetParam(); }
};
INSTANTIATE_TEST_SUITE_P(, GpuComm, ::testing::ValuesIn(kRankCounts), rankCountName);

// ranks / 2 pairs, each its own heap, ping-pong side by side for kCalls calls.
TEST_P(GpuComm, PingPongModeA) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  ModeA a;
  openModeA(a, ranks(), 2, pingPongRegions(kRounds), parseEnv(), kRounds);
  std::string values;
  for (int call = 0; call < kCalls; ++call) {
    for (int r = 0; r < a.size(); ++r) ASSERT_EQ(a[r].readEpoch(), uint64_t(call)) << "rank " << r;
    const uint64_t epoch = uint64_t(call);
    // Every rank launched before any is synchronised: each kernel needs its peer running.
    for (int r = 0; r < a.size(); ++r) a[r].launchPingPong();
    for (int r = 0; r < a.size(); ++r) a[r].launchEpochAdvance();
    for (int r = 0; r < a.size(); ++r) a[r].heap->checkErrors(a[r].stream);
    for (int r = 0; r < a.size(); ++r) {
      EXPECT_EQ(checkPingPong(a[r], epoch, kRounds), "") << "pair " << r / 2;
      EXPECT_EQ(a[r].readEpoch(), epoch + 1) << "rank " << r;
    }
    values += " call" + std::to_string(call) + ":rank0.log[63]=" + std::to_string(a[0].readI64("log", 64)[63]) +
              ",rank1.log[62]=" + std::to_string(a[1].readI64("log", 64)[62]);
  }
  std::printf("SUMMARY ping_pong mode A %d pairs (%s) rounds=%lld calls=%d:%s\n", ranks() / 2,
              placement(*backend_, ranks()).c_str(), (long long)kRounds, kCalls, values.c_str());
}

// Two processes (ping_pong is a two-rank kernel); on one GPU they share it, time-sliced (see runModeB).
TEST(GpuCommModeB, PingPong) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, 2);
  runModeB("ping_pong", 2, testSeed(), *backend_);
}

TEST_P(GpuComm, AllToAllRowsModeA) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  const int R = ranks();
  const uint64_t seed = testSeed();
  ModeA a;
  openModeA(a, R, R, a2aRegions(R), parseEnv(), kRounds);
  for (int r = 0; r < R; ++r) loadA2a(a[r]);
  std::vector<DevicePtr> send(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) send[size_t(r)] = a[r].device().allocate(size_t(R * kA2aRows * kA2aHidden) * 2);
  size_t total = 0;
  for (int call = 0; call < kCalls; ++call) {
    const uint64_t epoch = a[0].readEpoch();
    ASSERT_EQ(epoch, uint64_t(call));
    const std::vector<std::vector<uint16_t>> sends = a2aAllSendData(seed, call, R);  // fresh data every call
    for (int r = 0; r < R; ++r) {
      uploadAndWait(a[r].device(), send[size_t(r)], sends[size_t(r)].data(), sends[size_t(r)].size() * 2);
      poisonRecv(a[r]);
    }
    for (int r = 0; r < R; ++r) a[r].launchA2a(send[size_t(r)]);
    for (int r = 0; r < R; ++r) a[r].launchEpochAdvance();
    for (int r = 0; r < R; ++r) a[r].heap->checkErrors(a[r].stream);
    for (int r = 0; r < R; ++r) {
      size_t mismatches = 0;
      EXPECT_EQ(checkA2a(a[r], sends, call, epoch, &mismatches), "");
      total += mismatches;
      EXPECT_EQ(a[r].readEpoch(), epoch + 1) << "rank " << r;
    }
  }
  for (int r = 0; r < R; ++r) a[r].device().free(send[size_t(r)]);
  std::printf("SUMMARY a2a_rows mode A H=%lld rows=%lld ranks=%d (%s) calls=%d: mismatched_elements=%zu of %lld\n",
              (long long)kA2aHidden, (long long)kA2aRows, R, placement(*backend_, R).c_str(), kCalls, total,
              (long long)(kCalls * R * R * kA2aRows * kA2aHidden));
}

// One process per rank. At 8 processes on one GPU each a2a call waits on all 7 other processes' kernels, which run
// in turn (time slices) without MPS: slower than side by side, but every wait ends once each process has had a slice,
// well inside the 60 s bound runModeB sets there.
TEST_P(GpuComm, AllToAllRowsModeB) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  runModeB("a2a", ranks(), testSeed(), *backend_);
}

// Each rank captures one call [ping_pong rounds=2, epoch_advance] into a graph (ranks / 2 pairs, each its own heap);
// the host then replays every rank's graph in turn 10,000 times without synchronising. Epochs alone keep the calls
// apart.
TEST_P(GpuComm, GraphReplayAdvancesEpochs) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  constexpr int kReplays = 10000;
  const int R = ranks();
  ModeA a;
  openModeA(a, R, 2, pingPongRegions(kGraphRounds), parseEnv(), kGraphRounds);
  const uint64_t epoch0 = a[0].readEpoch();
  for (int r = 1; r < R; ++r) ASSERT_EQ(a[r].readEpoch(), epoch0) << "rank " << r;
  std::vector<GraphHandle> graphs(static_cast<size_t>(R), nullptr);
  for (int r = 0; r < R; ++r) {
    Rank& rank = a[r];
    rank.device().beginCapture(rank.stream);
    rank.launchPingPong();
    rank.launchEpochAdvance();
    graphs[size_t(r)] = rank.device().endCapture(rank.stream);
  }
  // Capture ran nothing.
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(a[r].readEpoch(), epoch0) << "rank " << r;
    EXPECT_EQ(a[r].readI64("flag", 1)[0], 0) << "rank " << r;
  }

  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kReplays; ++i)
    for (int r = 0; r < R; ++r) a[r].device().launchGraph(graphs[size_t(r)], a[r].stream);
  const auto enqueued = std::chrono::steady_clock::now();
  for (int r = 0; r < R; ++r) a[r].heap->checkErrors(a[r].stream);
  const auto end = std::chrono::steady_clock::now();

  // The last replay ran at epoch epoch0 + kReplays - 1: in each pair, rank 0 sent round 0, rank 1 round 1.
  const uint64_t last = epoch0 + kReplays - 1;
  std::string epochs;
  for (int r = 0; r < R; ++r) {
    const uint64_t epoch = a[r].readEpoch();
    EXPECT_EQ(epoch, epoch0 + kReplays) << "rank " << r;
    EXPECT_EQ(checkPingPong(a[r], last, kGraphRounds), "") << "pair " << r / 2;
    epochs += (epochs.empty() ? "" : ",") + std::to_string(epoch);
  }
  for (int r = 0; r < R; ++r) a[r].device().destroyGraph(graphs[size_t(r)]);
  const double wallMs = std::chrono::duration<double, std::milli>(end - start).count();
  const double enqueueMs = std::chrono::duration<double, std::milli>(enqueued - start).count();
  std::printf("SUMMARY graph replay ping_pong(rounds=2)+epoch_advance x %d per rank, %d pairs (%s): epochs=%s (start "
              "%llu) rank0.flag=%lld rank1.flag=%lld wall_ms=%.1f enqueue_ms=%.1f us_per_call=%.2f\n",
              kReplays, R / 2, placement(*backend_, R).c_str(), epochs.c_str(), (unsigned long long)epoch0,
              (long long)a[0].readI64("flag", 1)[0], (long long)a[1].readI64("flag", 1)[0], wallMs, enqueueMs,
              wallMs * 1e3 / kReplays);
}

// In each of ranks / 2 pairs only rank 1 runs ping_pong; its first wait (round 0, sent by the absent rank 0) must time
// out into a device error naming rank 1 and the flag of peer 0, well within the timeout plus 2 s, after which the
// heap refuses launches. The waiters of all pairs wait side by side.
TEST_P(GpuComm, WaitTimeoutBecomesDeviceError) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  constexpr uint64_t kTimeoutMs = 300;
  const RuntimeEnv env = envWithWaitTimeout(kTimeoutMs);
  ASSERT_EQ(env.waitTimeoutMs, kTimeoutMs);
  ModeA a;
  openModeA(a, ranks(), 2, pingPongRegions(kRounds), env, kRounds);

  const auto start = std::chrono::steady_clock::now();
  for (int r = 1; r < a.size(); r += 2) a[r].launchPingPong();
  const std::string awaited = "cross-rank wait for rank 0 timed out";
  for (int r = 1; r < a.size(); r += 2) {
    Rank& waiter = a[r];
    std::string message;
    ErrorCode code = ErrorCode::kOk;
    try {
      waiter.heap->checkErrors(waiter.stream);
    } catch (const Error& e) {
      message = e.what();
      code = e.code();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string at = "pair " + std::to_string(r / 2) + ": ";
    EXPECT_EQ(code, ErrorCode::kDeviceError) << at << message;
    EXPECT_LE(seconds, kTimeoutMs / 1000.0 + 2.0) << at;
    EXPECT_GE(seconds, kTimeoutMs / 1000.0 * 0.9) << at << "the wait gave up before its timeout";
    EXPECT_NE(message.find("rank 1:"), std::string::npos) << at << message;
    EXPECT_NE(message.find(awaited), std::string::npos) << at << message;
    EXPECT_NE(message.find("(seen 0, expected 1)"), std::string::npos) << at << message;
    EXPECT_FALSE(waiter.heap->usable()) << at;

    ErrorCode refused = ErrorCode::kOk;
    try {
      waiter.launchPingPong();
    } catch (const Error& e) {
      refused = e.code();
    }
    EXPECT_EQ(refused, ErrorCode::kHeapUnusable) << at;
    std::printf("SUMMARY wait timeout (MEGAMOE_WAIT_TIMEOUT_MS=%llu, %s) pair %d: error after %.3f s: \"%s\"; next "
                "launch: %s\n",
                (unsigned long long)kTimeoutMs, placement(*backend_, ranks()).c_str(), r / 2, seconds,
                message.c_str(), errorCodeName(refused));
  }
}

// 1 GiB from rank 0 into rank R-1's heap (GPU 0 into GPU R-1 with enough GPUs; otherwise the same GPU, so the numbers
// are on-device copy rates, not a peer link's): peer_store at two grid sizes against the copy engine
// (cuMemcpyDtoDAsync to the peer's address). Only the copies' correctness is asserted; the numbers are information.
TEST_P(GpuComm, PeerStoreBandwidth) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  constexpr size_t kBytes = size_t(1) << 30, kChunk = 16;
  const int R = ranks(), target = R - 1;
  const uint64_t seed = testSeed();
  ModeA a;
  openModeA(a, R, R, {{"bw", kBytes, 256}}, parseEnv(), kRounds);
  Rank& from = a[0];
  Rank& to = a[target];
  from.peerStore = loadKernel(*from.runtime, "peer_store", {});
  const int sms = from.device().multiprocessors();  // the grid sizes asked for are 2 and 4 blocks per SM
  const bool sameGpu = from.device().ordinal() == to.device().ordinal();
  const std::string route = "rank 0 (gpu" + std::to_string(from.device().ordinal()) + ") -> rank " +
                            std::to_string(target) + " (gpu" + std::to_string(to.device().ordinal()) + ")" +
                            (sameGpu ? ", on-device copies (the ranks share a GPU)" : ", peer link");

  // Random 64-bit words: the values only need to be fresh and distinguishable from the zeroed destination.
  std::vector<uint64_t> host(kBytes / 8);
  std::mt19937_64 rng(seed);
  for (auto& w : host) w = rng() | 1;  // odd: never zero
  const DevicePtr src = from.device().allocate(kBytes);
  uploadAndWait(from.device(), src, host.data(), kBytes);
  const DevicePtr dstLocal = from.heap->regionAddress("bw");                // as rank 0 names it
  const DevicePtr dstOnPeer = from.heap->peerAddress(target, dstLocal);    // the target's memory, from rank 0
  const DevicePtr dstAtPeer = to.heap->regionAddress("bw");                // the same memory, as the target names it

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
  auto measure = [&](const std::string& what, const std::function<void()>& copy) {
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
    std::printf("%s, %s: median %.3f ms, %.1f GB/s, %d of %zu sampled pages wrong\n", what.c_str(), route.c_str(),
                medianMs(ms), gbps, bad, samples.size());
    return gbps;
  };
  auto peerStore = [&](uint32_t blocks) {
    return [&, blocks] {
      KernelArgs a = from.args(*from.peerStore);
      a.ptr("src", src).ptr("dst", dstLocal).i32("chunks", int64_t(kBytes / kChunk)).i32("peer", target);
      a.i32("grid", blocks);
      from.launch(*from.peerStore, blocks, a);
    };
  };
  const uint32_t grid2 = uint32_t(sms * 2), grid4 = uint32_t(sms * 4);
  const double store2 = measure("peer_store grid=" + std::to_string(grid2), peerStore(grid2));
  const double store4 = measure("peer_store grid=" + std::to_string(grid4), peerStore(grid4));
  const double engine = measure("copy engine (cuMemcpyDtoDAsync to the target's address)",
                                [&] { from.device().copyDeviceToDeviceAsync(dstOnPeer, src, kBytes, from.stream); });
  from.device().destroyEvent(start);
  from.device().destroyEvent(end);
  from.device().free(src);
  std::printf("BANDWIDTH %s gpu%d->gpu%d bytes=%zu peer_store_grid%u_GBps=%.1f peer_store_grid%u_GBps=%.1f "
              "copy_engine_GBps=%.1f ratio_best_peer_store_over_copy_engine=%.3f\n",
              sameGpu ? "on-device-copy" : "peer", from.device().ordinal(), to.device().ordinal(), kBytes, grid2,
              store2, grid4, store4, engine, std::max(store2, store4) / engine);
}

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) {
  megamoe::gputest::initGpuTestProcess();
  // A mode B worker: --comm-worker TEST RANK NRANKS PATH SEED WAIT_TIMEOUT_MS.
  if (argc == 8 && std::strcmp(argv[1], megamoe::kWorkerFlag) == 0)
    return megamoe::runWorker(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), argv[5],
                              std::strtoull(argv[6], nullptr, 10), std::strtoull(argv[7], nullptr, 10));
  ::testing::InitGoogleTest(&argc, argv);
  megamoe::gputest::initBaseSeed(argc, argv);
  return RUN_ALL_TESTS();
}
