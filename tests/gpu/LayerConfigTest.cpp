// The layer under its settings and ways of being built, at 2 and at 8 ranks on the small layer: the small forwards
// (plain and with dedupTokens) that compute-sanitizer runs; the default SM budgets of the ranks sharing a device,
// and a training step at the smallest budget (2 SMs); int64 topk_idx bitwise equal to int32; a receive capacity
// overflowed (an error on every rank) and dropped past (dropOverflow: bitwise the step on the kept picks, the drops
// counted); one Workspace per rank serving several layers with forwards outstanding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerChecks.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Workspace.h"

namespace megamoe::layertest {
namespace {

// Small enough for compute-sanitizer (memcheck, racecheck): 64 tokens per rank, one call, checked.
TEST_P(LayerTest, SmallForward) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {}, parseEnv(), rng));
  std::printf("SUMMARY layer %s\n", runCase(g, rng, Routing::kUniform, cycled(ranks(), {64}), 1.f, false).c_str());
}

// The same with token deduplication (the forward's gathering L1 tiles and carrier pushes under the sanitizers).
TEST_P(LayerTest, SmallForwardDedup) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {0, false, true, 0}, parseEnv(), rng));
  std::printf("SUMMARY layer dedup %s\n",
              runCase(g, rng, Routing::kUniform, cycled(ranks(), {64}), 1.f, false).c_str());
}

// The default SM budgets (MoeLayerConfig::smBudget 0): the device's SMs shared by the ranks on it, rounded down to
// even (66 each for 2 ranks on an H200, 16 each for 8), all of them fitting the device together; then a checked call.
TEST_P(LayerTest, DefaultSmBudgetsShareTheDevice) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  if (std::getenv("MEGAMOE_SM_BUDGET")) GTEST_SKIP() << "MEGAMOE_SM_BUDGET is set: the default is not in use";
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(R), {}, parseEnv(), rng));
  std::string budgets;
  for (int r = 0; r < R; ++r) {
    const int ordinal = g[r].device().ordinal();
    int sharing = 0, used = 0;
    for (int q = 0; q < R; ++q)
      if (g[q].device().ordinal() == ordinal) {
        ++sharing;
        used += g[q].layer->smBudget();
      }
    const int sms = g[r].device().multiprocessors();
    EXPECT_EQ(g[r].layer->smBudget(), (sms / sharing) & ~1)
        << "rank " << r << ": " << sharing << " ranks share device " << ordinal << " (" << sms << " SMs)";
    EXPECT_LE(used, sms) << "the budgets of the ranks on device " << ordinal << " exceed its SMs";
    budgets += (budgets.empty() ? "" : ",") + std::to_string(g[r].layer->smBudget());
  }
  std::printf("SUMMARY layer SM budgets (%s): %s; %s\n", placement(*backend_, R).c_str(), budgets.c_str(),
              runCase(g, rng, Routing::kUniform, cycled(R, {256, 0, 97}), 1.f, false).c_str());
}

