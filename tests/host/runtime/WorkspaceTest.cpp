// One workspace serving many layers, on the fake HIP backend: its bytes, known before it exists, do not grow with
// the layers; every training forward writes the caller's saved state and its backward reads that one, with
// several forwards outstanding and their backwards in reverse order; layers that do not fit are refused by name.
// (The numbers a real GPU computes are checked in tests/gpu/LayerConfigTest.cpp.)
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "FakeLayerKernels.h"
#include "TestSupport.h"
#include "compiler/abi/DeviceAbi.h"
#include "compiler/abi/KernelAbi.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"
#include "megamoe/Workspace.h"

namespace megamoe {
namespace {

MoeLayerConfig small(bool training) {
  MoeLayerConfig c{512, 256, 16, 4, 64, 0};
  c.training = training;
  return c;
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

class WorkspaceOnFakeHip : public ::testing::Test {
 protected:
  static constexpr int kRanks = 2;
  void SetUp() override {
    RuntimeEnv env = parseEnv([](const char*) -> const char* { return nullptr; });
    env.hipLibrary = test::FakeHip::path();
    env.cacheDir = dir.path();
    test::storeFakeLayerKernels(dir.path(), small(true), kRanks, /*recordArguments=*/true);
    for (int r = 0; r < kRanks; ++r) runtimes.push_back(std::make_unique<Runtime>(BackendKind::kHip, 0, env));
  }
  std::vector<Runtime*> raw() {
    std::vector<Runtime*> out;
    for (auto& rt : runtimes) out.push_back(rt.get());
    return out;
  }
  // The recorded launches of `kernel` since launch index `from`, in order.
  std::vector<FakeHipLaunch> launchesOf(const std::string& kernel, int from) {
    std::vector<FakeHipLaunch> out;
    for (int i = from; i < test::FakeHip::get().launchCount(); ++i) {
      FakeHipLaunch l{};
      test::FakeHip::get().launch(i, &l);
      if (kernel == l.name) out.push_back(l);
    }
    return out;
  }
  static int argIndex(const char* kernel, const char* arg) { return abi::findKernelDecl(kernel)->indexOf(arg); }
  test::TempDir dir;
  std::vector<std::unique_ptr<Runtime>> runtimes;
};

TEST_F(WorkspaceOnFakeHip, BytesAreKnownBeforeCreationAndDoNotGrowWithLayers) {
  const WorkspaceBytes expected = Workspace::bytesFor(small(true), kRanks);
  auto& fake = test::FakeHip::get();
  const int before = fake.liveAllocations();
  auto workspaces = Workspace::createLocal(raw(), small(true));
  const int withWorkspace = fake.liveAllocations();
  EXPECT_EQ(workspaces[0]->bytes().total(), expected.total());
  EXPECT_GT(withWorkspace, before);
  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (int l = 0; l < 4; ++l)
    for (auto& ws : workspaces) layers.push_back(MoeLayer::create(ws, small(true)));
  EXPECT_EQ(fake.liveAllocations(), withWorkspace) << "a layer on a workspace allocates no device memory";
  EXPECT_EQ(layers[0]->activationBytes(), expected.total());
  std::printf("workspace bytes per rank (H 512, I 256, E 16, top-4, 64 tokens, 2 ranks): heap %llu + buffers %llu, "
              "with 1 or 4 layers; saved bytes per training forward %llu\n",
              static_cast<unsigned long long>(expected.heap), static_cast<unsigned long long>(expected.buffers),
              static_cast<unsigned long long>(MoeLayer::savedBytes(small(true), kRanks)));
}

TEST_F(WorkspaceOnFakeHip, ForwardsOutstandingAndBackwardsInReverseOrderUseTheirOwnSavedState) {
  auto workspaces = Workspace::createLocal(raw(), small(true));
  constexpr int kLayers = 4, kOutstanding = 3;
  std::vector<std::vector<std::unique_ptr<MoeLayer>>> layers(kRanks);  // [rank][layer]
  for (int r = 0; r < kRanks; ++r)
    for (int l = 0; l < kLayers; ++l) layers[size_t(r)].push_back(MoeLayer::create(workspaces[size_t(r)], small(true)));
  Device& d = *runtimes[0]->device();
  std::vector<DevicePtr> buffers;
  auto buffer = [&](uint64_t bytes) {
    buffers.push_back(d.allocate(size_t(bytes)));
    return buffers.back();
  };
  const uint64_t savedBytes = MoeLayer::savedBytes(small(true), kRanks);
  ASSERT_GT(savedBytes, 0u);
  std::vector<std::vector<DevicePtr>> saved(kRanks);
  const DevicePtr x = buffer(1 << 20), idx = buffer(1 << 20), w = buffer(1 << 20), w1 = buffer(1 << 20),
                  w2 = buffer(1 << 20), y = buffer(1 << 20);
  const int from = test::FakeHip::get().launchCount();
  for (int f = 0; f < kOutstanding; ++f)
    for (int r = 0; r < kRanks; ++r) {
      saved[size_t(r)].push_back(buffer(savedBytes));
      ForwardArgs a{x, 8, idx, w, w1, w2, y};
      a.saved = saved[size_t(r)].back();
      layers[size_t(r)][size_t(f)]->forward(a, nullptr);
    }
  for (int f = kOutstanding - 1; f >= 0; --f)
    for (int r = 0; r < kRanks; ++r) {
      BackwardArgs b{y, x, 8, idx, w, w1, w2, y, w, w1, w2};
      b.saved = saved[size_t(r)][size_t(f)];
      layers[size_t(r)][size_t(f)]->backward(b, nullptr);
    }
  // Forward f of rank r wrote h into its saved state (the NT dispatch's `extra`); backward f read that one (the
  // SwiGLU backward's `h`) and wrote dh into the workspace's buffer, never into a saved state.
  const auto dispatches = launchesOf("dispatch_grouped_gemm", from);
  const auto swiglus = launchesOf("swiglu_bwd", from);
  ASSERT_EQ(dispatches.size(), size_t(kOutstanding * kRanks * 3));  // per forward one, per backward two
  ASSERT_EQ(swiglus.size(), size_t(kOutstanding * kRanks));
  const int extra = argIndex("dispatch_grouped_gemm", "extra"), h = argIndex("swiglu_bwd", "h"),
            dh = argIndex("swiglu_bwd", "dh");
  for (int f = 0; f < kOutstanding; ++f)
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(dispatches[size_t(f * kRanks + r)].params[extra], saved[size_t(r)][size_t(f)]) << "forward " << f;
      const FakeHipLaunch& s = swiglus[size_t((kOutstanding - 1 - f) * kRanks + r)];
      EXPECT_EQ(s.params[h], saved[size_t(r)][size_t(f)]) << "backward " << f << " rank " << r;
      EXPECT_EQ(s.params[dh], workspaces[size_t(r)]->buffers().dh) << "backward " << f << " rank " << r;
    }
  // Each backward recomputes its routing: one dispatch_prologue per forward and per backward.
  EXPECT_EQ(launchesOf("dispatch_prologue", from).size(), size_t(2 * kOutstanding * kRanks));
  for (DevicePtr p : buffers) d.free(p);
}

// A workspace whose construction fails part way (out of memory at any of its allocations) leaves nothing allocated.
TEST_F(WorkspaceOnFakeHip, AFailedCreationFreesWhatItAllocated) {
  auto& fake = test::FakeHip::get();
  const int before = fake.liveAllocations(), mallocs = fake.callCount("hipMalloc");
  Workspace::createLocal(raw(), small(true));  // destroyed at once
  const int perCreation = fake.callCount("hipMalloc") - mallocs;
  ASSERT_GT(perCreation, 4);
  for (int failAt : {1, perCreation / 2, perCreation - 1}) {
    fake.failMallocAfter(failAt);
    EXPECT_THROW(Workspace::createLocal(raw(), small(true)), Error) << "failing allocation " << failAt;
    EXPECT_EQ(fake.liveAllocations(), before) << "failing allocation " << failAt;
  }
  fake.failMallocAfter(-1);
}

// checkErrors and droppedPicks read back on the caller's stream, never through the legacy default stream (which
// would wait for another rank's work on the same GPU while that rank waits for this one).
TEST_F(WorkspaceOnFakeHip, ReadBacksRunOnTheCallersStream) {
  auto workspaces = Workspace::createLocal(raw(), small(true));
  Device& d = *runtimes[0]->device();
  StreamHandle stream = d.createStream();
  auto& fake = test::FakeHip::get();
  const int sync = fake.callCount("hipMemcpyDtoH"), async = fake.callCount("hipMemcpyDtoHAsync");
  workspaces[0]->heap().checkErrors(stream);
  EXPECT_EQ(workspaces[0]->droppedPicks(stream), 0u);
  EXPECT_EQ(fake.callCount("hipMemcpyDtoH"), sync);
  EXPECT_EQ(fake.callCount("hipMemcpyDtoHAsync"), async + 2);
  d.destroyStream(stream);
}

// Waiting for the device inside a graph capture is refused by name; the capture and the heap stay usable.
TEST_F(WorkspaceOnFakeHip, ReadBacksDuringACaptureAreRefusedAndBreakNothing) {
  auto workspaces = Workspace::createLocal(raw(), small(true));
  Device& d = *runtimes[0]->device();
  StreamHandle stream = d.createStream();
  d.beginCapture(stream);
  EXPECT_NE(errorOf([&] { workspaces[0]->heap().checkErrors(stream); }).find("checkErrors: the stream is being captured"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { workspaces[0]->droppedPicks(stream); }).find("droppedPicks: the stream is being captured"),
            std::string::npos);
  d.destroyGraph(d.endCapture(stream));
  EXPECT_TRUE(workspaces[0]->heap().usable());
  workspaces[0]->heap().checkErrors(stream);  // after the capture: fine
  d.destroyStream(stream);
}

TEST_F(WorkspaceOnFakeHip, WhatDoesNotFitIsRefusedByName) {
  auto training = Workspace::createLocal(raw(), small(true));
  MoeLayerConfig wide = small(true);
  wide.hidden = 1024;
  EXPECT_NE(errorOf([&] { MoeLayer::create(training[0], wide); }).find("hidden=1024 exceeds the workspace's hidden=512"),
            std::string::npos);
  // The arrival counters are laid out by the workspace's experts: a layer with fewer would read stale counts.
  MoeLayerConfig fewer = small(true);
  fewer.experts = 8;
  EXPECT_NE(errorOf([&] { MoeLayer::create(training[0], fewer); }).find("experts=8 must equal the workspace's experts=16"),
            std::string::npos);
  auto inference = Workspace::createLocal(raw(), small(false));
  EXPECT_NE(errorOf([&] { MoeLayer::create(inference[0], small(true)); }).find("needs a workspace created with training"),
            std::string::npos);
  // A training layer on a caller's workspace has no saved state of its own: forward without one is refused.
  auto layer = MoeLayer::create(training[0], small(true));
  Device& d = *runtimes[0]->device();
  const DevicePtr p = d.allocate(1 << 20);
  EXPECT_NE(errorOf([&] { layer->forward({p, 8, p, p, p, p, p}, nullptr); }).find("saved must be given"),
            std::string::npos);
  ForwardArgs misaligned{p, 8, p, p, p, p, p};
  misaligned.saved = p + 8;
  EXPECT_NE(errorOf([&] { layer->forward(misaligned, nullptr); }).find("saved must be 16-byte aligned"),
            std::string::npos);
  // Every buffer is sized for max_tokens: a backward with more is refused before anything is launched, saved state
  // given or not.
  const int launches = test::FakeHip::get().launchCount();
  BackwardArgs more{p, p, 65, p, p, p, p, p, p, p, p};
  more.saved = p;
  EXPECT_NE(errorOf([&] { layer->backward(more, nullptr); }).find("backward: tokens=65 must be in [0, max_tokens=64]"),
            std::string::npos);
  EXPECT_EQ(test::FakeHip::get().launchCount(), launches);
  d.free(p);
  EXPECT_NE(errorOf([] { Workspace::bytesFor(small(true), 9); }).find("ranks=9"), std::string::npos);
}

// A receive capacity shrinks the pool and the saved state, and every call's routing is checked against it: the
// dispatch_prologue gets it as its `capacity`.
TEST_F(WorkspaceOnFakeHip, ReceiveCapacityShrinksThePoolAndReachesThePrologue) {
  MoeLayerConfig capped = small(true);
  capped.receiveCapacity = 100;
  EXPECT_LT(Workspace::bytesFor(capped, kRanks).total(), Workspace::bytesFor(small(true), kRanks).total());
  EXPECT_EQ(MoeLayer::savedBytes(capped, kRanks), uint64_t(100) * 2 * 256 * 2);
  MoeLayerConfig above = small(true);
  above.receiveCapacity = 1 << 20;  // above the worst case: the worst case
  EXPECT_EQ(MoeLayer::savedBytes(above, kRanks), MoeLayer::savedBytes(small(true), kRanks));
  MoeLayerConfig negative = small(true);
  negative.receiveCapacity = -1;
  EXPECT_NE(MoeLayer::validate(negative, kRanks).find("receive_capacity=-1"), std::string::npos);
  auto workspaces = Workspace::createLocal(raw(), capped);
  // A layer whose pool would be larger than the workspace's does not fit.
  EXPECT_NE(errorOf([&] { MoeLayer::create(workspaces[0], small(true)); }).find("exceed the workspace's receive pool"),
            std::string::npos);
  auto layer = MoeLayer::create(workspaces[0], capped);
  Device& d = *runtimes[0]->device();
  const DevicePtr p = d.allocate(1 << 20);
  const int from = test::FakeHip::get().launchCount();
  ForwardArgs a{p, 8, p, p, p, p, p};
  a.saved = p;
  layer->forward(a, nullptr);
  const auto prologues = launchesOf("dispatch_prologue", from);
  ASSERT_EQ(prologues.size(), 1u);
  EXPECT_EQ(int32_t(prologues[0].params[argIndex("dispatch_prologue", "capacity")]), 100);
  d.free(p);
}

// Dropping past the capacity: every kernel of the call reads the layer's own copy of topk_idx (the prologue marks
// the dropped picks -1 there, never in the caller's array), the forward's prologue counts them into the workspace's
// counter and the backward's rerun does not count them again; the dispatches know the capacity.
TEST_F(WorkspaceOnFakeHip, DroppingPastTheCapacityWorksOnACopyAndCountsOnce) {
  MoeLayerConfig dropping = small(true);
  dropping.receiveCapacity = 100;
  dropping.dropOverflow = true;
  MoeLayerConfig dedup = dropping;
  dedup.dedupTokens = true;
  EXPECT_NE(MoeLayer::validate(dedup, kRanks).find("drop_overflow is not supported with dedup_tokens"),
            std::string::npos);
  // With dedup a token's row lands at receive row source * max_tokens + token: the pool must hold them all.
  dedup.dropOverflow = false;
  EXPECT_NE(MoeLayer::validate(dedup, kRanks).find("receive_capacity=100 must be 0 or >= ranks * max_tokens = 128"),
            std::string::npos);
  dedup.receiveCapacity = 128;
  EXPECT_EQ(MoeLayer::validate(dedup, kRanks), "");
  auto workspaces = Workspace::createLocal(raw(), dropping);
  auto layer = MoeLayer::create(workspaces[0], dropping);
  Device& d = *runtimes[0]->device();
  const DevicePtr p = d.allocate(1 << 20), idx = p + 4096;
  const int from = test::FakeHip::get().launchCount();
  ForwardArgs a{p, 8, idx, p, p, p, p};
  a.saved = p;
  layer->forward(a, nullptr);
  BackwardArgs b{p, p, 8, idx, p, p, p, p, p, p, p};
  b.saved = p;
  layer->backward(b, nullptr);
  const Workspace::Buffers& buf = workspaces[0]->buffers();
  const auto prologues = launchesOf("dispatch_prologue", from);
  ASSERT_EQ(prologues.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(prologues[i].params[argIndex("dispatch_prologue", "topk_idx")], buf.topkIdx32) << "call " << i;
    EXPECT_EQ(prologues[i].params[argIndex("dispatch_prologue", "dropped")], buf.dropped);
    EXPECT_EQ(int32_t(prologues[i].params[argIndex("dispatch_prologue", "capacity")]), 100);
  }
  EXPECT_EQ(int32_t(prologues[0].params[argIndex("dispatch_prologue", "drop")]), 1) << "the forward counts";
  EXPECT_EQ(int32_t(prologues[1].params[argIndex("dispatch_prologue", "drop")]), 2) << "the backward does not";
  const auto dispatches = launchesOf("dispatch_grouped_gemm", from);
  ASSERT_EQ(dispatches.size(), 3u);
  for (const auto& l : dispatches) {
    EXPECT_EQ(int32_t(l.params[argIndex("dispatch_grouped_gemm", "capacity")]), 100);
    EXPECT_EQ(l.params[argIndex("dispatch_grouped_gemm", "topk_idx")], buf.topkIdx32);
  }
  for (const auto& l : launchesOf("grouped_gemm_combine", from))
    EXPECT_EQ(l.params[argIndex("grouped_gemm_combine", "topk_idx")], buf.topkIdx32);
  EXPECT_EQ(layer->droppedPicks(nullptr), 0u);  // the stand-in kernels drop nothing: the counter starts at zero
  // Without dropping, the caller's array is read in place and an overflow is an error (drop 0).
  MoeLayerConfig failing = dropping;
  failing.dropOverflow = false;
  auto strict = MoeLayer::create(workspaces[0], failing);
  const int before = test::FakeHip::get().launchCount();
  strict->forward(a, nullptr);
  const auto plain = launchesOf("dispatch_prologue", before);
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_EQ(plain[0].params[argIndex("dispatch_prologue", "topk_idx")], idx);
  EXPECT_EQ(int32_t(plain[0].params[argIndex("dispatch_prologue", "drop")]), 0);
  d.free(p);
}

// Each call tells the peers which layer and role it is (issue 46 item 7): the prologue of every call gets the
// workspace's call words (heap moe.calls), the layer's number on its workspace (creation order, the same on every
// rank that creates them in the same order) and the call's role: forward or backward, a profiled forward (which
// meets the peers once more), and the legs. The comparison itself runs on the device
// (tests/gpu/LayerFailureTest.cpp).
TEST_F(WorkspaceOnFakeHip, EveryCallNamesItsLayerAndRoleToThePeers) {
  auto workspaces = Workspace::createLocal(raw(), small(true));
  std::vector<std::vector<std::unique_ptr<MoeLayer>>> layers(kRanks);  // [rank][layer]
  for (int l = 0; l < 3; ++l)
    for (int r = 0; r < kRanks; ++r) layers[size_t(r)].push_back(MoeLayer::create(workspaces[size_t(r)], small(true)));
  for (int r = 0; r < kRanks; ++r)
    for (int l = 0; l < 3; ++l) EXPECT_EQ(layers[size_t(r)][size_t(l)]->number(), uint32_t(l)) << "rank " << r;
  auto own = MoeLayer::createLocal(raw(), small(true));  // a workspace of its own: its only layer
  EXPECT_EQ(own[1]->number(), 0u);
  Device& d = *runtimes[0]->device();
  const DevicePtr p = d.allocate(1 << 20);
  ForwardArgs a{p, 8, p, p, p, p, p};
  a.saved = p;
  BackwardArgs b{p, p, 8, p, p, p, p, p, p, p, p};
  b.saved = p;
  MoeLayer& second = *layers[0][2];
  const int from = test::FakeHip::get().launchCount();
  layers[0][1]->forward(a, nullptr);
  second.forward(a, nullptr);
  second.backward(b, nullptr);
  second.setProfiling(true);
  second.forward(a, nullptr);
  second.backward(b, nullptr);  // profiling changes no backward launch: the same role as before
  second.setProfiling(false);
  second.setLegs(Leg::kCommOnly, Leg::kGemmOnly);
  second.forward(a, nullptr);
  const auto prologues = launchesOf("dispatch_prologue", from);
  ASSERT_EQ(prologues.size(), 6u);
  using abi::CallKind;
  const struct {
    uint32_t layer, role;
  } expected[] = {{1, abi::callRole(CallKind::kForward, false, 3, 3)},
                  {2, abi::callRole(CallKind::kForward, false, 3, 3)},
                  {2, abi::callRole(CallKind::kBackward, false, 3, 3)},
                  {2, abi::callRole(CallKind::kForward, true, 3, 3)},
                  {2, abi::callRole(CallKind::kBackward, false, 3, 3)},
                  {2, abi::callRole(CallKind::kForward, false, 1, 2)}};
  const int calls = argIndex("dispatch_prologue", "calls"), layer = argIndex("dispatch_prologue", "layer"),
            role = argIndex("dispatch_prologue", "role");
  for (size_t i = 0; i < prologues.size(); ++i) {
    EXPECT_EQ(prologues[i].params[calls], workspaces[0]->buffers().calls) << "call " << i;
    EXPECT_EQ(uint32_t(prologues[i].params[layer]), expected[i].layer) << "call " << i;
    EXPECT_EQ(uint32_t(prologues[i].params[role]), expected[i].role) << "call " << i;
  }
  // The four roles differ from each other, and a layer's call word from another layer's.
  EXPECT_NE(expected[0].role, expected[2].role);
  EXPECT_NE(expected[0].role, expected[3].role);
  EXPECT_NE(expected[0].role, expected[5].role);
  EXPECT_NE(abi::callWord(1, expected[0].role), abi::callWord(2, expected[0].role));
  d.free(p);
}

// int64 topk_idx: each call first narrows the caller's indices into the workspace's int32 buffer, which every later
// kernel reads; an int64 array must be 8-byte aligned.
TEST_F(WorkspaceOnFakeHip, Int64IndicesAreNarrowedFirst) {
  MoeLayerConfig wide = small(true);
  wide.topkIdxInt64 = true;
  test::storeFakeLayerKernels(dir.path(), wide, kRanks, /*recordArguments=*/true);
  auto workspaces = Workspace::createLocal(raw(), wide);
  auto layer = MoeLayer::create(workspaces[0], wide);
  Device& d = *runtimes[0]->device();
  const DevicePtr p = d.allocate(1 << 20);
  const int from = test::FakeHip::get().launchCount();
  ForwardArgs a{p, 8, p + 256, p, p, p, p};
  a.saved = p;
  layer->forward(a, nullptr);
  const auto narrows = launchesOf("topk_idx_narrow", from);
  const auto prologues = launchesOf("dispatch_prologue", from);
  ASSERT_EQ(narrows.size(), 1u);
  ASSERT_EQ(prologues.size(), 1u);
  const DevicePtr narrowed = workspaces[0]->buffers().topkIdx32;
  EXPECT_EQ(narrows[0].params[argIndex("topk_idx_narrow", "src")], p + 256);
  EXPECT_EQ(narrows[0].params[argIndex("topk_idx_narrow", "dst")], narrowed);
  EXPECT_EQ(prologues[0].params[argIndex("dispatch_prologue", "topk_idx")], narrowed);
  ForwardArgs misaligned = a;
  misaligned.topkIdx = p + 4;
  EXPECT_NE(errorOf([&] { layer->forward(misaligned, nullptr); }).find("topk_idx"), std::string::npos);
  d.free(p);
}

// FP8: x quantised into the workspace (unless the caller gives e4m3 x and its scales), its codes and scales pushed,
// act quantised over the rows the prologue counted, the combine reading act's codes; the scales go where the
// kernels read them, the FP8 buffers exist in an FP8 workspace only, and missing or stray scales are refused.
TEST_F(WorkspaceOnFakeHip, Fp8ForwardQuantisesXAndActAroundTheFp8Kernels) {
  MoeLayerConfig fp8 = small(false);
  fp8.dtype = DType::kFp8E4m3;
  test::storeFakeLayerKernels(dir.path(), fp8, kRanks, /*recordArguments=*/true);
  auto workspaces = Workspace::createLocal(raw(), fp8);
  auto layer = MoeLayer::create(workspaces[0], fp8);
  const Workspace::Buffers& b = workspaces[0]->buffers();
  ASSERT_TRUE(b.poolScales && b.xCodes && b.xScales && b.actCodes && b.actScales);
  EXPECT_EQ(Workspace::bytesFor(fp8, kRanks).buffers - Workspace::bytesFor(small(false), kRanks).buffers,
            uint64_t(64 * 512 + 64 * 4 * 4 + 2 * 64 * 4 * 256 + 2 * 64 * 4 * 2 * 4))
      << "x's codes and scales for 64 tokens, act's for 512 rows";
  Device& d = *runtimes[0]->device();
  const DevicePtr p = d.allocate(1 << 20);
  const DevicePtr x = p, idx = p + 0x10000, w = p + 0x20000, w1 = p + 0x30000, w2 = p + 0x40000, y = p + 0x50000,
                  w1s = p + 0x60000, w2s = p + 0x70000, xs = p + 0x80000;
  ForwardArgs a{x, 8, idx, w, w1, w2, y};
  a.w1Scales = w1s, a.w2Scales = w2s;
  int from = test::FakeHip::get().launchCount();
  layer->forward(a, nullptr);
  auto quantisers = launchesOf("quantize_tokens_fp8", from);
  auto dispatches = launchesOf("dispatch_grouped_gemm_fp8", from);
  auto combines = launchesOf("grouped_gemm_combine_fp8", from);
  ASSERT_EQ(quantisers.size(), 2u);
  ASSERT_EQ(dispatches.size(), 1u);
  ASSERT_EQ(combines.size(), 1u);
  auto q = [&](const char* arg) { return argIndex("quantize_tokens_fp8", arg); };
  auto disp = [&](const char* arg) { return dispatches[0].params[argIndex("dispatch_grouped_gemm_fp8", arg)]; };
  auto comb = [&](const char* arg) { return combines[0].params[argIndex("grouped_gemm_combine_fp8", arg)]; };
  EXPECT_EQ(quantisers[0].params[q("x")], x);
  EXPECT_EQ(quantisers[0].params[q("q")], b.xCodes);
  EXPECT_EQ(quantisers[0].params[q("scales")], b.xScales);
  EXPECT_EQ(quantisers[0].params[q("rows_at")], 0u);
  EXPECT_EQ(disp("src"), b.xCodes);
  EXPECT_EQ(disp("src_scales"), b.xScales);
  EXPECT_EQ(disp("pool"), b.pool);
  EXPECT_EQ(disp("pool_scales"), b.poolScales);
  EXPECT_EQ(disp("weights"), w1);
  EXPECT_EQ(disp("weight_scales"), w1s);
  EXPECT_EQ(disp("out"), b.act);
  EXPECT_EQ(quantisers[1].params[q("x")], b.act);
  EXPECT_EQ(quantisers[1].params[q("q")], b.actCodes);
  EXPECT_EQ(quantisers[1].params[q("scales")], b.actScales);
  EXPECT_EQ(quantisers[1].params[q("rows_at")], b.poolOffsets + 8 * 4) << "pool_offsets[E/R]: the rows received";
  EXPECT_EQ(comb("a"), b.actCodes);
  EXPECT_EQ(comb("a_scales"), b.actScales);
  EXPECT_EQ(comb("b"), w2);
  EXPECT_EQ(comb("b_scales"), w2s);
  EXPECT_EQ(comb("y"), y);
  // The order: x quantised, the prologue, the dispatch, act quantised, the combine.
  std::vector<std::string> order;
  for (int i = from; i < test::FakeHip::get().launchCount(); ++i) {
    FakeHipLaunch l{};
    test::FakeHip::get().launch(i, &l);
    order.push_back(l.name);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"quantize_tokens_fp8", "dispatch_prologue", "dispatch_grouped_gemm_fp8",
                                             "quantize_tokens_fp8", "grouped_gemm_combine_fp8", "epoch_advance"}));
  // e4m3 x with its scales: no quantisation of x; the caller's codes and scales are pushed.
  ForwardArgs given = a;
  given.xScales = xs;
  from = test::FakeHip::get().launchCount();
  layer->forward(given, nullptr);
  ASSERT_EQ(launchesOf("quantize_tokens_fp8", from).size(), 1u) << "act only";
  dispatches = launchesOf("dispatch_grouped_gemm_fp8", from);
  ASSERT_EQ(dispatches.size(), 1u);
  EXPECT_EQ(disp("src"), x);
  EXPECT_EQ(disp("src_scales"), xs);
  // Refused before anything is enqueued.
  from = test::FakeHip::get().launchCount();
  ForwardArgs noScales = a;
  noScales.w2Scales = 0;
  EXPECT_NE(errorOf([&] { layer->forward(noScales, nullptr); }).find("w1_scales and w2_scales must not be null"),
            std::string::npos);
  ForwardArgs misaligned = a;
  misaligned.w1Scales = w1s + 2;
  EXPECT_NE(errorOf([&] { layer->forward(misaligned, nullptr); }).find("w1_scales"), std::string::npos);
  EXPECT_EQ(test::FakeHip::get().launchCount(), from);
  // A bf16 layer takes no scales, and does not fit an FP8 workspace (its pool holds e4m3 rows), nor the reverse.
  EXPECT_NE(workspaces[0]->fits(small(false)).find("dtype=bf16 differs from the workspace's dtype=fp8_e4m3"),
            std::string::npos);
  auto bf16Workspaces = Workspace::createLocal(raw(), small(false));
  EXPECT_NE(bf16Workspaces[0]->fits(fp8).find("dtype=fp8_e4m3 differs"), std::string::npos);
  test::storeFakeLayerKernels(dir.path(), small(false), kRanks, /*recordArguments=*/true);
  auto bf16 = MoeLayer::create(bf16Workspaces[0], small(false));
  EXPECT_NE(errorOf([&] { bf16->forward(a, nullptr); }).find("are for a dtype fp8_e4m3 layer"), std::string::npos);
  d.free(p);
}

