// The symmetric heap over the fake HIP backend: the context it writes, both modes (mode B with fork()ed ranks and
// fake IPC over shared memory), the device-error path and the unusable-heap policy, and teardown.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstring>
#include <functional>

#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Rendezvous.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {
namespace {

const std::vector<RegionSpec> kRegions = {{"flags", 4096, 256}, {"pool", 1 << 20, 128}, {"counts", 24, 8}};

RuntimeEnv fakeEnv() {
  RuntimeEnv env = parseEnv();
  env.hipLibrary = test::FakeHip::path();
  env.waitTimeoutMs = 2500;
  env.rendezvousTimeoutS = 10;
  return env;
}

std::shared_ptr<Device> fakeDevice(int ordinal) {
  return openBackend(BackendKind::kHip, test::FakeHip::path())->device(ordinal);
}

abi::DeviceContext readContext(const SymmetricHeap& heap) {
  abi::DeviceContext ctx{};
  heap.device().copyDeviceToHost(&ctx, heap.contextAddress(), sizeof ctx);
  return ctx;
}

void writeError(const SymmetricHeap& heap, abi::DeviceError e) {
  heap.device().copyHostToDevice(heap.errorAddress(), &e, sizeof e);
}

// "" when every peer's context, read through this heap's mapping of it, names that peer and there is one open
// mapping per peer; else what is wrong.
std::string peersMapped(const SymmetricHeap& heap) {
  for (int p = 0; p < heap.nranks(); ++p) {
    abi::DeviceContext peer{};
    heap.device().copyDeviceToHost(&peer, heap.peerAddress(p, heap.contextAddress()), sizeof peer);
    if (peer.rank != static_cast<uint32_t>(p)) return "peer " + std::to_string(p) + "'s context is wrong";
  }
  if (test::FakeHip::get().openIpcMappings() != heap.nranks() - 1) return "expected one mapping per peer";
  return "";
}

TEST(SymmetricHeap, ModeAWritesContextsWithUvaOffsets) {
  const int liveBefore = test::FakeHip::get().liveAllocations();
  {
    std::vector<std::shared_ptr<Device>> devices = {fakeDevice(0), fakeDevice(1), fakeDevice(2), fakeDevice(3)};
    auto heaps = SymmetricHeap::createSingleProcess(devices, kRegions, fakeEnv());
    ASSERT_EQ(heaps.size(), 4u);
    EXPECT_EQ(test::FakeHip::get().liveAllocations(), liveBefore + 4);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        if (i != j) EXPECT_EQ(test::FakeHip::get().peerEnabled(i, j), 1) << i << "->" << j;
    for (int r = 0; r < 4; ++r) {
      const SymmetricHeap& heap = *heaps[r];
      const abi::DeviceContext ctx = readContext(heap);
      EXPECT_EQ(ctx.heap_base, heap.base());
      EXPECT_EQ(ctx.rank, static_cast<uint32_t>(r));
      EXPECT_EQ(ctx.nranks, 4u);
      EXPECT_EQ(ctx.timeout_ns, 2500ull * 1000 * 1000);
      EXPECT_EQ(ctx.error, heap.errorAddress());
      EXPECT_EQ(ctx.epoch, 0u);
      for (int p = 0; p < 4; ++p) {
        EXPECT_EQ(heap.base() + static_cast<uint64_t>(ctx.peer_offset[p]), heaps[p]->base());
        // The same region on the peer is at the same offset from the peer's base.
        EXPECT_EQ(heap.peerAddress(p, heap.regionAddress("pool")), heaps[p]->regionAddress("pool"));
      }
      for (int p = 4; p < abi::kMaxRanks; ++p) EXPECT_EQ(ctx.peer_offset[p], 0);
      EXPECT_EQ(std::memcmp(&ctx, &heap.context(), sizeof ctx), 0);
      // User regions start zeroed (the fake's fresh memory is 0xA5).
      std::vector<uint8_t> flags(4096, 0xff);
      heap.device().copyDeviceToHost(flags.data(), heap.regionAddress("flags"), flags.size());
      EXPECT_EQ(std::count(flags.begin(), flags.end(), 0), 4096);
    }
    // Writing through a peer address lands in the peer's heap (one address space in the fake, as with UVA).
    const uint64_t value = 42;
    heaps[0]->device().copyHostToDevice(heaps[0]->peerAddress(2, heaps[0]->regionAddress("counts")), &value, 8);
    uint64_t seen = 0;
    heaps[2]->device().copyDeviceToHost(&seen, heaps[2]->regionAddress("counts"), 8);
    EXPECT_EQ(seen, value);
    // Destroying one heap of the group leaves the others' memory valid.
    heaps[1].reset();
    EXPECT_EQ(test::FakeHip::get().liveAllocations(), liveBefore + 4);
  }
  EXPECT_EQ(test::FakeHip::get().liveAllocations(), liveBefore) << "the last heap of the group frees all";
}

TEST(SymmetricHeap, ModeARejectsBadDeviceLists) {
  EXPECT_THROW(SymmetricHeap::createSingleProcess({}, kRegions, fakeEnv()), Error);
  test::ScopedEnv noP2P("FAKEHIP_NO_P2P", "1");
  try {
    SymmetricHeap::createSingleProcess({fakeDevice(0), fakeDevice(1)}, kRegions, fakeEnv());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("device 0 cannot access device 1"), std::string::npos) << e.what();
  }
}