// topk_idx as int64 (MoeLayerConfig::topkIdxInt64): the same inputs and weights as an int32 layer, -1 picks included,
// give the bitwise same y on every rank.
TEST_P(LayerTest, Int64TopkIdxMatchesInt32) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  std::mt19937 rng = testRng();
  const Shape s = smallShape(R);
  Group narrow;
  ASSERT_NO_FATAL_FAILURE(openGroup(narrow, s, {}, parseEnv(), rng));
  MoeLayerConfig config = layerConfig(s, {});
  config.topkIdxInt64 = true;
  std::vector<Runtime*> runtimes;
  for (int r = 0; r < R; ++r) runtimes.push_back(narrow[r].runtime.get());
  auto layers = MoeLayer::createLocal(runtimes, config);
  const std::vector<int64_t> tokens = cycled(R, {300, 0, 77});
  size_t differing = 0;
  for (int r = 0; r < R; ++r) {
    const Inputs in = makeInputs(rng, s, Routing::kSparse, r, tokens[size_t(r)], 0, 1.f);
    upload(narrow[r], in);
    narrow[r].fillSentinels();
  }
  forwardAll(narrow, tokens);
  std::vector<std::vector<uint16_t>> y32;
  for (int r = 0; r < R; ++r) y32.push_back(narrow[r].readY());
  // The same call through the int64 layers: topk_idx widened, y into the same (re-filled) buffer.
  std::vector<DevicePtr> idx64(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    Device& d = narrow[r].device();
    const std::vector<int32_t> idx = readBack<int32_t>(d, narrow[r].topkIdx, size_t(s.maxTokens * s.topk));
    const std::vector<int64_t> wideIdx(idx.begin(), idx.end());
    idx64[size_t(r)] = d.allocate(wideIdx.size() * 8);
    uploadAndWait(d, idx64[size_t(r)], wideIdx.data(), wideIdx.size() * 8);
    narrow[r].fillSentinels();
  }
  for (int r = 0; r < R; ++r) {
    ForwardArgs a = narrow[r].args(tokens[size_t(r)]);
    a.topkIdx = idx64[size_t(r)];
    layers[size_t(r)]->forward(a, narrow[r].stream);
  }
  for (int r = 0; r < R; ++r) layers[size_t(r)]->checkErrors(narrow[r].stream);
  for (int r = 0; r < R; ++r) {
    differing += countDiffering(y32[size_t(r)], narrow[r].readY());
    narrow[r].device().free(idx64[size_t(r)]);
  }
  EXPECT_EQ(differing, 0u) << "int64 topk_idx gave another y";
  std::printf("SUMMARY layer int64 topk_idx (%s): y of %s tokens bitwise equal to int32's: %s\n",
              placement(*backend_, R).c_str(), joined(tokens).c_str(), differing ? "NO" : "yes");
  for (auto& l : layers) l.reset();
}

// Every rank's inputs (tokensOf(r) tokens on rank r) with rank 1's first expert among every token's picks, and in
// `received` the rows each owner would receive from them.
std::vector<Inputs> hotExpertInputs(std::mt19937& rng, const Shape& s, const std::function<int64_t(int)>& tokensOf,
                                    bool training, std::vector<int64_t>* received) {
  const int32_t hot = int32_t(s.local());
  std::vector<Inputs> in;
  received->assign(size_t(s.ranks), 0);
  for (int r = 0; r < s.ranks; ++r) {
    in.push_back(makeInputs(rng, s, Routing::kHotExpert, r, tokensOf(r), hot, 1.f, training));
    for (int32_t e : in.back().topkIdx)
      if (e >= 0) ++(*received)[size_t(e / s.local())];
  }
  return in;
}

// A receive capacity just below what a routing sends to one rank (every token picks one hot expert of rank 1; every
// other rank receives less): every rank's prologue sees it before a row moves, every rank's error record says
// kCapacity naming rank 1 and exactly the rows it needed, and nothing is written into y (all sentinels).
TEST_P(LayerTest, ReceiveCapacityOverflowIsAnErrorOnEveryRank) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  std::mt19937 rng = testRng();
  const Shape s = smallShape(R);
  std::vector<int64_t> received;  // rows each owner would receive
  const std::vector<Inputs> in = hotExpertInputs(rng, s, [](int) { return int64_t(256); }, false, &received);
  int64_t others = 0;
  for (int r = 0; r < R; ++r)
    if (r != 1) others = std::max(others, received[size_t(r)]);
  ASSERT_GT(received[1], others + 1) << "the hot owner must receive the most";
  Group g;
  LayerOptions o;
  o.receiveCapacity = received[1] - 1;  // rank 1's rows do not fit; every other rank's do
  ASSERT_NO_FATAL_FAILURE(openGroup(g, s, o, parseEnv(), rng));
  for (int r = 0; r < R; ++r) {
    upload(g[r], in[size_t(r)]);
    g[r].fillSentinels();
  }
  for (int r = 0; r < R; ++r) g[r].layer->forward(g[r].args(256), g[r].stream);
  const std::string expected = "capacity exceeded at site 1 (needed " + std::to_string(received[1]) + ", capacity " +
                               std::to_string(received[1] - 1) + ")";
  for (int r = 0; r < R; ++r) {
    std::string message;
    ErrorCode code = ErrorCode::kOk;
    try {
      g[r].layer->checkErrors(g[r].stream);
    } catch (const Error& e) {
      code = e.code();
      message = e.what();
    }
    EXPECT_EQ(code, ErrorCode::kDeviceError) << "rank " << r << ": " << message;
    EXPECT_EQ(message.rfind("rank " + std::to_string(r) + ": " + expected, 0), 0u) << "rank " << r << ": " << message;
    const std::vector<uint16_t> y = g[r].readY();
    EXPECT_EQ(size_t(std::count(y.begin(), y.end(), kSentinel)), y.size()) << "rank " << r << " wrote into y";
    if (r == 0)
      std::printf("SUMMARY layer receive capacity (%s): \"%s\"\n", placement(*backend_, R).c_str(), message.c_str());
  }
}

