// GPU tier for the FP8 MoE layer (MoeLayer.h DType::kFp8E4m3) in mode A (createLocal), every rank on GPU
// r % deviceCount (on one GPU, every rank on its share of the SMs). Weights are random e4m3 codes of moderate
// magnitude with random fp32 block scales (one per 128 x 128 block), x random bf16.
// Reference: every pick in double from the dequantised operands, quantised where the kernels quantise: x per token
// and 128 channels (amax / 448 in fp32, IEEE quotient, nearest even, saturating: the host quantiser, which
// quantize_tokens_fp8 matches bitwise), h = x . w1[e]^T, act = bf16(swiglu(gate, up)) quantised the same way,
// out = bf16(act . w2[e]^T), y[t] = bf16(sum_j w[t][j] out_j). Checked stage by stage (relative Frobenius errors):
// each received row's act (the workspace's, read back through pool_src) against the reference's (<= 1e-2), act's
// e4m3 codes and scales bitwise the host quantiser's of that act, y against the reference that takes the kernel's
// act codes (<= 1e-2); and y against the reference end to end over every rank's tokens (<= 3e-2: act's codes flip
// wherever the kernel's fp32 L1 sums and the exact ones round across an e4m3 boundary, ~1.6e-2 of y measured). Every row of y[:tokens]
// written and the rows past it (to max_tokens plus guard rows) still the sentinel, a rerun bitwise identical, e4m3
// x with its scales given bitwise equal to bf16 x, CUDA-graph replays with
// the routing changed in-stream bitwise equal to plain calls. Shapes: the small layer at 2 and 8 ranks (tokens 0 / 1
// / 777 / max), Qwen3-30B-A3B, DeepSeek-V3 and Kimi-K2 per-GPU shapes with few tokens.
// Kernels from the test cache (scripts/gen-gpu-test-cache.sh); skipped, saying why, without an sm_90a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "GpuTestSupport.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"
#include "megamoe/Workspace.h"
#include "compiler/abi/DeviceAbi.h"

namespace megamoe {
namespace {

using namespace gputest;

constexpr int64_t kGuardRows = 16;
constexpr uint16_t kSentinel = 0x7fc1;  // a bf16 NaN no kernel result has
constexpr double kTolerance = 1e-2;         // a stage against its reference from the kernel's own inputs
constexpr double kEndToEndTolerance = 3e-2;  // y against the reference end to end (see the file comment)
constexpr int64_t kBlock = 128;  // scale blocks: 128 x 128 for weights, 1 x 128 for activations

struct Shape {
  const char* name;
  int ranks;
  int64_t hidden, inter, experts, topk, maxTokens;
  int64_t local() const { return experts / ranks; }
  size_t w1Elems() const { return size_t(local() * 2 * inter * hidden); }
  size_t w2Elems() const { return size_t(local() * hidden * inter); }
  size_t w1Scales() const { return size_t(local() * (2 * inter / kBlock) * (hidden / kBlock)); }
  size_t w2Scales() const { return size_t(local() * (hidden / kBlock) * (inter / kBlock)); }
  size_t yElems() const { return size_t((maxTokens + kGuardRows) * hidden); }
};

Shape smallShape(int ranks) { return {"small", ranks, 512, 256, 16, 4, 1024}; }

// Codes of moderate magnitude (exponent fields 5..14: |value| in [0.25, 448]), both signs, all mantissas.
std::vector<uint8_t> moderateE4m3(uint64_t seed, size_t count) {
  std::vector<uint8_t> out(count);
  const int64_t chunks = int64_t((count + (1 << 20) - 1) >> 20);
  parallelFor(chunks, [&](int64_t c) {
    uint64_t state = seed + uint64_t(c) * 0x9e3779b97f4a7c15ull;
    const size_t end = std::min(count, size_t(c + 1) << 20);
    for (size_t i = size_t(c) << 20; i < end; i += 4) {
      uint64_t bits = splitMix64(state);
      for (size_t j = i; j < std::min(end, i + 4); ++j, bits >>= 16)
        out[j] = uint8_t((bits & 0x80) | ((5 + ((bits >> 8) & 0xff) % 10) << 3) | (bits & 7));
    }
  });
  return out;
}

// Block scales that make a dequantised weight's magnitude about 1 / sqrt(K) (the codes' RMS is about 140).
std::vector<float> blockScales(std::mt19937& rng, size_t count, int64_t k) {
  std::uniform_real_distribution<float> u(0.5f, 1.f);
  std::vector<float> out(count);
  for (float& v : out) v = u(rng) / float(140 * std::sqrt(double(k)));
  return out;
}

// The host quantiser of one row of `n` values (a multiple of 128) per 128 channels, as quantize_tokens_fp8.
void quantizeRow(const float* x, int64_t n, uint8_t* codes, float* scales) {
  for (int64_t g = 0; g < n / kBlock; ++g) {
    float amax = 0;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[g * kBlock + i]));
    const float ratio = amax / 448.f, scale = ratio == 0.f ? 1.f : ratio;
    scales[g] = scale;
    for (int64_t i = 0; i < kBlock; ++i) codes[g * kBlock + i] = toE4m3(x[g * kBlock + i] / scale);
  }
}

