// The layer's backward (training layers) at 2 and at 8 ranks: forward then backward on every rank, dx, d_topk_weights
// and dW1/dW2 (on the experts' owners, summed over every rank's picks) against the host reference, over the forward's
// routings and token counts, after a deduplicating forward, with the clamp, at H=1024 (the combines reduce in column
// chunks) and at I=640 (an odd number of 128-column halves); every element a call may write written, the guard rows
// untouched, a repeated step bitwise identical; what a training forward keeps (recomputing the dispatched x saves
// exactly its bytes); bad backward arguments; the small training steps that compute-sanitizer runs.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerChecks.h"
#include "megamoe/MoeLayer.h"

namespace megamoe::layertest {
namespace {

// 16 consecutive training steps (every routing at every token set), each repeated, nothing reset in between.
TEST_P(LayerTest, BackwardMatchesReference) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {0, true, false, 0}, parseEnv(), rng));
  const int R = ranks();
  const std::vector<int64_t> tokenSets[] = {cycled(R, {1024}), cycled(R, {777, 1024}), cycled(R, {0, 1}),
                                            cycled(R, {1024, 0, 300, 1})};
  for (const auto& tokens : tokenSets) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer %s\n", runBackwardCase(g, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// Training steps on a layer whose forward deduplicates tokens (the forward that keeps h, dedup=1), then the plain
// backward re-dispatches.
TEST_P(LayerTest, BackwardAfterDedupForward) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {0, true, true, 0}, parseEnv(), rng));
  const std::vector<int64_t> tokenSets[] = {cycled(ranks(), {1024, 777}), cycled(ranks(), {0, 1})};
  for (const auto& tokens : tokenSets) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer dedup %s\n", runBackwardCase(g, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// SwiGLU clamp 7.0 with x ~ N(0, 4²): the clamped components' gradients are 0. The clamp must change the reference
// dx (checked on the host, so that the case can tell), and the kernels must match the clamped reference.
TEST_P(LayerTest, BackwardSwigluClamp) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  constexpr int64_t kClampMilli = 7000;
  constexpr float kXScale = 4.f;
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {kClampMilli, true, false, 0}, parseEnv(), rng));
  std::vector<Inputs> probe(size_t(g.size()));
  for (int r = 0; r < g.size(); ++r)
    probe[size_t(r)] = makeInputs(rng, g.shape, Routing::kUniform, r, 128, 0, kXScale, true);
  const BackwardReference plain = backwardReference(g, probe, 0), clamped = backwardReference(g, probe, kClampMilli);
  // dW1 of expert 0 (on rank 0): its rows, plain and clamped.
  const int64_t rows = 2 * g.shape.inter, width = g.shape.hidden;
  std::vector<float> dW1Plain(size_t(rows * width)), dW1Clamped(dW1Plain.size());
  for (int64_t row = 0; row < rows; ++row) {
    plain.dW1Row(0, row, &dW1Plain[size_t(row * width)]);
    clamped.dW1Row(0, row, &dW1Clamped[size_t(row * width)]);
  }
  const double dxEffect = relativeError(plain.ranks[0].dx, clamped.ranks[0].dx),
               dW1Effect = relativeError(dW1Plain, dW1Clamped);
  std::printf("clamp %.1f changes the reference dx by %.3g, dW1[0] by %.3g (relative)\n", kClampMilli / 1000.0,
              dxEffect, dW1Effect);
  EXPECT_GT(dxEffect, 5 * kTolerance) << "the inputs do not exercise the clamp";
  const std::vector<int64_t> tokenSets[] = {cycled(ranks(), {1024, 777}), cycled(ranks(), {256, 1024})};
  const Routing routings[] = {Routing::kUniform, Routing::kSparse};
  for (int c = 0; c < 2; ++c) {
    std::printf("SUMMARY layer %s\n", runBackwardCase(g, rng, routings[c], tokenSets[c], kXScale, true).c_str());
    if (HasFailure()) return;
  }
}