// Rendezvous through the caller: each fork()ed rank prepares its workspace, the "caller" all-gathers the handles (here
// through files), every rank joins, meets, runs a training forward and backward of a layer on it, and meets again
// before destroying it. The layers' launches reach the peers' heaps through the mapped handles.
TEST_F(WorkspaceOnFakeHip, HandlesExchangedByTheCallerMakeOneWorkspaceAcrossProcesses) {
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.push_back(std::make_unique<test::Child>([&, r]() -> std::string {
      RuntimeEnv env = runtimes[0]->env();
      Runtime rt(BackendKind::kHip, 0, env);
      auto pending = Workspace::prepare(rt, small(true), r, kRanks);
      if (pending->handle().size() != Workspace::handleBytes()) throw std::runtime_error("handle size");
      const std::vector<uint8_t> all = test::allGatherThroughFiles(dir.path(), "handles", r, kRanks, pending->handle());
      std::shared_ptr<Workspace> ws = Workspace::join(*pending, all.data(), all.size());
      test::allGatherThroughFiles(dir.path(), "joined", r, kRanks, {1});  // the caller's barrier
      if (ws->rank() != r || ws->ranks() != kRanks) throw std::runtime_error("rank fields");
      const abi::DeviceContext& ctx = ws->heap().context();
      for (int p = 0; p < kRanks; ++p) {
        abi::DeviceContext peer{};
        ws->device().copyDeviceToHost(&peer, ws->heap().peerAddress(p, ws->heap().contextAddress()), sizeof peer);
        if (peer.rank != uint32_t(p)) throw std::runtime_error("peer " + std::to_string(p) + " not reached");
      }
      auto layer = MoeLayer::create(ws, small(true));
      Device& d = *rt.device();
      const DevicePtr p = d.allocate(1 << 20), saved = d.allocate(size_t(MoeLayer::savedBytes(small(true), kRanks)));
      ForwardArgs a{p, 8, p, p, p, p, p};
      a.saved = saved;
      layer->forward(a, nullptr);
      BackwardArgs b{p, p, 8, p, p, p, p, p, p, p, p};
      b.saved = saved;
      layer->backward(b, nullptr);
      ws->heap().checkErrors();
      d.free(p);
      d.free(saved);
      layer.reset();
      test::allGatherThroughFiles(dir.path(), "done", r, kRanks, {1});  // met again: now destroy
      const bool peerMapped = ctx.peer_offset[1 - r] != 0;  // read before ws.reset() frees the context
      ws.reset();
      return "ok " + std::to_string(peerMapped);
    }));
  }
  for (auto& c : ranks) {
    const test::ChildOutcome o = c->wait(30);
    ASSERT_TRUE(o.finished);
    EXPECT_TRUE(o.ok) << o.text;
    EXPECT_EQ(o.text, "ok 1");
  }
}