TEST(SymmetricHeap, DeviceErrorBecomesAnErrorAndMarksTheHeapUnusable) {
  auto heaps = SymmetricHeap::createSingleProcess({fakeDevice(0)}, kRegions, fakeEnv());
  SymmetricHeap& heap = *heaps[0];
  heap.checkErrors();  // clean
  EXPECT_TRUE(heap.usable());
  writeError(heap, {static_cast<uint64_t>(abi::ErrorCode::kWaitTimeout), 0, 7, 3, 4, 12});
  try {
    heap.checkErrors(nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeviceError);
    EXPECT_STREQ(e.what(),
                 "rank 0: cross-rank wait timed out on flag 7 (seen 3, expected 4) in block 12; the symmetric heap is "
                 "now marked unusable");
  }
  EXPECT_FALSE(heap.usable());
  try {
    heap.requireUsable();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHeapUnusable);
    EXPECT_NE(std::string(e.what()).find("unusable after an earlier device error (rank 0: cross-rank wait"),
              std::string::npos)
        << e.what();
  }
  // Clearing the record does not make the heap usable again: flags may be half-advanced.
  writeError(heap, {});
  EXPECT_THROW(heap.checkErrors(), Error);
}

TEST(SymmetricHeap, DescribesEveryDeviceErrorCode) {
  using abi::ErrorCode;
  EXPECT_EQ(describeDeviceError({uint64_t(ErrorCode::kBadIndex), 1, 9, 300, 256, 5}),
            "rank 1: index out of range at site 9 (value 300, bound 256) in block 5");
  EXPECT_EQ(describeDeviceError({uint64_t(ErrorCode::kCapacity), 2, 3, 9000, 8192, 0}),
            "rank 2: capacity exceeded at site 3 (needed 9000, capacity 8192) in block 0");
  EXPECT_EQ(describeDeviceError({77, 3, 1, 2, 3, 4}),
            "rank 3: unknown device error code 77 (flag 1, seen 2, expected 3) in block 4");
}

// A call mismatch names the rule, the peer, and both ranks' layer and role (abi::callWord: seen is the peer's call,
// expected this rank's), profiling and legs only where they are not the plain layer's.
TEST(SymmetricHeap, CallMismatchNamesBothRanksLayersAndRoles) {
  using abi::CallKind;
  const uint64_t mismatch = uint64_t(abi::ErrorCode::kCallMismatch);
  const uint32_t forward = abi::callRole(CallKind::kForward, false, 3, 3);
  const uint32_t backward = abi::callRole(CallKind::kBackward, false, 3, 3);
  const uint64_t peer1 = abi::flagId(abi::FlagKind::kPeer, 1);
  const std::string rule = "every rank must call the same layers, forward and backward, in the same order (a "
                           "workspace's layers are numbered in creation order on each rank)";
  EXPECT_EQ(describeDeviceError({mismatch, 0, peer1, abi::callWord(1, forward), abi::callWord(0, forward), 0}),
            "rank 0: layer call differs from rank 1's (this rank: layer 0 forward; rank 1: layer 1 forward): " + rule +
                " in block 0");
  EXPECT_EQ(describeDeviceError({mismatch, 2, abi::flagId(abi::FlagKind::kPeer, 0), abi::callWord(3, backward),
                                 abi::callWord(3, forward), 0}),
            "rank 2: layer call differs from rank 0's (this rank: layer 3 forward; rank 0: layer 3 backward): " + rule +
                " in block 0");
  const uint32_t profiled = abi::callRole(CallKind::kForward, true, 3, 3);
  const uint32_t commOnly = abi::callRole(CallKind::kForward, false, 1, 2);
  EXPECT_EQ(describeDeviceError({mismatch, 1, abi::flagId(abi::FlagKind::kPeer, 0), abi::callWord(0, commOnly),
                                 abi::callWord(0, profiled), 0}),
            "rank 1: layer call differs from rank 0's (this rank: layer 0 forward profiled; rank 0: layer 0 forward, "
            "legs dispatch comm-only / combine gemm-only): " + rule + " in block 0");
}