// What a training forward keeps for the backward: h and the routing tables; without recomputation the dispatched x
// as well, which is exactly (received rows = ranks x max_tokens x topk) x H bf16 more. A layer built without
// training refuses backward() (kInvalidArgument naming "training") before enqueueing anything: its forward still
// works.
TEST_P(LayerTest, BackwardKeepsLessThanWithoutRecompute) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  const Shape s = smallShape(ranks());
  const uint64_t receivedRows = uint64_t(s.ranks * s.maxTokens * s.topk);
  {
    Group g;
    ASSERT_NO_FATAL_FAILURE(openGroup(g, s, {0, true, false, 0}, parseEnv(), rng));
    for (int r = 0; r < g.size(); ++r) {
      const MoeLayer& layer = *g[r].layer;
      const uint64_t kept = layer.keptBytes(), without = layer.keptBytesWithoutRecompute();
      std::printf("SUMMARY layer kept bytes rank %d of %d: %llu with recompute, %llu without (the dispatched x: "
                  "%llu)\n",
                  r, g.size(), static_cast<unsigned long long>(kept), static_cast<unsigned long long>(without),
                  static_cast<unsigned long long>(receivedRows * uint64_t(s.hidden) * 2));
      EXPECT_GT(kept, 0u) << "rank " << r;
      EXPECT_GT(without, 0u) << "rank " << r;
      EXPECT_GE(kept, receivedRows * uint64_t(2 * s.inter) * 2) << "rank " << r
                                                                 << ": less than h (received rows x 2I)";
      EXPECT_EQ(int64_t(without) - int64_t(kept), int64_t(receivedRows) * s.hidden * 2)
          << "rank " << r << ": recomputation must save exactly the dispatched x (" << receivedRows << " rows x H)";
    }
  }
  {
    Group g;
    ASSERT_NO_FATAL_FAILURE(openGroup(g, s, {}, parseEnv(), rng));
    const std::vector<int64_t> tokens = cycled(ranks(), {64});
    std::printf("SUMMARY layer %s\n", runCase(g, rng, Routing::kUniform, tokens, 1.f, false).c_str());
    for (int r = 0; r < g.size(); ++r) {
      Rank& rank = g[r];
      expectInvalidArgument([&] { rank.layer->backward(rank.backwardArgs(tokens[size_t(r)]), rank.stream); },
                            "training", "rank " + std::to_string(r) + ": backward on a layer built without training");
    }
    std::printf("SUMMARY layer %s\n", runCase(g, rng, Routing::kUniform, tokens, 1.f, false).c_str());
  }
}

// Host-visible bad backward arguments throw Error(kInvalidArgument) before anything is enqueued: a backward before any
// forward, tokens other than the last forward's (naming "tokens"), a null pointer. A checked training step on every
// rank works afterwards (had one rank enqueued a kernel, the ranks' epochs would disagree or its waits time out).
TEST_P(LayerTest, BackwardInvalidArgumentsThrowBeforeEnqueue) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {0, true, false, 0}, parseEnv(), rng));
  constexpr int64_t kTokens = 256;
  const std::vector<int64_t> tokens = cycled(ranks(), {kTokens});
  for (int r = 0; r < g.size(); ++r) {
    Rank& rank = g[r];
    expectInvalidArgument([&] { rank.layer->backward(rank.backwardArgs(kTokens), rank.stream); }, nullptr,
                          "rank " + std::to_string(r) + ": backward before any forward");
  }
  for (int r = 0; r < g.size(); ++r)
    upload(g[r], makeInputs(rng, g.shape, Routing::kUniform, r, kTokens, 0, 1.f, true));
  forwardAll(g, tokens);
  const std::pair<const char*, DevicePtr BackwardArgs::*> pointers[] = {
      {"dy", &BackwardArgs::dy}, {"x", &BackwardArgs::x},   {"topk_idx", &BackwardArgs::topkIdx},
      {"dx", &BackwardArgs::dx}, {"dW1", &BackwardArgs::dW1}, {"d_topk_weights", &BackwardArgs::dTopkWeights}};
  for (int r = 0; r < g.size(); ++r) {
    Rank& rank = g[r];
    const std::string at = "rank " + std::to_string(r) + ": ";
    for (const int64_t bad : {kTokens - 1, kTokens + 1, int64_t(0)})
      expectInvalidArgument([&] { rank.layer->backward(rank.backwardArgs(bad), rank.stream); }, "tokens",
                            at + "backward tokens = " + std::to_string(bad) + " after a forward of " +
                                std::to_string(kTokens));
    for (const auto& [name, field] : pointers) {
      BackwardArgs args = rank.backwardArgs(kTokens);
      args.*field = 0;
      expectInvalidArgument([&] { rank.layer->backward(args, rank.stream); }, nullptr, at + name + " null");
    }
  }
  std::printf("SUMMARY layer %s\n", runBackwardCase(g, rng, Routing::kUniform, tokens, 1.f, false).c_str());
}

// The backward's case for compute-sanitizer (memcheck, racecheck): 64 tokens per rank, one training step, checked.
TEST_P(LayerTest, SmallBackward) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  checkTrainingStep(smallShape(ranks()), "", {64});
}

// Training steps on the layer whose combines reduce in column chunks: every routing, full and ragged token counts
// (a rank without tokens still passes every chunk), each checked and repeated.
TEST_P(LayerTest, ChunkedCombinesMatchReference) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, chunkedShape(ranks()), {0, true, false, 0}, parseEnv(), rng));
  const int R = ranks();
  for (const auto& tokens : {cycled(R, {1024}), cycled(R, {1024, 0, 300, 1})}) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer H=1024 %s\n", runBackwardCase(g, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// The chunked combines' case for compute-sanitizer: 64 tokens per rank, one training step, checked.
TEST_P(LayerTest, SmallChunkedBackward) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  checkTrainingStep(chunkedShape(ranks()), "H=1024 ", {64});
}

// Every layer kernel at I=640 (oddHalvesShape): one training step at uneven token counts, checked.
TEST_P(LayerTest, OddHalvesBackward) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  checkTrainingStep(oddHalvesShape(ranks()), "I=640 ", {1024, 97});
}

}  // namespace
}  // namespace megamoe::layertest