struct Rank {
  Shape shape;
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<MoeLayer> layer;
  StreamHandle stream = nullptr;
  DevicePtr x = 0, xCodes = 0, xScales = 0, topkIdx = 0, topkWeights = 0, w1 = 0, w1s = 0, w2 = 0, w2s = 0, y = 0;
  std::vector<uint8_t> w1Host, w2Host;  // codes
  std::vector<float> w1sHost, w2sHost;  // block scales
  Device& device() const { return *runtime->device(); }
  ~Rank() {
    if (!runtime) return;
    try {
      device().synchronize(stream);
    } catch (...) {
    }
    layer.reset();
    try {
      for (DevicePtr p : {x, xCodes, xScales, topkIdx, topkWeights, w1, w1s, w2, w2s, y})
        if (p) device().free(p);
      if (stream) device().destroyStream(stream);
    } catch (...) {
    }
  }
  ForwardArgs args(int64_t tokens, bool givenCodes) const {
    ForwardArgs a;
    a.x = givenCodes ? xCodes : x;
    a.xScales = givenCodes ? xScales : 0;
    a.tokens = tokens;
    a.topkIdx = topkIdx;
    a.topkWeights = topkWeights;
    a.w1 = w1, a.w1Scales = w1s, a.w2 = w2, a.w2Scales = w2s, a.y = y;
    return a;
  }
  std::vector<uint16_t> readY() const { return readBack<uint16_t>(device(), y, shape.yElems()); }
};

struct Group {
  Shape shape;
  std::vector<std::unique_ptr<Rank>> ranks;
  int size() const { return int(ranks.size()); }
  Rank& operator[](int r) { return *ranks[size_t(r)]; }
  const Rank& operator[](int r) const { return *ranks[size_t(r)]; }
  ~Group() {
    for (auto& r : ranks) r->layer.reset();  // the layers before any runtime
  }
};

void openGroup(Group& g, const Shape& s, std::mt19937& rng) {
  MoeLayerConfig c;
  c.hidden = s.hidden, c.intermediate = s.inter, c.experts = s.experts, c.topk = s.topk, c.maxTokens = s.maxTokens;
  c.dtype = DType::kFp8E4m3;
  ASSERT_EQ(MoeLayer::validate(c, s.ranks), "");
  g.shape = s;
  const int devices = openBackend(BackendKind::kCuda)->deviceCount();
  std::vector<Runtime*> runtimes;
  for (int r = 0; r < s.ranks; ++r) {
    g.ranks.push_back(std::make_unique<Rank>());
    g[r].shape = s;
    g[r].runtime = std::make_unique<Runtime>(BackendKind::kCuda, rankOrdinal(r, devices), parseEnv());
    g[r].stream = g[r].device().createStream();
    runtimes.push_back(g[r].runtime.get());
  }
  auto layers = MoeLayer::createLocal(runtimes, c);
  for (int r = 0; r < s.ranks; ++r) {
    Rank& k = g[r];
    k.layer = std::move(layers[size_t(r)]);
    Device& d = k.device();
    k.x = d.allocate(size_t(s.maxTokens * s.hidden) * 2);
    k.xCodes = d.allocate(size_t(s.maxTokens * s.hidden));
    k.xScales = d.allocate(size_t(s.maxTokens * s.hidden / kBlock) * 4);
    k.topkIdx = d.allocate(size_t(s.maxTokens * s.topk) * 4);
    k.topkWeights = d.allocate(size_t(s.maxTokens * s.topk) * 4);
    k.y = d.allocate(s.yElems() * 2);
    k.w1Host = moderateE4m3(uint64_t(rng()) << 32 | rng(), s.w1Elems());
    k.w2Host = moderateE4m3(uint64_t(rng()) << 32 | rng(), s.w2Elems());
    k.w1sHost = blockScales(rng, s.w1Scales(), s.hidden);
    k.w2sHost = blockScales(rng, s.w2Scales(), s.inter);
    k.w1 = d.allocate(k.w1Host.size());
    k.w2 = d.allocate(k.w2Host.size());
    k.w1s = d.allocate(k.w1sHost.size() * 4);
    k.w2s = d.allocate(k.w2sHost.size() * 4);
    uploadAndWait(d, k.w1, k.w1Host.data(), k.w1Host.size());
    uploadAndWait(d, k.w2, k.w2Host.data(), k.w2Host.size());
    uploadAndWait(d, k.w1s, k.w1sHost.data(), k.w1sHost.size() * 4);
    uploadAndWait(d, k.w2s, k.w2sHost.data(), k.w2sHost.size() * 4);
  }
}

