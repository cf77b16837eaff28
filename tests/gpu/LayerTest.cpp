// GPU tier for the MoE layer (MoeLayer.h) on two GPUs in mode A (one process drives both ranks, createLocal), at
// H=512 I=256 E=16 (8 per rank) topk=4 max_tokens=1024.
// Forward: y of each rank against a host reference in double that emulates the kernels' bf16 roundings, over
// routings (uniform, all picks remote, one hot expert, ~10% -1 entries) and token counts that differ between the
// ranks (zero included), with the SwiGLU clamp on and off; every row of y[:tokens] written, the guard rows past it
// untouched, a repeated call bitwise identical, epochs advancing on the device; 1000 CUDA-graph replays with the
// routing changed in-stream before each, bitwise equal to plain calls; host-visible bad arguments (kInvalidArgument)
// and an out-of-range expert index (kBadIndex on its rank, a bounded timeout on the peer).
// Backward (training layers): forward then backward on both ranks, dx, d_topk_weights and dW1/dW2 (on the experts'
// owners, summed over both ranks' picks) against the reference, over the same routings and token counts and with the
// clamp; every element a call may write written, the guard rows untouched, a repeated step bitwise identical; what a
// training forward keeps (recomputing the dispatched x saves exactly its bytes); bad backward arguments.
// Kernels come from the test cache (scripts/gen-gpu-test-cache.sh DIR, MEGAMOE_CACHE_DIR=DIR): a cache without them
// fails the test with the loader's message. Skips, saying why, without two sm_90a CUDA devices.
// LayerTest.SmallForward and LayerTest.SmallBackward are the cases to run under compute-sanitizer (memcheck,
// racecheck).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"
#include "megamoe/env.h"

