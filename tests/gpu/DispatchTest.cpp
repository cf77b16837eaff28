// GPU tier for dispatch_prologue (kernels/Kernels.h, DispatchPrologueSpec) in mode A (one process drives every rank)
// at 2 and at 8 ranks (GpuDispatch.*/Ranks2, /Ranks8), rank r on GPU r % deviceCount (on one GPU all ranks share it,
// each on its own stream): the routing tables of random topk_idx against a host reference, over consecutive calls
// whose epochs advance without a reset (token counts that differ between ranks and calls, zero included), at E=16
// topk=4 and at the DeepSeek-V3 shape E=256 topk=8, and an out-of-range index that must become a kBadIndex device
// error on its rank while every other rank still completes. Every rank's launch is enqueued before any is waited for
// (each waits for the others' counts); 8 ranks x 7 blocks of 1024 threads fit one H200 together. Skips, saying why,
// without a CUDA device or when a device the ranks run on is not sm_90a; never for too few GPUs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "compiler/abi/DeviceAbi.h"
#include "megamoe/KernelArgs.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {
namespace {

using namespace gputest;

// DispatchPrologueSpec::kBlockThreads (kernels/Kernels.h is not included: it pulls in MLIR).
constexpr int64_t kBlockThreads = 1024;
constexpr int32_t kSentinel = 0x7fffffff;  // pre-filled into every output entry; no kernel result is this large
constexpr size_t kGuard = 64;              // sentinel entries past the end of each output: must stay untouched
// dispatch_prologue's blocks here: 7, so that the blocks' pick ranges split unevenly (the layer launches 16); the
// routing tables must not depend on it.
constexpr int32_t kPrologueBlocks = 7;
constexpr int kMaxMessages = 8;            // differences spelled out per check; the rest are only counted

struct Shape {
  int64_t experts, topk;
  int ranks;
  int64_t local() const { return experts / ranks; }  // experts per rank; rank p owns [p * local, (p + 1) * local)
  std::vector<std::pair<std::string, int64_t>> spec() const {
    return {{"E", experts}, {"topk", topk}, {"ranks", ranks}};
  }
  std::string text() const {
    return "E=" + std::to_string(experts) + " topk=" + std::to_string(topk) + " ranks=" + std::to_string(ranks);
  }
};

// ---- one rank: runtime (device), heap, stream, kernels and the kernel's device buffers ----

struct Rank {
  std::unique_ptr<Runtime> runtime;
  SymmetricHeap* heap = nullptr;  // owned by ModeA::heaps
  StreamHandle stream = nullptr;
  std::shared_ptr<const Kernel> prologue, epochAdvance;
  DevicePtr topkIdx = 0, sendSlot = 0, poolOffsets = 0, sendList = 0, sendOff = 0, sendBase = 0, routeEpoch = 0,
            scratch = 0;
  size_t maxPicks = 0;  // capacity of topk_idx and send_slot (send_slot has kGuard more)

  Device& device() const { return *runtime->device(); }
  ~Rank() {
    try {
      for (DevicePtr p : {topkIdx, sendSlot, poolOffsets, sendList, sendOff, sendBase, routeEpoch, scratch})
        if (p) device().free(p);
      if (stream) device().destroyStream(stream);
    } catch (...) {
    }
  }