enum class Routing { kUniform, kAllRemote, kSparse };
const char* routingName(Routing r) {
  return r == Routing::kUniform ? "uniform" : r == Routing::kAllRemote ? "all-remote" : "sparse(-1)";
}

struct Inputs {
  int64_t tokens = 0;
  std::vector<uint16_t> x;  // bf16 [tokens, H]
  std::vector<uint8_t> xCodes;  // the host quantiser's
  std::vector<float> xScales;
  std::vector<int32_t> topkIdx;
  std::vector<float> topkWeights;
};

Inputs makeInputs(std::mt19937& rng, const Shape& s, Routing routing, int rank, int64_t tokens) {
  Inputs in;
  in.tokens = tokens;
  in.x = randomBf16(rng, size_t(tokens * s.hidden));
  in.xCodes.resize(in.x.size());
  in.xScales.resize(size_t(tokens * s.hidden / kBlock));
  std::vector<float> row(static_cast<size_t>(s.hidden));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t k = 0; k < s.hidden; ++k) row[size_t(k)] = fromBf16(in.x[size_t(t * s.hidden + k)]);
    quantizeRow(row.data(), s.hidden, &in.xCodes[size_t(t * s.hidden)], &in.xScales[size_t(t * s.hidden / kBlock)]);
  }
  in.topkIdx.resize(size_t(tokens * s.topk));
  std::bernoulli_distribution skip(0.1);
  const int32_t ownFirst = int32_t(rank * s.local()), local = int32_t(s.local());
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* picks = &in.topkIdx[size_t(t * s.topk)];
    const int32_t n = routing == Routing::kAllRemote ? int32_t(s.experts) - local : int32_t(s.experts);
    std::vector<int32_t> pool(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) pool[size_t(i)] = i;
    for (int64_t j = 0; j < s.topk; ++j) {
      std::swap(pool[size_t(j)], pool[size_t(std::uniform_int_distribution<int64_t>(j, n - 1)(rng))]);
      picks[j] = pool[size_t(j)];
      if (routing == Routing::kAllRemote && picks[j] >= ownFirst) picks[j] += local;
      if (routing == Routing::kSparse && skip(rng)) picks[j] = -1;
    }
  }
  std::uniform_real_distribution<float> weight(0.05f, 1.f);
  in.topkWeights.resize(size_t(tokens * s.topk));
  for (float& w : in.topkWeights) w = weight(rng);
  return in;
}

void upload(Rank& k, const Inputs& in) {
  if (in.tokens == 0) return;
  Device& d = k.device();
  uploadAndWait(d, k.x, in.x.data(), in.x.size() * 2);
  uploadAndWait(d, k.xCodes, in.xCodes.data(), in.xCodes.size());
  uploadAndWait(d, k.xScales, in.xScales.data(), in.xScales.size() * 4);
  uploadAndWait(d, k.topkIdx, in.topkIdx.data(), in.topkIdx.size() * 4);
  uploadAndWait(d, k.topkWeights, in.topkWeights.data(), in.topkWeights.size() * 4);
}

double silu(double z) { return z / (1 + std::exp(-z)); }