namespace megamoe {
namespace {

using namespace gputest;

constexpr int kRanks = 2;
constexpr int64_t kHidden = 512, kInter = 256, kExperts = 16, kLocal = kExperts / kRanks, kTopk = 4;
constexpr int64_t kMaxTokens = 1024;
constexpr int64_t kW1Rows = kLocal * 2 * kInter, kW2Rows = kLocal * kHidden;  // one rank's w1 [.., H], w2 [.., I]
// Every output buffer holds kGuardRows rows past what a call may write, pre-filled with the sentinel like the rest.
constexpr int64_t kGuardRows = 64;
constexpr size_t kYElems = size_t((kMaxTokens + kGuardRows) * kHidden);  // y and dx
constexpr size_t kDTopkElems = size_t((kMaxTokens + kGuardRows) * kTopk);
constexpr size_t kDW1Elems = size_t((kW1Rows + kGuardRows) * kHidden);
constexpr size_t kDW2Elems = size_t((kW2Rows + kGuardRows) * kInter);
constexpr uint16_t kSentinel = 0x7fc1;        // a bf16 NaN no kernel result has (the host's NaN rounding gives 0x7fc0)
constexpr uint32_t kSentinel32 = 0x7fc1dead;  // the same for fp32 outputs (d_topk_weights)
constexpr double kTolerance = 1e-2;           // relative Frobenius error of each output against the reference

MoeLayerConfig layerConfig(int64_t clampMilli, bool training, bool dedup = false) {
  MoeLayerConfig c;
  c.hidden = kHidden;
  c.intermediate = kInter;
  c.experts = kExperts;
  c.topk = kTopk;
  c.maxTokens = kMaxTokens;
  c.swigluClampMilli = clampMilli;
  c.training = training;
  c.dedupTokens = dedup;
  return c;
}

#define MEGAMOE_REQUIRE_TWO_SM90A_GPUS()                                                                      \
  MEGAMOE_REQUIRE_CUDA(backend_);                                                                             \
  if (backend_->deviceCount() < kRanks)                                                                       \
    GTEST_SKIP() << "needs " << kRanks << " GPUs (mode A, one rank per GPU), " << backend_->deviceCount()     \
                 << " visible";                                                                               \
  for (int ordinal = 0; ordinal < kRanks; ++ordinal)                                                          \
    if (backend_->device(ordinal)->target() != kTarget)                                                       \
      GTEST_SKIP() << "the test cache holds sm_90a code; device " << ordinal << " is "                        \
                   << backend_->device(ordinal)->target()

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

// Every output buffer of one rank, guard rows included.
struct Outputs {
  std::vector<uint16_t> y, dx;
  std::vector<uint32_t> dTopkWeights;
  std::vector<uint16_t> dW1, dW2;
};

size_t countDiffering(const Outputs& a, const Outputs& b) {
  return countDiffering(a.y, b.y) + countDiffering(a.dx, b.dx) + countDiffering(a.dTopkWeights, b.dTopkWeights) +
         countDiffering(a.dW1, b.dW1) + countDiffering(a.dW2, b.dW2);
}

// ---- one rank: runtime (device), layer, stream and the forward's and backward's device buffers ----

struct Rank {
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<MoeLayer> layer;
  StreamHandle stream = nullptr;
  DevicePtr x = 0, topkIdx = 0, topkWeights = 0, w1 = 0, w2 = 0, y = 0;
  DevicePtr dy = 0, dx = 0, dTopkWeights = 0, dW1 = 0, dW2 = 0;
  std::vector<float> w1f, w2f;  // this rank's experts' weights as the host reference reads them (bf16 values)

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
  std::vector<uint16_t> readY() const { return read<uint16_t>(y, kYElems); }
  Outputs readOutputs() const {
    return {readY(), read<uint16_t>(dx, kYElems), read<uint32_t>(dTopkWeights, kDTopkElems),
            read<uint16_t>(dW1, kDW1Elems), read<uint16_t>(dW2, kDW2Elems)};
  }
  uint64_t readEpoch() const { return gputest::readEpoch(layer->heap()); }
  template <typename Bits>
  void fill(DevicePtr at, size_t count, Bits value) {
    const std::vector<Bits> values(count, value);
    uploadAndWait(device(), at, values.data(), count * sizeof(Bits));
  }
  // Every output buffer (the forward's and the backward's), guard rows included.
  void fillSentinels() {
    fill(y, kYElems, kSentinel);
    fill(dx, kYElems, kSentinel);
    fill(dTopkWeights, kDTopkElems, kSentinel32);
    fill(dW1, kDW1Elems, kSentinel);
    fill(dW2, kDW2Elems, kSentinel);
  }
};

struct Pair {
  Rank ranks[kRanks];
  int64_t clampMilli = 0;
  uint64_t stepEpochs = 0;  // how far one forward + backward advances the epoch (learned on the first step)
  ~Pair() {
    // Nothing may still run when the buffers and layers go; the layers go before any runtime.
    for (Rank& rank : ranks) {
      if (!rank.runtime || !rank.stream) continue;
      try {
        rank.device().synchronize(rank.stream);
      } catch (...) {
      }
    }
    for (Rank& rank : ranks) rank.layer.reset();
  }
};

// Opens devices 0 and 1, a layer on each (createLocal: kernels from the cache; a cache miss throws
// Error(kKernelNotFound), which fails the test), the buffers at max_tokens and random expert weights.
void openPair(Pair& p, int64_t clampMilli, const RuntimeEnv& env, std::mt19937& rng, bool training = false,
              bool dedup = false) {
  const MoeLayerConfig config = layerConfig(clampMilli, training, dedup);
  ASSERT_EQ(MoeLayer::validate(config, kRanks), "");
  p.clampMilli = clampMilli;
  std::vector<Runtime*> runtimes;
  for (int r = 0; r < kRanks; ++r) {
    p.ranks[r].runtime = std::make_unique<Runtime>(BackendKind::kCuda, r, env);
    p.ranks[r].stream = p.ranks[r].device().createStream();
    runtimes.push_back(p.ranks[r].runtime.get());
  }
  auto layers = MoeLayer::createLocal(runtimes, config);
  ASSERT_EQ(layers.size(), size_t(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(layers[size_t(r)]);
    EXPECT_EQ(layers[size_t(r)]->rank(), r);
    EXPECT_EQ(layers[size_t(r)]->ranks(), kRanks);
    p.ranks[r].layer = std::move(layers[size_t(r)]);
  }
  const size_t w1Elems = size_t(kW1Rows * kHidden), w2Elems = size_t(kW2Rows * kInter);
  for (Rank& rank : p.ranks) {
    Device& d = rank.device();
    rank.x = d.allocate(size_t(kMaxTokens * kHidden) * 2);
    rank.topkIdx = d.allocate(size_t(kMaxTokens * kTopk) * 4);
    rank.topkWeights = d.allocate(size_t(kMaxTokens * kTopk) * 4);
    rank.w1 = d.allocate(w1Elems * 2);
    rank.w2 = d.allocate(w2Elems * 2);
    rank.y = d.allocate(kYElems * 2);
    rank.dy = d.allocate(size_t(kMaxTokens * kHidden) * 2);
    rank.dx = d.allocate(kYElems * 2);
    rank.dTopkWeights = d.allocate(kDTopkElems * 4);
    rank.dW1 = d.allocate(kDW1Elems * 2);
    rank.dW2 = d.allocate(kDW2Elems * 2);
    const std::vector<uint16_t> w1 = randomBf16(rng, w1Elems, float(1 / std::sqrt(double(kHidden))));
    const std::vector<uint16_t> w2 = randomBf16(rng, w2Elems, float(1 / std::sqrt(double(kInter))));
    uploadAndWait(d, rank.w1, w1.data(), w1.size() * 2);
    uploadAndWait(d, rank.w2, w2.data(), w2.size() * 2);
    rank.w1f.resize(w1Elems);
    rank.w2f.resize(w2Elems);
    std::transform(w1.begin(), w1.end(), rank.w1f.begin(), fromBf16);
    std::transform(w2.begin(), w2.end(), rank.w2f.begin(), fromBf16);
  }
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

// `out[0 .. k)`: k distinct experts from [lo, lo + n), in random order.
void distinctExperts(std::mt19937& rng, int32_t lo, int32_t n, int32_t* out, int64_t k) {
  std::vector<int32_t> pool(static_cast<size_t>(n));
  std::iota(pool.begin(), pool.end(), lo);
  for (int64_t i = 0; i < k; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, n - 1);
    std::swap(pool[size_t(i)], pool[size_t(pick(rng))]);
    out[i] = pool[size_t(i)];
  }
}

// Rank `rank`'s inputs: x ~ N(0, xScale²), distinct experts per token (uniform; all owned by the other rank; always
// including `hot`; uniform with ~10% of the entries -1) and weights uniform in [0.05, 1); with `training`, dy ~ N(0, 1)
// as well.
Inputs makeInputs(std::mt19937& rng, Routing routing, int rank, int64_t tokens, int32_t hot, float xScale,
                  bool training = false) {
  Inputs in;
  in.tokens = tokens;
  in.x = randomBf16(rng, size_t(tokens * kHidden), xScale);
  in.topkIdx.resize(size_t(tokens * kTopk));
  std::uniform_int_distribution<int64_t> slot(0, kTopk - 1);
  std::bernoulli_distribution skip(0.1);
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* picks = &in.topkIdx[size_t(t * kTopk)];
    if (routing == Routing::kAllRemote) {
      const int other = (rank + 1) % kRanks;
      distinctExperts(rng, int32_t(other * kLocal), int32_t(kLocal), picks, kTopk);
      continue;
    }
    distinctExperts(rng, 0, int32_t(kExperts), picks, kTopk);
    if (routing == Routing::kHotExpert && std::find(picks, picks + kTopk, hot) == picks + kTopk)
      picks[slot(rng)] = hot;
    if (routing == Routing::kSparse)
      for (int64_t j = 0; j < kTopk; ++j)
        if (skip(rng)) picks[j] = -1;
  }
  std::uniform_real_distribution<float> weight(0.05f, 1.f);
  in.topkWeights.resize(size_t(tokens * kTopk));
  for (float& w : in.topkWeights) w = weight(rng);
  if (training) in.dy = randomBf16(rng, size_t(tokens * kHidden));
  return in;
}

void upload(Rank& rank, const Inputs& in) {
  if (in.tokens == 0) return;
  uploadAndWait(rank.device(), rank.x, in.x.data(), in.x.size() * 2);
  uploadAndWait(rank.device(), rank.topkIdx, in.topkIdx.data(), in.topkIdx.size() * 4);
  uploadAndWait(rank.device(), rank.topkWeights, in.topkWeights.data(), in.topkWeights.size() * 4);
  if (!in.dy.empty()) uploadAndWait(rank.device(), rank.dy, in.dy.data(), in.dy.size() * 2);
}

// ---- the host reference ----

double roundBf16(double v) { return fromBf16(toBf16(float(v))); }

// a . b over n (a multiple of 4) elements, in four chains: one chain's sum is latency-bound.
static_assert(kHidden % 4 == 0 && kInter % 4 == 0);
double dot(const double* a, const float* b, int64_t n) {
  double s[4] = {0, 0, 0, 0};
  for (int64_t i = 0; i < n; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += a[i + k] * double(b[i + k]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// acc[0 .. n) += a * b[0 .. n).
void axpy(double a, const float* b, double* acc, int64_t n) {
  if (a == 0) return;
  for (int64_t i = 0; i < n; ++i) acc[i] += a * double(b[i]);
}

// body(i) for i in [0, n) over the host's cores.
void parallelFor(int64_t n, const std::function<void(int64_t)>& body) {
  const int64_t workers = std::min<int64_t>(n, std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 32));
  std::atomic<int64_t> next{0};
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w)
    threads.emplace_back([&] {
      for (int64_t i; (i = next.fetch_add(1)) < n;) body(i);
    });
  for (auto& t : threads) t.join();
}

// Expert e's w1 [2I, H] and w2 [H, I] as the reference reads them (on its owner e / (E/R), local expert e % (E/R)).
const float* w1Of(const Pair& p, int32_t e) {
  return &p.ranks[e / kLocal].w1f[size_t((e % kLocal) * 2 * kInter * kHidden)];
}
const float* w2Of(const Pair& p, int32_t e) {
  return &p.ranks[e / kLocal].w2f[size_t((e % kLocal) * kHidden * kInter)];
}

// h = bf16(x . w1^T) [2I]: one pick's L1 pre-activation, rounded where the forward rounds (and keeps) it.
void preActivation(const double* x, const float* w1, double* h) {
  for (int64_t k = 0; k < 2 * kInter; ++k) h[k] = roundBf16(dot(x, w1 + k * kHidden, kHidden));
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
std::vector<float> forwardReference(const Pair& p, const Inputs& in, int64_t clampMilli) {
  const double c = double(clampMilli) / 1000;
  std::vector<float> y(size_t(in.tokens * kHidden));
  parallelFor(in.tokens, [&](int64_t t) {
    std::vector<double> x(static_cast<size_t>(kHidden)), h(static_cast<size_t>(2 * kInter)),
        act(static_cast<size_t>(kInter)), acc(static_cast<size_t>(kHidden), 0.0);
    for (int64_t k = 0; k < kHidden; ++k) x[size_t(k)] = fromBf16(in.x[size_t(t * kHidden + k)]);
    for (int64_t j = 0; j < kTopk; ++j) {
      const int32_t e = in.topkIdx[size_t(t * kTopk + j)];
      if (e < 0 || e >= kExperts) continue;
      const float* w2 = w2Of(p, e);
      preActivation(x.data(), w1Of(p, e), h.data());
      for (int64_t i = 0; i < kInter; ++i)
        act[size_t(i)] = roundBf16(swiglu(h[size_t(i)], h[size_t(kInter + i)], c).act);
      const double w = in.topkWeights[size_t(t * kTopk + j)];
      for (int64_t n = 0; n < kHidden; ++n) acc[size_t(n)] += w * roundBf16(dot(act.data(), w2 + n * kInter, kInter));
    }
    for (int64_t n = 0; n < kHidden; ++n) y[size_t(t * kHidden + n)] = float(roundBf16(acc[size_t(n)]));
  });
  return y;
}

// One rank's backward outputs: dx [tokens, H], d_topk_weights [tokens, topk], and dW1 / dW2 of the rank's own experts
// (w1's and w2's layouts).
struct Gradients {
  std::vector<float> dx, dTopkWeights, dW1, dW2;
};

// Both ranks' gradients for their inputs (dy included), in double, rounded to bf16 where the kernels round. For every
// pick j of token t with weight w and expert e != -1: h = bf16(x[t] . w1[e]^T) and act = swiglu(gate, up) unrounded
// (the kernels' fp32 act from the kept h); g = bf16(dy[t] . w2[e]); d_topk_weights[t][j] = <g, act> (0 for -1);
// dact = w g; dh = bf16([dact dact/dgate | dact dact/dup]); dx[t] = bf16(sum_j bf16(dh . w1[e])). On e's owner, over
// the picks of e on both ranks: dW2[e] = bf16(sum dy[t]^T bf16(w act)), dW1[e] = bf16(sum dh^T x[t]); 0 without picks.
std::array<Gradients, kRanks> backwardReference(const Pair& p, const Inputs (&in)[kRanks], int64_t clampMilli) {
  const double c = double(clampMilli) / 1000;
  std::array<Gradients, kRanks> out;
  // x and dy as floats; per pick (token * topk + slot): dh [2I] and w act [I] (bf16 values).
  std::vector<float> x[kRanks], dy[kRanks], dh[kRanks], wAct[kRanks];
  int64_t allTokens = 0;
  for (int r = 0; r < kRanks; ++r) {
    const size_t tokens = size_t(in[r].tokens), picks = size_t(in[r].tokens * kTopk);
    x[r].resize(in[r].x.size());
    dy[r].resize(in[r].dy.size());
    std::transform(in[r].x.begin(), in[r].x.end(), x[r].begin(), fromBf16);
    std::transform(in[r].dy.begin(), in[r].dy.end(), dy[r].begin(), fromBf16);
    dh[r].assign(picks * size_t(2 * kInter), 0.f);
    wAct[r].assign(picks * size_t(kInter), 0.f);
    Gradients& grads = out[size_t(r)];
    grads.dx.assign(tokens * size_t(kHidden), 0.f);
    grads.dTopkWeights.assign(picks, 0.f);
    grads.dW1.assign(size_t(kW1Rows * kHidden), 0.f);
    grads.dW2.assign(size_t(kW2Rows * kInter), 0.f);
    allTokens += in[r].tokens;
  }

  // Per token: everything but dW.
  parallelFor(allTokens, [&](int64_t t) {
    int r = 0;
    for (; t >= in[r].tokens; ++r) t -= in[r].tokens;
    Gradients& grads = out[size_t(r)];
    std::vector<double> xt(static_cast<size_t>(kHidden)), dyt(static_cast<size_t>(kHidden)),
        h(static_cast<size_t>(2 * kInter)), g(static_cast<size_t>(kInter)), dxPick(static_cast<size_t>(kHidden)),
        dxSum(static_cast<size_t>(kHidden), 0.0);
    for (int64_t n = 0; n < kHidden; ++n) {
      xt[size_t(n)] = x[r][size_t(t * kHidden + n)];
      dyt[size_t(n)] = dy[r][size_t(t * kHidden + n)];
    }
    for (int64_t j = 0; j < kTopk; ++j) {
      const int64_t pick = t * kTopk + j;
      const int32_t e = in[r].topkIdx[size_t(pick)];
      if (e < 0 || e >= kExperts) continue;
      const float *w1 = w1Of(p, e), *w2 = w2Of(p, e);
      const double w = in[r].topkWeights[size_t(pick)];
      preActivation(xt.data(), w1, h.data());
      std::fill(g.begin(), g.end(), 0.0);
      for (int64_t n = 0; n < kHidden; ++n) axpy(dyt[size_t(n)], w2 + n * kInter, g.data(), kInter);
      float* dhPick = &dh[r][size_t(pick * 2 * kInter)];
      float* wActPick = &wAct[r][size_t(pick * kInter)];
      double dTopkWeight = 0;
      for (int64_t i = 0; i < kInter; ++i) {
        const double gi = roundBf16(g[size_t(i)]);
        const Swiglu s = swiglu(h[size_t(i)], h[size_t(kInter + i)], c);
        dTopkWeight += gi * s.act;
        dhPick[i] = float(roundBf16(w * gi * s.dGate));
        dhPick[kInter + i] = float(roundBf16(w * gi * s.dUp));
        wActPick[i] = float(roundBf16(w * s.act));
      }
      grads.dTopkWeights[size_t(pick)] = float(dTopkWeight);
      std::fill(dxPick.begin(), dxPick.end(), 0.0);
      for (int64_t k = 0; k < 2 * kInter; ++k) axpy(dhPick[k], w1 + k * kHidden, dxPick.data(), kHidden);
      for (int64_t n = 0; n < kHidden; ++n) dxSum[size_t(n)] += roundBf16(dxPick[size_t(n)]);
    }
    for (int64_t n = 0; n < kHidden; ++n) grads.dx[size_t(t * kHidden + n)] = float(roundBf16(dxSum[size_t(n)]));
  });

  // dW: one task per row of dW1 [E, 2I, H], then per row of dW2 [E, H, I], over all E experts.
  std::vector<std::pair<int, int64_t>> picksOf[kExperts];  // (rank, token * topk + slot) of each expert's picks
  for (int r = 0; r < kRanks; ++r)
    for (int64_t pick = 0; pick < in[r].tokens * kTopk; ++pick) {
      const int32_t e = in[r].topkIdx[size_t(pick)];
      if (e >= 0 && e < kExperts) picksOf[e].emplace_back(r, pick);
    }
  constexpr int64_t kDW1Tasks = kExperts * 2 * kInter;
  parallelFor(kDW1Tasks + kExperts * kHidden, [&](int64_t task) {
    const bool l1 = task < kDW1Tasks;
    const int64_t rowsPerExpert = l1 ? 2 * kInter : kHidden, width = l1 ? kHidden : kInter;
    if (!l1) task -= kDW1Tasks;
    const int64_t e = task / rowsPerExpert, row = task % rowsPerExpert;
    std::vector<double> acc(static_cast<size_t>(width), 0.0);
    for (const auto& [r, pick] : picksOf[e]) {
      const int64_t t = pick / kTopk;
      if (l1)
        axpy(dh[r][size_t(pick * 2 * kInter + row)], &x[r][size_t(t * kHidden)], acc.data(), kHidden);
      else
        axpy(dy[r][size_t(t * kHidden + row)], &wAct[r][size_t(pick * kInter)], acc.data(), kInter);
    }
    Gradients& owner = out[size_t(e / kLocal)];
    float* dst = &(l1 ? owner.dW1 : owner.dW2)[size_t(((e % kLocal) * rowsPerExpert + row) * width)];
    for (int64_t k = 0; k < width; ++k) dst[k] = float(roundBf16(acc[size_t(k)]));
  });
  return out;
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

// One output buffer `name` of `width` columns (guard rows included) against the reference for its first `rows`
// rows: no sentinel left there, relative error <= kTolerance, every element past them still the sentinel. Returns the
// relative error.
template <typename Bits>
double expectMatches(const std::vector<Bits>& got, int64_t rows, int64_t width, const std::vector<float>& ref,
                     const std::string& name, const std::string& label) {
  const size_t n = size_t(rows * width), w = size_t(width);
  EXPECT_EQ(ref.size(), n) << label << ": the reference's " << name << " has the wrong size";
  const auto where = [w](size_t i) { return "row " + std::to_string(i / w) + " column " + std::to_string(i % w); };
  size_t unwritten = 0, touched = 0;
  std::string firstUnwritten, firstTouched;
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    if (isSentinel(got[i]) && unwritten++ == 0) firstUnwritten = " (first: " + where(i) + ")";
    values[i] = isSentinel(got[i]) ? ref[i] : valueOf(got[i]);  // counted above, kept out of the error
  }
  for (size_t i = n; i < got.size(); ++i)
    if (!isSentinel(got[i]) && touched++ == 0) firstTouched = " (first: " + where(i) + " = " + hex(got[i]) + ")";
  const double err = relativeError(values, ref);
  EXPECT_EQ(unwritten, 0u) << label << ": elements of " << name << "[:" << rows << "] never written" << firstUnwritten;
  EXPECT_LE(err, kTolerance) << label << ": relative Frobenius error of " << name << "[:" << rows << "]";
  EXPECT_EQ(touched, 0u) << label << ": elements of " << name << " past row " << rows << " (guard rows up to "
                         << got.size() / w << ") overwritten" << firstTouched;
  return err;
}

// Enqueues one forward on rank 0, then on rank 1 (the kernels wait on each other: nothing is synchronised in
// between), then checks both ranks' errors.
void forwardBoth(Pair& p, const int64_t (&tokens)[kRanks]) {
  for (int r = 0; r < kRanks; ++r) p.ranks[r].layer->forward(p.ranks[r].args(tokens[r]), p.ranks[r].stream);
  for (Rank& rank : p.ranks) rank.layer->checkErrors(rank.stream);
}

// One training step: forward on rank 0, forward on rank 1, backward on rank 0, backward on rank 1, all enqueued before
// anything is synchronised; then both ranks' errors.
void stepBoth(Pair& p, const int64_t (&tokens)[kRanks]) {
  for (int r = 0; r < kRanks; ++r) p.ranks[r].layer->forward(p.ranks[r].args(tokens[r]), p.ranks[r].stream);
  for (int r = 0; r < kRanks; ++r)
    p.ranks[r].layer->backward(p.ranks[r].backwardArgs(tokens[r]), p.ranks[r].stream);
  for (Rank& rank : p.ranks) rank.layer->checkErrors(rank.stream);
}

std::string caseLabel(const Pair& p, Routing routing, const int64_t (&tokens)[kRanks]) {
  return std::string(routingName(routing)) + " tokens=" + std::to_string(tokens[0]) + "," +
         std::to_string(tokens[1]) + " clamp=" + std::to_string(p.clampMilli) + "m";
}

// Fresh inputs for one case on both ranks (dy too with `training`), uploaded, and every output buffer filled with the
// sentinel. Returns the epoch, which both ranks must agree on.
uint64_t startCase(Pair& p, std::mt19937& rng, Routing routing, const int64_t (&tokens)[kRanks], float xScale,
                   bool training, Inputs (&in)[kRanks], const std::string& label) {
  const int32_t hot = std::uniform_int_distribution<int32_t>(0, int32_t(kExperts) - 1)(rng);
  for (int r = 0; r < kRanks; ++r) {
    in[r] = makeInputs(rng, routing, r, tokens[r], hot, xScale, training);
    upload(p.ranks[r], in[r]);
    p.ranks[r].fillSentinels();
  }
  const uint64_t epoch = p.ranks[0].readEpoch();
  EXPECT_EQ(p.ranks[1].readEpoch(), epoch) << label << ": the ranks' epochs differ before the call";
  return epoch;
}

// One call on both ranks with fresh inputs (`routing`, `tokens` per rank, x ~ N(0, xScale²)): y against the
// reference, epochs one further on both ranks; with `repeat`, a second call on the same inputs must give the same y
// bit for bit. Returns a summary fragment.
std::string runCase(Pair& p, std::mt19937& rng, Routing routing, const int64_t (&tokens)[kRanks], float xScale,
                    bool repeat) {
  const std::string label = caseLabel(p, routing, tokens);
  Inputs in[kRanks];
  const uint64_t epoch = startCase(p, rng, routing, tokens, xScale, false, in, label);
  forwardBoth(p, tokens);
  std::vector<uint16_t> y[kRanks];
  double err[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    y[r] = p.ranks[r].readY();
    err[r] = expectMatches(y[r], tokens[r], kHidden, forwardReference(p, in[r], p.clampMilli), "y",
                           label + " rank " + std::to_string(r));
    EXPECT_EQ(p.ranks[r].readEpoch(), epoch + 1) << label << " rank " << r << ": the epoch did not advance by one";
  }
  std::string summary = label + ": rel err " + std::to_string(err[0]) + "," + std::to_string(err[1]);
  if (!repeat) return summary;

  for (Rank& rank : p.ranks) rank.fillSentinels();
  forwardBoth(p, tokens);
  size_t differing = 0;
  for (int r = 0; r < kRanks; ++r) {
    const size_t d = countDiffering(p.ranks[r].readY(), y[r]);
    EXPECT_EQ(d, 0u) << label << " rank " << r << ": a second call on the same inputs changed y";
    EXPECT_EQ(p.ranks[r].readEpoch(), epoch + 2) << label << " rank " << r;
    differing += d;
  }
  return summary + ", repeat differs in " + std::to_string(differing);
}

// Both ranks' epochs `steps` training steps past `before`: equal, and each step the same advance (> 0) as every
// earlier step on `p` (the first step sets it).
void expectEpochsAdvanced(Pair& p, uint64_t before, uint64_t steps, const std::string& label) {
  const uint64_t advance = p.ranks[0].readEpoch() - before;
  EXPECT_EQ(p.ranks[1].readEpoch() - before, advance) << label << ": the ranks' epochs differ after the call";
  EXPECT_GT(advance, 0u) << label << ": the epoch did not advance";
  if (p.stepEpochs == 0 && advance % steps == 0) p.stepEpochs = advance / steps;
  EXPECT_EQ(advance, steps * p.stepEpochs) << label << ": " << steps << " step(s) advanced the epoch by " << advance
                                           << ", earlier steps by " << p.stepEpochs << " each";
}

std::string formatErrors(const char* name, const double (&err)[kRanks]) {
  char text[96];
  std::snprintf(text, sizeof text, " %s %.2e,%.2e", name, err[0], err[1]);
  return text;
}

// One training step on both ranks (stepBoth) with fresh inputs (`routing`, `tokens` per rank, x ~ N(0, xScale²),
// dy ~ N(0, 1)) on a training pair: y, dx, d_topk_weights, dW1 and dW2 of both ranks against the reference, each
// written where it may be and untouched past it; both epochs one step further; with `repeat`, a second step on the
// same inputs must give the same outputs (guard rows included) bit for bit. Returns a summary fragment.
std::string runBackwardCase(Pair& p, std::mt19937& rng, Routing routing, const int64_t (&tokens)[kRanks],
                            float xScale, bool repeat) {
  const std::string label = "backward " + caseLabel(p, routing, tokens);
  Inputs in[kRanks];
  const uint64_t epoch = startCase(p, rng, routing, tokens, xScale, true, in, label);
  stepBoth(p, tokens);
  expectEpochsAdvanced(p, epoch, 1, label);

  const std::array<Gradients, kRanks> grads = backwardReference(p, in, p.clampMilli);
  Outputs outputs[kRanks];
  double yErr[kRanks], dxErr[kRanks], dTopkErr[kRanks], dW1Err[kRanks], dW2Err[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    const std::string at = label + " rank " + std::to_string(r);
    const Gradients& ref = grads[size_t(r)];
    const Outputs& o = outputs[r] = p.ranks[r].readOutputs();
    yErr[r] = expectMatches(o.y, tokens[r], kHidden, forwardReference(p, in[r], p.clampMilli), "y", at);
    dxErr[r] = expectMatches(o.dx, tokens[r], kHidden, ref.dx, "dx", at);
    dTopkErr[r] = expectMatches(o.dTopkWeights, tokens[r], kTopk, ref.dTopkWeights, "d_topk_weights", at);
    dW1Err[r] = expectMatches(o.dW1, kW1Rows, kHidden, ref.dW1, "dW1", at);
    dW2Err[r] = expectMatches(o.dW2, kW2Rows, kInter, ref.dW2, "dW2", at);
  }
  std::string summary = label + ": rel err" + formatErrors("y", yErr) + formatErrors("dx", dxErr) +
                        formatErrors("d_topk_weights", dTopkErr) + formatErrors("dW1", dW1Err) +
                        formatErrors("dW2", dW2Err) + ", epoch +" + std::to_string(p.stepEpochs) + " per step";
  if (!repeat) return summary;

  for (Rank& rank : p.ranks) rank.fillSentinels();
  stepBoth(p, tokens);
  expectEpochsAdvanced(p, epoch, 2, label + " (repeat)");
  size_t differing = 0;
  for (int r = 0; r < kRanks; ++r) {
    const size_t d = countDiffering(p.ranks[r].readOutputs(), outputs[r]);
    EXPECT_EQ(d, 0u) << label << " rank " << r << ": a second step on the same inputs changed the outputs";
    differing += d;
  }
  return summary + ", repeat differs in " + std::to_string(differing);
}

// ---------------------------------------------------------------------------------------------------- tests

// 24 consecutive calls (every routing at every token pair, each repeated), nothing reset in between.
TEST(LayerTest, ForwardRoutingsAndTokenCounts) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng));
  const int64_t tokenPairs[][kRanks] = {{1024, 1024}, {777, 1024}, {0, 1}, {1, 0}, {0, 0}, {1024, 0}};
  for (const auto& tokens : tokenPairs) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer %s\n", runCase(p, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// Token deduplication (MoeLayerConfig::dedupTokens): the same checks over every routing and uneven token counts.
// With 8 experts per rank and top-4, most tokens pick several experts of one owner (one row crosses, the L1 tiles
// gather it for each pick); -1 entries and one hot expert included (kRoutings).
TEST(LayerTest, ForwardDedupRoutingsAndTokenCounts) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/false, /*dedup=*/true));
  const int64_t tokenPairs[][kRanks] = {{1024, 1024}, {777, 1024}, {0, 1}, {1024, 0}};
  for (const auto& tokens : tokenPairs) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer dedup %s\n", runCase(p, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// SwiGLU clamp 7.0 with x ~ N(0, 4²), so that |gate|, |up| exceed it often: the clamp must change the result (checked
