// What the layer refuses and how it fails, at 2 and at 8 ranks: host-visible bad forward arguments throw
// kInvalidArgument before anything is enqueued; an out-of-range expert index on one rank is kBadIndex there and a
// bounded timeout on the others; a rank whose forward is never launched makes every other rank's wait end in a
// timeout (bounded at 300 ms) naming it; ranks calling another layer or role than their peers' get kCallMismatch on
// every rank, naming both calls. After a device error every heap refuses further calls.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerChecks.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/SymmetricHeap.h"
#include "megamoe/Workspace.h"

namespace megamoe::layertest {
namespace {

// Host-visible bad arguments throw before anything is enqueued: a normal call on every rank still works afterwards
// (had one rank enqueued a kernel, the ranks' epochs would disagree).
TEST_P(LayerTest, InvalidArgumentsThrowBeforeEnqueue) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {}, parseEnv(), rng));
  const int64_t maxTokens = g.shape.maxTokens;
  for (int r = 0; r < g.size(); ++r) {
    Rank& rank = g[r];
    const std::string at = "rank " + std::to_string(r) + ": ";
    expectInvalidArgument([&] { rank.layer->forward(rank.args(maxTokens + 1), rank.stream); }, "max_tokens",
                          at + "tokens = max_tokens + 1");
    expectInvalidArgument([&] { rank.layer->forward(rank.args(-1), rank.stream); }, "max_tokens",
                          at + "tokens = -1");
    ForwardArgs nullX = rank.args(1);
    nullX.x = 0;
    expectInvalidArgument([&] { rank.layer->forward(nullX, rank.stream); }, nullptr, at + "x null, tokens = 1");
  }
  std::printf("SUMMARY layer %s\n", runCase(g, rng, Routing::kUniform, cycled(ranks(), {64}), 1.f, false).c_str());
}