// A rank whose layer configuration differs is named with the field, before anything is mapped; a join with the
// right handles then works, and the C ABI's calls do the same.
TEST_F(WorkspaceOnFakeHip, HandlesOfADifferentConfigurationAreRefusedNamingTheField) {
  MoeLayerConfig clamped = small(true);
  clamped.swigluClampMilli = 7000;
  auto zero = Workspace::prepare(*runtimes[0], small(true), 0, kRanks);
  auto one = Workspace::prepare(*runtimes[1], clamped, 1, kRanks);
  std::vector<uint8_t> all = zero->handle();
  all.insert(all.end(), one->handle().begin(), one->handle().end());
  try {
    Workspace::join(*zero, all.data(), all.size());
    ADD_FAILURE() << "handles of another configuration were joined";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kRendezvous);
    EXPECT_NE(std::string(e.what()).find("rank 1's swiglu_clamp_milli=7000 differs from rank 0's swiglu_clamp_milli=0"),
              std::string::npos)
        << e.what();
  }
  // A field that changes the heap layout too (max_tokens sizes the combine buffer) is still named as the field.
  MoeLayerConfig fewer = small(true);
  fewer.maxTokens = 32;
  auto shorter = Workspace::prepare(*runtimes[1], fewer, 1, kRanks);
  all = zero->handle();
  all.insert(all.end(), shorter->handle().begin(), shorter->handle().end());
  try {
    Workspace::join(*zero, all.data(), all.size());
    ADD_FAILURE() << "handles of another max_tokens were joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1's max_tokens=32 differs from rank 0's max_tokens=64"),
              std::string::npos)
        << e.what();
  }
  auto again = Workspace::prepare(*runtimes[1], small(true), 1, kRanks);
  all = zero->handle();
  all.insert(all.end(), again->handle().begin(), again->handle().end());
  auto w0 = Workspace::join(*zero, all.data(), all.size());
  auto w1 = Workspace::join(*again, all.data(), all.size());
  // Rank 0 reaches rank 1's pool through its mapping (a mapping of its own: another address, the same memory).
  const uint64_t mark = 0x5eed1234abcdull;
  w1->device().copyHostToDevice(w1->buffers().pool, &mark, sizeof mark);
  uint64_t seen = 0;
  w0->device().copyDeviceToHost(&seen, w0->heap().peerAddress(1, w0->buffers().pool), sizeof seen);
  EXPECT_EQ(seen, mark);
  EXPECT_NE(errorOf([&] { Workspace::join(*zero, all.data(), all.size()); }).find("joined already"),
            std::string::npos);
}