// on the host, so that the case can tell) and y must match the clamped reference.
TEST(LayerTest, ForwardSwigluClamp) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  constexpr int64_t kClampMilli = 7000;
  constexpr float kXScale = 4.f;
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, kClampMilli, parseEnv(), rng));
  const Inputs probe = makeInputs(rng, Routing::kUniform, 0, 128, 0, kXScale);
  const double clampEffect = relativeError(forwardReference(p, probe, 0), forwardReference(p, probe, kClampMilli));
  std::printf("clamp %.1f changes the reference by %.3g (relative)\n", kClampMilli / 1000.0, clampEffect);
  EXPECT_GT(clampEffect, 5 * kTolerance) << "the inputs do not exercise the clamp";
  const int64_t tokenPairs[][kRanks] = {{1024, 777}, {256, 1024}};
  const Routing routings[] = {Routing::kUniform, Routing::kSparse};
  for (int c = 0; c < 2; ++c) {
    std::printf("SUMMARY layer %s\n", runCase(p, rng, routings[c], tokenPairs[c], kXScale, true).c_str());
    if (HasFailure()) return;
  }
}

// One forward per rank captured into a graph at 256 tokens; 8 routings (and weights) whose y comes from plain calls
// checked against the reference; then 1000 replays, each after copying routing i % 8 into topk_idx/topk_weights on
// the rank's stream: y must equal routing i % 8's plain-call y bit for bit every time.
TEST(LayerTest, CudaGraphReplay) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  constexpr int64_t kTokens = 256;
  constexpr int kVariants = 8, kReplays = 1000;
  constexpr size_t kYUsed = size_t(kTokens * kHidden);
  const int64_t tokens[kRanks] = {kTokens, kTokens};
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng));

  // The host copies stay alive and unchanged while the replays' in-stream copies read them.
  Inputs in[kVariants][kRanks];
  std::vector<uint16_t> expected[kVariants][kRanks];
  for (int v = 0; v < kVariants; ++v) {
    const Routing routing = kRoutings[size_t(v) % std::size(kRoutings)];
    const int32_t hot = std::uniform_int_distribution<int32_t>(0, int32_t(kExperts) - 1)(rng);
    for (int r = 0; r < kRanks; ++r) {
      in[v][r] = makeInputs(rng, routing, r, kTokens, hot, 1.f);
      if (v > 0) in[v][r].x = in[0][r].x;  // the graph changes the routing only
      upload(p.ranks[r], in[v][r]);
      p.ranks[r].fillSentinels();
    }
    forwardBoth(p, tokens);
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<uint16_t> y = p.ranks[r].readY();
      expectMatches(y, kTokens, kHidden, forwardReference(p, in[v][r], 0), "y",
                    "plain call, routing " + std::to_string(v) + " (" + routingName(routing) + ") rank " +
                        std::to_string(r));
      expected[v][r].assign(y.begin(), y.begin() + std::ptrdiff_t(kYUsed));
    }
  }
  ASSERT_FALSE(HasFailure()) << "the plain calls the replays are compared with are wrong";

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
  } graphs[kRanks];
  const uint64_t epoch0 = p.ranks[0].readEpoch();
  for (int r = 0; r < kRanks; ++r) {
    Rank& rank = p.ranks[r];
    graphs[r].device = &rank.device();
    rank.device().beginCapture(rank.stream);
    try {
      rank.layer->forward(rank.args(kTokens), rank.stream);
    } catch (...) {
      try {
        graphs[r].handle = rank.device().endCapture(rank.stream);
      } catch (...) {
      }
      throw;
    }
    graphs[r].handle = rank.device().endCapture(rank.stream);
  }
  EXPECT_EQ(p.ranks[0].readEpoch(), epoch0) << "capture ran something";

  size_t badReplays = 0, badElements = 0;
  std::string firstBad;
  std::vector<uint16_t> y(kYUsed);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kReplays; ++i) {
    const int v = i % kVariants;
    // Both ranks' copies before either graph: a copy from pageable memory may wait for its stream to drain, and a
    // rank's graph waits for the other rank's.
    for (int r = 0; r < kRanks; ++r) {
      Rank& rank = p.ranks[r];
      rank.device().copyHostToDeviceAsync(rank.topkIdx, in[v][r].topkIdx.data(), in[v][r].topkIdx.size() * 4,
                                          rank.stream);
      rank.device().copyHostToDeviceAsync(rank.topkWeights, in[v][r].topkWeights.data(),
                                          in[v][r].topkWeights.size() * 4, rank.stream);
    }
    for (int r = 0; r < kRanks; ++r) p.ranks[r].device().launchGraph(graphs[r].handle, p.ranks[r].stream);
    for (Rank& rank : p.ranks) rank.layer->checkErrors(rank.stream);
    for (int r = 0; r < kRanks; ++r) {
      p.ranks[r].device().copyDeviceToHost(y.data(), p.ranks[r].y, kYUsed * 2);
      size_t d = 0;
      for (size_t k = 0; k < kYUsed; ++k) d += y[k] != expected[v][r][k];
      if (d && badReplays++ == 0)
        firstBad = "replay " + std::to_string(i) + " (routing " + std::to_string(v) + ") rank " + std::to_string(r) +
                   ": " + std::to_string(d) + " elements differ";
      badElements += d;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(badReplays, 0u) << badElements << " elements differ in all; first: " << firstBad;
  for (int r = 0; r < kRanks; ++r)
    EXPECT_EQ(p.ranks[r].readEpoch(), epoch0 + kReplays) << "rank " << r << ": one epoch per replay";
  std::printf("SUMMARY layer graph: %d replays x %d ranks at tokens=%lld over %d routings in %.3f s (%.3f ms per "
              "replay incl. routing upload, sync and copy-back); %zu replay/rank pairs differ (%zu elements)\n",
              kReplays, kRanks, static_cast<long long>(kTokens), kVariants, seconds, seconds * 1000 / kReplays,
              badReplays, badElements);
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

// Host-visible bad arguments throw before anything is enqueued: a normal call on both ranks still works afterwards
// (had one rank enqueued a kernel, the ranks' epochs would disagree).
TEST(LayerTest, InvalidArgumentsThrowBeforeEnqueue) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng));
  for (int r = 0; r < kRanks; ++r) {
    Rank& rank = p.ranks[r];
    const std::string at = "rank " + std::to_string(r) + ": ";
    expectInvalidArgument([&] { rank.layer->forward(rank.args(kMaxTokens + 1), rank.stream); }, "max_tokens",
                          at + "tokens = max_tokens + 1");
    expectInvalidArgument([&] { rank.layer->forward(rank.args(-1), rank.stream); }, "max_tokens",
                          at + "tokens = -1");
    ForwardArgs nullX = rank.args(1);
    nullX.x = 0;
    expectInvalidArgument([&] { rank.layer->forward(nullX, rank.stream); }, nullptr, at + "x null, tokens = 1");
  }
  const int64_t tokens[kRanks] = {64, 64};
  std::printf("SUMMARY layer %s\n", runCase(p, rng, Routing::kUniform, tokens, 1.f, false).c_str());
}