// What one rank received in the last forward, read back from its workspace: each pool row's act (bf16 [rows, I]),
// act's e4m3 codes and scales as the act quantiser wrote them, and the pool row of each (source rank, pick).
struct Received {
  std::vector<uint16_t> act;
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::map<int64_t, int64_t> rowOf;  // source rank * abi::kPoolSourceShift + pick -> pool row
};

Received readReceived(Rank& k) {
  const Shape& s = k.shape;
  const Workspace::Buffers& b = k.layer->workspace().buffers();
  Device& d = k.device();
  const int64_t rows = readBack<int32_t>(d, b.poolOffsets, size_t(s.local() + 1))[size_t(s.local())];
  Received out;
  if (rows == 0) return out;
  out.act = readBack<uint16_t>(d, b.act, size_t(rows * s.inter));
  out.codes = readBack<uint8_t>(d, b.actCodes, size_t(rows * s.inter));
  out.scales = readBack<float>(d, b.actScales, size_t(rows * s.inter / kBlock));
  const std::vector<int32_t> src = readBack<int32_t>(d, b.poolSrc, size_t(rows));
  for (int64_t r = 0; r < rows; ++r) out.rowOf[src[size_t(r)]] = r;
  return out;
}

// Rows of `got` whose e4m3 codes or scales differ from the host quantiser's of its own act.
size_t quantiserDiffs(const Received& got, int64_t I) {
  const size_t rows = got.act.size() / size_t(I);
  std::vector<float> act(static_cast<size_t>(I)), scales(static_cast<size_t>(I / kBlock));
  std::vector<uint8_t> codes(static_cast<size_t>(I));
  size_t bad = 0;
  for (size_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < I; ++i) act[size_t(i)] = fromBf16(got.act[r * size_t(I) + size_t(i)]);
    quantizeRow(act.data(), I, codes.data(), scales.data());
    bad += !std::equal(codes.begin(), codes.end(), got.codes.begin() + std::ptrdiff_t(r * size_t(I))) ||
           !std::equal(scales.begin(), scales.end(), got.scales.begin() + std::ptrdiff_t(r * size_t(I / kBlock)));
  }
  return bad;
}

// Rank `rank`'s expected y [tokens, H] (see the file comment): `exact` with the reference's own act, `staged` with
// the act codes its owners' kernels produced (`received`, by owner rank), and the sums of squares of act's error
// against the reference's act and of the reference's act (a pick whose row its owner lacks counts as missing).
struct Expected {
  std::vector<float> exact, staged;
  double actErr2 = 0, act2 = 0;
  int64_t missing = 0;
};