// A timed-out wait names whom it waited for, from the flag's kind (abi::FlagKind).
TEST(SymmetricHeap, TimeoutsNameTheRankWaitedFor) {
  const uint64_t timeout = uint64_t(abi::ErrorCode::kWaitTimeout);
  EXPECT_EQ(describeDeviceError({timeout, 0, abi::flagId(abi::FlagKind::kPeer, 3), 0, 1, 14}),
            "rank 0: cross-rank wait for rank 3 timed out (seen 0, expected 1) in block 14");
  EXPECT_EQ(describeDeviceError({timeout, 1, abi::flagId(abi::FlagKind::kArrivals, 2 * 65536 + 5), 4, 63, 2}),
            "rank 1: cross-rank wait for rank 2's rows of local expert 5 timed out (seen 4, expected 63) in block 2");
  EXPECT_EQ(describeDeviceError({timeout, 2, abi::flagId(abi::FlagKind::kRankBarrier, 7), 0, 1, 0}),
            "rank 2: rank barrier wait for rank 7 timed out (seen 0, expected 1) in block 0");
  EXPECT_EQ(describeDeviceError({timeout, 2, abi::flagId(abi::FlagKind::kGridBarrier, 0), 5, 8, 1}),
            "rank 2: grid barrier of its own blocks timed out (seen 5, expected 8) in block 1");
  EXPECT_EQ(describeDeviceError({timeout, 0, 7, 3, 4, 12}),
            "rank 0: cross-rank wait timed out on flag 7 (seen 3, expected 4) in block 12");
}

TEST(SymmetricHeap, ModeBSingleRankNeedsNoRendezvous) {
  auto heap = SymmetricHeap::createMultiProcess(fakeDevice(0), kRegions, 0, 1, "", fakeEnv());
  const abi::DeviceContext ctx = readContext(*heap);
  EXPECT_EQ(ctx.nranks, 1u);
  EXPECT_EQ(ctx.peer_offset[0], 0);
  heap->checkErrors();
}

TEST(SymmetricHeap, ModeBAcrossForkedRanksMapsEveryPeer) {
  test::TempDir dir;
  const std::string path = dir.file("heap.sock");
  const int nranks = 3;
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < nranks; ++r) {
    ranks.push_back(std::make_unique<test::Child>([=]() -> std::string {
      auto heap = SymmetricHeap::createMultiProcess(fakeDevice(r), kRegions, r, nranks, path, fakeEnv());
      auto fail = [&](const std::string& why) { throw std::runtime_error("rank " + std::to_string(r) + ": " + why); };
      const abi::DeviceContext ctx = readContext(*heap);
      if (ctx.rank != static_cast<uint32_t>(r) || ctx.nranks != nranks) fail("bad rank fields");
      if (ctx.peer_offset[r] != 0) fail("own offset is not 0");
      // Every peer's context, read through the mapping, names that peer: the mappings point at the right heaps.
      if (std::string why = peersMapped(*heap); !why.empty()) fail(why);
      heap.reset();  // teardown: close mappings, barrier, free
      if (test::FakeHip::get().openIpcMappings() != 0) fail("mappings left open after teardown");
      return "ok";
    }));
  }
  for (int r = 0; r < nranks; ++r) test::expectOk(*ranks[size_t(r)], "rank " + std::to_string(r), 30);
}

