// gpu_layer_test's host reference in double, the one for every test of the binary: the forward's y and the
// backward's dx, d_topk_weights, dW1 and dW2 of every rank, from the inputs and the weights the ranks uploaded,
// rounded to bf16 where the kernels round; and the relative error of two references.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerHarness.h"

namespace megamoe::layertest {

using namespace gputest;

inline double roundBf16(double v) { return fromBf16(toBf16(float(v))); }

// a . b over n (a multiple of 8) elements, b in bf16, in eight chains (one chain's sum is latency-bound); a float
// times a bf16 is exact in double.
inline double dot(const float* a, const uint16_t* b, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += double(a[i + k]) * double(fromBf16(b[i + k]));
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// acc[0 .. n) += a * b[0 .. n), b in bf16 or fp32.
inline void axpy(double a, const uint16_t* b, double* acc, int64_t n) {
  if (a == 0) return;
  for (int64_t i = 0; i < n; ++i) acc[i] += a * double(fromBf16(b[i]));
}
inline void axpy(double a, const float* b, double* acc, int64_t n) {
  if (a == 0) return;
  for (int64_t i = 0; i < n; ++i) acc[i] += a * double(b[i]);
}

// Expert e's w1 [2I, H] and w2 [H, I] (bf16) as the reference reads them (on its owner e / (E/R), local expert
// e % (E/R)).
inline const uint16_t* w1Of(const Group& g, int32_t e) {
  const Shape& s = g.shape;
  return &g[int(e / s.local())].w1Host[size_t((e % s.local()) * 2 * s.inter * s.hidden)];
}
inline const uint16_t* w2Of(const Group& g, int32_t e) {
  const Shape& s = g.shape;
  return &g[int(e / s.local())].w2Host[size_t((e % s.local()) * s.hidden * s.inter)];
}

// h = bf16(x . w1^T) [2I]: one pick's L1 pre-activation, rounded where the forward rounds (and keeps) it.
inline void preActivation(const Shape& s, const float* x, const uint16_t* w1, double* h) {
  for (int64_t k = 0; k < 2 * s.inter; ++k) h[k] = roundBf16(dot(x, w1 + k * s.hidden, s.hidden));
}

// SwiGLU of one (gate, up) component with the clamp c (c <= 0: none): gate' = min(gate, c), up' = clamp(up, -c, c),
// act = silu(gate') up'; its derivatives dact/dgate = up' silu'(gate) and dact/dup = silu(gate'), each 0 where the
// clamp cut its component; silu'(z) = s(z) (1 + z (1 - s(z))), s the sigmoid.
struct Swiglu {
  double act, dGate, dUp;
};
inline Swiglu swiglu(double gate, double up, double c) {
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
inline std::vector<float> forwardReference(const Group& g, const Inputs& in, int64_t clampMilli) {
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

inline BackwardReference backwardReference(const Group& g, const std::vector<Inputs>& in, int64_t clampMilli) {
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
inline double relativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace megamoe::layertest
