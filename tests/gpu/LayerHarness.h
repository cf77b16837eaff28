// The ranks harness of gpu_layer_test: the MoE layer (MoeLayer.h) in mode A, one process driving every rank
// (createLocal), rank r on GPU r % deviceCount (on one GPU every rank shares it, each with its own stream and, by
// default, its share of the SMs: MoeLayerConfig::smBudget; with enough GPUs each rank has its own). A layer's shape
// and options, the shapes the tests run, one rank's runtime, layer, stream and device buffers (every output with
// sentinel-filled guard rows past what a call may write), every rank of one layer opened with random expert weights,
// and one case's random inputs by routing. Kernels come from the test cache (scripts/gen-gpu-test-cache.sh DIR,
// MEGAMOE_CACHE_DIR=DIR): a cache without them fails the test with the loader's message.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"
#include "megamoe/env.h"

namespace megamoe::layertest {

using namespace gputest;

// Every output buffer holds kGuardRows rows past what a call may write, pre-filled with the sentinel like the rest.
constexpr int64_t kGuardRows = 64;
constexpr uint16_t kSentinel = 0x7fc1;        // a bf16 NaN no kernel result has (the host's NaN rounding gives 0x7fc0)
constexpr uint32_t kSentinel32 = 0x7fc1dead;  // the same for fp32 outputs (d_topk_weights)
constexpr double kTolerance = 1e-2;           // relative Frobenius error of each output against the reference

// One layer's shape over `ranks` ranks.
struct Shape {
  int ranks = 0;
  int64_t hidden = 0, inter = 0, experts = 0, topk = 0, maxTokens = 0;
  int64_t local() const { return experts / ranks; }  // experts per rank: rank p owns [p * local, (p + 1) * local)
  int64_t w1Rows() const { return local() * 2 * inter; }  // one rank's w1 [w1Rows, H]
  int64_t w2Rows() const { return local() * hidden; }     // one rank's w2 [w2Rows, I]
  size_t yElems() const { return size_t((maxTokens + kGuardRows) * hidden); }  // y and dx
  size_t dTopkElems() const { return size_t((maxTokens + kGuardRows) * topk); }
  size_t dW1Elems() const { return size_t((w1Rows() + kGuardRows) * hidden); }
  size_t dW2Elems() const { return size_t((w2Rows() + kGuardRows) * inter); }
};

// What most tests run: H=512 I=256 E=16 topk=4 (E divides by 8: 2 experts per rank at 8 ranks), max_tokens=1024.
inline Shape smallShape(int ranks) { return {ranks, 512, 256, 16, 4, 1024}; }
// DeepSeek-V3's MoE layer with few tokens per rank: its weights (44M parameters per expert) dominate the memory and
// the host reference's time.
inline Shape deepSeekShape(int ranks) { return {ranks, 7168, 2048, 256, 8, 32}; }
// The small layer twice as wide: H=1024 is 4 of the combines' 256-wide n-tiles, so both combines reduce in 2 column
// chunks, the first under the GEMM (the early reduce); at H=512 they reduce in one, after it.
inline Shape chunkedShape(int ranks) { return {ranks, 1024, 256, 16, 4, 1024}; }
// I=640, an odd number of 128-column halves: the L1 tiles' 2I = 1280 columns are 5 n-tiles of 256 (an odd count,
// so an expert's odd last m-tile is not split by n-tile pairs), the dgrad dispatch's 640 columns and the forward
// combine's K of 640 are no multiple of 256.
inline Shape oddHalvesShape(int ranks) { return {ranks, 512, 640, 16, 4, 1024}; }

struct LayerOptions {
  int64_t clampMilli = 0;  // SwiGLU clamp in thousandths, 0 = off
  bool training = false;
  bool dedup = false;
  int64_t smBudget = 0;  // 0: the default (the device's SMs shared by the ranks on it)
  int64_t receiveCapacity = 0;  // 0: the worst case
  bool dropOverflow = false;    // past the capacity: drop instead of failing
};

inline MoeLayerConfig layerConfig(const Shape& s, const LayerOptions& o) {
  MoeLayerConfig c;
  c.hidden = s.hidden;
  c.intermediate = s.inter;
  c.experts = s.experts;
  c.topk = s.topk;
  c.maxTokens = s.maxTokens;
  c.swigluClampMilli = o.clampMilli;
  c.training = o.training;
  c.dedupTokens = o.dedup;
  c.smBudget = o.smBudget;
  c.receiveCapacity = o.receiveCapacity;
  c.dropOverflow = o.dropOverflow;
  return c;
}

// `ranks` token counts: rank r gets pattern[r % size] (the 2-rank patterns of the tests, extended to 8 ranks).
inline std::vector<int64_t> cycled(int ranks, std::initializer_list<int64_t> pattern) {
  std::vector<int64_t> out;
  for (int r = 0; r < ranks; ++r) out.push_back(pattern.begin()[size_t(r) % pattern.size()]);
  return out;
}

// ---- one rank: runtime (device), layer, stream and the forward's and backward's device buffers ----

struct Rank {
  Shape shape;
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<MoeLayer> layer;
  StreamHandle stream = nullptr;
  DevicePtr x = 0, topkIdx = 0, topkWeights = 0, w1 = 0, w2 = 0, y = 0;
  DevicePtr dy = 0, dx = 0, dTopkWeights = 0, dW1 = 0, dW2 = 0;
  // This rank's experts' weights as uploaded (bf16), which the host reference reads.
  std::vector<uint16_t> w1Host, w2Host;

