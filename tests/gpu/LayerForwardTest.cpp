// The layer's forward at 2 and at 8 ranks (LayerTest.*/Ranks2, LayerTest.*/Ranks8) on H=512 I=256 E=16 (8 or 2
// experts per rank) topk=4 max_tokens=1024: y of each rank against the host reference in double over routings
// (uniform, all picks remote, one hot expert, ~10% -1 entries) and token counts that differ between the ranks (zero
// included), with token deduplication and with the SwiGLU clamp; every row of y[:tokens] written, the guard rows past
// it untouched, a repeated call bitwise identical, epochs advancing on the device; 1000 CUDA-graph replays with the
// routing changed in-stream before each, bitwise equal to plain calls.
#include <gtest/gtest.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerChecks.h"

namespace megamoe::layertest {
namespace {

// 28 consecutive cases (every routing at every token set, each call repeated), nothing reset in between.
TEST_P(LayerTest, ForwardRoutingsAndTokenCounts) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {}, parseEnv(), rng));
  const int R = ranks();
  const std::vector<int64_t> tokenSets[] = {cycled(R, {1024}),    cycled(R, {777, 1024}), cycled(R, {0, 1}),
                                            cycled(R, {1, 0}),    cycled(R, {0}),         cycled(R, {1024, 0}),
                                            cycled(R, {513, 0, 1024, 1, 777, 64, 0, 1000})};
  for (const auto& tokens : tokenSets) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer %s\n", runCase(g, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// Token deduplication (MoeLayerConfig::dedupTokens): the same checks over every routing and uneven token counts.
// With 8 (2 ranks) or 2 (8 ranks) experts per rank and top-4, many tokens pick several experts of one owner (one row
// crosses, the L1 tiles gather it for each pick); -1 entries and one hot expert included (kRoutings).
TEST_P(LayerTest, ForwardDedupRoutingsAndTokenCounts) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {0, false, true, 0}, parseEnv(), rng));
  const int R = ranks();
  const std::vector<int64_t> tokenSets[] = {cycled(R, {1024}), cycled(R, {777, 1024}), cycled(R, {0, 1}),
                                            cycled(R, {1024, 0})};
  for (const auto& tokens : tokenSets) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer dedup %s\n", runCase(g, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// SwiGLU clamp 7.0 with x ~ N(0, 4²), so that |gate|, |up| exceed it often: the clamp must change the result (checked
// on the host, so that the case can tell) and y must match the clamped reference.
TEST_P(LayerTest, ForwardSwigluClamp) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  constexpr int64_t kClampMilli = 7000;
  constexpr float kXScale = 4.f;
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {kClampMilli, false, false, 0}, parseEnv(), rng));
  const Inputs probe = makeInputs(rng, g.shape, Routing::kUniform, 0, 128, 0, kXScale);
  const double clampEffect = relativeError(forwardReference(g, probe, 0), forwardReference(g, probe, kClampMilli));
  std::printf("clamp %.1f changes the reference by %.3g (relative)\n", kClampMilli / 1000.0, clampEffect);
  EXPECT_GT(clampEffect, 5 * kTolerance) << "the inputs do not exercise the clamp";
  const std::vector<int64_t> tokenSets[] = {cycled(ranks(), {1024, 777}), cycled(ranks(), {256, 1024})};
  const Routing routings[] = {Routing::kUniform, Routing::kSparse};
  for (int c = 0; c < 2; ++c) {
    std::printf("SUMMARY layer %s\n", runCase(g, rng, routings[c], tokenSets[c], kXScale, true).c_str());
    if (HasFailure()) return;
  }
}

// One forward per rank captured into a graph at 256 tokens; 8 routings (and weights) whose y comes from plain calls
// checked against the reference; then 1000 replays, each after copying routing i % 8 into topk_idx/topk_weights on
// the rank's stream: y must equal routing i % 8's plain-call y bit for bit every time, on every rank.
TEST_P(LayerTest, CudaGraphReplay) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  constexpr int64_t kTokens = 256;
  constexpr int kVariants = 8, kReplays = 1000;
  const int R = ranks();
  const std::vector<int64_t> tokens = cycled(R, {kTokens});
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(R), {}, parseEnv(), rng));
  const size_t yUsed = size_t(kTokens * g.shape.hidden);

  // The host copies stay alive and unchanged while the replays' in-stream copies read them.
  std::vector<std::vector<Inputs>> in(kVariants, std::vector<Inputs>(size_t(R)));
  std::vector<std::vector<std::vector<uint16_t>>> expected(kVariants, std::vector<std::vector<uint16_t>>(size_t(R)));
  for (int v = 0; v < kVariants; ++v) {
    const Routing routing = kRoutings[size_t(v) % std::size(kRoutings)];
    const int32_t hot = std::uniform_int_distribution<int32_t>(0, int32_t(g.shape.experts) - 1)(rng);
    for (int r = 0; r < R; ++r) {
      Inputs& rin = in[size_t(v)][size_t(r)];
      rin = makeInputs(rng, g.shape, routing, r, kTokens, hot, 1.f);
      if (v > 0) rin.x = in[0][size_t(r)].x;  // the graph changes the routing only
      upload(g[r], rin);
      g[r].fillSentinels();
    }
    forwardAll(g, tokens);
    for (int r = 0; r < R; ++r) {
      const std::vector<uint16_t> y = g[r].readY();
      expectMatches(y, kTokens, g.shape.hidden, forwardReference(g, in[size_t(v)][size_t(r)], 0), "y",
                    "plain call, routing " + std::to_string(v) + " (" + routingName(routing) + ") rank " +
                        std::to_string(r));
      expected[size_t(v)][size_t(r)].assign(y.begin(), y.begin() + std::ptrdiff_t(yUsed));
    }
  }
  ASSERT_FALSE(HasFailure()) << "the plain calls the replays are compared with are wrong";

  std::vector<Graph> graphs(static_cast<size_t>(R));
  const uint64_t epoch0 = commonEpoch(g, "before capture");
  captureForwards(g, tokens, graphs);
  EXPECT_EQ(g[0].readEpoch(), epoch0) << "capture ran something";

  size_t badReplays = 0, badElements = 0;
  std::string firstBad;
  std::vector<uint16_t> y(yUsed);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kReplays; ++i) {
    const int v = i % kVariants;
    replayWithRouting(g, graphs, in[size_t(v)]);
    for (int r = 0; r < R; ++r) {
      g[r].device().copyDeviceToHost(y.data(), g[r].y, yUsed * 2);
      const size_t d = countDiffering(y, expected[size_t(v)][size_t(r)]);
      if (d && badReplays++ == 0)
        firstBad = "replay " + std::to_string(i) + " (routing " + std::to_string(v) + ") rank " + std::to_string(r) +
                   ": " + std::to_string(d) + " elements differ";
      badElements += d;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(badReplays, 0u) << badElements << " elements differ in all; first: " << firstBad;
  for (int r = 0; r < R; ++r)
    EXPECT_EQ(g[r].readEpoch(), epoch0 + kReplays) << "rank " << r << ": one epoch per replay";
  std::printf("SUMMARY layer graph (%s): %d replays x %d ranks at tokens=%lld over %d routings in %.3f s (%.3f ms per "
              "replay incl. routing upload, sync and copy-back); %zu replay/rank pairs differ (%zu elements)\n",
              placement(*backend_, R).c_str(), kReplays, R, static_cast<long long>(kTokens), kVariants, seconds,
              seconds * 1000 / kReplays, badReplays, badElements);
}

}  // namespace
}  // namespace megamoe::layertest
