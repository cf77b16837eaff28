// The caller-exchanged rendezvous (Workspace::prepare / join) at 2 and at 8 processes, each rank's training step
// bitwise the one-process group's; and what the whole binary shares: LayerTest's one instantiation (every file's
// LayerTest.* at every count of kRankCounts) and main(), which also runs the exchange's worker processes.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerChecks.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"
#include "megamoe/Workspace.h"
#include "tests/support/FileAllGather.h"

namespace megamoe::layertest {
namespace {

// Every LayerTest.* of this binary's files, at every count of kRankCounts (LayerTest.*/Ranks2, LayerTest.*/Ranks8).
INSTANTIATE_TEST_SUITE_P(, LayerTest, ::testing::ValuesIn(kRankCounts), rankCountName);

// ---- The caller-exchanged rendezvous (Workspace::prepare / join): one process per rank, the workers this binary
// re-executes, every rank on GPU r % deviceCount (CUDA IPC works between processes on one device), the handles
// all-gathered by the "caller" through files. Each rank's training step must be bitwise the one-process group's
// (createLocal) on the same inputs, weights and SM budget.

Shape exchangeShape(int ranks) { return smallShape(ranks); }
LayerOptions exchangeOptions(int ranks, int sms) {
  LayerOptions o;
  o.training = true;
  o.smBudget = (sms / ranks) & ~1;  // each process its share: the ranks' persistent kernels must all be resident
  return o;
}
constexpr uint64_t kExchangeWeightSeed = 0x5eedc0ffee123ull;
Inputs exchangeInputs(const Shape& s, int rank) {
  std::mt19937 rng(uint32_t(7000 + rank));
  return makeInputs(rng, s, Routing::kUniform, rank, 100 + 61 * rank, 0, 1.f, /*training=*/true);
}
// The outputs (outputBytes) of one forward + backward.
std::vector<uint8_t> stepOutputs(Rank& rank, const Inputs& in, DevicePtr saved) {
  rank.fillSentinels();
  upload(rank, in);
  ForwardArgs f = rank.args(in.tokens);
  f.saved = saved;
  rank.layer->forward(f, rank.stream);
  BackwardArgs b = rank.backwardArgs(in.tokens);
  b.saved = saved;
  rank.layer->backward(b, rank.stream);
  rank.layer->checkErrors(rank.stream);
  return outputBytes(rank);
}

int runExchangeWorker(int r, int R, const std::string& dir) {
  try {
    const Shape s = exchangeShape(R);
    const int devices = openBackend(BackendKind::kCuda)->deviceCount();
    Rank rank;
    rank.shape = s;
    rank.runtime = std::make_unique<Runtime>(BackendKind::kCuda, rankOrdinal(r, devices), parseEnv());
    rank.stream = rank.device().createStream();
    const MoeLayerConfig config = layerConfig(s, exchangeOptions(R, rank.device().multiprocessors()));
    auto pending = Workspace::prepare(*rank.runtime, config, r, R);
    const std::vector<uint8_t> handles = test::allGatherThroughFiles(dir, "handles", r, R, pending->handle(), 60);
    std::shared_ptr<Workspace> ws = Workspace::join(*pending, handles.data(), handles.size());
    test::allGatherThroughFiles(dir, "joined", r, R, {1}, 60);  // the caller's barrier before the first call
    rank.layer = MoeLayer::create(ws, config);
    uint64_t seeds = kExchangeWeightSeed;
    for (int q = 0; q < r; ++q) {  // the earlier ranks' draws: this rank's weights are the group's rank r's
      splitMix64(seeds);
      splitMix64(seeds);
    }
    allocateRank(rank, s, seeds);
    const DevicePtr saved = rank.device().allocate(size_t(MoeLayer::savedBytes(config, R)));
    const std::vector<uint8_t> out = stepOutputs(rank, exchangeInputs(s, r), saved);
    rank.device().free(saved);
    test::allGatherThroughFiles(dir, "outputs", r, R, out, 60);  // also: every rank is done before any destroys
    rank.layer.reset();
    ws.reset();
    std::printf("rank %d of %d: workspace from exchanged handles, training step done (%zu output bytes)\n", r, R,
                out.size());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", r, e.what());
    return 1;
  }
}

TEST_P(LayerTest, WorkspaceFromExchangedHandlesMatchesOneProcess) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  char pattern[] = "/tmp/megamoe-exchange-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  std::vector<std::vector<std::string>> workers;
  for (int r = 0; r < R; ++r) workers.push_back({"--exchange-worker", std::to_string(r), std::to_string(R), dir});
  std::vector<WorkerExit> exits;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(runSelfWorkers(workers, std::chrono::seconds(180), std::chrono::milliseconds(50), &exits));
  const double workerS = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bool allOk = true;
  for (size_t r = 0; r < exits.size(); ++r) {
    if (exits[r].hung) ADD_FAILURE() << "rank " << r << " hung";
    else EXPECT_TRUE(exits[r].succeeded()) << "rank " << r << " failed (see its stderr)";
    allOk = allOk && !exits[r].hung && exits[r].succeeded();
  }
  if (allOk) {
    // The same step in this process, every rank on its share of the same SMs.
    const Shape s = exchangeShape(R);
    Group g;
    std::mt19937 unused(0);
    const int sms = openBackend(BackendKind::kCuda)->device(0)->multiprocessors();
    const LayerOptions o = exchangeOptions(R, sms);
    ASSERT_NO_FATAL_FAILURE(openGroup(g, s, o, parseEnv(), unused, kExchangeWeightSeed));
    // Every rank's forward, then every rank's backward, then the read-back (the group's calls run side by side).
    std::vector<Inputs> in;
    for (int r = 0; r < R; ++r) {
      in.push_back(exchangeInputs(s, r));
      g[r].fillSentinels();
      upload(g[r], in.back());
    }
    std::vector<int64_t> tokens;
    for (const Inputs& i : in) tokens.push_back(i.tokens);
    stepAll(g, tokens);
    std::vector<uint8_t> expected;
    for (int r = 0; r < R; ++r) {
      const std::vector<uint8_t> theirs = outputBytes(g[r]);
      expected.insert(expected.end(), theirs.begin(), theirs.end());
    }
    std::vector<uint8_t> got;
    for (int r = 0; r < R; ++r) {
      std::ifstream f(dir + "/outputs." + std::to_string(r), std::ios::binary);
      got.insert(got.end(), std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    ASSERT_EQ(got.size(), expected.size());
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += got[i] != expected[i];
    EXPECT_EQ(differing, 0u) << "bytes of the processes' outputs that differ from the one-process group's";
    std::printf("SUMMARY exchanged-handle workspace, %d processes (%s): training step bitwise equal to one process's "
                "(%zu output bytes, %zu differ); workers took %.1f s\n",
                R, placement(*backend_, R).c_str(), got.size(), differing, workerS);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace megamoe::layertest

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--exchange-worker") == 0) {
    megamoe::gputest::initGpuTestProcess();
    return megamoe::layertest::runExchangeWorker(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  }
  return megamoe::gputest::runGpuTests(argc, argv);
}