// Expert index E in rank 0's topk_idx: rank 0 reports kBadIndex naming it and writes nothing into y; rank 1's waits
// end in a timeout (bounded at 300 ms here) instead of a hang; both heaps then refuse further calls.
TEST(LayerTest, BadExpertIndexBecomesDeviceError) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  const RuntimeEnv env = parseEnv([](const char* name) -> const char* {
    return std::strcmp(name, "MEGAMOE_WAIT_TIMEOUT_MS") == 0 ? "300" : std::getenv(name);
  });
  ASSERT_EQ(env.waitTimeoutMs, 300u);
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, env, rng));
  const int64_t tokens[kRanks] = {256, 256};
  Inputs in[kRanks];
  for (int r = 0; r < kRanks; ++r) in[r] = makeInputs(rng, Routing::kUniform, r, tokens[r], 0, 1.f);
  const size_t bad = std::uniform_int_distribution<size_t>(0, in[0].topkIdx.size() - 1)(rng);
  in[0].topkIdx[bad] = int32_t(kExperts);
  for (int r = 0; r < kRanks; ++r) {
    upload(p.ranks[r], in[r]);
    p.ranks[r].fillSentinels();
  }

  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < kRanks; ++r) p.ranks[r].layer->forward(p.ranks[r].args(tokens[r]), p.ranks[r].stream);
  std::string message[kRanks];
  ErrorCode code[kRanks] = {ErrorCode::kOk, ErrorCode::kOk};
  double after[kRanks] = {0, 0};
  for (int r = 0; r < kRanks; ++r) {
    try {
      p.ranks[r].layer->checkErrors(p.ranks[r].stream);
    } catch (const Error& e) {
      code[r] = e.code();
      message[r] = e.what();
    }
    after[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::printf("SUMMARY layer bad index (topk_idx[%zu] = %lld on rank 0): rank 0 after %.3f s: \"%s\"; rank 1 after "
              "%.3f s: \"%s\"\n",
              bad, static_cast<long long>(kExperts), after[0], message[0].c_str(), after[1], message[1].c_str());
  EXPECT_LT(after[1], 30.0) << "the errors took too long (wait timeout 300 ms)";

  EXPECT_EQ(code[0], ErrorCode::kDeviceError) << message[0];
  EXPECT_EQ(message[0].rfind("rank 0: index out of range", 0), 0u) << message[0];
  EXPECT_NE(message[0].find("(value " + std::to_string(kExperts)), std::string::npos)
      << "rank 0's error does not name the bad value " << kExperts << ": " << message[0];
  EXPECT_EQ(code[1], ErrorCode::kDeviceError) << message[1];
  EXPECT_EQ(message[1].rfind("rank 1: ", 0), 0u) << message[1];
  EXPECT_NE(message[1].find("timed out"), std::string::npos) << message[1];

  const std::vector<uint16_t> y0 = p.ranks[0].readY();
  const size_t touched = size_t(std::count_if(y0.begin(), y0.end(), [](uint16_t v) { return v != kSentinel; }));
  EXPECT_EQ(touched, 0u) << "rank 0 wrote into y after its bad index";

  for (int r = 0; r < kRanks; ++r) {
    Rank& rank = p.ranks[r];
    EXPECT_FALSE(rank.layer->heap().usable()) << "rank " << r;
    ErrorCode again = ErrorCode::kOk;
    std::string text;
    try {
      rank.layer->forward(rank.args(tokens[r]), rank.stream);
    } catch (const Error& e) {
      again = e.code();
      text = e.what();
    }
    EXPECT_EQ(again, ErrorCode::kHeapUnusable) << "rank " << r << ": a call after the device error: " << text;
  }
}

// Small enough for compute-sanitizer (memcheck, racecheck): 64 tokens per rank, one call, checked.
TEST(LayerTest, SmallForward) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng));
  const int64_t tokens[kRanks] = {64, 64};
  std::printf("SUMMARY layer %s\n", runCase(p, rng, Routing::kUniform, tokens, 1.f, false).c_str());
}