TEST(SymmetricHeap, ModeCHandlesExchangedByTheCallerMapEveryPeerAcrossProcesses) {
  test::TempDir dir;
  const int nranks = 3;
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < nranks; ++r) {
    ranks.push_back(std::make_unique<test::Child>([=, &dir]() -> std::string {
      auto fail = [&](const std::string& why) { throw std::runtime_error("rank " + std::to_string(r) + ": " + why); };
      auto heap = SymmetricHeap::prepareExchange(fakeDevice(r), kRegions, r, nranks, fakeEnv(), {{"job", "a"}});
      if (heap->exchangeHandle().size() != SymmetricHeap::kHandleBytes) fail("handle size");
      if (heap->usable()) fail("usable before join()");
      try {
        heap->requireUsable();
        fail("requireUsable() passed before join()");
      } catch (const Error& e) {
        if (std::string(e.what()).find("waits for join()") == std::string::npos) fail(e.what());
      }
      const std::vector<uint8_t> all = test::allGatherThroughFiles(dir.path(), "handles", r, nranks,
                                                                   heap->exchangeHandle());
      heap->join(all.data(), all.size());
      if (!heap->usable()) fail("not usable after join()");
      const abi::DeviceContext ctx = readContext(*heap);
      if (ctx.rank != static_cast<uint32_t>(r) || ctx.nranks != nranks) fail("bad rank fields");
      // The caller's barrier, then every peer's context read through the mapping names that peer.
      test::allGatherThroughFiles(dir.path(), "joined", r, nranks, {1});
      if (std::string why = peersMapped(*heap); !why.empty()) fail(why);
      test::allGatherThroughFiles(dir.path(), "done", r, nranks, {1});  // the caller meets its ranks, then destroys
      heap.reset();
      if (test::FakeHip::get().openIpcMappings() != 0) fail("mappings left open after teardown");
      return "ok";
    }));
  }
  for (int r = 0; r < nranks; ++r) test::expectOk(*ranks[size_t(r)], "rank " + std::to_string(r), 30);
}

TEST(SymmetricHeap, ModeCChecksEveryHandleBeforeMappingAnything) {
  auto prepare = [](int rank, int nranks, const RendezvousAgreement& agreement,
                    const std::vector<RegionSpec>& regions = kRegions) {
    return SymmetricHeap::prepareExchange(fakeDevice(rank), regions, rank, nranks, fakeEnv(), agreement);
  };
  auto zero = prepare(0, 2, {{"intermediate", "2048"}, {"topk", "8"}});
  auto one = prepare(1, 2, {{"topk", "8"}, {"intermediate", "2048"}});  // order does not matter
  auto concat = [](std::initializer_list<std::vector<uint8_t>> parts) {
    std::vector<uint8_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
  };
  auto refusal = [&](const std::vector<uint8_t>& handles, ErrorCode code = ErrorCode::kRendezvous) -> std::string {
    try {
      zero->join(handles.data(), handles.size());
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_FALSE(zero->joined());
      EXPECT_EQ(test::FakeHip::get().openIpcMappings(), 0) << "a refused join mapped something: " << e.what();
      return e.what();
    }
    ADD_FAILURE() << "join accepted bad handles";
    return "";
  };
  const std::vector<uint8_t> h0 = zero->exchangeHandle(), h1 = one->exchangeHandle();
  EXPECT_NE(refusal(std::vector<uint8_t>(h0), ErrorCode::kInvalidArgument).find("expected 2 ranks x 4096"),
            std::string::npos);
  EXPECT_NE(refusal(concat({h1, h0})).find("is not rank 0's own handle"), std::string::npos);
  EXPECT_NE(refusal(concat({h0, h0})).find("position 1 is rank 0's"), std::string::npos);
  std::vector<uint8_t> damaged = h1;
  damaged[100] ^= 1;
  EXPECT_NE(refusal(concat({h0, damaged})).find("position 1 is damaged"), std::string::npos);
  std::vector<uint8_t> junk(SymmetricHeap::kHandleBytes, 7);
  EXPECT_NE(refusal(concat({h0, junk})).find("is not a megamoe rendezvous handle"), std::string::npos);
  auto otherGroup = prepare(1, 3, {{"intermediate", "2048"}, {"topk", "8"}});
  EXPECT_NE(refusal(concat({h0, otherGroup->exchangeHandle()})).find("of a group of 3 ranks"), std::string::npos);
  auto otherLayout = prepare(1, 2, {{"intermediate", "2048"}, {"topk", "8"}}, {{"flags", 4096, 256}});
  EXPECT_NE(refusal(concat({h0, otherLayout->exchangeHandle()})).find("rank 1's heap layout"), std::string::npos);
  auto otherValue = prepare(1, 2, {{"intermediate", "1024"}, {"topk", "8"}});
  EXPECT_NE(refusal(concat({h0, otherValue->exchangeHandle()}))
                .find("rank 1's intermediate=1024 differs from rank 0's intermediate=2048"),
            std::string::npos);
  auto missing = prepare(1, 2, {{"topk", "8"}});
  EXPECT_NE(refusal(concat({h0, missing->exchangeHandle()})).find("rank 1 does not declare intermediate"),
            std::string::npos);
  // The right handles, after all those refusals: both ranks join and see each other.
  const std::vector<uint8_t> all = concat({h0, h1});
  zero->join(all.data(), all.size());
  one->join(all.data(), all.size());
  EXPECT_TRUE(zero->usable() && one->usable());
  EXPECT_EQ(zero->peerAddress(1, zero->regionAddress("pool")) - zero->regionAddress("pool") + zero->base(),
            zero->base() + uint64_t(readContext(*zero).peer_offset[1]));
  abi::DeviceContext peer{};
  zero->device().copyDeviceToHost(&peer, zero->peerAddress(1, zero->contextAddress()), sizeof peer);
  EXPECT_EQ(peer.rank, 1u);
  try {
    zero->join(all.data(), all.size());
    ADD_FAILURE() << "a second join() was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("joined already"), std::string::npos) << e.what();
  }
}