  Device& device() const { return *runtime->device(); }
  ~Rank() {
    if (!runtime) return;
    layer.reset();
    try {
      for (DevicePtr p : {x, topkIdx, topkWeights, w1, w2, y, dy, dx, dTopkWeights, dW1, dW2})
        if (p) device().free(p);
      if (stream) device().destroyStream(stream);
    } catch (...) {
    }
  }

  ForwardArgs args(int64_t tokens) const {
    ForwardArgs a;
    a.x = x;
    a.tokens = tokens;
    a.topkIdx = topkIdx;
    a.topkWeights = topkWeights;
    a.w1 = w1;
    a.w2 = w2;
    a.y = y;
    return a;
  }
  BackwardArgs backwardArgs(int64_t tokens) const {
    BackwardArgs a;
    a.dy = dy;
    a.x = x;
    a.tokens = tokens;
    a.topkIdx = topkIdx;
    a.topkWeights = topkWeights;
    a.w1 = w1;
    a.w2 = w2;
    a.dx = dx;
    a.dTopkWeights = dTopkWeights;
    a.dW1 = dW1;
    a.dW2 = dW2;
    return a;
  }
  template <typename T>
  std::vector<T> read(DevicePtr at, size_t count) const {
    return readBack<T>(device(), at, count);
  }
  std::vector<uint16_t> readY() const { return read<uint16_t>(y, shape.yElems()); }
  uint64_t readEpoch() const { return gputest::readEpoch(layer->heap()); }
  // Every output buffer (the forward's and the backward's), guard rows included.
  void fillSentinels() {
    fillDevice(device(), y, shape.yElems(), kSentinel);
    fillDevice(device(), dx, shape.yElems(), kSentinel);
    fillDevice(device(), dTopkWeights, shape.dTopkElems(), kSentinel32);
    fillDevice(device(), dW1, shape.dW1Elems(), kSentinel);
    fillDevice(device(), dW2, shape.dW2Elems(), kSentinel);
  }
};

// Every rank of one layer, in this process.
struct Group {
  Shape shape;
  LayerOptions options;
  std::vector<std::unique_ptr<Rank>> ranks;
  uint64_t stepEpochs = 0;  // how far one forward + backward advances the epoch (learned on the first step)