// The same with token deduplication (the forward's gathering L1 tiles and carrier pushes under the sanitizers).
TEST(LayerTest, SmallForwardDedup) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/false, /*dedup=*/true));
  const int64_t tokens[kRanks] = {64, 64};
  std::printf("SUMMARY layer dedup %s\n", runCase(p, rng, Routing::kUniform, tokens, 1.f, false).c_str());
}


// ---- backward ----

// 16 consecutive training steps (every routing at every token pair), each repeated, nothing reset in between.
TEST(LayerTest, BackwardMatchesReference) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/true));
  const int64_t tokenPairs[][kRanks] = {{1024, 1024}, {777, 1024}, {0, 1}, {1024, 0}};
  for (const auto& tokens : tokenPairs) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer %s\n", runBackwardCase(p, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// Training steps on a layer whose forward deduplicates tokens (the forward that keeps h, dedup=1), then the plain
// backward re-dispatches.
TEST(LayerTest, BackwardAfterDedupForward) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/true, /*dedup=*/true));
  const int64_t tokenPairs[][kRanks] = {{1024, 777}, {0, 1}};
  for (const auto& tokens : tokenPairs) {
    for (Routing routing : kRoutings) {
      std::printf("SUMMARY layer dedup %s\n", runBackwardCase(p, rng, routing, tokens, 1.f, true).c_str());
      if (HasFailure()) return;
    }
  }
}

