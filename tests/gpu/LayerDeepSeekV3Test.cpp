// DeepSeek-V3's MoE layer (H=7168 I=2048 E=256 topk=8) at EP2 and EP8 with at most 32 tokens per rank
// (LayerDeepSeekV3.*/Ranks2, /Ranks8): one training step checked like the small layer's and repeated bitwise
// identical, then a CUDA-graph replay of the forward with a fresh routing, y against the host reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerChecks.h"

namespace megamoe::layertest {
namespace {

// DeepSeek-V3's layer (H=7168 I=2048 E=256 topk=8) over 2 (EP2, 128 experts per rank) or 8 ranks (EP8, 32 per rank),
// training: one step at token counts that differ between the ranks (EP8: one rank has none) with ~10% -1 picks,
// checked like the small layer's (every output against the reference, fully written, guards untouched), repeated
// bitwise identical; then one CUDA-graph replay of the forward with a fresh routing copied in-stream, y against
// the reference. The weights are 11.3G parameters (22.5 GB in bf16) over all ranks, on the host (for the reference)
// and on the device, where their gradients and the repeat's snapshot of them take as much again each.
class LayerDeepSeekV3 : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(, LayerDeepSeekV3, ::testing::ValuesIn(kRankCounts), rankCountName);

TEST_P(LayerDeepSeekV3, TrainingStepAndGraphReplay) {
  const int R = GetParam();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  std::mt19937 rng = testRng();
  Group g;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_NO_FATAL_FAILURE(openGroup(g, deepSeekShape(R), {0, true, false, 0}, parseEnv(), rng));
  const auto opened = std::chrono::steady_clock::now();
  // EP2: {32, 19}; EP8: {32, 19, 0, 31, 1, 32, 24, 7}.
  const std::vector<int64_t> tokens = cycled(R, {32, 19, 0, 31, 1, 32, 24, 7});
  std::printf("SUMMARY layer DeepSeek-V3 EP%d (%s) %s\n", R, placement(*backend_, R).c_str(),
              runBackwardCase(g, rng, Routing::kSparse, tokens, 1.f, true).c_str());
  const auto stepped = std::chrono::steady_clock::now();
  if (HasFailure()) return;

  // The graph: a forward of every rank at the same token counts; then a fresh routing (same x) copied in before
  // the replay.
  std::vector<Graph> graphs(static_cast<size_t>(R));
  const uint64_t epoch = commonEpoch(g, "before capture");
  captureForwards(g, tokens, graphs);
  std::vector<Inputs> fresh(static_cast<size_t>(R));
  const std::string label = "graph replay with a fresh routing";
  // The step's x is still on the device and stays: only the routing is new.
  for (int r = 0; r < R; ++r) {
    fresh[size_t(r)] = makeInputs(rng, g.shape, Routing::kSparse, r, tokens[size_t(r)], 0, 1.f);
    fresh[size_t(r)].x = g[r].read<uint16_t>(g[r].x, size_t(tokens[size_t(r)] * g.shape.hidden));
    g[r].fillSentinels();
  }
  replayWithRouting(g, graphs, fresh);
  for (int r = 0; r < R; ++r) {
    expectMatches(g[r].readY(), tokens[size_t(r)], g.shape.hidden, forwardReference(g, fresh[size_t(r)], 0), "y",
                  label + " rank " + std::to_string(r));
    EXPECT_EQ(g[r].readEpoch(), epoch + 1) << label << " rank " << r << ": one epoch per replay";
  }
  const auto done = std::chrono::steady_clock::now();
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  std::printf("SUMMARY layer DeepSeek-V3 EP%d: open %.1f s, step + reference + repeat %.1f s, graph replay %.1f s\n",
              R, seconds(start, opened), seconds(opened, stepped), seconds(stepped, done));
}

}  // namespace
}  // namespace megamoe::layertest