// Expert index E in one random rank's topk_idx: that rank reports kBadIndex naming it and writes nothing into y; every
// other rank's waits end in a timeout (bounded at 300 ms here) instead of a hang; every heap then refuses calls.
TEST_P(LayerTest, BadExpertIndexBecomesDeviceError) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  const RuntimeEnv env = envWithWaitTimeout(300);
  ASSERT_EQ(env.waitTimeoutMs, 300u);
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(R), {}, env, rng));
  const int64_t E = g.shape.experts;
  const std::vector<int64_t> tokens = cycled(R, {256});
  const int badRank = std::uniform_int_distribution<int>(0, R - 1)(rng);
  std::vector<Inputs> in(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) in[size_t(r)] = makeInputs(rng, g.shape, Routing::kUniform, r, tokens[size_t(r)], 0, 1.f);
  const size_t bad = std::uniform_int_distribution<size_t>(0, in[size_t(badRank)].topkIdx.size() - 1)(rng);
  in[size_t(badRank)].topkIdx[bad] = int32_t(E);
  for (int r = 0; r < R; ++r) {
    upload(g[r], in[size_t(r)]);
    g[r].fillSentinels();
  }

  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < R; ++r) g[r].layer->forward(g[r].args(tokens[size_t(r)]), g[r].stream);
  std::vector<std::string> message(static_cast<size_t>(R));
  std::vector<ErrorCode> code(static_cast<size_t>(R), ErrorCode::kOk);
  std::vector<double> after(static_cast<size_t>(R), 0.0);
  for (int r = 0; r < R; ++r) {
    try {
      g[r].layer->checkErrors(g[r].stream);
    } catch (const Error& e) {
      code[size_t(r)] = e.code();
      message[size_t(r)] = e.what();
    }
    after[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("SUMMARY layer bad index (%s, topk_idx[%zu] = %lld on rank %d):", placement(*backend_, R).c_str(), bad,
              static_cast<long long>(E), badRank);
  for (int r = 0; r < R; ++r) std::printf(" rank %d after %.3f s: \"%s\";", r, after[size_t(r)], message[size_t(r)].c_str());
  std::printf("\n");

  const std::string badPrefix = "rank " + std::to_string(badRank) + ": index out of range";
  for (int r = 0; r < R; ++r) {
    const std::string& m = message[size_t(r)];
    EXPECT_EQ(code[size_t(r)], ErrorCode::kDeviceError) << "rank " << r << ": " << m;
    EXPECT_LT(after[size_t(r)], 30.0) << "rank " << r << ": the errors took too long (wait timeout 300 ms)";
    if (r == badRank) {
      EXPECT_EQ(m.rfind(badPrefix, 0), 0u) << m;
      EXPECT_NE(m.find("(value " + std::to_string(E)), std::string::npos)
          << "rank " << r << "'s error does not name the bad value " << E << ": " << m;
    } else {
      EXPECT_EQ(m.rfind("rank " + std::to_string(r) + ": ", 0), 0u) << m;
      EXPECT_NE(m.find("timed out"), std::string::npos) << m;
    }
  }

  const std::vector<uint16_t> y = g[badRank].readY();
  const size_t touched = size_t(std::count_if(y.begin(), y.end(), [](uint16_t v) { return v != kSentinel; }));
  EXPECT_EQ(touched, 0u) << "rank " << badRank << " wrote into y after its bad index";

  for (int r = 0; r < R; ++r) {
    Rank& rank = g[r];
    EXPECT_FALSE(rank.layer->heap().usable()) << "rank " << r;
    ErrorCode again = ErrorCode::kOk;
    std::string text;
    try {
      rank.layer->forward(rank.args(tokens[size_t(r)]), rank.stream);
    } catch (const Error& e) {
      again = e.code();
      text = e.what();
    }
    EXPECT_EQ(again, ErrorCode::kHeapUnusable) << "rank " << r << ": a call after the device error: " << text;
  }
}

// One random rank's forward is never launched: every other rank's first wait for it (dispatch_prologue's count
// exchange, which waits for each source rank's flag in turn) times out after 300 ms into a device error whose flag
// is that rank's exchange flag (FlagKind::kPeer, index = the awaited source rank: kernels/DispatchPrologue.cpp), seen
// 0 of 1 at epoch 0. The absent rank's heap stays usable; the others' refuse further calls.
TEST_P(LayerTest, AbsentRankMakesEveryOtherRankTimeOut) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  constexpr uint64_t kTimeoutMs = 300;
  const RuntimeEnv env = envWithWaitTimeout(kTimeoutMs);
  ASSERT_EQ(env.waitTimeoutMs, kTimeoutMs);
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(R), {}, env, rng));
  ASSERT_EQ(commonEpoch(g, "fresh layer"), 0u);
  const int absent = std::uniform_int_distribution<int>(0, R - 1)(rng);
  const std::vector<int64_t> tokens = cycled(R, {256, 100});
  for (int r = 0; r < R; ++r) {
    upload(g[r], makeInputs(rng, g.shape, Routing::kUniform, r, tokens[size_t(r)], 0, 1.f));
    g[r].fillSentinels();
  }

  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < R; ++r)
    if (r != absent) g[r].layer->forward(g[r].args(tokens[size_t(r)]), g[r].stream);
  std::vector<std::string> message(static_cast<size_t>(R));
  std::vector<ErrorCode> code(static_cast<size_t>(R), ErrorCode::kOk);
  std::vector<double> after(static_cast<size_t>(R), 0.0);
  for (int r = 0; r < R; ++r) {
    if (r == absent) continue;
    try {
      g[r].layer->checkErrors(g[r].stream);
    } catch (const Error& e) {
      code[size_t(r)] = e.code();
      message[size_t(r)] = e.what();
    }
    after[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("SUMMARY layer absent rank %d (%s, wait timeout %llu ms):", absent, placement(*backend_, R).c_str(),
              static_cast<unsigned long long>(kTimeoutMs));
  for (int r = 0; r < R; ++r)
    if (r != absent) std::printf(" rank %d after %.3f s: \"%s\";", r, after[size_t(r)], message[size_t(r)].c_str());
  std::printf("\n");

  const std::string awaited = "cross-rank wait for rank " + std::to_string(absent) + " timed out (seen 0, expected 1)";
  for (int r = 0; r < R; ++r) {
    if (r == absent) continue;
    const std::string& m = message[size_t(r)];
    EXPECT_EQ(code[size_t(r)], ErrorCode::kDeviceError) << "rank " << r << ": " << m;
    EXPECT_EQ(m.rfind("rank " + std::to_string(r) + ": " + awaited, 0), 0u)
        << "rank " << r << "'s error must be its wait for absent rank " << absent << " (\"rank " << r << ": "
        << awaited << " ...\"): " << m;
    EXPECT_GE(after[size_t(r)], kTimeoutMs / 1000.0 * 0.9) << "rank " << r << " gave up before its timeout";
    EXPECT_LT(after[size_t(r)], 30.0) << "rank " << r << ": the timeout took too long (wait timeout 300 ms)";
    EXPECT_FALSE(g[r].layer->heap().usable()) << "rank " << r;
  }
  // The absent rank ran nothing: its error record is clear and its heap usable.
  EXPECT_NO_THROW(g[absent].layer->checkErrors(g[absent].stream));
  EXPECT_TRUE(g[absent].layer->heap().usable());
}

// Ranks calling another layer or role than their peers at the same point (issue 46 item 7). Each case makes a fresh
// workspace per rank with two training layers of one shape (numbers 0 and 1, created in the same order on every
// rank) and first runs the same calls on every rank (layer 0's forward, then layer 1's: no error); then rank 0 runs
// layer 0's forward while every other rank runs layer 1's forward ("another layer"), or its backward ("another
// role"). Every rank's record must say kCallMismatch, naming the first peer whose call differs (rank 0: rank 1;
// every other rank: rank 0) and both calls; y, dx, d_topk_weights and dW1 stay sentinels (not dW2: its GEMM takes
// no device context and runs on the routing tables the last prologue left); no rank waits out a timeout (300 ms
// here); every heap refuses calls afterwards. Without the check the first case gave no error at all (rank 0's rows were
// multiplied by layer 1's weights) and the second timed out.
TEST_P(LayerTest, AnotherLayerOrRoleThanAPeersIsAnErrorOnEveryRank) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  constexpr uint64_t kTimeoutMs = 300;
  const RuntimeEnv env = envWithWaitTimeout(kTimeoutMs);
  ASSERT_EQ(env.waitTimeoutMs, kTimeoutMs);
  std::mt19937 rng = testRng();
  Group g;  // the runtimes, streams, buffers and weights; its own layers are not used
  const Shape s = smallShape(R);
  const LayerOptions o{0, true, false, 0};
  ASSERT_NO_FATAL_FAILURE(openGroup(g, s, o, env, rng));
  const MoeLayerConfig config = layerConfig(s, o);
  std::vector<Runtime*> runtimes;
  std::vector<DevicePtr> saved;
  for (int r = 0; r < R; ++r) {
    runtimes.push_back(g[r].runtime.get());
    saved.push_back(g[r].device().allocate(size_t(MoeLayer::savedBytes(config, R))));
  }
  const std::vector<int64_t> tokens = cycled(R, {256, 100});
  struct Call {
    int layer;
    bool backward;
  };
  struct Case {
    const char* name;
    std::function<Call(int)> of;  // rank r's mismatched call
  };
  const Case cases[] = {{"another layer", [](int r) { return Call{r == 0 ? 0 : 1, false}; }},
                        {"another role", [](int r) { return Call{0, r != 0}; }}};
  auto describe = [](const Call& c) {
    return "layer " + std::to_string(c.layer) + (c.backward ? " backward" : " forward");
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto workspaces = Workspace::createLocal(runtimes, config);
    std::vector<std::vector<std::unique_ptr<MoeLayer>>> layers(static_cast<size_t>(R));  // [rank][layer]
    for (int l = 0; l < 2; ++l)
      for (int r = 0; r < R; ++r) layers[size_t(r)].push_back(MoeLayer::create(workspaces[size_t(r)], config));
    auto run = [&](int r, const Call& call) {
      MoeLayer& layer = *layers[size_t(r)][size_t(call.layer)];
      if (call.backward) {
        BackwardArgs b = g[r].backwardArgs(tokens[size_t(r)]);
        b.saved = saved[size_t(r)];
        layer.backward(b, g[r].stream);
      } else {
        ForwardArgs a = g[r].args(tokens[size_t(r)]);
        a.saved = saved[size_t(r)];
        layer.forward(a, g[r].stream);
      }
    };
    for (int r = 0; r < R; ++r)
      upload(g[r], makeInputs(rng, s, Routing::kUniform, r, tokens[size_t(r)], 0, 1.f, /*training=*/true));
    // The same calls on every rank pass the check.
    for (int l = 0; l < 2; ++l)
      for (int r = 0; r < R; ++r) run(r, {l, false});
    for (int r = 0; r < R; ++r) ASSERT_NO_THROW(layers[size_t(r)][0]->checkErrors(g[r].stream)) << "rank " << r;
    for (int r = 0; r < R; ++r) g[r].fillSentinels();

    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < R; ++r) run(r, c.of(r));
    std::vector<std::string> message(static_cast<size_t>(R));
    std::vector<ErrorCode> code(static_cast<size_t>(R), ErrorCode::kOk);
    std::vector<double> after(static_cast<size_t>(R), 0.0);
    for (int r = 0; r < R; ++r) {
      try {
        layers[size_t(r)][0]->checkErrors(g[r].stream);
      } catch (const Error& e) {
        code[size_t(r)] = e.code();
        message[size_t(r)] = e.what();
      }
      after[size_t(r)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    std::printf("SUMMARY layer call mismatch, %s (%s, wait timeout %llu ms):", c.name, placement(*backend_, R).c_str(),
                static_cast<unsigned long long>(kTimeoutMs));
    for (int r = 0; r < R; ++r)
      std::printf(" rank %d after %.3f s: \"%s\";", r, after[size_t(r)], message[size_t(r)].c_str());
    std::printf("\n");
    for (int r = 0; r < R; ++r) {
      const int peer = r == 0 ? 1 : 0;  // the first rank whose call differs from rank r's
      const std::string expected = "rank " + std::to_string(r) + ": layer call differs from rank " +
                                   std::to_string(peer) + "'s (this rank: " + describe(c.of(r)) + "; rank " +
                                   std::to_string(peer) + ": " + describe(c.of(peer)) + "): every rank must call";
      const std::string& m = message[size_t(r)];
      EXPECT_EQ(code[size_t(r)], ErrorCode::kDeviceError) << "rank " << r << ": " << m;
      EXPECT_EQ(m.rfind(expected, 0), 0u) << "rank " << r << ": expected \"" << expected << " ...\", got: " << m;
      EXPECT_LT(after[size_t(r)], 30.0) << "rank " << r << ": the error took too long (wait timeout 300 ms)";
      EXPECT_FALSE(workspaces[size_t(r)]->heap().usable()) << "rank " << r;
      const Rank& rank = g[r];
      auto untouched = [&](const char* name, DevicePtr at, size_t elems) {
        const std::vector<uint16_t> v = rank.read<uint16_t>(at, elems);
        EXPECT_EQ(size_t(std::count(v.begin(), v.end(), kSentinel)), v.size())
            << "rank " << r << " wrote into " << name << " after the mismatch";
      };
      untouched("y", rank.y, s.yElems());
      untouched("dx", rank.dx, s.yElems());
      untouched("dW1", rank.dW1, s.dW1Elems());
      const std::vector<uint32_t> dtw = rank.read<uint32_t>(rank.dTopkWeights, s.dTopkElems());
      EXPECT_EQ(size_t(std::count(dtw.begin(), dtw.end(), kSentinel32)), dtw.size())
          << "rank " << r << " wrote into d_topk_weights after the mismatch";
    }
  }
  for (int r = 0; r < R; ++r) g[r].device().free(saved[size_t(r)]);
}

}  // namespace
}  // namespace megamoe::layertest