// Dropping past the capacity (MoeLayerConfig::dropOverflow): with a hot expert of rank 1 and a capacity below what
// rank 1 receives, the picks whose rows would lie past it (rank 1's pool: local experts in order, each by source
// rank, each source's picks in order) are dropped. A training step must be bitwise the step of a layer that does not
// drop, given the same inputs with exactly those picks -1 (y, dx, d_topk_weights, dW1, dW2, guard rows included);
// each rank's count must be its dropped picks (the backward's rerun not counted again); the caller's topk_idx
// stays as it was. Two capacities: 37 rows short (a cut mostly inside one source's rows of one expert), and halfway
// between the other ranks' rows and rank 1's (several sources' rows of an expert start past it: none of them kept).
TEST_P(LayerTest, ReceiveCapacityDropsThePicksPastItAndCountsThem) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  std::mt19937 rng = testRng();
  const Shape s = smallShape(R);
  std::vector<int64_t> received;
  const std::vector<Inputs> in =
      hotExpertInputs(rng, s, [](int r) { return int64_t(200 + 13 * r); }, /*training=*/true, &received);
  int64_t others = 0;
  for (int r = 0; r < R; ++r)
    if (r != 1) others = std::max(others, received[size_t(r)]);
  const int64_t shortBy37 = received[1] - 37, halfway = (received[1] + others) / 2;
  ASSERT_GT(shortBy37, others) << "only rank 1 may overflow in this test";
  std::vector<int64_t> tokens;
  for (const Inputs& i : in) tokens.push_back(i.tokens);
  for (const int64_t capacity : {shortBy37, halfway}) {
    SCOPED_TRACE("capacity " + std::to_string(capacity));
    // The picks a capacity drops, and the inputs with them as -1; `ranges` counts the (expert, source) rows that
    // start past the capacity.
    std::vector<Inputs> kept = in;
    std::vector<int64_t> dropped(size_t(R), 0);
    int64_t ranges = 0;
    for (int owner = 0; owner < R; ++owner) {
      int64_t row = 0;
      for (int64_t el = 0; el < s.local(); ++el)
        for (int src = 0; src < R; ++src) {
          bool first = true;
          for (int32_t& e : kept[size_t(src)].topkIdx)
            if (e == int32_t(owner * s.local() + el)) {
              if (row >= capacity) {
                e = -1;
                ++dropped[size_t(src)];
                ranges += first;
              }
              first = false;
              ++row;
            }
        }
    }
    ASSERT_EQ(std::accumulate(dropped.begin(), dropped.end(), int64_t(0)), received[1] - capacity);
    if (capacity == halfway) {
      ASSERT_GT(ranges, 1) << "the second capacity must lie before whole ranges";
    }
    LayerOptions dropping;
    dropping.training = true;
    dropping.receiveCapacity = capacity;
    LayerOptions strict = dropping;
    dropping.dropOverflow = true;
    const uint64_t seeds = (uint64_t(rng()) << 32) | uint64_t(rng());
    auto step = [&](const LayerOptions& o, const std::vector<Inputs>& inputs, std::vector<uint64_t>* counts) {
      Group g;
      openGroup(g, s, o, parseEnv(), rng, seeds);
      for (int r = 0; r < R; ++r) {
        g[r].fillSentinels();
        upload(g[r], inputs[size_t(r)]);
      }
      stepAll(g, tokens);
      std::vector<std::vector<uint8_t>> out;
      for (int r = 0; r < R; ++r) {
        out.push_back(outputBytes(g[r]));
        if (counts) {
          counts->push_back(g[r].layer->droppedPicks(g[r].stream));
          const std::vector<int32_t> idx = g[r].read<int32_t>(g[r].topkIdx, inputs[size_t(r)].topkIdx.size());
          EXPECT_EQ(idx, inputs[size_t(r)].topkIdx) << "rank " << r << ": the caller's topk_idx changed";
        }
      }
      return out;
    };
    std::vector<uint64_t> counts;
    const auto got = step(dropping, in, &counts);
    const auto want = step(strict, kept, nullptr);
    size_t differing = 0;
    for (int r = 0; r < R; ++r) {
      ASSERT_EQ(got[size_t(r)].size(), want[size_t(r)].size());
      for (size_t i = 0; i < got[size_t(r)].size(); ++i) differing += got[size_t(r)][i] != want[size_t(r)][i];
      EXPECT_EQ(counts[size_t(r)], uint64_t(dropped[size_t(r)])) << "rank " << r << "'s dropped picks";
    }
    EXPECT_EQ(differing, 0u) << "bytes of the dropping step that differ from the strict step on the kept picks";
    std::printf("SUMMARY layer drop past the capacity (%s): capacity %lld of rank 1's %lld rows, %s picks dropped "
                "(per rank; %lld source ranges start past it), training step bitwise equal to the kept picks' (%zu "
                "bytes differ)\n",
                placement(*backend_, R).c_str(), (long long)capacity, (long long)received[1],
                joined(dropped).c_str(), (long long)ranges, differing);
  }
}