TEST(SymmetricHeap, ModeBWithDifferentRegionsNamesTheRank) {
  test::TempDir dir;
  const std::string path = dir.file("heap.sock");
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<test::Child>([=]() -> std::string {
      std::vector<RegionSpec> regions = kRegions;
      if (r == 1) regions[1].size *= 2;  // rank 1 sized its pool differently
      SymmetricHeap::createMultiProcess(fakeDevice(r), regions, r, 2, path, fakeEnv());
      return "ok";
    }));
  }
  for (auto& c : ranks) {
    const test::ChildOutcome o = c->wait(30);
    ASSERT_TRUE(o.finished);
    EXPECT_FALSE(o.ok);
    EXPECT_NE(o.text.find("rank 1's heap layout"), std::string::npos) << o.text;
  }
}

// What SymmetricHeap.cpp's IpcPayload holds, for a forged rank: the handle, the heap size, the backend, 0.
struct ForgedPayload {
  IpcHandle handle;
  uint64_t heapBytes = 0;
  uint32_t backend = 0;
  uint32_t reserved = 0;
};

// A peer's payload is checked field by field before its memory is mapped: a rank that agrees on the layout hash
// but offers a heap of another size, or of another backend, is refused with the rank and the field named.
TEST(SymmetricHeap, ModeBRefusesAPeerPayloadWithAnotherHeapSizeOrBackend) {
  struct Case {
    uint64_t extraBytes;
    BackendKind backend;
    uint32_t reserved;
    std::string named;
  };
  const uint64_t total = SymmetricHeap::layoutFor(kRegions).totalBytes();
  const Case cases[] = {
      {4096, BackendKind::kHip, 0,
       "rank 1's heap payload has heapBytes=" + std::to_string(total + 4096) + ", but rank 0's layout totals " +
           std::to_string(total) + " bytes"},
      {0, BackendKind::kCuda, 0, "rank 1's heap payload has backend=cuda, but rank 0's is hip"},
      {0, BackendKind::kHip, 7, "rank 1's heap payload has reserved=7"},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    const std::string path = dir.file("heap.sock");
    auto rank0 = std::make_unique<test::Child>([=]() -> std::string {
      SymmetricHeap::createMultiProcess(fakeDevice(0), kRegions, 0, 2, path, fakeEnv());
      return "ok";
    });
    // Rank 1 speaks the rendezvous itself, with a real handle to memory of its own and one field forged.
    auto forger = std::make_unique<test::Child>([=]() -> std::string {
      auto device = fakeDevice(1);
      const HeapLayout layout = SymmetricHeap::layoutFor(kRegions);
      ForgedPayload p;
      p.handle = device->exportIpcHandle(device->allocate(layout.totalBytes()));
      p.heapBytes = layout.totalBytes() + c.extraBytes;
      p.backend = static_cast<uint32_t>(c.backend);
      p.reserved = c.reserved;
      std::vector<uint8_t> bytes(sizeof p);
      std::memcpy(bytes.data(), &p, sizeof p);
      RendezvousOptions o;
      o.path = path;
      o.rank = 1;
      o.nranks = 2;
      o.layoutHash = layout.hash() ^ (static_cast<uint64_t>(BackendKind::kHip) << 56);  // as the heap computes it
      o.timeoutS = 10;
      Rendezvous rv(o, bytes);
      rv.barrier("heap setup");  // rank 0 abandons with its reason
      return "ok";
    });
    for (test::Child* child : {rank0.get(), forger.get()}) {
      const test::ChildOutcome o = child->wait(30);
      ASSERT_TRUE(o.finished);
      EXPECT_FALSE(o.ok) << "rank 0 mapped a forged payload: " << o.text;
      EXPECT_NE(o.text.find(c.named), std::string::npos) << o.text;
    }
  }
}