Expected reference(const Group& g, const Inputs& in, int rank, const std::vector<Received>& received) {
  const Shape& s = g.shape;
  const int64_t H = s.hidden, I = s.inter, hb = H / kBlock, ib = I / kBlock;
  const std::vector<double>& value = e4m3Values();
  Expected out;
  out.exact.resize(size_t(in.tokens * H));
  out.staged.resize(size_t(in.tokens * H));
  std::vector<double> actErr2(size_t(in.tokens)), act2(size_t(in.tokens));
  std::vector<int64_t> missing(size_t(in.tokens));
  parallelFor(in.tokens, [&](int64_t t) {
    const uint8_t* xq = &in.xCodes[size_t(t * H)];
    const float* xs = &in.xScales[size_t(t * hb)];
    std::vector<double> h(static_cast<size_t>(2 * I)), exact(static_cast<size_t>(H), 0.0), staged(exact);
    std::vector<float> act(static_cast<size_t>(I), 0.f), actScales(static_cast<size_t>(ib));
    std::vector<uint8_t> actCodes(static_cast<size_t>(I));
    // bf16(act . w2[e]^T) of codes q with scales qs, through the owner's w2 of local expert le.
    auto l2 = [&](const Rank& owner, int64_t le, const uint8_t* q, const float* qs, int64_t n) {
      const uint8_t* w2 = &owner.w2Host[size_t(le * H * I)];
      const float* w2s = &owner.w2sHost[size_t(le * hb * ib)];
      double sum = 0;
      for (int64_t kb = 0; kb < ib; ++kb) {
        double block = 0;
        for (int64_t i = kb * kBlock; i < (kb + 1) * kBlock; ++i) block += value[q[i]] * value[w2[n * I + i]];
        sum += block * double(qs[kb]) * double(w2s[(n / kBlock) * ib + kb]);
      }
      return double(fromBf16(toBf16(float(sum))));
    };
    for (int64_t j = 0; j < s.topk; ++j) {
      const int32_t e = in.topkIdx[size_t(t * s.topk + j)];
      if (e < 0) continue;
      const int o = int(e / s.local());
      const Rank& owner = g[o];
      const int64_t le = e % s.local();
      const uint8_t* w1 = &owner.w1Host[size_t(le * 2 * I * H)];
      const float* w1s = &owner.w1sHost[size_t(le * (2 * I / kBlock) * hb)];
      for (int64_t n = 0; n < 2 * I; ++n) {
        double sum = 0;
        for (int64_t kb = 0; kb < hb; ++kb) {
          double block = 0;
          for (int64_t i = kb * kBlock; i < (kb + 1) * kBlock; ++i) block += value[xq[i]] * value[w1[n * H + i]];
          sum += block * double(xs[kb]) * double(w1s[(n / kBlock) * hb + kb]);
        }
        h[size_t(n)] = sum;
      }
      for (int64_t i = 0; i < I; ++i) act[size_t(i)] = fromBf16(toBf16(float(silu(h[size_t(i)]) * h[size_t(I + i)])));
      quantizeRow(act.data(), I, actCodes.data(), actScales.data());
      const double w = in.topkWeights[size_t(t * s.topk + j)];
      const Received& got = received[size_t(o)];
      const auto row = got.rowOf.find(rank * abi::kPoolSourceShift + t * s.topk + j);
      if (row == got.rowOf.end()) ++missing[size_t(t)];
      const int64_t r = row == got.rowOf.end() ? -1 : row->second;
      for (int64_t i = 0; r >= 0 && i < I; ++i) {
        const double d = double(fromBf16(got.act[size_t(r * I + i)])) - act[size_t(i)];
        actErr2[size_t(t)] += d * d;
        act2[size_t(t)] += double(act[size_t(i)]) * act[size_t(i)];
      }
      for (int64_t n = 0; n < H; ++n) {
        exact[size_t(n)] += w * l2(owner, le, actCodes.data(), actScales.data(), n);
        if (r >= 0) staged[size_t(n)] += w * l2(owner, le, &got.codes[size_t(r * I)], &got.scales[size_t(r * ib)], n);
      }
    }
    for (int64_t n = 0; n < H; ++n) {
      out.exact[size_t(t * H + n)] = fromBf16(toBf16(float(exact[size_t(n)])));
      out.staged[size_t(t * H + n)] = fromBf16(toBf16(float(staged[size_t(n)])));
    }
  });
  for (int64_t t = 0; t < in.tokens; ++t) {
    out.actErr2 += actErr2[size_t(t)];
    out.act2 += act2[size_t(t)];
    out.missing += missing[size_t(t)];
  }
  return out;
}

