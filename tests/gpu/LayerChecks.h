// gpu_layer_test's checks and its LayerTest fixture: an output buffer against the reference (every element a call
// may write written, relative Frobenius error <= kTolerance, the guard rows past it untouched); one forward case and
// one training step on every rank, checked, the epochs advancing, a repeat bitwise identical; device snapshots of
// the outputs to compare a repeat with; a refusal (kInvalidArgument); CUDA-graph capture of every rank's forward and
// its replay with the routing changed in-stream.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerHarness.h"
#include "LayerReference.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"

namespace megamoe::layertest {

using namespace gputest;

// ---- output elements as bits: bf16 (uint16_t) or fp32 (uint32_t) ----

inline float valueOf(uint16_t bits) { return fromBf16(bits); }
inline float valueOf(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline bool isSentinel(uint16_t bits) { return bits == kSentinel; }
inline bool isSentinel(uint32_t bits) { return bits == kSentinel32; }

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

inline std::string joined(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
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
inline void forwardAll(Group& g, const std::vector<int64_t>& tokens) {
  for (int r = 0; r < g.size(); ++r) g[r].layer->forward(g[r].args(tokens[size_t(r)]), g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->checkErrors(g[r].stream);
}

// One training step: every rank's forward, then every rank's backward, all enqueued before anything is
// synchronised; then every rank's errors.
inline void stepAll(Group& g, const std::vector<int64_t>& tokens) {
  for (int r = 0; r < g.size(); ++r) g[r].layer->forward(g[r].args(tokens[size_t(r)]), g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->backward(g[r].backwardArgs(tokens[size_t(r)]), g[r].stream);
  for (int r = 0; r < g.size(); ++r) g[r].layer->checkErrors(g[r].stream);
}

inline std::string caseLabel(const Group& g, Routing routing, const std::vector<int64_t>& tokens) {
  return std::string(routingName(routing)) + " ranks=" + std::to_string(g.size()) + " tokens=" + joined(tokens) +
         " clamp=" + std::to_string(g.options.clampMilli) + "m";
}

// The epoch every rank is at; a failure when they differ.
inline uint64_t commonEpoch(const Group& g, const std::string& label) {
  const uint64_t epoch = g[0].readEpoch();
  for (int r = 1; r < g.size(); ++r)
    EXPECT_EQ(g[r].readEpoch(), epoch) << label << ": rank " << r << "'s epoch differs from rank 0's";
  return epoch;
}

// Fresh inputs for one case on every rank (dy too with `training`), uploaded, and every output buffer filled with
// the sentinel. Returns the epoch, which every rank must agree on.
inline uint64_t startCase(Group& g, std::mt19937& rng, Routing routing, const std::vector<int64_t>& tokens,
                          float xScale, bool training, std::vector<Inputs>& in, const std::string& label) {
  const int32_t hot = std::uniform_int_distribution<int32_t>(0, int32_t(g.shape.experts) - 1)(rng);
  in.assign(size_t(g.size()), Inputs{});
  for (int r = 0; r < g.size(); ++r) {
    in[size_t(r)] = makeInputs(rng, g.shape, routing, r, tokens[size_t(r)], hot, xScale, training);
    upload(g[r], in[size_t(r)]);
    g[r].fillSentinels();
  }
  return commonEpoch(g, label + " (before the call)");
}

inline std::string formatMax(const char* name, const std::vector<double>& err) {
  char text[64];
  std::snprintf(text, sizeof text, " %s<=%.2e", name, err.empty() ? 0.0 : *std::max_element(err.begin(), err.end()));
  return text;
}

// One call on every rank with fresh inputs (`routing`, `tokens` per rank, x ~ N(0, xScale²)): y against the
// reference, epochs one further on every rank; with `repeat`, a second call on the same inputs must give the same y
// bit for bit. Returns a summary fragment.
inline std::string runCase(Group& g, std::mt19937& rng, Routing routing, const std::vector<int64_t>& tokens,
                           float xScale, bool repeat) {
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
inline void expectEpochsAdvanced(Group& g, uint64_t before, uint64_t steps, const std::string& label) {
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
inline OutputBuffers outputsOf(const Rank& rank) { return {rank.y, rank.dx, rank.dTopkWeights, rank.dW1, rank.dW2}; }

inline void takeSnapshot(Device& d, const Shape& s, const OutputBuffers& out, Snapshot& snap) {
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
inline void takeSnapshot(const Rank& rank, Snapshot& snap) {
  takeSnapshot(rank.device(), rank.shape, outputsOf(rank), snap);
}

// Elements of the outputs (guard rows included) that differ from the snapshot.
inline size_t countDiffering(Device& d, const Shape& s, const OutputBuffers& out, const Snapshot& snap) {
  return countDifferingOnDevice<uint16_t>(d, out.y, snap.y, s.yElems()) +
         countDifferingOnDevice<uint16_t>(d, out.dx, snap.dx, s.yElems()) +
         countDifferingOnDevice<uint32_t>(d, out.dTopkWeights, snap.dTopkWeights, s.dTopkElems()) +
         countDifferingOnDevice<uint16_t>(d, out.dW1, snap.dW1, s.dW1Elems()) +
         countDifferingOnDevice<uint16_t>(d, out.dW2, snap.dW2, s.dW2Elems());
}
inline size_t countDiffering(const Rank& rank, const Snapshot& snap) {
  return countDiffering(rank.device(), rank.shape, outputsOf(rank), snap);
}

// One training step on every rank (stepAll) with fresh inputs (`routing`, `tokens` per rank, x ~ N(0, xScale²),
// dy ~ N(0, 1)) on a training group: y, dx, d_topk_weights, dW1 and dW2 of every rank against the reference, each
// written where it may be and untouched past it; every epoch one step further; with `repeat`, a second step on the
// same inputs must give the same outputs (guard rows included) bit for bit. Returns a summary fragment.
inline std::string runBackwardCase(Group& g, std::mt19937& rng, Routing routing, const std::vector<int64_t>& tokens,
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
inline void expectInvalidArgument(const std::function<void()>& call, const char* mustName, const std::string& what) {
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
inline void captureForwards(Group& g, const std::vector<int64_t>& tokens, std::vector<Graph>& graphs) {
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
inline void replayWithRouting(Group& g, const std::vector<Graph>& graphs, const std::vector<Inputs>& in) {
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

// ---- the fixture ----

// The multi-rank layer tests, at every count of kRankCounts (instantiated once for the binary, in
// LayerExchangeTest.cpp beside main()).
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

}  // namespace megamoe::layertest