// One workspace per rank serving 4 training layers with different weights (MoeLayer::create(workspace, config)):
// 3 forwards outstanding (layers 0, 1, 2, each with its own inputs and its own caller-owned saved state), a whole
// step of layer 3 in between, then the backwards in reverse order. Every output and gradient of every call, guard
// rows included, must be bitwise equal to the same call made as a forward immediately followed by its backward;
// the workspace's bytes do not depend on the number of layers.
TEST_P(LayerTest, WorkspaceServesLayersWithForwardsOutstanding) {
  const int R = ranks();
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, R);
  std::mt19937 rng = testRng();
  Group g;  // the runtimes, streams and shape; its own layers are not used
  const Shape s = smallShape(R);
  ASSERT_NO_FATAL_FAILURE(openGroup(g, s, {0, true, false, 0}, parseEnv(), rng));
  const MoeLayerConfig config = layerConfig(s, {0, true, false, 0});
  std::vector<Runtime*> runtimes;
  for (int r = 0; r < R; ++r) runtimes.push_back(g[r].runtime.get());
  auto workspaces = Workspace::createLocal(runtimes, config);
  constexpr int kLayers = 4, kCalls = 4;  // call c runs on layer c
  std::vector<std::vector<std::unique_ptr<MoeLayer>>> layers(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r)
    for (int l = 0; l < kLayers; ++l) layers[size_t(r)].push_back(MoeLayer::create(workspaces[size_t(r)], config));
  const WorkspaceBytes bytes = workspaces[0]->bytes();
  EXPECT_EQ(bytes.total(), Workspace::bytesFor(config, R).total());
  const uint64_t savedBytes = MoeLayer::savedBytes(config, R);

  // Per rank and call: weights of the call's layer, inputs, outputs (sentinel-filled, with guard rows), saved state.
  struct Call {
    DevicePtr w1 = 0, w2 = 0, x = 0, idx = 0, wts = 0, dy = 0, y = 0, dx = 0, dtw = 0, dW1 = 0, dW2 = 0, saved = 0;
    int64_t tokens = 0;
  };
  std::vector<std::vector<Call>> calls(static_cast<size_t>(R), std::vector<Call>(kCalls));
  std::vector<std::pair<Device*, DevicePtr>> owned;
  const std::vector<int64_t> tokenSets[kCalls] = {cycled(R, {300, 64}), cycled(R, {0, 1000, 17}), cycled(R, {513}),
                                                  cycled(R, {64, 0})};
  for (int r = 0; r < R; ++r) {
    Device& d = g[r].device();
    auto alloc = [&](size_t bytesWanted) {
      owned.push_back({&d, d.allocate(bytesWanted)});
      return owned.back().second;
    };
    for (int c = 0; c < kCalls; ++c) {
      Call& k = calls[size_t(r)][size_t(c)];
      k.tokens = tokenSets[c][size_t(r)];
      const size_t w1Elems = size_t(s.w1Rows() * s.hidden), w2Elems = size_t(s.w2Rows() * s.inter);
      k.w1 = alloc(w1Elems * 2);
      k.w2 = alloc(w2Elems * 2);
      const std::vector<uint16_t> w1 = randomBf16(rng, w1Elems, float(1 / std::sqrt(double(s.hidden))));
      const std::vector<uint16_t> w2 = randomBf16(rng, w2Elems, float(1 / std::sqrt(double(s.inter))));
      uploadAndWait(d, k.w1, w1.data(), w1.size() * 2);
      uploadAndWait(d, k.w2, w2.data(), w2.size() * 2);
      const Inputs in = makeInputs(rng, s, Routing::kSparse, r, k.tokens, 0, 1.f, true);
      k.x = alloc(size_t(s.maxTokens * s.hidden) * 2);
      k.idx = alloc(size_t(s.maxTokens * s.topk) * 4);
      k.wts = alloc(size_t(s.maxTokens * s.topk) * 4);
      k.dy = alloc(size_t(s.maxTokens * s.hidden) * 2);
      if (k.tokens > 0) {
        uploadAndWait(d, k.x, in.x.data(), in.x.size() * 2);
        uploadAndWait(d, k.idx, in.topkIdx.data(), in.topkIdx.size() * 4);
        uploadAndWait(d, k.wts, in.topkWeights.data(), in.topkWeights.size() * 4);
        uploadAndWait(d, k.dy, in.dy.data(), in.dy.size() * 2);
      }
      k.y = alloc(s.yElems() * 2);
      k.dx = alloc(s.yElems() * 2);
      k.dtw = alloc(s.dTopkElems() * 4);
      k.dW1 = alloc(s.dW1Elems() * 2);
      k.dW2 = alloc(s.dW2Elems() * 2);
      k.saved = alloc(size_t(savedBytes));
    }
  }
  auto fill = [&](int r, const Call& k) {
    Device& d = g[r].device();
    fillDevice(d, k.y, s.yElems(), kSentinel);
    fillDevice(d, k.dx, s.yElems(), kSentinel);
    fillDevice(d, k.dtw, s.dTopkElems(), kSentinel32);
    fillDevice(d, k.dW1, s.dW1Elems(), kSentinel);
    fillDevice(d, k.dW2, s.dW2Elems(), kSentinel);
  };
  auto forward = [&](int c) {
    for (int r = 0; r < R; ++r) {
      const Call& k = calls[size_t(r)][size_t(c)];
      ForwardArgs a{k.x, k.tokens, k.idx, k.wts, k.w1, k.w2, k.y};
      a.saved = k.saved;
      layers[size_t(r)][size_t(c)]->forward(a, g[r].stream);
    }
  };
  auto backward = [&](int c) {
    for (int r = 0; r < R; ++r) {
      const Call& k = calls[size_t(r)][size_t(c)];
      BackwardArgs b{k.dy, k.x, k.tokens, k.idx, k.wts, k.w1, k.w2, k.dx, k.dtw, k.dW1, k.dW2};
      b.saved = k.saved;
      layers[size_t(r)][size_t(c)]->backward(b, g[r].stream);
    }
  };
  auto checkAll = [&] {
    for (int r = 0; r < R; ++r) layers[size_t(r)][0]->checkErrors(g[r].stream);
  };
  // Pairs first: each call's forward then its backward; keep every output.
  std::vector<std::vector<std::unique_ptr<Snapshot>>> pairs(static_cast<size_t>(R));
  for (int c = 0; c < kCalls; ++c) {
    for (int r = 0; r < R; ++r) fill(r, calls[size_t(r)][size_t(c)]);
    forward(c);
    backward(c);
    checkAll();
    for (int r = 0; r < R; ++r) {
      const Call& k = calls[size_t(r)][size_t(c)];
      pairs[size_t(r)].push_back(std::make_unique<Snapshot>());
      takeSnapshot(g[r].device(), s, {k.y, k.dx, k.dtw, k.dW1, k.dW2}, *pairs[size_t(r)].back());
    }
  }
  // Then interleaved: forwards 0, 1, 2 outstanding, a whole step of layer 3, the backwards 2, 1, 0.
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kCalls; ++c) fill(r, calls[size_t(r)][size_t(c)]);
  forward(0);
  forward(1);
  forward(2);
  forward(3);
  backward(3);
  backward(2);
  backward(1);
  backward(0);
  checkAll();
  size_t differing = 0;
  for (int r = 0; r < R; ++r) {
    Device& d = g[r].device();
    for (int c = 0; c < kCalls; ++c) {
      const Call& k = calls[size_t(r)][size_t(c)];
      const Snapshot& p = *pairs[size_t(r)][size_t(c)];
      const size_t n = countDiffering(d, s, {k.y, k.dx, k.dtw, k.dW1, k.dW2}, p);
      EXPECT_EQ(n, 0u) << "rank " << r << " call " << c << ": outputs differ from its forward-then-backward pair";
      differing += n;
      // The pair's outputs were checked nowhere else: at least y must be written where tokens are.
      if (k.tokens > 0) {
        const std::vector<uint16_t> y = readBack<uint16_t>(d, k.y, size_t(k.tokens * s.hidden));
        EXPECT_EQ(std::count(y.begin(), y.end(), kSentinel), 0) << "rank " << r << " call " << c << ": y not written";
      }
    }
  }
  for (const auto& [d, p] : owned) d->free(p);
  std::printf("SUMMARY layer workspace (%s): %d layers on one workspace per rank (%.1f MiB: heap %.1f + buffers "
              "%.1f, the same for 1 or %d layers), saved %.1f MiB per forward; 3 forwards outstanding, a step of a "
              "4th in between, backwards in reverse order: %zu elements differ from forward-then-backward pairs\n",
              placement(*backend_, R).c_str(), kLayers, bytes.total() / 1048576.0, bytes.heap / 1048576.0,
              bytes.buffers / 1048576.0, kLayers, savedBytes / 1048576.0, differing);
}

// The smallest budget (2 SMs, one cluster pair, per rank): every persistent kernel runs on a grid of 2, its push
// blocks included; the outputs of a training step must not depend on the grid.
TEST_P(LayerTest, TrainingStepOnTwoSmsPerRank) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), {0, true, false, 2}, parseEnv(), rng));
  for (int r = 0; r < g.size(); ++r) EXPECT_EQ(g[r].layer->smBudget(), 2) << "rank " << r;
  std::printf("SUMMARY layer sm_budget=2 %s\n",
              runBackwardCase(g, rng, Routing::kSparse, cycled(ranks(), {256, 0, 97, 1024}), 1.f, true).c_str());
}

}  // namespace
}  // namespace megamoe::layertest