void forwardAll(Group& g, const std::vector<int64_t>& tokens, bool givenCodes = false) {
  for (int r = 0; r < g.size(); ++r) g[r].layer->forward(g[r].args(tokens[size_t(r)], givenCodes), g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->checkErrors(g[r].stream);
}

// A relative Frobenius error in parts, so that several ranks' can be pooled.
struct RelErr {
  double num = 0, den = 0;
  double value() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
  void add(const RelErr& o) { num += o.num, den += o.den; }
};

// y[:tokens] against `ref` (every element written), every element past it still the sentinel; the error.
RelErr check(const std::vector<uint16_t>& y, const std::vector<float>& ref, int64_t tokens, int64_t H,
             const std::string& label) {
  RelErr err;
  size_t unwritten = 0, touched = 0;
  for (size_t i = 0; i < size_t(tokens * H); ++i) {
    if (y[i] == kSentinel) {
      ++unwritten;
      continue;
    }
    const double d = double(fromBf16(y[i])) - ref[i];
    err.num += d * d;
    err.den += double(ref[i]) * ref[i];
  }
  for (size_t i = size_t(tokens * H); i < y.size(); ++i) touched += y[i] != kSentinel;
  EXPECT_EQ(unwritten, 0u) << label << ": elements of y[:tokens] never written";
  EXPECT_EQ(touched, 0u) << label << ": elements past y[:tokens] written";
  return err;
}

// One case: inputs of `routing` at `tokens` per rank; bf16 x, then the same call again, then e4m3 x given.
std::string runCase(Group& g, std::mt19937& rng, Routing routing, const std::vector<int64_t>& tokens) {
  const Shape& s = g.shape;
  std::vector<Inputs> in;
  for (int r = 0; r < g.size(); ++r) {
    in.push_back(makeInputs(rng, s, routing, r, tokens[size_t(r)]));
    upload(g[r], in.back());
  }
  std::vector<std::vector<uint16_t>> first(size_t(g.size()));
  auto run = [&](bool givenCodes) {
    for (int r = 0; r < g.size(); ++r) fillDevice(g[r].device(), g[r].y, s.yElems(), kSentinel);
    forwardAll(g, tokens, givenCodes);
  };
  run(false);
  double worstStaged = 0, worstAct = 0;
  RelErr exact;  // pooled over the ranks: a rank with one token is a handful of code flips
  size_t quantiser = 0;
  std::string label = std::string(s.name) + " " + routingName(routing) + " ranks=" + std::to_string(g.size());
  std::vector<Received> received;
  for (int r = 0; r < g.size(); ++r) {
    received.push_back(readReceived(g[r]));
    quantiser += quantiserDiffs(received.back(), s.inter);
  }
  EXPECT_EQ(quantiser, 0u) << label << ": received rows whose act codes or scales are not the host quantiser's";
  for (int r = 0; r < g.size(); ++r) {
    const std::string at = label + " rank " + std::to_string(r);
    first[size_t(r)] = g[r].readY();
    const Expected want = reference(g, in[size_t(r)], r, received);
    EXPECT_EQ(want.missing, 0) << at << ": picks without a received row";
    const double actErr = want.act2 > 0 ? std::sqrt(want.actErr2 / want.act2) : std::sqrt(want.actErr2);
    EXPECT_LE(actErr, kTolerance) << at << ": act";
    worstAct = std::max(worstAct, actErr);
    const int64_t T = tokens[size_t(r)];
    const double staged = check(first[size_t(r)], want.staged, T, s.hidden, at).value();
    EXPECT_LE(staged, kTolerance) << at << ": y against the reference on the kernel's act codes";
    worstStaged = std::max(worstStaged, staged);
    exact.add(check(first[size_t(r)], want.exact, T, s.hidden, at));
  }
  const double endToEnd = exact.value();
  EXPECT_LE(endToEnd, kEndToEndTolerance) << label << ": y end to end, over every rank";
  run(false);
  bool rerunIdentical = true, codesIdentical = true;
  for (int r = 0; r < g.size(); ++r) rerunIdentical &= g[r].readY() == first[size_t(r)];
  run(true);
  for (int r = 0; r < g.size(); ++r) codesIdentical &= g[r].readY() == first[size_t(r)];
  EXPECT_TRUE(rerunIdentical) << label;
  EXPECT_TRUE(codesIdentical) << label << ": e4m3 x with its scales differs from bf16 x";
  std::string t;
  for (int64_t v : tokens) t += (t.empty() ? "" : ",") + std::to_string(v);
  char text[384];
  std::snprintf(text, sizeof text,
                "%s tokens=%s: rel_err act=%.3e y_staged=%.3e y_end_to_end_pooled=%.3e quantiser_diffs=%zu rerun=%s "
                "e4m3_x=%s",
                label.c_str(), t.c_str(), worstAct, worstStaged, endToEnd, quantiser,
                rerunIdentical ? "identical" : "DIFFERENT", codesIdentical ? "identical" : "DIFFERENT");
  return text;
}

std::vector<int64_t> cycled(int ranks, std::initializer_list<int64_t> pattern) {
  std::vector<int64_t> out;
  for (int r = 0; r < ranks; ++r) out.push_back(pattern.begin()[size_t(r) % pattern.size()]);
  return out;
}

class LayerFp8Test : public ::testing::TestWithParam<int> {
 protected:
  int ranks() const { return GetParam(); }
};
INSTANTIATE_TEST_SUITE_P(, LayerFp8Test, ::testing::ValuesIn(kRankCounts), rankCountName);

TEST_P(LayerFp8Test, ForwardMatchesReference) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend, ranks());
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), rng));
  for (Routing routing : {Routing::kUniform, Routing::kAllRemote, Routing::kSparse})
    for (auto tokens : {cycled(ranks(), {777, 0}), cycled(ranks(), {1, 1024}), cycled(ranks(), {1024})})
      std::printf("SUMMARY fp8 layer %s\n", runCase(g, rng, routing, tokens).c_str());
}

