// GPU tier for the MoE layer (MoeLayer.h) in mode A (one process drives every rank, createLocal), at 2 and at 8 ranks
// (LayerTest.*/Ranks2, LayerTest.*/Ranks8). Rank r runs on GPU r % deviceCount: on one GPU every rank shares it, each
// with its own stream and, by default, its share of the SMs (MoeLayerConfig::smBudget); with enough GPUs each rank
// has its own. The layer is H=512 I=256 E=16 (8 or 2 experts per rank) topk=4 max_tokens=1024; LayerDeepSeekV3.*
// runs DeepSeek-V3's (H=7168 I=2048 E=256 topk=8) at EP2 and EP8 with at most 32 tokens per rank.
// Forward: y of each rank against a host reference in double that emulates the kernels' bf16 roundings, over
// routings (uniform, all picks remote, one hot expert, ~10% -1 entries) and token counts that differ between the
// ranks (zero included), with the SwiGLU clamp on and off and with token deduplication; every row of y[:tokens]
// written, the guard rows past it untouched, a repeated call bitwise identical, epochs advancing on the device;
// 1000 CUDA-graph replays with the routing changed in-stream before each, bitwise equal to plain calls; host-visible
// bad arguments (kInvalidArgument).
// Backward (training layers): forward then backward on every rank, dx, d_topk_weights and dW1/dW2 (on the experts'
// owners, summed over every rank's picks) against the reference, over the same routings and token counts and with
// the clamp; every element a call may write written, the guard rows untouched, a repeated step bitwise identical;
// what a training forward keeps (recomputing the dispatched x saves exactly its bytes); bad backward arguments.
// SM budgets: the default shares of the ranks on one device, and a training step at the smallest budget (2 SMs).
// Failure paths: a rank whose forward is never launched makes every other rank's wait end in a timeout (bounded at
// 300 ms) naming it; an out-of-range expert index on one rank is kBadIndex there and a bounded timeout on the others;
// ranks calling another layer or role than their peers' get kCallMismatch on every rank, naming both calls.
// Kernels come from the test cache (scripts/gen-gpu-test-cache.sh DIR, MEGAMOE_CACHE_DIR=DIR): a cache without them
// fails the test with the loader's message; LayerTest.GpuTestCacheListsEveryLayerKernel checks, without a GPU, that
// the script lists every kernel these tests' layers load. The GPU tests skip, saying why, without a CUDA device or
// when a device the ranks run on is not sm_90a; never for too few GPUs.
// LayerTest.SmallForward/*, LayerTest.SmallForwardDedup/* and LayerTest.SmallBackward/* are the cases to run under
// compute-sanitizer (memcheck, racecheck).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"
#include "megamoe/Workspace.h"
#include "tests/support/FileAllGather.h"
#include "megamoe/env.h"