// SwiGLU clamp 7.0 with x ~ N(0, 4²): the clamped components' gradients are 0. The clamp must change the reference
// dx (checked on the host, so that the case can tell), and the kernels must match the clamped reference.
TEST(LayerTest, BackwardSwigluClamp) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  constexpr int64_t kClampMilli = 7000;
  constexpr float kXScale = 4.f;
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, kClampMilli, parseEnv(), rng, /*training=*/true));
  Inputs probe[kRanks];
  for (int r = 0; r < kRanks; ++r) probe[r] = makeInputs(rng, Routing::kUniform, r, 128, 0, kXScale, true);
  const std::array<Gradients, kRanks> plain = backwardReference(p, probe, 0),
                                      clamped = backwardReference(p, probe, kClampMilli);
  const double dxEffect = relativeError(plain[0].dx, clamped[0].dx),
               dW1Effect = relativeError(plain[0].dW1, clamped[0].dW1);
  std::printf("clamp %.1f changes the reference dx by %.3g, dW1 by %.3g (relative)\n", kClampMilli / 1000.0, dxEffect,
              dW1Effect);
  EXPECT_GT(dxEffect, 5 * kTolerance) << "the inputs do not exercise the clamp";
  const int64_t tokenPairs[][kRanks] = {{1024, 777}, {256, 1024}};
  const Routing routings[] = {Routing::kUniform, Routing::kSparse};
  for (int c = 0; c < 2; ++c) {
    std::printf("SUMMARY layer %s\n", runBackwardCase(p, rng, routings[c], tokenPairs[c], kXScale, true).c_str());
    if (HasFailure()) return;
  }
}