  // The arguments of `kernel`, by name (compiler/abi/KernelAbi.h), with this rank's context set.
  KernelArgs args(const Kernel& kernel) const {
    KernelArgs a(kernel.key().kernel);
    a.context(heap->contextAddress());
    return a;
  }
  void launch(const Kernel& kernel, uint32_t grid, KernelArgs& args) {
    gputest::launch1d(*runtime, kernel, grid, stream, args, heap);
  }
  // dispatch_prologue on this rank's buffers and heap regions: kPrologueBlocks blocks.
  void launchPrologue(int32_t tokens) {
    KernelArgs a = args(*prologue);
    a.ptr("topk_idx", topkIdx).i32("tokens", tokens);
    a.ptr("counts", heap->regionAddress("counts")).ptr("flags", heap->regionAddress("flags"));
    a.ptr("send_slot", sendSlot).ptr("pool_offsets", poolOffsets);
    a.ptr("send_list", sendList).ptr("send_off", sendOff).ptr("send_base", sendBase);
    a.ptr("arrivals", heap->regionAddress("arrivals")).ptr("done", heap->regionAddress("done"));
    a.ptr("route_epoch", routeEpoch).ptr("scratch", scratch).i32("blocks", kPrologueBlocks);
    // The worst case (every rank's every pick here): these tests check the tables, not a receive capacity.
    a.i32("capacity", int64_t(heap->nranks()) * int64_t(maxPicks)).i32("drop", 0).ptr("dropped", 0);
    // Every rank the same call (layer 0, a fused forward): the call check passes.
    const uint32_t role = abi::callRole(abi::CallKind::kForward, false, 3, 3);
    a.ptr("calls", heap->regionAddress("calls")).i32("layer", 0).i32("role", int64_t(role));
    launch(*prologue, uint32_t(kPrologueBlocks), a);
  }
  void launchEpochAdvance() {
    KernelArgs a = args(*epochAdvance);
    launch(*epochAdvance, 1, a);
  }

