// GPU tier for the MoE layer (MoeLayer.h) on two GPUs in mode A (one process drives both ranks, createLocal), at
// H=512 I=256 E=16 (8 per rank) topk=4 max_tokens=1024: y of each rank against a host reference in double that
// emulates the kernels' bf16 roundings, over routings (uniform, all picks remote, one hot expert, ~10% -1 entries)
// and token counts that differ between the ranks (zero included), with the SwiGLU clamp on and off; every row of
// y[:tokens] written, the guard rows past it untouched, a repeated call bitwise identical, epochs advancing on the
// device; 1000 CUDA-graph replays with the routing changed in-stream before each, bitwise equal to plain calls;
// host-visible bad arguments (kInvalidArgument) and an out-of-range expert index (kBadIndex on its rank, a bounded
// timeout on the peer). Kernels come from the test cache (scripts/gen-gpu-test-cache.sh DIR, MEGAMOE_CACHE_DIR=DIR):
// a cache without them fails the test with the loader's message. Skips, saying why, without two sm_90a CUDA devices.
// LayerTest.SmallForward is the case to run under compute-sanitizer (memcheck, racecheck).
#include <gtest/gtest.h>

#include <algorithm>
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
constexpr int64_t kGuardRows = 64;  // rows of y past max_tokens, pre-filled with the sentinel like the rest
constexpr size_t kYElems = size_t((kMaxTokens + kGuardRows) * kHidden);
constexpr uint16_t kSentinel = 0x7fc1;  // a bf16 NaN no kernel result has (the host's NaN rounding gives 0x7fc0)
constexpr double kTolerance = 1e-2;     // relative Frobenius error of y against the reference