// The caller's configuration, agreed at the rendezvous: a difference fails both ranks naming the field, even where
// the heap layouts are equal.
TEST(SymmetricHeap, ModeBRanksThatDisagreeNameTheField) {
  test::TempDir dir;
  const std::string path = dir.file("heap.sock");
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(std::make_unique<test::Child>([=]() -> std::string {
      const RendezvousAgreement agreement = {{"hidden", "7168"}, {"intermediate", r == 1 ? "1024" : "2048"}};
      SymmetricHeap::createMultiProcess(fakeDevice(r), kRegions, r, 2, path, fakeEnv(), agreement);
      return "ok";
    }));
  for (auto& c : ranks) {
    const test::ChildOutcome o = c->wait(30);
    ASSERT_TRUE(o.finished);
    EXPECT_FALSE(o.ok);
    EXPECT_NE(o.text.find("rank 1's intermediate=1024 differs from rank 0's intermediate=2048"), std::string::npos)
        << o.text;
  }
}

// MoeLayer::create agrees on every MoeLayerConfig field: two ranks that differ in one fail on both ranks naming
// it (before any kernel is loaded), whether or not the field changes the heap layout.
TEST(SymmetricHeap, ModeBLayersThatDifferInOneFieldNameIt) {
  const MoeLayerConfig base = {512, 256, 16, 4, 64, 0};
  struct Case {
    const char* field;
    std::function<void(MoeLayerConfig&)> change;
  };
  const Case cases[] = {
      {"hidden", [](MoeLayerConfig& c) { c.hidden = 1024; }},
      {"intermediate", [](MoeLayerConfig& c) { c.intermediate = 512; }},
      {"experts", [](MoeLayerConfig& c) { c.experts = 32; }},
      {"topk", [](MoeLayerConfig& c) { c.topk = 2; }},
      {"max_tokens", [](MoeLayerConfig& c) { c.maxTokens = 128; }},
      {"swiglu_clamp_milli", [](MoeLayerConfig& c) { c.swigluClampMilli = 7000; }},
      {"training", [](MoeLayerConfig& c) { c.training = true; }},
      {"dedup_tokens", [](MoeLayerConfig& c) { c.dedupTokens = true; }},
  };
  for (const Case& c : cases) {
    test::TempDir dir;
    const std::string path = dir.file("layer.sock");
    // Empty: a layer that got past the rendezvous would fail to load its kernels instead.
    const std::string cache = dir.file("cache");
    ASSERT_EQ(::mkdir(cache.c_str(), 0700), 0);
    std::vector<std::unique_ptr<test::Child>> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.push_back(std::make_unique<test::Child>([=]() -> std::string {
        RuntimeEnv env = fakeEnv();
        env.cacheDir = cache;
        Runtime runtime(BackendKind::kHip, r, env);
        MoeLayerConfig config = base;
        if (r == 1) c.change(config);
        MoeLayer::create(runtime, config, r, 2, path);
        return "ok";
      }));
    for (int r = 0; r < 2; ++r) {
      const test::ChildOutcome o = ranks[r]->wait(30);
      ASSERT_TRUE(o.finished) << c.field;
      EXPECT_FALSE(o.ok) << c.field;
      EXPECT_NE(o.text.find(std::string("rank 1's ") + c.field + "="), std::string::npos)
          << "rank " << r << ", " << c.field << ": " << o.text;
    }
  }
}

// Ranks may share a device (oversubscription): separate allocations, peer offsets between them, and no peer
// access needed (the fake refuses P2P here, which would fail any pair of distinct devices).
TEST(SymmetricHeap, ModeARanksCanShareADevice) {
  test::ScopedEnv noP2P("FAKEHIP_NO_P2P", "1");
  auto heaps = SymmetricHeap::createSingleProcess({fakeDevice(0), fakeDevice(0)}, kRegions, fakeEnv());
  ASSERT_EQ(heaps.size(), 2u);
  EXPECT_NE(heaps[0]->base(), heaps[1]->base());
  EXPECT_EQ(heaps[0]->peerAddress(1, heaps[0]->base()), heaps[1]->base());
  EXPECT_EQ(heaps[1]->peerAddress(0, heaps[1]->base()), heaps[0]->base());
}

}  // namespace
}  // namespace megamoe