// The figures the README quotes for DeepSeek-V3 (H 7168, I 2048, 256 experts, top-8, 8192 tokens per rank).
TEST(WorkspaceSizes, DeepSeekV3) {
  for (int ranks : {2, 8}) {
    MoeLayerConfig c{7168, 2048, 256, 8, 8192, 0};
    c.training = true;
    const WorkspaceBytes b = Workspace::bytesFor(c, ranks);
    const uint64_t saved = MoeLayer::savedBytes(c, ranks);
    // The worst case: every rank's every pick to one owner; saved = those rows x 2I bf16.
    EXPECT_EQ(saved, uint64_t(ranks) * 8192 * 8 * 2 * 2048 * 2);
    MoeLayerConfig capped = c;
    capped.receiveCapacity = 2 * 8192 * 8;  // twice the mean: a rank's share of the picks, twice over
    const WorkspaceBytes cb = Workspace::bytesFor(capped, ranks);
    EXPECT_EQ(MoeLayer::savedBytes(capped, ranks), uint64_t(2) * 8192 * 8 * 2 * 2048 * 2);
    std::printf("DeepSeek-V3 EP%d training, 8192 tokens per rank: workspace %.2f GiB (heap %.2f + buffers %.2f), saved "
                "per forward %.2f GiB; with a receive capacity of twice the mean: workspace %.2f GiB, saved %.2f GiB\n",
                ranks, b.total() / 1073741824.0, b.heap / 1073741824.0, b.buffers / 1073741824.0,
                saved / 1073741824.0, cb.total() / 1073741824.0, MoeLayer::savedBytes(capped, ranks) / 1073741824.0);
  }
}