MoeLayerConfig layerConfig(int64_t clampMilli) {
  MoeLayerConfig c;
  c.hidden = kHidden;
  c.intermediate = kInter;
  c.experts = kExperts;
  c.topk = kTopk;
  c.maxTokens = kMaxTokens;
  c.swigluClampMilli = clampMilli;
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

// ---- one rank: runtime (device), layer, stream and the forward's device buffers ----

struct Rank {
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<MoeLayer> layer;
  StreamHandle stream = nullptr;
  DevicePtr x = 0, topkIdx = 0, topkWeights = 0, w1 = 0, w2 = 0, y = 0;
  std::vector<float> w1f, w2f;  // this rank's experts' weights as the host reference reads them (bf16 values)

  Device& device() const { return *runtime->device(); }
  ~Rank() {
    if (!runtime) return;
    layer.reset();
    try {
      for (DevicePtr p : {x, topkIdx, topkWeights, w1, w2, y})
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
  template <typename T>
  std::vector<T> read(DevicePtr at, size_t count) const {
    std::vector<T> out(count);
    if (count) device().copyDeviceToHost(out.data(), at, count * sizeof(T));
    return out;
  }
  std::vector<uint16_t> readY() const { return read<uint16_t>(y, kYElems); }
  uint64_t readEpoch() const {
    return read<uint64_t>(layer->heap().contextAddress() + offsetof(abi::DeviceContext, epoch), 1)[0];
  }
  void fillSentinel() {
    const std::vector<uint16_t> sentinel(kYElems, kSentinel);
    uploadAndWait(device(), y, sentinel.data(), sentinel.size() * 2);
  }
};

struct Pair {
  Rank ranks[kRanks];
  int64_t clampMilli = 0;
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
void openPair(Pair& p, int64_t clampMilli, const RuntimeEnv& env, std::mt19937& rng) {
  const MoeLayerConfig config = layerConfig(clampMilli);
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
  const size_t w1Elems = size_t(kLocal * 2 * kInter * kHidden), w2Elems = size_t(kLocal * kHidden * kInter);
  for (Rank& rank : p.ranks) {
    Device& d = rank.device();
    rank.x = d.allocate(size_t(kMaxTokens * kHidden) * 2);
    rank.topkIdx = d.allocate(size_t(kMaxTokens * kTopk) * 4);
    rank.topkWeights = d.allocate(size_t(kMaxTokens * kTopk) * 4);
    rank.w1 = d.allocate(w1Elems * 2);
    rank.w2 = d.allocate(w2Elems * 2);
    rank.y = d.allocate(kYElems * 2);
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
// including `hot`; uniform with ~10% of the entries -1) and weights uniform in [0.05, 1).
Inputs makeInputs(std::mt19937& rng, Routing routing, int rank, int64_t tokens, int32_t hot, float xScale) {
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
  return in;
}

void upload(Rank& rank, const Inputs& in) {
  if (in.tokens == 0) return;
  uploadAndWait(rank.device(), rank.x, in.x.data(), in.x.size() * 2);
  uploadAndWait(rank.device(), rank.topkIdx, in.topkIdx.data(), in.topkIdx.size() * 4);
  uploadAndWait(rank.device(), rank.topkWeights, in.topkWeights.data(), in.topkWeights.size() * 4);
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

// y [tokens, H] for one rank's inputs, in double, rounded to bf16 where the kernels round: for every pick j of
// token t with expert e != -1 (owner e / (E/R), local expert e % (E/R)): h = bf16(x[t] . w1[e]^T) (gate = h[:I],
// up = h[I:]); with a clamp c, gate = min(gate, c) and up = clamp(up, -c, c); act = bf16(silu(gate) * up);
// out = bf16(act . w2[e]^T); y[t] = bf16(sum_j w[t][j] * out_j).
std::vector<float> reference(const Pair& p, const Inputs& in, int64_t clampMilli) {
  const double c = double(clampMilli) / 1000;
  std::vector<float> y(size_t(in.tokens * kHidden));
  parallelFor(in.tokens, [&](int64_t t) {
    std::vector<double> x(static_cast<size_t>(kHidden)), h(static_cast<size_t>(2 * kInter)),
        act(static_cast<size_t>(kInter)), acc(static_cast<size_t>(kHidden), 0.0);
    for (int64_t k = 0; k < kHidden; ++k) x[size_t(k)] = fromBf16(in.x[size_t(t * kHidden + k)]);
    for (int64_t j = 0; j < kTopk; ++j) {
      const int32_t e = in.topkIdx[size_t(t * kTopk + j)];
      if (e < 0 || e >= kExperts) continue;
      const Rank& owner = p.ranks[e / kLocal];
      const int64_t el = e % kLocal;
      const float* w1 = &owner.w1f[size_t(el * 2 * kInter * kHidden)];
      const float* w2 = &owner.w2f[size_t(el * kHidden * kInter)];
      for (int64_t k = 0; k < 2 * kInter; ++k) h[size_t(k)] = roundBf16(dot(x.data(), w1 + k * kHidden, kHidden));
      for (int64_t i = 0; i < kInter; ++i) {
        double gate = h[size_t(i)], up = h[size_t(kInter + i)];
        if (clampMilli > 0) {
          gate = std::min(gate, c);
          up = std::clamp(up, -c, c);
        }
        act[size_t(i)] = roundBf16(gate / (1 + std::exp(-gate)) * up);
      }
      const double w = in.topkWeights[size_t(t * kTopk + j)];
      for (int64_t n = 0; n < kHidden; ++n) acc[size_t(n)] += w * roundBf16(dot(act.data(), w2 + n * kInter, kInter));
    }
    for (int64_t n = 0; n < kHidden; ++n) y[size_t(t * kHidden + n)] = float(roundBf16(acc[size_t(n)]));
  });
  return y;
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

std::string hex16(uint16_t v) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%04x", v);
  return text;
}

// One rank's y (the whole buffer, guard rows included) against the reference for its first `tokens` rows: no
// sentinel left in y[:tokens], relative error <= kTolerance there, every element past it still the sentinel.
// Returns the relative error.
double expectMatches(const std::vector<uint16_t>& y, int64_t tokens, const std::vector<float>& ref,
                     const std::string& label) {
  const size_t n = size_t(tokens * kHidden);
  size_t unwritten = 0, touched = 0;
  std::string firstUnwritten, firstTouched;
  std::vector<float> got(n);
  for (size_t i = 0; i < n; ++i) {
    if (y[i] == kSentinel && unwritten++ == 0)
      firstUnwritten = " (first: row " + std::to_string(i / kHidden) + " column " + std::to_string(i % kHidden) + ")";
    got[i] = y[i] == kSentinel ? ref[i] : fromBf16(y[i]);  // counted above, kept out of the error
  }
  for (size_t i = n; i < y.size(); ++i)
    if (y[i] != kSentinel && touched++ == 0)
      firstTouched = " (first: row " + std::to_string(i / kHidden) + " column " + std::to_string(i % kHidden) +
                     " = " + hex16(y[i]) + ")";
  const double err = relativeError(got, ref);
  EXPECT_EQ(unwritten, 0u) << label << ": elements of y[:" << tokens << "] never written" << firstUnwritten;
  EXPECT_LE(err, kTolerance) << label << ": relative Frobenius error of y[:" << tokens << "]";
  EXPECT_EQ(touched, 0u) << label << ": elements of y past row " << tokens << " (guard rows up to "
                         << kMaxTokens + kGuardRows << ") overwritten" << firstTouched;
  return err;
}

// Enqueues one forward on rank 0, then on rank 1 (the kernels wait on each other: nothing is synchronised in
// between), then checks both ranks' errors.
void forwardBoth(Pair& p, const int64_t (&tokens)[kRanks]) {
  for (int r = 0; r < kRanks; ++r) p.ranks[r].layer->forward(p.ranks[r].args(tokens[r]), p.ranks[r].stream);
  for (Rank& rank : p.ranks) rank.layer->checkErrors(rank.stream);
}

// One call on both ranks with fresh inputs (`routing`, `tokens` per rank, x ~ N(0, xScale²)): y against the
// reference, epochs one further on both ranks; with `repeat`, a second call on the same inputs must give the same y
// bit for bit. Returns a summary fragment.
std::string runCase(Pair& p, std::mt19937& rng, Routing routing, const int64_t (&tokens)[kRanks], float xScale,
                    bool repeat) {
  const std::string label = std::string(routingName(routing)) + " tokens=" + std::to_string(tokens[0]) + "," +
                            std::to_string(tokens[1]) + " clamp=" + std::to_string(p.clampMilli) + "m";
  const int32_t hot = std::uniform_int_distribution<int32_t>(0, int32_t(kExperts) - 1)(rng);
  Inputs in[kRanks];
  std::vector<float> ref[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    in[r] = makeInputs(rng, routing, r, tokens[r], hot, xScale);
    upload(p.ranks[r], in[r]);
    p.ranks[r].fillSentinel();
  }
  const uint64_t epoch = p.ranks[0].readEpoch();
  EXPECT_EQ(p.ranks[1].readEpoch(), epoch) << label << ": the ranks' epochs differ before the call";
  forwardBoth(p, tokens);
  std::vector<uint16_t> y[kRanks];
  double err[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    ref[r] = reference(p, in[r], p.clampMilli);
    y[r] = p.ranks[r].readY();
    err[r] = expectMatches(y[r], tokens[r], ref[r], label + " rank " + std::to_string(r));
    EXPECT_EQ(p.ranks[r].readEpoch(), epoch + 1) << label << " rank " << r << ": the epoch did not advance by one";
  }
  std::string summary = label + ": rel err " + std::to_string(err[0]) + "," + std::to_string(err[1]);
  if (!repeat) return summary;

  for (Rank& rank : p.ranks) rank.fillSentinel();
  forwardBoth(p, tokens);
  size_t differing = 0;
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<uint16_t> again = p.ranks[r].readY();
    size_t d = 0;
    for (size_t i = 0; i < kYElems; ++i) d += again[i] != y[r][i];
    EXPECT_EQ(d, 0u) << label << " rank " << r << ": a second call on the same inputs changed y";
    EXPECT_EQ(p.ranks[r].readEpoch(), epoch + 2) << label << " rank " << r;
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
  const double clampEffect = relativeError(reference(p, probe, 0), reference(p, probe, kClampMilli));
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
    const Routing routing = kRoutings[v % std::size(kRoutings)];
    const int32_t hot = std::uniform_int_distribution<int32_t>(0, int32_t(kExperts) - 1)(rng);
    for (int r = 0; r < kRanks; ++r) {
      in[v][r] = makeInputs(rng, routing, r, kTokens, hot, 1.f);
      if (v > 0) in[v][r].x = in[0][r].x;  // the graph changes the routing only
      upload(p.ranks[r], in[v][r]);
      p.ranks[r].fillSentinel();
    }
    forwardBoth(p, tokens);
    for (int r = 0; r < kRanks; ++r) {
      const std::vector<uint16_t> y = p.ranks[r].readY();
      expectMatches(y, kTokens, reference(p, in[v][r], 0),
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
    p.ranks[r].fillSentinel();
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

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) { return megamoe::gputest::runGpuTests(argc, argv); }