// What a training forward keeps for the backward: h and the routing tables; without recomputation the dispatched x
// as well, which is exactly (received rows = ranks x max_tokens x topk) x H bf16 more. A layer built without
// training refuses backward() (kInvalidArgument naming "training") before enqueueing anything: its forward still works.
TEST(LayerTest, BackwardKeepsLessThanWithoutRecompute) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  const uint64_t receivedRows = uint64_t(kRanks * kMaxTokens * kTopk);
  {
    Pair p;
    ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/true));
    for (int r = 0; r < kRanks; ++r) {
      const MoeLayer& layer = *p.ranks[r].layer;
      const uint64_t kept = layer.keptBytes(), without = layer.keptBytesWithoutRecompute();
      std::printf("SUMMARY layer kept bytes rank %d: %llu with recompute, %llu without (the dispatched x: %llu)\n", r,
                  static_cast<unsigned long long>(kept), static_cast<unsigned long long>(without),
                  static_cast<unsigned long long>(receivedRows * uint64_t(kHidden) * 2));
      EXPECT_GT(kept, 0u) << "rank " << r;
      EXPECT_GT(without, 0u) << "rank " << r;
      EXPECT_GE(kept, receivedRows * uint64_t(2 * kInter) * 2) << "rank " << r << ": less than h (received rows x 2I)";
      EXPECT_EQ(int64_t(without) - int64_t(kept), int64_t(receivedRows) * kHidden * 2)
          << "rank " << r << ": recomputation must save exactly the dispatched x (" << receivedRows << " rows x H)";
    }
  }
  {
    Pair p;
    ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/false));
    const int64_t tokens[kRanks] = {64, 64};
    std::printf("SUMMARY layer %s\n", runCase(p, rng, Routing::kUniform, tokens, 1.f, false).c_str());
    for (int r = 0; r < kRanks; ++r) {
      Rank& rank = p.ranks[r];
      expectInvalidArgument([&] { rank.layer->backward(rank.backwardArgs(tokens[r]), rank.stream); }, "training",
                            "rank " + std::to_string(r) + ": backward on a layer built without training");
    }
    std::printf("SUMMARY layer %s\n", runCase(p, rng, Routing::kUniform, tokens, 1.f, false).c_str());
  }
}