  uint64_t readEpoch() const { return gputest::readEpoch(*heap); }
  template <typename T>
  std::vector<T> read(DevicePtr at, size_t count) const {
    return readBack<T>(device(), at, count);
  }
};

// ---- mode A: every rank in this process ----

std::vector<RegionSpec> prologueRegions(const Shape& s) {
  const uint64_t R = uint64_t(s.ranks);
  return {{"counts", 2 * R * uint64_t(s.experts) * 4, 256},
          {"flags", R * 8, 256},
          {"calls", 2 * R * 8, 256},
          {"arrivals", 2 * R * uint64_t(s.local()) * 8, 256},
          {"done", 2 * R * 8, 256}};
}

struct ModeA {
  std::vector<std::unique_ptr<SymmetricHeap>> heaps;
  std::vector<std::unique_ptr<Rank>> ranks;
  int size() const { return int(ranks.size()); }
  Rank& operator[](int r) { return *ranks[size_t(r)]; }
  const Rank& operator[](int r) const { return *ranks[size_t(r)]; }
  ~ModeA() {
    // Nothing may still run when the buffers and heaps go.
    for (auto& rank : ranks) {
      if (!rank->runtime || !rank->stream) continue;
      try {
        rank->device().synchronize(rank->stream);
      } catch (...) {
      }
    }
  }
};

// Opens rank r's runtime on device r % deviceCount and a heap over the s.ranks ranks; loads dispatch_prologue for
// `s` and epoch_advance; allocates the buffers for up to `maxTokens` tokens per rank.
void openModeA(ModeA& a, const Shape& s, int64_t maxTokens, const RuntimeEnv& env) {
  const int devices = openBackend(BackendKind::kCuda)->deviceCount();
  std::vector<std::shared_ptr<Device>> rankDevices;
  for (int r = 0; r < s.ranks; ++r) {
    a.ranks.push_back(std::make_unique<Rank>());
    a[r].runtime = std::make_unique<Runtime>(BackendKind::kCuda, rankOrdinal(r, devices), env);
    a[r].stream = a[r].device().createStream();
    rankDevices.push_back(a[r].runtime->device());
  }
  a.heaps = SymmetricHeap::createSingleProcess(rankDevices, prologueRegions(s), env);
  for (int r = 0; r < s.ranks; ++r) {
    Rank& rank = a[r];
    rank.heap = a.heaps[size_t(r)].get();
    rank.prologue = loadKernel(*rank.runtime, "dispatch_prologue", s.spec());
    rank.epochAdvance = loadKernel(*rank.runtime, "epoch_advance", {});
    ASSERT_EQ(rank.prologue->metadata().blockThreads, kBlockThreads);
    rank.maxPicks = size_t(std::max<int64_t>(maxTokens * s.topk, 1));
    rank.topkIdx = rank.device().allocate(rank.maxPicks * 4);
    rank.sendSlot = rank.device().allocate((rank.maxPicks + kGuard) * 4);
    rank.poolOffsets = rank.device().allocate((size_t(s.local()) + 1 + kGuard) * 4);
    rank.sendList = rank.device().allocate(rank.maxPicks * 4);
    rank.sendOff = rank.device().allocate(size_t(s.experts + 1) * 4);
    rank.sendBase = rank.device().allocate(size_t(s.experts) * 4);
    rank.routeEpoch = rank.device().allocate(8);
    const size_t scratchBytes = size_t(abi::prologueScratchBytes(kPrologueBlocks, s.experts));
    rank.scratch = rank.device().allocate(scratchBytes);
    rank.device().memsetZero(rank.scratch, scratchBytes, nullptr);
    rank.device().synchronize(nullptr);
  }
}

// ---- the routing data and its host reference ----

// tokens * topk picks drawn uniformly from [-1, E): about one in E + 1 is -1 ("no expert").
std::vector<int32_t> randomTopk(std::mt19937& rng, int64_t tokens, const Shape& s) {
  std::uniform_int_distribution<int32_t> pick(-1, int32_t(s.experts) - 1);
  std::vector<int32_t> idx(size_t(tokens * s.topk));
  for (auto& e : idx) e = pick(rng);
  return idx;
}

bool validExpert(int32_t e, const Shape& s) { return e >= 0 && e < s.experts; }

struct Reference {
  std::vector<std::vector<int64_t>> counts;  // [R][E]: source s's picks of expert e (entries outside [0, E) skipped)
  std::vector<int64_t> offset;               // [E]: first row of expert e in its owner's pool
  std::vector<std::vector<int64_t>> first;   // [R][E]: first row of (source s, expert e) in e's owner's pool
  std::vector<int64_t> received;             // [R]: rows of rank p's pool
  std::vector<std::vector<int32_t>> poolOffsets;  // [R][E/R + 1]: what rank p's pool_offsets must hold
};

// The owner's pool is grouped by local expert, then by source rank.
Reference reference(const Shape& s, const std::vector<std::vector<int32_t>>& idx) {
  const int64_t E = s.experts, local = s.local();
  const size_t R = size_t(s.ranks);
  Reference ref;
  ref.counts.assign(R, std::vector<int64_t>(size_t(E), 0));
  for (size_t src = 0; src < R; ++src)
    for (int32_t e : idx[src])
      if (validExpert(e, s)) ++ref.counts[src][size_t(e)];
  ref.offset.assign(size_t(E), 0);
  ref.first.assign(R, std::vector<int64_t>(size_t(E), 0));
  ref.received.assign(R, 0);
  ref.poolOffsets.assign(R, std::vector<int32_t>(size_t(local) + 1, 0));
  for (int p = 0; p < s.ranks; ++p) {
    int64_t row = 0;
    for (int64_t el = 0; el < local; ++el) {
      const size_t e = size_t(p * local + el);
      ref.offset[e] = row;
      ref.poolOffsets[size_t(p)][size_t(el)] = int32_t(row);
      for (int src = 0; src < s.ranks; ++src) {
        ref.first[size_t(src)][e] = row;
        row += ref.counts[size_t(src)][e];
      }
    }
    ref.received[size_t(p)] = row;
    ref.poolOffsets[size_t(p)][size_t(local)] = int32_t(row);
  }
  return ref;
}

// What one rank's call left behind.
struct Outputs {
  std::vector<int32_t> sendSlot;     // [picks + kGuard]
  std::vector<int32_t> poolOffsets;  // [E/R + 1 + kGuard]
  std::vector<int32_t> counts;       // heap [2][R][E]
  std::vector<uint64_t> flags;       // heap [R]
  std::vector<int32_t> sendList;     // [picks]
  std::vector<int32_t> sendOff;      // [E + 1]
  std::vector<int32_t> sendBase;     // [E]
};

Outputs readOutputs(const Rank& rank, const Shape& s, size_t picks) {
  Outputs out;
  out.sendSlot = rank.read<int32_t>(rank.sendSlot, picks + kGuard);
  out.poolOffsets = rank.read<int32_t>(rank.poolOffsets, size_t(s.local()) + 1 + kGuard);
  out.counts = rank.read<int32_t>(rank.heap->regionAddress("counts"), size_t(2 * s.ranks * s.experts));
  out.flags = rank.read<uint64_t>(rank.heap->regionAddress("flags"), size_t(s.ranks));
  out.sendList = rank.read<int32_t>(rank.sendList, picks);
  out.sendOff = rank.read<int32_t>(rank.sendOff, size_t(s.experts) + 1);
  out.sendBase = rank.read<int32_t>(rank.sendBase, size_t(s.experts));
  return out;
}

// Collects differences: the first kMaxMessages spelled out, all counted.
struct Diffs {
  std::string text;
  size_t count = 0;
  void add(const std::string& what) {
    if (count++ < size_t(kMaxMessages)) text += "\n  " + what;
  }
};

// Checks the call at `epoch` against the reference. On every rank in `checkedRanks`: pool_offsets equal the
// reference exactly (and [E/R] = rows received), the count slab [epoch % 2] holds the whole count matrix and
// flags[src] = epoch + 1. For every pick of every source in `checkedSources`: -1 when its entry is outside [0, E),
// else a row inside the sub-range of (source, expert) at the expert's owner, [first, first + counts), used by no
// other pick; with every source checked, every row of every pool is then used exactly once. Entries past the picks
// must keep the sentinel. "" when all of it holds.
std::string checkCall(const Shape& s, const std::vector<std::vector<int32_t>>& idx, const Reference& ref,
                      const std::vector<Outputs>& out, uint64_t epoch, const std::vector<int>& checkedRanks,
                      const std::vector<int>& checkedSources, size_t* mismatches) {
  const int64_t E = s.experts, local = s.local();
  Diffs d;
  for (int r : checkedRanks) {
    const std::string at = "rank " + std::to_string(r) + ": ";
    const Outputs& o = out[size_t(r)];
    for (size_t i = 0; i < o.poolOffsets.size(); ++i) {
      const int32_t expected = i <= size_t(local) ? ref.poolOffsets[size_t(r)][i] : kSentinel;
      if (o.poolOffsets[i] != expected)
        d.add(at + "pool_offsets[" + std::to_string(i) + "] = " + std::to_string(o.poolOffsets[i]) + ", expected " +
              std::to_string(expected) + (i > size_t(local) ? " (past the end: the sentinel)" : ""));
    }
    const size_t slab = size_t(epoch % 2) * size_t(s.ranks * E);
    for (int src = 0; src < s.ranks; ++src)
      for (int64_t e = 0; e < E; ++e) {
        const int32_t got = o.counts[slab + size_t(src * E + e)];
        if (got != ref.counts[size_t(src)][size_t(e)])
          d.add(at + "counts[" + std::to_string(epoch % 2) + "][" + std::to_string(src) + "][" + std::to_string(e) +
                "] = " + std::to_string(got) + ", expected " + std::to_string(ref.counts[size_t(src)][size_t(e)]));
      }
    for (int src = 0; src < s.ranks; ++src)
      if (o.flags[size_t(src)] != epoch + 1)
        d.add(at + "flags[" + std::to_string(src) + "] = " + std::to_string(o.flags[size_t(src)]) + ", expected " +
              std::to_string(epoch + 1));
  }
  // used[p][row]: the pick that took row `row` of rank p's pool, as (source << 40) | pick, or -1.
  std::vector<std::vector<int64_t>> used(size_t(s.ranks));
  for (int p = 0; p < s.ranks; ++p) used[size_t(p)].assign(size_t(ref.received[size_t(p)]), -1);
  for (int src : checkedSources) {
    const std::string at = "rank " + std::to_string(src) + ": ";
    const std::vector<int32_t>& slot = out[size_t(src)].sendSlot;
    const size_t picks = idx[size_t(src)].size();
    std::vector<int64_t> earlier(size_t(E), 0);  // picks of each expert before pick i: rows follow pick order
    for (size_t i = 0; i < picks; ++i) {
      const int32_t e = idx[size_t(src)][i], v = slot[i];
      const std::string pick = at + "send_slot[" + std::to_string(i) + "] (expert " + std::to_string(e) + ") = " +
                               std::to_string(v);
      if (!validExpert(e, s)) {
        if (v != -1) d.add(pick + ", expected -1");
        continue;
      }
      const int owner = int(e / local);
      const int64_t lo = ref.first[size_t(src)][size_t(e)], hi = lo + ref.counts[size_t(src)][size_t(e)];
      if (v < lo || v >= hi) {
        d.add(pick + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + ") of (source " +
              std::to_string(src) + ", expert " + std::to_string(e) + ") in rank " + std::to_string(owner) +
              "'s pool");
        continue;
      }
      if (v != lo + earlier[size_t(e)]++)
        d.add(pick + ", expected row " + std::to_string(lo + earlier[size_t(e)] - 1) +
              " (rows of one source and expert follow pick order)");
      int64_t& taken = used[size_t(owner)][size_t(v)];
      if (taken >= 0) {
        d.add(pick + ", a row of rank " + std::to_string(owner) + "'s pool already taken by rank " +
              std::to_string(taken >> 40) + "'s pick " + std::to_string(taken & ((int64_t(1) << 40) - 1)));
        continue;
      }
      taken = (int64_t(src) << 40) | int64_t(i);
    }
    // The push list: expert e's picks at [send_off[e], send_off[e + 1]), the j-th of them in pool row
    // send_base[e] + j of e's owner.
    const Outputs& o = out[size_t(src)];
    for (int64_t e = 0; e < E; ++e) {
      const std::string list = at + "expert " + std::to_string(e) + ": ";
      const int32_t lo = o.sendOff[size_t(e)], hi = o.sendOff[size_t(e) + 1];
      if (hi - lo != ref.counts[size_t(src)][size_t(e)] || lo < 0 || size_t(hi) > picks) {
        d.add(list + "send_off range [" + std::to_string(lo) + ", " + std::to_string(hi) + ") does not hold its " +
              std::to_string(ref.counts[size_t(src)][size_t(e)]) + " picks");
        continue;
      }
      if (o.sendBase[size_t(e)] != ref.first[size_t(src)][size_t(e)])
        d.add(list + "send_base = " + std::to_string(o.sendBase[size_t(e)]) + ", expected " +
              std::to_string(ref.first[size_t(src)][size_t(e)]));
      for (int32_t j = lo; j < hi; ++j) {
        const int32_t p = o.sendList[size_t(j)];
        if (p < 0 || size_t(p) >= picks || idx[size_t(src)][size_t(p)] != e ||
            slot[size_t(p)] != o.sendBase[size_t(e)] + (j - lo))
          d.add(list + "send_list[" + std::to_string(j) + "] = " + std::to_string(p) +
                " is not a pick of this expert in the matching pool row");
      }
    }
    for (size_t i = picks; i < slot.size(); ++i)
      if (slot[i] != kSentinel)
        d.add(at + "send_slot[" + std::to_string(i) + "] = " + std::to_string(slot[i]) + " past the " +
              std::to_string(picks) + " picks (expected the sentinel)");
  }
  if (checkedSources.size() == size_t(s.ranks))
    for (int p = 0; p < s.ranks; ++p) {
      const size_t free = size_t(std::count(used[size_t(p)].begin(), used[size_t(p)].end(), int64_t(-1)));
      if (free) d.add("rank " + std::to_string(p) + "'s pool: " + std::to_string(free) + " of " +
                      std::to_string(ref.received[size_t(p)]) + " rows taken by no pick");
    }
  *mismatches = d.count;
  if (!d.count) return "";
  return "call at epoch " + std::to_string(epoch) + ": " + std::to_string(d.count) + " differences:" + d.text;
}

// Uploads rank r's topk_idx and fills its outputs (and their guards) with the sentinel.
void prepare(Rank& rank, const Shape& s, const std::vector<int32_t>& idx) {
  ASSERT_LE(idx.size(), rank.maxPicks);
  if (!idx.empty()) uploadAndWait(rank.device(), rank.topkIdx, idx.data(), idx.size() * 4);
  const std::vector<int32_t> slots(rank.maxPicks + kGuard, kSentinel), offsets(size_t(s.local()) + 1 + kGuard,
                                                                                kSentinel);
  uploadAndWait(rank.device(), rank.sendSlot, slots.data(), slots.size() * 4);
  uploadAndWait(rank.device(), rank.poolOffsets, offsets.data(), offsets.size() * 4);
}

// Every rank's dispatch_prologue, then epoch_advance, launched before any is synchronised: each waits for the others.
void launchAll(ModeA& a, const std::vector<int32_t>& tokens) {
  for (int r = 0; r < a.size(); ++r) a[r].launchPrologue(tokens[size_t(r)]);
  for (int r = 0; r < a.size(); ++r) a[r].launchEpochAdvance();
}

std::vector<int> allRanks(int ranks) {
  std::vector<int> out(size_t(ranks), 0);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

template <typename T>
std::string joined(const std::vector<T>& values) {
  std::string text;
  for (const T& v : values) text += (text.empty() ? "" : ",") + std::to_string(v);
  return text;
}

// `ranks` token counts: rank r gets pattern[r % size] (the 2-rank patterns, extended to 8 ranks).
std::vector<int32_t> cycled(int ranks, std::initializer_list<int32_t> pattern) {
  std::vector<int32_t> out;
  for (int r = 0; r < ranks; ++r) out.push_back(pattern.begin()[size_t(r) % pattern.size()]);
  return out;
}

// One full call on every rank with fresh random data of `tokens` per rank; checks everything. Returns a summary
// fragment; `mismatches` accumulates.
std::string runCheckedCall(ModeA& a, const Shape& s, std::mt19937& rng, const std::vector<int32_t>& tokens,
                           size_t* mismatches) {
  const uint64_t epoch = a[0].readEpoch();
  for (int r = 1; r < a.size(); ++r) EXPECT_EQ(a[r].readEpoch(), epoch) << "rank " << r;
  std::vector<std::vector<int32_t>> idx(size_t(a.size()));
  for (int r = 0; r < a.size(); ++r) {
    idx[size_t(r)] = randomTopk(rng, tokens[size_t(r)], s);
    prepare(a[r], s, idx[size_t(r)]);
  }
  const Reference ref = reference(s, idx);
  launchAll(a, tokens);
  for (int r = 0; r < a.size(); ++r) a[r].heap->checkErrors(a[r].stream);
  std::vector<Outputs> out(size_t(a.size()));
  for (int r = 0; r < a.size(); ++r) out[size_t(r)] = readOutputs(a[r], s, idx[size_t(r)].size());
  size_t bad = 0;
  EXPECT_EQ(checkCall(s, idx, ref, out, epoch, allRanks(s.ranks), allRanks(s.ranks), &bad), "") << s.text();
  *mismatches += bad;
  for (int r = 0; r < a.size(); ++r) EXPECT_EQ(a[r].readEpoch(), epoch + 1) << "rank " << r;
  size_t skipped = 0;
  for (const auto& v : idx) skipped += size_t(std::count(v.begin(), v.end(), -1));
  return "epoch " + std::to_string(epoch) + " tokens=" + joined(tokens) + " skipped(-1)=" + std::to_string(skipped) +
         " received=" + joined(ref.received) + " differences=" + std::to_string(bad);
}

// ---------------------------------------------------------------------------------------------------- tests

// The prologue tests, at every count of kRankCounts.
class GpuDispatch : public ::testing::TestWithParam<int> {
 protected:
  int ranks() const { return GetParam(); }
};
INSTANTIATE_TEST_SUITE_P(, GpuDispatch, ::testing::ValuesIn(kRankCounts), rankCountName);

// Three consecutive calls at E=16, topk=4 (epochs 0, 1, 2; nothing reset in between), token counts that differ
// between the ranks and the calls, one of them zero.
TEST_P(GpuDispatch, PrologueSmallThreeCalls) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  const Shape s{16, 4, ranks()};
  const std::vector<int32_t> tokens[] = {cycled(ranks(), {777, 1, 4096, 0}), cycled(ranks(), {0, 513}),
                                         cycled(ranks(), {8192})};
  ModeA a;
  ASSERT_NO_FATAL_FAILURE(openModeA(a, s, 8192, parseEnv()));
  std::string summary;
  size_t mismatches = 0;
  for (const auto& t : tokens) {
    summary += "; " + runCheckedCall(a, s, rng, t, &mismatches);
    if (HasFailure()) break;
  }
  std::printf("SUMMARY dispatch_prologue %s (%s) calls=%zu%s; total differences=%zu\n", s.text().c_str(),
              placement(*backend_, s.ranks).c_str(), std::size(tokens), summary.c_str(), mismatches);
}

// The DeepSeek-V3 routing shape: E=256, topk=8, 8192 tokens per rank, one call.
TEST_P(GpuDispatch, PrologueDeepSeekV3) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  std::mt19937 rng = testRng();
  const Shape s{256, 8, ranks()};
  ModeA a;
  ASSERT_NO_FATAL_FAILURE(openModeA(a, s, 8192, parseEnv()));
  size_t mismatches = 0;
  const std::string summary = runCheckedCall(a, s, rng, cycled(ranks(), {8192}), &mismatches);
  std::printf("SUMMARY dispatch_prologue %s (DeepSeek-V3, %s): %s\n", s.text().c_str(),
              placement(*backend_, s.ranks).c_str(), summary.c_str());
}