  int size() const { return int(ranks.size()); }
  Rank& operator[](int r) { return *ranks[size_t(r)]; }
  const Rank& operator[](int r) const { return *ranks[size_t(r)]; }
  ~Group() {
    // Nothing may still run when the buffers and layers go; the layers go before any runtime.
    for (auto& rank : ranks) {
      if (!rank->runtime || !rank->stream) continue;
      try {
        rank->device().synchronize(rank->stream);
      } catch (...) {
      }
    }
    for (auto& rank : ranks) rank->layer.reset();
  }
};

// Rank's buffers at max_tokens and its experts' weights (uniform, variance 1/H for w1 and 1/I for w2), drawn from
// `seeds`: rank r's are the r-th pair of draws.
inline void allocateRank(Rank& rank, const Shape& s, uint64_t& seeds) {
  const size_t w1Elems = size_t(s.w1Rows() * s.hidden), w2Elems = size_t(s.w2Rows() * s.inter);
  Device& d = rank.device();
  rank.x = d.allocate(size_t(s.maxTokens * s.hidden) * 2);
  rank.topkIdx = d.allocate(size_t(s.maxTokens * s.topk) * 4);
  rank.topkWeights = d.allocate(size_t(s.maxTokens * s.topk) * 4);
  rank.w1 = d.allocate(w1Elems * 2);
  rank.w2 = d.allocate(w2Elems * 2);
  rank.y = d.allocate(s.yElems() * 2);
  rank.dy = d.allocate(size_t(s.maxTokens * s.hidden) * 2);
  rank.dx = d.allocate(s.yElems() * 2);
  rank.dTopkWeights = d.allocate(s.dTopkElems() * 4);
  rank.dW1 = d.allocate(s.dW1Elems() * 2);
  rank.dW2 = d.allocate(s.dW2Elems() * 2);
  rank.w1Host = uniformBf16(splitMix64(seeds), w1Elems, float(1 / std::sqrt(double(s.hidden))));
  rank.w2Host = uniformBf16(splitMix64(seeds), w2Elems, float(1 / std::sqrt(double(s.inter))));
  uploadAndWait(d, rank.w1, rank.w1Host.data(), w1Elems * 2);
  uploadAndWait(d, rank.w2, rank.w2Host.data(), w2Elems * 2);
}

// Opens rank r's runtime on device r % deviceCount, a layer on every rank (createLocal: kernels from the cache; a
// cache miss throws Error(kKernelNotFound), which fails the test), the buffers at max_tokens and random expert
// weights (allocateRank; drawn from `weightSeeds` when given, else from `rng`).
inline void openGroup(Group& g, const Shape& s, const LayerOptions& o, const RuntimeEnv& env, std::mt19937& rng,
                      std::optional<uint64_t> weightSeeds = std::nullopt) {
  const MoeLayerConfig config = layerConfig(s, o);
  ASSERT_EQ(MoeLayer::validate(config, s.ranks), "");
  ASSERT_EQ(s.hidden % 8, 0);  // the reference's dot products run in chains of 8 (validate asks for 128)
  ASSERT_EQ(s.inter % 8, 0);
  g.shape = s;
  g.options = o;
  const int devices = openBackend(BackendKind::kCuda)->deviceCount();
  std::vector<Runtime*> runtimes;
  for (int r = 0; r < s.ranks; ++r) {
    g.ranks.push_back(std::make_unique<Rank>());
    Rank& rank = g[r];
    rank.shape = s;
    rank.runtime = std::make_unique<Runtime>(BackendKind::kCuda, rankOrdinal(r, devices), env);
    rank.stream = rank.device().createStream();
    runtimes.push_back(rank.runtime.get());
  }
  auto layers = MoeLayer::createLocal(runtimes, config);
  ASSERT_EQ(layers.size(), size_t(s.ranks));
  for (int r = 0; r < s.ranks; ++r) {
    ASSERT_TRUE(layers[size_t(r)]);
    EXPECT_EQ(layers[size_t(r)]->rank(), r);
    EXPECT_EQ(layers[size_t(r)]->ranks(), s.ranks);
    g[r].layer = std::move(layers[size_t(r)]);
  }
  uint64_t seeds = weightSeeds ? *weightSeeds : (uint64_t(rng()) << 32) | uint64_t(rng());
  for (int r = 0; r < s.ranks; ++r) allocateRank(g[r], s, seeds);
}

// ---- inputs ----

enum class Routing { kUniform, kAllRemote, kHotExpert, kSparse };
constexpr Routing kRoutings[] = {Routing::kUniform, Routing::kAllRemote, Routing::kHotExpert, Routing::kSparse};

inline const char* routingName(Routing routing) {
  switch (routing) {
    case Routing::kUniform: return "uniform";
    case Routing::kAllRemote: return "all-remote";
    case Routing::kHotExpert: return "hot-expert";
    case Routing::kSparse: return "sparse(-1)";
  }
  return "?";
}

struct Inputs {
  int64_t tokens = 0;
  std::vector<uint16_t> x;          // [tokens, H] bf16
  std::vector<int32_t> topkIdx;     // [tokens, topk]
  std::vector<float> topkWeights;   // [tokens, topk]
  std::vector<uint16_t> dy;         // [tokens, H] bf16; empty for forward-only cases
};

// `out[0 .. k)`: k distinct values from [0, n), in random order.
inline void distinct(std::mt19937& rng, int32_t n, int32_t* out, int64_t k) {
  std::vector<int32_t> pool(static_cast<size_t>(n));
  std::iota(pool.begin(), pool.end(), 0);
  for (int64_t i = 0; i < k; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, n - 1);
    std::swap(pool[size_t(i)], pool[size_t(pick(rng))]);
    out[i] = pool[size_t(i)];
  }
}