// Model shapes per GPU, few tokens (the host reference reads every picked expert's weights).
TEST_P(LayerFp8Test, ModelShapes) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend, ranks());
  const int R = ranks();
  const Shape shapes[] = {{"qwen3-30b-a3b", R, 2048, 768, 128, 8, 256},
                          {"deepseek-v3", R, 7168, 2048, 256, 8, 16},
                          {"kimi-k2", R, 7168, 2048, 384, 8, 16}};
  for (const Shape& s : shapes) {
    if (std::string(s.name) == "kimi-k2" && R != 8) continue;  // its EP2 share (192 experts a rank) is ~17 GB twice
    std::mt19937 rng = testRng();
    Group g;
    ASSERT_NO_FATAL_FAILURE(openGroup(g, s, rng));
    const int64_t many = s.maxTokens;
    std::printf("SUMMARY fp8 layer %s\n", runCase(g, rng, Routing::kUniform, cycled(R, {many, 1, 0})).c_str());
  }
}

// Graph replays with the routing changed in-stream before each: bitwise the plain calls'.
TEST_P(LayerFp8Test, CudaGraphReplayEqualsEager) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend, ranks());
  constexpr int kVariants = 4, kReplays = 40;
  constexpr int64_t kTokens = 200;
  std::mt19937 rng = testRng();
  Group g;
  ASSERT_NO_FATAL_FAILURE(openGroup(g, smallShape(ranks()), rng));
  const std::vector<int64_t> tokens = cycled(ranks(), {kTokens});
  const size_t used = size_t(kTokens * g.shape.hidden);
  std::vector<std::vector<Inputs>> in(kVariants);
  std::vector<std::vector<std::vector<uint16_t>>> expected(kVariants);
  for (int v = 0; v < kVariants; ++v)
    for (int r = 0; r < g.size(); ++r) {
      in[size_t(v)].push_back(makeInputs(rng, g.shape, v % 2 ? Routing::kSparse : Routing::kUniform, r, kTokens));
      if (v > 0) in[size_t(v)][size_t(r)].x = in[0][size_t(r)].x;  // the graph changes the routing only
    }
  for (int v = 0; v < kVariants; ++v) {
    for (int r = 0; r < g.size(); ++r) upload(g[r], in[size_t(v)][size_t(r)]);
    forwardAll(g, tokens);
    expected[size_t(v)].resize(size_t(g.size()));
    for (int r = 0; r < g.size(); ++r) {
      auto y = g[r].readY();
      expected[size_t(v)][size_t(r)].assign(y.begin(), y.begin() + std::ptrdiff_t(used));
    }
  }
  std::vector<GraphHandle> graphs;
  for (int r = 0; r < g.size(); ++r) {
    g[r].device().beginCapture(g[r].stream);
    g[r].layer->forward(g[r].args(kTokens, false), g[r].stream);
    graphs.push_back(g[r].device().endCapture(g[r].stream));
  }
  size_t bad = 0;
  for (int i = 0; i < kReplays; ++i) {
    const int v = i % kVariants;
    for (int r = 0; r < g.size(); ++r) {
      const Inputs& rin = in[size_t(v)][size_t(r)];
      g[r].device().copyHostToDeviceAsync(g[r].topkIdx, rin.topkIdx.data(), rin.topkIdx.size() * 4, g[r].stream);
      g[r].device().copyHostToDeviceAsync(g[r].topkWeights, rin.topkWeights.data(), rin.topkWeights.size() * 4,
                                          g[r].stream);
    }
    for (int r = 0; r < g.size(); ++r) g[r].device().launchGraph(graphs[size_t(r)], g[r].stream);
    for (int r = 0; r < g.size(); ++r) {
      g[r].layer->checkErrors(g[r].stream);
      auto y = g[r].readY();
      bad += !std::equal(y.begin(), y.begin() + std::ptrdiff_t(used), expected[size_t(v)][size_t(r)].begin());
    }
  }
  for (int r = 0; r < g.size(); ++r) g[r].device().destroyGraph(graphs[size_t(r)]);
  EXPECT_EQ(bad, 0u);
  std::printf("SUMMARY fp8 layer graph ranks=%d: %d replays over %d routings, %zu replay/rank pairs differ\n",
              g.size(), kReplays, kVariants, bad);
}

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) { return megamoe::gputest::runGpuTests(argc, argv); }