namespace megamoe {
namespace {

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
Shape smallShape(int ranks) { return {ranks, 512, 256, 16, 4, 1024}; }
// DeepSeek-V3's MoE layer with few tokens per rank: its weights (44M parameters per expert) dominate the memory and
// the host reference's time.
Shape deepSeekShape(int ranks) { return {ranks, 7168, 2048, 256, 8, 32}; }
// The small layer twice as wide: H=1024 is 4 of the combines' 256-wide n-tiles, so both combines reduce in 2 column
// chunks, the first under the GEMM (the early reduce); at H=512 they reduce in one, after it.
Shape chunkedShape(int ranks) { return {ranks, 1024, 256, 16, 4, 1024}; }
// I=640, an odd number of 128-column halves: the L1 tiles' 2I = 1280 columns are 5 n-tiles of 256 (an odd count,
// so an expert's odd last m-tile is not split by n-tile pairs), the dgrad dispatch's 640 columns and the forward
// combine's K of 640 are no multiple of 256.
Shape oddHalvesShape(int ranks) { return {ranks, 512, 640, 16, 4, 1024}; }

struct LayerOptions {
  int64_t clampMilli = 0;  // SwiGLU clamp in thousandths, 0 = off
  bool training = false;
  bool dedup = false;
  int64_t smBudget = 0;  // 0: the default (the device's SMs shared by the ranks on it)
  int64_t receiveCapacity = 0;  // 0: the worst case
  bool dropOverflow = false;    // past the capacity: drop instead of failing
};

MoeLayerConfig layerConfig(const Shape& s, const LayerOptions& o) {
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

// Every (shape, options) a test below opens a layer with: the test cache must hold their kernels
// (GpuTestCacheListsEveryLayerKernel). Keep in step with the tests.
std::vector<std::pair<Shape, LayerOptions>> testedLayers() {
  std::vector<std::pair<Shape, LayerOptions>> out;
  for (int ranks : kRankCounts) {
    for (int64_t clamp : {int64_t(0), int64_t(7000)})
      for (bool training : {false, true}) out.push_back({smallShape(ranks), {clamp, training, false, 0}});
    for (bool training : {false, true}) out.push_back({smallShape(ranks), {0, training, true, 0}});
    out.push_back({deepSeekShape(ranks), {0, true, false, 0}});
    out.push_back({chunkedShape(ranks), {0, true, false, 0}});
    out.push_back({oddHalvesShape(ranks), {0, true, false, 0}});
  }
  return out;
}

// `ranks` token counts: rank r gets pattern[r % size] (the 2-rank patterns of the tests, extended to 8 ranks).
std::vector<int64_t> cycled(int ranks, std::initializer_list<int64_t> pattern) {
  std::vector<int64_t> out;
  for (int r = 0; r < ranks; ++r) out.push_back(pattern.begin()[size_t(r) % pattern.size()]);
  return out;
}

// ---- output elements as bits: bf16 (uint16_t) or fp32 (uint32_t) ----

float valueOf(uint16_t bits) { return fromBf16(bits); }
float valueOf(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
bool isSentinel(uint16_t bits) { return bits == kSentinel; }
bool isSentinel(uint32_t bits) { return bits == kSentinel32; }

template <typename Bits>
std::string hex(Bits v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%0*x", int(2 * sizeof v), unsigned(v));
  return text;
}

template <typename Bits>
size_t countDiffering(const std::vector<Bits>& a, const std::vector<Bits>& b) {
  size_t d = std::max(a.size(), b.size()) - std::min(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) d += a[i] != b[i];
  return d;
}

std::string joined(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
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
void allocateRank(Rank& rank, const Shape& s, uint64_t& seeds) {
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
void openGroup(Group& g, const Shape& s, const LayerOptions& o, const RuntimeEnv& env, std::mt19937& rng,
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

const char* routingName(Routing routing) {
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
void distinct(std::mt19937& rng, int32_t n, int32_t* out, int64_t k) {
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
Inputs makeInputs(std::mt19937& rng, const Shape& s, Routing routing, int rank, int64_t tokens, int32_t hot,
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

void upload(Rank& rank, const Inputs& in) {
  if (in.tokens == 0) return;
  uploadAndWait(rank.device(), rank.x, in.x.data(), in.x.size() * 2);
  uploadAndWait(rank.device(), rank.topkIdx, in.topkIdx.data(), in.topkIdx.size() * 4);
  uploadAndWait(rank.device(), rank.topkWeights, in.topkWeights.data(), in.topkWeights.size() * 4);
  if (!in.dy.empty()) uploadAndWait(rank.device(), rank.dy, in.dy.data(), in.dy.size() * 2);
}

// y, dx, d_topk_weights, dW1 and dW2 of `rank`, guard rows included, as bytes.
std::vector<uint8_t> outputBytes(const Rank& rank) {
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

// ---- the host reference ----

double roundBf16(double v) { return fromBf16(toBf16(float(v))); }

// a . b over n (a multiple of 8) elements, b in bf16, in eight chains (one chain's sum is latency-bound); a float
// times a bf16 is exact in double.
double dot(const float* a, const uint16_t* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += double(a[i + k]) * double(fromBf16(b[i + k]));
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// acc[0 .. n) += a * b[0 .. n), b in bf16 or fp32.
void axpy(double a, const uint16_t* b, double* acc, int64_t n) {
  if (a == 0) return;
  for (int64_t i = 0; i < n; ++i) acc[i] += a * double(fromBf16(b[i]));
}
void axpy(double a, const float* b, double* acc, int64_t n) {
  if (a == 0) return;
  for (int64_t i = 0; i < n; ++i) acc[i] += a * double(b[i]);
}

// Expert e's w1 [2I, H] and w2 [H, I] (bf16) as the reference reads them (on its owner e / (E/R), local expert
// e % (E/R)).
const uint16_t* w1Of(const Group& g, int32_t e) {
  const Shape& s = g.shape;
  return &g[int(e / s.local())].w1Host[size_t((e % s.local()) * 2 * s.inter * s.hidden)];
}
const uint16_t* w2Of(const Group& g, int32_t e) {
  const Shape& s = g.shape;
  return &g[int(e / s.local())].w2Host[size_t((e % s.local()) * s.hidden * s.inter)];
}

// h = bf16(x . w1^T) [2I]: one pick's L1 pre-activation, rounded where the forward rounds (and keeps) it.
void preActivation(const Shape& s, const float* x, const uint16_t* w1, double* h) {
  for (int64_t k = 0; k < 2 * s.inter; ++k) h[k] = roundBf16(dot(x, w1 + k * s.hidden, s.hidden));
}

// SwiGLU of one (gate, up) component with the clamp c (c <= 0: none): gate' = min(gate, c), up' = clamp(up, -c, c),
// act = silu(gate') up'; its derivatives dact/dgate = up' silu'(gate) and dact/dup = silu(gate'), each 0 where the
// clamp cut its component; silu'(z) = s(z) (1 + z (1 - s(z))), s the sigmoid.
struct Swiglu {
  double act, dGate, dUp;
};
Swiglu swiglu(double gate, double up, double c) {
  const bool clamp = c > 0, gateCut = clamp && gate > c, upCut = clamp && std::abs(up) > c;
  if (clamp) {
    gate = std::min(gate, c);
    up = std::clamp(up, -c, c);
  }
  const double s = 1 / (1 + std::exp(-gate));
  return {gate * s * up, gateCut ? 0 : s * (1 + gate * (1 - s)) * up, upCut ? 0 : gate * s};
}

// y [tokens, H] for one rank's inputs, in double, rounded to bf16 where the kernels round: for every pick j of
// token t with expert e != -1: h = bf16(x[t] . w1[e]^T) (gate = h[:I], up = h[I:]); act = bf16(swiglu(gate, up));
// out = bf16(act . w2[e]^T); y[t] = bf16(sum_j w[t][j] * out_j).
std::vector<float> forwardReference(const Group& g, const Inputs& in, int64_t clampMilli) {
  const Shape& s = g.shape;
  const int64_t H = s.hidden, I = s.inter;
  const double c = double(clampMilli) / 1000;
  std::vector<float> y(size_t(in.tokens * H));
  parallelFor(in.tokens, [&](int64_t t) {
    std::vector<float> x(static_cast<size_t>(H)), act(static_cast<size_t>(I));
    std::vector<double> h(static_cast<size_t>(2 * I)), acc(static_cast<size_t>(H), 0.0);
    for (int64_t k = 0; k < H; ++k) x[size_t(k)] = fromBf16(in.x[size_t(t * H + k)]);
    for (int64_t j = 0; j < s.topk; ++j) {
      const int32_t e = in.topkIdx[size_t(t * s.topk + j)];
      if (e < 0 || e >= s.experts) continue;
      const uint16_t* w2 = w2Of(g, e);
      preActivation(s, x.data(), w1Of(g, e), h.data());
      for (int64_t i = 0; i < I; ++i) act[size_t(i)] = float(roundBf16(swiglu(h[size_t(i)], h[size_t(I + i)], c).act));
      const double w = in.topkWeights[size_t(t * s.topk + j)];
      for (int64_t n = 0; n < H; ++n) acc[size_t(n)] += w * roundBf16(dot(act.data(), w2 + n * I, I));
    }
    for (int64_t n = 0; n < H; ++n) y[size_t(t * H + n)] = float(roundBf16(acc[size_t(n)]));
  });
  return y;
}

// One rank's backward outputs apart from the weight gradients: dx [tokens, H] and d_topk_weights [tokens, topk].
struct Gradients {
  std::vector<float> dx, dTopkWeights;
};

// Every rank's gradients for their inputs (dy included), in double, rounded to bf16 where the kernels round. For every
// pick j of token t with weight w and expert e != -1: h = bf16(x[t] . w1[e]^T) and act = swiglu(gate, up) unrounded
// (the kernels' fp32 act from the kept h); g = bf16(dy[t] . w2[e]); d_topk_weights[t][j] = <g, act> (0 for -1);
// dact = w g; dh = bf16([dact dact/dgate | dact dact/dup]); dx[t] = bf16(sum_j bf16(dh . w1[e])). On e's owner, over
// the picks of e on every rank: dW2[e] = bf16(sum dy[t]^T bf16(w act)), dW1[e] = bf16(sum dh^T x[t]); 0 without
// picks. The weight gradients are computed row by row when checked (dW1Row, dW2Row): the large shapes' would be
// E x 44M values.
struct BackwardReference {
  const Group* group = nullptr;
  std::vector<std::vector<float>> x, dy;    // per rank, as floats
  std::vector<std::vector<float>> dh, wAct;  // per rank and pick (token * topk + slot): dh [2I], w act [I] (bf16 values)
  std::vector<Gradients> ranks;
  std::vector<std::vector<std::pair<int, int64_t>>> picksOf;  // [E]: (rank, pick) of each expert's picks, in order

  // Row `row` of dW1[e] [2I, H] and of dW2[e] [H, I].
  void dW1Row(int64_t e, int64_t row, float* out) const {
    const Shape& s = group->shape;
    thread_local std::vector<double> acc;
    acc.assign(size_t(s.hidden), 0.0);
    for (const auto& [r, pick] : picksOf[size_t(e)])
      axpy(dh[size_t(r)][size_t(pick * 2 * s.inter + row)], &x[size_t(r)][size_t(pick / s.topk * s.hidden)],
           acc.data(), s.hidden);
    for (int64_t k = 0; k < s.hidden; ++k) out[k] = float(roundBf16(acc[size_t(k)]));
  }
  void dW2Row(int64_t e, int64_t row, float* out) const {
    const Shape& s = group->shape;
    thread_local std::vector<double> acc;
    acc.assign(size_t(s.inter), 0.0);
    for (const auto& [r, pick] : picksOf[size_t(e)])
      axpy(dy[size_t(r)][size_t(pick / s.topk * s.hidden + row)], &wAct[size_t(r)][size_t(pick * s.inter)],
           acc.data(), s.inter);
    for (int64_t k = 0; k < s.inter; ++k) out[k] = float(roundBf16(acc[size_t(k)]));
  }
};

BackwardReference backwardReference(const Group& g, const std::vector<Inputs>& in, int64_t clampMilli) {
  const Shape& s = g.shape;
  const int R = g.size();
  const int64_t H = s.hidden, I = s.inter, K = s.topk;
  const double c = double(clampMilli) / 1000;
  BackwardReference ref;
  ref.group = &g;
  ref.x.resize(static_cast<size_t>(R));
  ref.dy.resize(static_cast<size_t>(R));
  ref.dh.resize(static_cast<size_t>(R));
  ref.wAct.resize(static_cast<size_t>(R));
  ref.ranks.resize(static_cast<size_t>(R));
  int64_t allTokens = 0;
  for (int r = 0; r < R; ++r) {
    const Inputs& rin = in[size_t(r)];
    const size_t tokens = size_t(rin.tokens), picks = size_t(rin.tokens * K);
    ref.x[size_t(r)].resize(rin.x.size());
    ref.dy[size_t(r)].resize(rin.dy.size());
    std::transform(rin.x.begin(), rin.x.end(), ref.x[size_t(r)].begin(), fromBf16);
    std::transform(rin.dy.begin(), rin.dy.end(), ref.dy[size_t(r)].begin(), fromBf16);
    ref.dh[size_t(r)].assign(picks * size_t(2 * I), 0.f);
    ref.wAct[size_t(r)].assign(picks * size_t(I), 0.f);
    ref.ranks[size_t(r)].dx.assign(tokens * size_t(H), 0.f);
    ref.ranks[size_t(r)].dTopkWeights.assign(picks, 0.f);
    allTokens += rin.tokens;
  }

  // Per token of every rank: everything but dW.
  parallelFor(allTokens, [&](int64_t t) {
    int r = 0;
    for (; t >= in[size_t(r)].tokens; ++r) t -= in[size_t(r)].tokens;
    const Inputs& rin = in[size_t(r)];
    Gradients& grads = ref.ranks[size_t(r)];
    const float* xt = &ref.x[size_t(r)][size_t(t * H)];
    const float* dyt = &ref.dy[size_t(r)][size_t(t * H)];
    std::vector<double> h(static_cast<size_t>(2 * I)), gv(static_cast<size_t>(I)), dxPick(static_cast<size_t>(H)),
        dxSum(static_cast<size_t>(H), 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t pick = t * K + j;
      const int32_t e = rin.topkIdx[size_t(pick)];
      if (e < 0 || e >= s.experts) continue;
      const uint16_t *w1 = w1Of(g, e), *w2 = w2Of(g, e);
      const double w = rin.topkWeights[size_t(pick)];
      preActivation(s, xt, w1, h.data());
      std::fill(gv.begin(), gv.end(), 0.0);
      for (int64_t n = 0; n < H; ++n) axpy(double(dyt[n]), w2 + n * I, gv.data(), I);
      float* dhPick = &ref.dh[size_t(r)][size_t(pick * 2 * I)];
      float* wActPick = &ref.wAct[size_t(r)][size_t(pick * I)];
      double dTopkWeight = 0;
      for (int64_t i = 0; i < I; ++i) {
        const double gi = roundBf16(gv[size_t(i)]);
        const Swiglu sw = swiglu(h[size_t(i)], h[size_t(I + i)], c);
        dTopkWeight += gi * sw.act;
        dhPick[i] = float(roundBf16(w * gi * sw.dGate));
        dhPick[I + i] = float(roundBf16(w * gi * sw.dUp));
        wActPick[i] = float(roundBf16(w * sw.act));
      }
      grads.dTopkWeights[size_t(pick)] = float(dTopkWeight);
      std::fill(dxPick.begin(), dxPick.end(), 0.0);
      for (int64_t k = 0; k < 2 * I; ++k) axpy(double(dhPick[k]), w1 + k * H, dxPick.data(), H);
      for (int64_t n = 0; n < H; ++n) dxSum[size_t(n)] += roundBf16(dxPick[size_t(n)]);
    }
    for (int64_t n = 0; n < H; ++n) grads.dx[size_t(t * H + n)] = float(roundBf16(dxSum[size_t(n)]));
  });

  ref.picksOf.resize(size_t(s.experts));
  for (int r = 0; r < R; ++r)
    for (int64_t pick = 0; pick < in[size_t(r)].tokens * K; ++pick) {
      const int32_t e = in[size_t(r)].topkIdx[size_t(pick)];
      if (e >= 0 && e < s.experts) ref.picksOf[size_t(e)].emplace_back(r, pick);
    }
  return ref;
}

// ||a - b|| / ||b|| (plain ||a - b|| when b is all zero).
double relativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// ---- checks ----

// One output buffer `name` of `width` columns (guard rows included) against the reference for its first `rows` rows,
// row i's reference from refRow(i, out[width]) (called in parallel): no sentinel left there, relative Frobenius error
// <= kTolerance, every element past them still the sentinel. Returns the relative error.
template <typename Bits>
double expectMatchesRows(const std::vector<Bits>& got, int64_t rows, int64_t width,
                         const std::function<void(int64_t, float*)>& refRow, const std::string& name,
                         const std::string& label) {
  const size_t n = size_t(rows * width), w = size_t(width);
  if (got.size() < n) {
    ADD_FAILURE() << label << ": " << name << " holds " << got.size() << " elements, fewer than " << rows << " rows";
    return INFINITY;
  }
  const auto where = [w](size_t i) { return "row " + std::to_string(i / w) + " column " + std::to_string(i % w); };
  // Per row, summed in row order afterwards (the same sums whatever the threads did).
  std::vector<double> num(size_t(rows), 0.0), den(size_t(rows), 0.0);
  std::vector<size_t> unwrittenIn(size_t(rows), 0), firstUnwrittenIn(size_t(rows), 0);
  parallelFor(rows, [&](int64_t row) {
    thread_local std::vector<float> ref;
    ref.resize(w);
    refRow(row, ref.data());
    const Bits* at = &got[size_t(row) * w];
    double rowNum = 0, rowDen = 0;
    size_t unwritten = 0, first = 0;
    for (size_t k = 0; k < w; ++k) {
      rowDen += double(ref[k]) * ref[k];
      if (isSentinel(at[k])) {  // counted, kept out of the error
        if (unwritten++ == 0) first = k;
        continue;
      }
      const double d = double(valueOf(at[k])) - ref[k];
      rowNum += d * d;
    }
    num[size_t(row)] = rowNum;
    den[size_t(row)] = rowDen;
    unwrittenIn[size_t(row)] = unwritten;
    firstUnwrittenIn[size_t(row)] = size_t(row) * w + first;
  });
  double sumNum = 0, sumDen = 0;
  size_t unwritten = 0;
  std::string firstUnwritten;
  for (size_t row = 0; row < size_t(rows); ++row) {
    sumNum += num[row];
    sumDen += den[row];
    if (unwrittenIn[row] && unwritten == 0) firstUnwritten = " (first: " + where(firstUnwrittenIn[row]) + ")";
    unwritten += unwrittenIn[row];
  }
  size_t touched = 0;
  std::string firstTouched;
  for (size_t i = n; i < got.size(); ++i)
    if (!isSentinel(got[i]) && touched++ == 0) firstTouched = " (first: " + where(i) + " = " + hex(got[i]) + ")";
  const double err = sumDen > 0 ? std::sqrt(sumNum / sumDen) : std::sqrt(sumNum);
  EXPECT_EQ(unwritten, 0u) << label << ": elements of " << name << "[:" << rows << "] never written" << firstUnwritten;
  EXPECT_LE(err, kTolerance) << label << ": relative Frobenius error of " << name << "[:" << rows << "]";
  EXPECT_EQ(touched, 0u) << label << ": elements of " << name << " past row " << rows << " (guard rows up to "
                         << got.size() / w << ") overwritten" << firstTouched;
  return err;
}

// The same against a reference held whole ([rows, width]).
template <typename Bits>
double expectMatches(const std::vector<Bits>& got, int64_t rows, int64_t width, const std::vector<float>& ref,
                     const std::string& name, const std::string& label) {
  EXPECT_EQ(ref.size(), size_t(rows * width)) << label << ": the reference's " << name << " has the wrong size";
  if (ref.size() != size_t(rows * width)) return INFINITY;
  return expectMatchesRows(
      got, rows, width,
      [&](int64_t row, float* out) { std::copy_n(&ref[size_t(row * width)], size_t(width), out); }, name, label);
}

// Enqueues one forward on every rank in rank order (the kernels wait on each other: nothing is synchronised in
// between), then checks every rank's errors.
void forwardAll(Group& g, const std::vector<int64_t>& tokens) {
  for (int r = 0; r < g.size(); ++r) g[r].layer->forward(g[r].args(tokens[size_t(r)]), g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->checkErrors(g[r].stream);
}

// One training step: every rank's forward, then every rank's backward, all enqueued before anything is
// synchronised; then every rank's errors.
void stepAll(Group& g, const std::vector<int64_t>& tokens) {
  for (int r = 0; r < g.size(); ++r) g[r].layer->forward(g[r].args(tokens[size_t(r)]), g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->backward(g[r].backwardArgs(tokens[size_t(r)]), g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->checkErrors(g[r].stream);
}

std::string caseLabel(const Group& g, Routing routing, const std::vector<int64_t>& tokens) {
  return std::string(routingName(routing)) + " ranks=" + std::to_string(g.size()) + " tokens=" + joined(tokens) +
         " clamp=" + std::to_string(g.options.clampMilli) + "m";
}

// The epoch every rank is at; a failure when they differ.
uint64_t commonEpoch(const Group& g, const std::string& label) {
  const uint64_t epoch = g[0].readEpoch();
  for (int r = 1; r < g.size(); ++r)
    EXPECT_EQ(g[r].readEpoch(), epoch) << label << ": rank " << r << "'s epoch differs from rank 0's";
  return epoch;
}

// Fresh inputs for one case on every rank (dy too with `training`), uploaded, and every output buffer filled with
// the sentinel. Returns the epoch, which every rank must agree on.
uint64_t startCase(Group& g, std::mt19937& rng, Routing routing, const std::vector<int64_t>& tokens, float xScale,
                   bool training, std::vector<Inputs>& in, const std::string& label) {
  const int32_t hot = std::uniform_int_distribution<int32_t>(0, int32_t(g.shape.experts) - 1)(rng);
  in.assign(size_t(g.size()), Inputs{});
  for (int r = 0; r < g.size(); ++r) {
    in[size_t(r)] = makeInputs(rng, g.shape, routing, r, tokens[size_t(r)], hot, xScale, training);
    upload(g[r], in[size_t(r)]);
    g[r].fillSentinels();
  }
  return commonEpoch(g, label + " (before the call)");
}

std::string formatMax(const char* name, const std::vector<double>& err) {
  char text[64];
  std::snprintf(text, sizeof text, " %s<=%.2e", name, err.empty() ? 0.0 : *std::max_element(err.begin(), err.end()));
  return text;
}

// One call on every rank with fresh inputs (`routing`, `tokens` per rank, x ~ N(0, xScale²)): y against the
// reference, epochs one further on every rank; with `repeat`, a second call on the same inputs must give the same y
// bit for bit. Returns a summary fragment.
std::string runCase(Group& g, std::mt19937& rng, Routing routing, const std::vector<int64_t>& tokens, float xScale,
                    bool repeat) {
  const std::string label = caseLabel(g, routing, tokens);
  std::vector<Inputs> in;
  const uint64_t epoch = startCase(g, rng, routing, tokens, xScale, false, in, label);
  forwardAll(g, tokens);
  std::vector<std::vector<uint16_t>> y(size_t(g.size()));
  std::vector<double> err(size_t(g.size()));
  for (int r = 0; r < g.size(); ++r) {
    y[size_t(r)] = g[r].readY();
    err[size_t(r)] = expectMatches(y[size_t(r)], tokens[size_t(r)], g.shape.hidden,
                                   forwardReference(g, in[size_t(r)], g.options.clampMilli), "y",
                                   label + " rank " + std::to_string(r));
    EXPECT_EQ(g[r].readEpoch(), epoch + 1) << label << " rank " << r << ": the epoch did not advance by one";
  }
  std::string summary = label + ": rel err" + formatMax("y", err);
  if (!repeat) return summary;

  for (int r = 0; r < g.size(); ++r) g[r].fillSentinels();
  forwardAll(g, tokens);
  size_t differing = 0;
  for (int r = 0; r < g.size(); ++r) {
    const size_t d = countDiffering(g[r].readY(), y[size_t(r)]);
    EXPECT_EQ(d, 0u) << label << " rank " << r << ": a second call on the same inputs changed y";
    EXPECT_EQ(g[r].readEpoch(), epoch + 2) << label << " rank " << r;
    differing += d;
  }
  return summary + ", repeat differs in " + std::to_string(differing);
}

// Every rank's epoch `steps` training steps past `before`: equal, and each step the same advance (> 0) as every
// earlier step on `g` (the first step sets it).
void expectEpochsAdvanced(Group& g, uint64_t before, uint64_t steps, const std::string& label) {
  const uint64_t advance = g[0].readEpoch() - before;
  for (int r = 1; r < g.size(); ++r)
    EXPECT_EQ(g[r].readEpoch() - before, advance) << label << ": rank " << r << "'s epoch differs after the call";
  EXPECT_GT(advance, 0u) << label << ": the epoch did not advance";
  if (g.stepEpochs == 0 && advance % steps == 0) g.stepEpochs = advance / steps;
  EXPECT_EQ(advance, steps * g.stepEpochs) << label << ": " << steps << " step(s) advanced the epoch by " << advance
                                           << ", earlier steps by " << g.stepEpochs << " each";
}

// Device copies of one rank's output buffers (guard rows included), which a repeated step is compared with: the
// large shapes' outputs are gigabytes a rank, too many to keep on the host.
struct Snapshot {
  Device* device = nullptr;
  DevicePtr y = 0, dx = 0, dTopkWeights = 0, dW1 = 0, dW2 = 0;
  ~Snapshot() {
    if (!device) return;
    try {
      for (DevicePtr p : {y, dx, dTopkWeights, dW1, dW2})
        if (p) device->free(p);
    } catch (...) {
    }
  }
};

// One call's five output buffers (y, dx, d_topk_weights, dW1, dW2), each with its guard rows.
struct OutputBuffers {
  DevicePtr y = 0, dx = 0, dTopkWeights = 0, dW1 = 0, dW2 = 0;
};
OutputBuffers outputsOf(const Rank& rank) { return {rank.y, rank.dx, rank.dTopkWeights, rank.dW1, rank.dW2}; }

void takeSnapshot(Device& d, const Shape& s, const OutputBuffers& out, Snapshot& snap) {
  snap.device = &d;
  const std::pair<DevicePtr Snapshot::*, std::pair<DevicePtr, size_t>> buffers[] = {
      {&Snapshot::y, {out.y, s.yElems() * 2}},
      {&Snapshot::dx, {out.dx, s.yElems() * 2}},
      {&Snapshot::dTopkWeights, {out.dTopkWeights, s.dTopkElems() * 4}},
      {&Snapshot::dW1, {out.dW1, s.dW1Elems() * 2}},
      {&Snapshot::dW2, {out.dW2, s.dW2Elems() * 2}}};
  for (const auto& [field, from] : buffers) {
    snap.*field = d.allocate(from.second);
    d.copyDeviceToDevice(snap.*field, from.first, from.second);
  }
  d.synchronizeDevice();
}
void takeSnapshot(const Rank& rank, Snapshot& snap) { takeSnapshot(rank.device(), rank.shape, outputsOf(rank), snap); }

// Elements of the outputs (guard rows included) that differ from the snapshot.
size_t countDiffering(Device& d, const Shape& s, const OutputBuffers& out, const Snapshot& snap) {
  return countDifferingOnDevice<uint16_t>(d, out.y, snap.y, s.yElems()) +
         countDifferingOnDevice<uint16_t>(d, out.dx, snap.dx, s.yElems()) +
         countDifferingOnDevice<uint32_t>(d, out.dTopkWeights, snap.dTopkWeights, s.dTopkElems()) +
         countDifferingOnDevice<uint16_t>(d, out.dW1, snap.dW1, s.dW1Elems()) +
         countDifferingOnDevice<uint16_t>(d, out.dW2, snap.dW2, s.dW2Elems());
}
size_t countDiffering(const Rank& rank, const Snapshot& snap) {
  return countDiffering(rank.device(), rank.shape, outputsOf(rank), snap);
}

// One training step on every rank (stepAll) with fresh inputs (`routing`, `tokens` per rank, x ~ N(0, xScale²),
// dy ~ N(0, 1)) on a training group: y, dx, d_topk_weights, dW1 and dW2 of every rank against the reference, each
// written where it may be and untouched past it; every epoch one step further; with `repeat`, a second step on the
// same inputs must give the same outputs (guard rows included) bit for bit. Returns a summary fragment.
std::string runBackwardCase(Group& g, std::mt19937& rng, Routing routing, const std::vector<int64_t>& tokens,
                            float xScale, bool repeat) {
  const Shape& s = g.shape;
  const std::string label = "backward " + caseLabel(g, routing, tokens);
  std::vector<Inputs> in;
  const uint64_t epoch = startCase(g, rng, routing, tokens, xScale, true, in, label);
  stepAll(g, tokens);
  expectEpochsAdvanced(g, epoch, 1, label);

  const BackwardReference ref = backwardReference(g, in, g.options.clampMilli);
  const size_t R = size_t(g.size());
  std::vector<double> yErr(R), dxErr(R), dTopkErr(R), dW1Err(R), dW2Err(R);
  // One buffer read back at a time: a rank's dW1 alone is gigabytes at the DeepSeek-V3 shape.
  for (int r = 0; r < g.size(); ++r) {
    const std::string at = label + " rank " + std::to_string(r);
    const Rank& rank = g[r];
    const Gradients& grads = ref.ranks[size_t(r)];
    const int64_t t = tokens[size_t(r)], firstExpert = r * s.local();
    yErr[size_t(r)] = expectMatches(rank.readY(), t, s.hidden, forwardReference(g, in[size_t(r)], g.options.clampMilli),
                                    "y", at);
    dxErr[size_t(r)] = expectMatches(rank.read<uint16_t>(rank.dx, s.yElems()), t, s.hidden, grads.dx, "dx", at);
    dTopkErr[size_t(r)] = expectMatches(rank.read<uint32_t>(rank.dTopkWeights, s.dTopkElems()), t, s.topk,
                                        grads.dTopkWeights, "d_topk_weights", at);
    dW1Err[size_t(r)] = expectMatchesRows(
        rank.read<uint16_t>(rank.dW1, s.dW1Elems()), s.w1Rows(), s.hidden,
        [&](int64_t row, float* out) { ref.dW1Row(firstExpert + row / (2 * s.inter), row % (2 * s.inter), out); },
        "dW1", at);
    dW2Err[size_t(r)] = expectMatchesRows(
        rank.read<uint16_t>(rank.dW2, s.dW2Elems()), s.w2Rows(), s.inter,
        [&](int64_t row, float* out) { ref.dW2Row(firstExpert + row / s.hidden, row % s.hidden, out); }, "dW2", at);
  }
  std::string summary = label + ": rel err" + formatMax("y", yErr) + formatMax("dx", dxErr) +
                        formatMax("d_topk_weights", dTopkErr) + formatMax("dW1", dW1Err) + formatMax("dW2", dW2Err) +
                        ", epoch +" + std::to_string(g.stepEpochs) + " per step";
  if (!repeat) return summary;

  std::vector<Snapshot> snapshots(R);
  for (int r = 0; r < g.size(); ++r) takeSnapshot(g[r], snapshots[size_t(r)]);
  for (int r = 0; r < g.size(); ++r) g[r].fillSentinels();
  stepAll(g, tokens);
  expectEpochsAdvanced(g, epoch, 2, label + " (repeat)");
  size_t differing = 0;
  for (int r = 0; r < g.size(); ++r) {
    const size_t d = countDiffering(g[r], snapshots[size_t(r)]);
    EXPECT_EQ(d, 0u) << label << " rank " << r << ": a second step on the same inputs changed the outputs";
    differing += d;
  }
  return summary + ", repeat differs in " + std::to_string(differing);
}

// `call` must throw Error(kInvalidArgument), naming `mustName` when given.
void expectInvalidArgument(const std::function<void()>& call, const char* mustName, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << what << ": no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << errorCodeName(e.code()) << ": " << e.what();
    if (mustName) {
      EXPECT_NE(std::string(e.what()).find(mustName), std::string::npos)
          << what << ": the message does not name " << mustName << ": " << e.what();
    }
    std::printf("%s: %s\n", what.c_str(), e.what());
  }
}

// An instantiated CUDA graph, destroyed with its owner.
struct Graph {
  Device* device = nullptr;
  GraphHandle handle = nullptr;
  ~Graph() {
    if (!handle) return;
    try {
      device->destroyGraph(handle);
    } catch (...) {
    }
  }
};

// Captures one forward of every rank at `tokens` into graphs[r] (nothing runs).
void captureForwards(Group& g, const std::vector<int64_t>& tokens, std::vector<Graph>& graphs) {
  for (int r = 0; r < g.size(); ++r) {
    Rank& rank = g[r];
    graphs[size_t(r)].device = &rank.device();
    rank.device().beginCapture(rank.stream);
    try {
      rank.layer->forward(rank.args(tokens[size_t(r)]), rank.stream);
    } catch (...) {
      try {
        graphs[size_t(r)].handle = rank.device().endCapture(rank.stream);
      } catch (...) {
      }
      throw;
    }
    graphs[size_t(r)].handle = rank.device().endCapture(rank.stream);
  }
}

// Copies every rank's routing (topk_idx, topk_weights) from `in` on its stream, then replays every rank's graph,
// then checks every rank's errors. Every rank's copies come before any graph: a copy from pageable memory may wait
// for its stream to drain, and a rank's graph waits for the others'.
void replayWithRouting(Group& g, const std::vector<Graph>& graphs, const std::vector<Inputs>& in) {
  for (int r = 0; r < g.size(); ++r) {
    Rank& rank = g[r];
    const Inputs& rin = in[size_t(r)];
    if (rin.tokens == 0) continue;
    rank.device().copyHostToDeviceAsync(rank.topkIdx, rin.topkIdx.data(), rin.topkIdx.size() * 4, rank.stream);
    rank.device().copyHostToDeviceAsync(rank.topkWeights, rin.topkWeights.data(), rin.topkWeights.size() * 4,
                                        rank.stream);
  }
  for (int r = 0; r < g.size(); ++r) g[r].device().launchGraph(graphs[size_t(r)].handle, g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->checkErrors(g[r].stream);
}

// ---------------------------------------------------------------------------------------------------- tests

// The multi-rank layer tests, at every count of kRankCounts.
class LayerTest : public ::testing::TestWithParam<int> {
 protected:
  int ranks() const { return GetParam(); }
  // One checked training step of `shape` with uniform routing at `tokens` per rank (cycled over the ranks), its
  // summary printed after `label`.
  void checkTrainingStep(const Shape& shape, const char* label, std::initializer_list<int64_t> tokens) {
    std::mt19937 rng = testRng();
    Group g;
    ASSERT_NO_FATAL_FAILURE(openGroup(g, shape, {0, true, false, 0}, parseEnv(), rng));
    std::printf("SUMMARY layer %s%s\n", label,
                runBackwardCase(g, rng, Routing::kUniform, cycled(ranks(), tokens), 1.f, false).c_str());
  }
};
INSTANTIATE_TEST_SUITE_P(, LayerTest, ::testing::ValuesIn(kRankCounts), rankCountName);

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

// ---- backward ----

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

// ---- DeepSeek-V3 ----

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

// ---- the test cache ----

// scripts/gen-gpu-test-cache.sh lists every kernel (MoeLayer::kernelSpecs) of every layer the tests above open
// (testedLayers()), so that a cache generated on another machine holds them. No GPU needed; skips when the script
// is not found (the source tree at MEGAMOE_SOURCE_DIR, or the working directory, must hold it).
TEST(LayerTestCache, GpuTestCacheListsEveryLayerKernel) {
  std::ifstream script;
  std::string path;
  for (const std::string& dir : {std::string(MEGAMOE_SOURCE_DIR), std::string(".")}) {
    path = dir + "/scripts/gen-gpu-test-cache.sh";
    script.open(path);
    if (script) break;
  }
  if (!script) GTEST_SKIP() << "scripts/gen-gpu-test-cache.sh not found (source tree " << MEGAMOE_SOURCE_DIR << ")";
  // Entries: "kernel spec" lines inside the kernels=( ... ) array, the spec "-" for none.
  std::set<std::string> listed;
  std::string line;
  bool inList = false;
  while (std::getline(script, line)) {
    if (line.rfind("kernels=(", 0) == 0) inList = true;
    else if (inList && line.rfind(")", 0) == 0) inList = false;
    if (!inList) continue;
    const size_t open = line.find('"'), close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close == std::string::npos) continue;
    std::istringstream entry(line.substr(open + 1, close - open - 1));
    std::string kernel, spec;
    entry >> kernel >> spec;
    listed.insert(kernel + " " + spec);
  }
  ASSERT_FALSE(listed.empty()) << path << ": no kernels=( ... ) entries";
  std::set<std::string> missing;
  size_t needed = 0;
  for (const auto& [shape, options] : testedLayers())
    for (const auto& [kernel, spec] : MoeLayer::kernelSpecs(layerConfig(shape, options), shape.ranks)) {
      ++needed;
      const std::string entry = kernel + " " + (spec.empty() ? "-" : specText(spec));
      if (!listed.count(entry)) missing.insert(entry);
    }
  std::string lines;
  for (const std::string& m : missing) lines += "\n  \"" + m + "\"";
  EXPECT_TRUE(missing.empty()) << path << " lacks " << missing.size() << " of the layer tests' kernels:" << lines;
  std::printf("SUMMARY %zu kernel loads of %zu tested layers, %zu listed entries in %s\n", needed,
              testedLayers().size(), listed.size(), path.c_str());
}

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
}  // namespace megamoe

int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "--exchange-worker") == 0) {
    megamoe::gputest::initGpuTestProcess();
    return megamoe::runExchangeWorker(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  }
  return megamoe::gputest::runGpuTests(argc, argv);
}