// Rank `rank`'s inputs: x ~ N(0, xScale²), distinct experts per token (uniform; all owned by other ranks; always
// including `hot`; uniform with ~10% of the entries -1) and weights uniform in [0.05, 1); with `training`, dy ~ N(0, 1)
// as well.
inline Inputs makeInputs(std::mt19937& rng, const Shape& s, Routing routing, int rank, int64_t tokens, int32_t hot,
                         float xScale, bool training = false) {
  Inputs in;
  in.tokens = tokens;
  in.x = randomBf16(rng, size_t(tokens * s.hidden), xScale);
  in.topkIdx.resize(size_t(tokens * s.topk));
  std::uniform_int_distribution<int64_t> slot(0, s.topk - 1);
  std::bernoulli_distribution skip(0.1);
  const int32_t ownFirst = int32_t(rank * s.local()), local = int32_t(s.local());
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* picks = &in.topkIdx[size_t(t * s.topk)];
    if (routing == Routing::kAllRemote) {
      // Distinct experts among the E - E/R owned elsewhere (E - E/R >= topk for every shape here).
      distinct(rng, int32_t(s.experts) - local, picks, s.topk);
      for (int64_t j = 0; j < s.topk; ++j)
        if (picks[j] >= ownFirst) picks[j] += local;
      continue;
    }
    distinct(rng, int32_t(s.experts), picks, s.topk);
    if (routing == Routing::kHotExpert && std::find(picks, picks + s.topk, hot) == picks + s.topk)
      picks[slot(rng)] = hot;
    if (routing == Routing::kSparse)
      for (int64_t j = 0; j < s.topk; ++j)
        if (skip(rng)) picks[j] = -1;
  }
  std::uniform_real_distribution<float> weight(0.05f, 1.f);
  in.topkWeights.resize(size_t(tokens * s.topk));
  for (float& w : in.topkWeights) w = weight(rng);
  if (training) in.dy = randomBf16(rng, size_t(tokens * s.hidden));
  return in;
}

inline void upload(Rank& rank, const Inputs& in) {
  if (in.tokens == 0) return;
  uploadAndWait(rank.device(), rank.x, in.x.data(), in.x.size() * 2);
  uploadAndWait(rank.device(), rank.topkIdx, in.topkIdx.data(), in.topkIdx.size() * 4);
  uploadAndWait(rank.device(), rank.topkWeights, in.topkWeights.data(), in.topkWeights.size() * 4);
  if (!in.dy.empty()) uploadAndWait(rank.device(), rank.dy, in.dy.data(), in.dy.size() * 2);
}

// y, dx, d_topk_weights, dW1 and dW2 of `rank`, guard rows included, as bytes.
inline std::vector<uint8_t> outputBytes(const Rank& rank) {
  std::vector<uint8_t> out;
  auto append = [&](DevicePtr at, size_t bytes) {
    const std::vector<uint8_t> v = rank.read<uint8_t>(at, bytes);
    out.insert(out.end(), v.begin(), v.end());
  };
  const Shape& s = rank.shape;
  append(rank.y, s.yElems() * 2);
  append(rank.dx, s.yElems() * 2);
  append(rank.dTopkWeights, s.dTopkElems() * 4);
  append(rank.dW1, s.dW1Elems() * 2);
  append(rank.dW2, s.dW2Elems() * 2);
  return out;
}

}  // namespace megamoe::layertest