// The memory of DeepSeek-V3 served in FP8 at EP8 with 8192 tokens per rank (issue 48's acceptance: 58 layers on
// one 141 GB GPU): one workspace for every layer, and each layer's experts (e4m3 codes and fp32 block scales).
TEST(WorkspaceSizes, DeepSeekV3Fp8At8RanksFits58LayersOnAn141GBGpu) {
  MoeLayerConfig c{7168, 2048, 256, 8, 8192, 0};
  c.dtype = DType::kFp8E4m3;
  const int ranks = 8;
  const uint64_t local = 256 / ranks, H = 7168, I = 2048;
  const WorkspaceBytes b = Workspace::bytesFor(c, ranks);
  const uint64_t weights = local * (2 * I * H + H * I), scales = local * ((2 * I / 128) * (H / 128) + (H / 128) * (I / 128)) * 4;
  const uint64_t total = b.total() + 58 * (weights + scales);
  std::printf("DeepSeek-V3 FP8 EP8, 8192 tokens per rank: workspace %.2f GB (heap %.2f + buffers %.2f), experts per "
              "layer %.3f GB (codes) + %.1f KB (scales); 58 layers + workspace = %.2f GB of 141\n",
              b.total() / 1e9, b.heap / 1e9, b.buffers / 1e9, weights / 1e9, scales / 1e3, total / 1e9);
  EXPECT_LT(total, uint64_t(141e9));
  // The bf16 layer's workspace at the same shape is larger (bf16 rows in the pool).
  c.dtype = DType::kBf16;
  EXPECT_GT(Workspace::bytesFor(c, ranks).heap, b.heap);
}

}  // namespace
}  // namespace megamoe