// Host-visible bad backward arguments throw Error(kInvalidArgument) before anything is enqueued: a backward before any
// forward, tokens other than the last forward's (naming "tokens"), a null pointer. A checked training step on both
// ranks works afterwards (had one rank enqueued a kernel, the ranks' epochs would disagree or its waits time out).
TEST(LayerTest, BackwardInvalidArgumentsThrowBeforeEnqueue) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/true));
  constexpr int64_t kTokens = 256;
  const int64_t tokens[kRanks] = {kTokens, kTokens};
  for (int r = 0; r < kRanks; ++r) {
    Rank& rank = p.ranks[r];
    expectInvalidArgument([&] { rank.layer->backward(rank.backwardArgs(kTokens), rank.stream); }, nullptr,
                          "rank " + std::to_string(r) + ": backward before any forward");
  }
  for (int r = 0; r < kRanks; ++r) upload(p.ranks[r], makeInputs(rng, Routing::kUniform, r, kTokens, 0, 1.f, true));
  forwardBoth(p, tokens);
  const std::pair<const char*, DevicePtr BackwardArgs::*> pointers[] = {
      {"dy", &BackwardArgs::dy}, {"x", &BackwardArgs::x},   {"topk_idx", &BackwardArgs::topkIdx},
      {"dx", &BackwardArgs::dx}, {"dW1", &BackwardArgs::dW1}, {"d_topk_weights", &BackwardArgs::dTopkWeights}};
  for (int r = 0; r < kRanks; ++r) {
    Rank& rank = p.ranks[r];
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
  std::printf("SUMMARY layer %s\n", runBackwardCase(p, rng, Routing::kUniform, tokens, 1.f, false).c_str());
}

// The backward's case for compute-sanitizer (memcheck, racecheck): 64 tokens per rank, one training step, checked.
TEST(LayerTest, SmallBackward) {
  MEGAMOE_REQUIRE_TWO_SM90A_GPUS();
  std::mt19937 rng = testRng();
  Pair p;
  ASSERT_NO_FATAL_FAILURE(openPair(p, 0, parseEnv(), rng, /*training=*/true));
  const int64_t tokens[kRanks] = {64, 64};
  std::printf("SUMMARY layer %s\n", runBackwardCase(p, rng, Routing::kUniform, tokens, 1.f, false).c_str());
}

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) { return megamoe::gputest::runGpuTests(argc, argv); }