// Rank 0's topk_idx holds `bad` (value at pick position) among valid entries. After the call every other rank must
// complete without error (rank 0 signals before it returns) and with tables that skip the bad picks; rank 0's
// checkErrors must throw a kBadIndex device error naming rank 0, the pick and its value. Waits are bounded at 2 s.
void runBadIndexCase(int ranks, const std::vector<int32_t>& badValues, const char* label) {
  constexpr uint64_t kTimeoutMs = 2000;
  const RuntimeEnv env = envWithWaitTimeout(kTimeoutMs);
  ASSERT_EQ(env.waitTimeoutMs, kTimeoutMs);
  std::mt19937 rng = testRng();
  const Shape s{16, 4, ranks};
  const std::vector<int32_t> tokens = cycled(ranks, {1000});
  ModeA a;
  ASSERT_NO_FATAL_FAILURE(openModeA(a, s, 1000, env));
  ASSERT_EQ(a[0].readEpoch(), 0u);

  std::vector<std::vector<int32_t>> idx(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) idx[size_t(r)] = randomTopk(rng, tokens[size_t(r)], s);
  // Distinct random positions on rank 0 for the bad values.
  std::vector<size_t> positions;
  std::uniform_int_distribution<size_t> where(0, idx[0].size() - 1);
  while (positions.size() < badValues.size()) {
    const size_t p = where(rng);
    if (std::find(positions.begin(), positions.end(), p) == positions.end()) positions.push_back(p);
  }
  std::vector<std::string> accepted;  // the messages a first-wins claim may produce, one per bad entry
  for (size_t k = 0; k < badValues.size(); ++k) {
    idx[0][positions[k]] = badValues[k];
    accepted.push_back("rank 0: index out of range at site " + std::to_string(positions[k]) + " (value " +
                       std::to_string(badValues[k]) + ", bound " + std::to_string(s.experts) + ") in block ");
  }
  for (int r = 0; r < ranks; ++r) prepare(a[r], s, idx[size_t(r)]);
  const Reference ref = reference(s, idx);  // the bad entries are skipped like -1

  const auto start = std::chrono::steady_clock::now();
  launchAll(a, tokens);
  // The other ranks first: each must finish on its own, error-free, well before its wait would time out.
  std::vector<int> others;
  double othersSeconds = 0;
  for (int r = 1; r < ranks; ++r) {
    others.push_back(r);
    std::string error;
    try {
      a[r].heap->checkErrors(a[r].stream);
    } catch (const Error& e) {
      error = e.what();
    }
    othersSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(error, "") << "rank " << r << " must complete without an error when rank 0 sees a bad index";
    EXPECT_LT(othersSeconds, kTimeoutMs / 1000.0) << "rank " << r << " waited out its timeout";
    EXPECT_TRUE(a[r].heap->usable()) << "rank " << r;
  }

  std::string message;
  ErrorCode code = ErrorCode::kOk;
  try {
    a[0].heap->checkErrors(a[0].stream);
  } catch (const Error& e) {
    message = e.what();
    code = e.code();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(code, ErrorCode::kDeviceError) << message;
  EXPECT_LT(seconds, kTimeoutMs / 1000.0 + 2.0);
  bool named = false;
  for (const std::string& m : accepted) named = named || message.rfind(m, 0) == 0;
  std::string expectedText;
  for (const std::string& m : accepted) expectedText += "\n  \"" + m + "...\"";
  EXPECT_TRUE(named) << "rank 0's error is \"" << message << "\"; expected one of:" << expectedText;
  EXPECT_FALSE(a[0].heap->usable());

  // The other ranks' tables: everything that does not depend on rank 0 having finished (their pool_offsets, their
  // count slabs and flags, their own picks' rows). Rank 0's bad picks were skipped: their send_slot is -1.
  std::vector<Outputs> out(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) out[size_t(r)] = readOutputs(a[r], s, idx[size_t(r)].size());
  size_t bad = 0;
  EXPECT_EQ(checkCall(s, idx, ref, out, 0, others, others, &bad), "");
  for (size_t k = 0; k < positions.size(); ++k)
    EXPECT_EQ(out[0].sendSlot[positions[k]], -1) << "rank 0's bad pick " << positions[k] << " (value "
                                                 << badValues[k] << ") was not skipped";
  std::printf("SUMMARY dispatch_prologue bad index (%s) %s: ranks 1..%d done in %.3f s without error (%zu "
              "differences); rank 0 error after %.3f s: \"%s\"\n",
              label, s.text().c_str(), ranks - 1, othersSeconds, bad, seconds, message.c_str());
}

// One entry = E and one = -7 on rank 0: whichever claims the error record first is named.
TEST_P(GpuDispatch, PrologueBadIndexBecomesDeviceError) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  runBadIndexCase(ranks(), {16, -7}, "one entry = E, one = -7");
}

// Only -7: the error names the value as the signed entry, -7 (not its 32-bit pattern 4294967289).
TEST_P(GpuDispatch, PrologueNegativeBadIndexNamesItsValue) {
  MEGAMOE_REQUIRE_SM90A_RANKS(backend_, ranks());
  runBadIndexCase(ranks(), {-7}, "one entry = -7");
}

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) { return megamoe::gputest::runGpuTests(argc, argv); }
