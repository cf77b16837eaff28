// MoeLayer's host side without a GPU: the configuration constraints, the heap regions every rank allocates, the
// kernels it loads, and the argument checks of forward and backward (a layer on the fake HIP device, its kernels
// stand-ins). The forward itself runs in tests/gpu/LayerForwardTest.cpp.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "FakeLayerKernels.h"
#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/HeapLayout.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Runtime.h"

namespace megamoe {
namespace {

MoeLayerConfig deepseek() { return {7168, 2048, 256, 8, 8192, 0}; }

TEST(MoeLayer, ValidConfigurations) {
  EXPECT_EQ(MoeLayer::validate(deepseek(), 2), "");
  EXPECT_EQ(MoeLayer::validate(deepseek(), 8), "");
  EXPECT_EQ(MoeLayer::validate({512, 256, 16, 4, 1024, 7000}, 2), "");
}

TEST(MoeLayer, EachBrokenConstraintIsNamed) {
  struct Case {
    MoeLayerConfig config;
    int ranks;
    const char* names;
  };
  const Case cases[] = {
      {deepseek(), 0, "ranks=0"},
      {deepseek(), 9, "ranks=9"},
      {{7168, 2048, 255, 8, 8192, 0}, 2, "experts=255"},
      {{7168, 2048, 2048, 8, 8192, 0}, 2, "experts=2048"},
      {{7168, 2048, 256, 0, 8192, 0}, 2, "topk=0"},
      {{7168, 2048, 256, 300, 8192, 0}, 2, "topk=300"},
      {{7100, 2048, 256, 8, 8192, 0}, 2, "hidden=7100"},
      {{7168, 2000, 256, 8, 8192, 0}, 2, "intermediate=2000"},
      {{7168, 2048, 256, 8, 0, 0}, 2, "max_tokens=0"},
      {{7168, 2048, 256, 8, 1 << 20, 0}, 2, "2^24"},
      {{7168, 2048, 256, 8, 8192, -1}, 2, "swiglu_clamp_milli"},
  };
  for (const Case& c : cases) {
    const std::string error = MoeLayer::validate(c.config, c.ranks);
    EXPECT_NE(error.find(c.names), std::string::npos) << "expected '" << c.names << "' in: " << error;
  }
  MoeLayerConfig unknown = deepseek();
  unknown.dtype = DType(2);
  EXPECT_NE(MoeLayer::validate(unknown, 2).find("dtype=2 must be bf16 (0) or fp8_e4m3 (1)"), std::string::npos);
}

// FP8 (DType::kFp8E4m3) is inference only, one row per pick, and both GEMMs' K at least the FP8 ring's two stages.
TEST(MoeLayer, Fp8TakesInferenceLayersOnly) {
  MoeLayerConfig fp8 = deepseek();
  fp8.dtype = DType::kFp8E4m3;
  EXPECT_EQ(MoeLayer::validate(fp8, 2), "");
  EXPECT_EQ(MoeLayer::validate(fp8, 8), "");
  struct Case {
    std::function<void(MoeLayerConfig&)> edit;
    const char* names;
  };
  const Case cases[] = {
      {[](MoeLayerConfig& c) { c.training = true; }, "training=true with dtype fp8_e4m3"},
      {[](MoeLayerConfig& c) { c.dedupTokens = true; }, "dedup_tokens with dtype fp8_e4m3"},
      {[](MoeLayerConfig& c) { c.hidden = 128; }, "hidden=128 must be >= 256 with dtype fp8_e4m3"},
      {[](MoeLayerConfig& c) { c.intermediate = 128; }, "intermediate=128 must be >= 256 with dtype fp8_e4m3"},
  };
  for (const Case& c : cases) {
    MoeLayerConfig config = fp8;
    c.edit(config);
    const std::string error = MoeLayer::validate(config, 2);
    EXPECT_NE(error.find(c.names), std::string::npos) << "expected '" << c.names << "' in: " << error;
  }
  MoeLayerConfig bf16 = fp8;
  bf16.dtype = DType::kBf16;
  bf16.hidden = 128;
  EXPECT_EQ(MoeLayer::validate(bf16, 2), "") << "the FP8 rules are FP8's";
}

TEST(MoeLayer, HeapRegionsHoldTheWorstCaseRouting) {
  const MoeLayerConfig c = deepseek();
  const HeapLayout layout = HeapLayout::place(MoeLayer::heapRegions(c, 2));
  // Every rank may send every pick to one owner: 2 ranks x 8192 tokens x 8 picks rows of H bf16.
  EXPECT_EQ(layout.region("moe.pool").size, uint64_t(2) * 8192 * 8 * 7168 * 2);
  EXPECT_EQ(layout.region("moe.pool_src").size, uint64_t(2) * 8192 * 8 * 4);
  EXPECT_EQ(layout.region("moe.comb").size, uint64_t(8192) * 8 * 7168 * 2);
  EXPECT_EQ(layout.region("moe.counts").size, uint64_t(2) * 2 * 256 * 4);
  EXPECT_EQ(layout.region("moe.calls").size, uint64_t(2) * 2 * 8);  // [parity][source] call words
  EXPECT_EQ(layout.region("moe.arrivals").size, uint64_t(2) * 2 * 128 * 8);
  EXPECT_EQ(layout.region("moe.done").size, uint64_t(2) * (2 + 8) * 8);  // [2][R + the combine's 8 chunk counters]
  EXPECT_EQ(layout.region("moe.pool_w").size, uint64_t(2) * 8192 * 8 * 4);
  EXPECT_EQ(layout.region("moe.dw").size, uint64_t(8192) * 8 * 4);
  // The same list on every rank: the layout's hash is what the rendezvous compares.
  EXPECT_EQ(layout.hash(), HeapLayout::place(MoeLayer::heapRegions(c, 2)).hash());
}

// The FP8 layer's pool holds e4m3 rows (H bytes) and their scales in a region of its own.
TEST(MoeLayer, Fp8HeapRegionsHoldCodesAndScales) {
  MoeLayerConfig c = deepseek();
  c.dtype = DType::kFp8E4m3;
  const HeapLayout layout = HeapLayout::place(MoeLayer::heapRegions(c, 2));
  EXPECT_EQ(layout.region("moe.pool").size, uint64_t(2) * 8192 * 8 * 7168);
  EXPECT_EQ(layout.region("moe.pool_scales").size, uint64_t(2) * 8192 * 8 * (7168 / 128) * 4);
  EXPECT_EQ(layout.region("moe.comb").size, uint64_t(8192) * 8 * 7168 * 2) << "the rows come home in bf16";
  EXPECT_THROW(HeapLayout::place(MoeLayer::heapRegions(deepseek(), 2)).region("moe.pool_scales"), Error);
}

// FP8: x quantised, the FP8 dispatch, act quantised (its rows counted on the device), the FP8 combine.
TEST(MoeLayer, Fp8LoadsTheQuantisersAndTheFp8FusedKernels) {
  MoeLayerConfig c = deepseek();
  c.dtype = DType::kFp8E4m3;
  c.swigluClampMilli = 7000;
  const auto specs = MoeLayer::kernelSpecs(c, 2);
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.first);
  EXPECT_EQ(names, (std::vector<std::string>{"dispatch_prologue", "quantize_tokens_fp8", "dispatch_grouped_gemm_fp8",
                                             "quantize_tokens_fp8", "grouped_gemm_combine_fp8", "epoch_advance",
                                             "stage_begin"}));
  using Constants = std::vector<std::pair<std::string, int64_t>>;
  EXPECT_EQ(specs[1].second, (Constants{{"H", 7168}, {"device_rows", 0}}));
  EXPECT_EQ(specs[2].second,
            (Constants{{"E", 256}, {"ranks", 2}, {"topk", 8}, {"H", 7168}, {"I", 2048}, {"clamp_milli", 7000}}));
  EXPECT_EQ(specs[3].second, (Constants{{"H", 2048}, {"device_rows", 1}}));
  EXPECT_EQ(specs[4].second, (Constants{{"E", 256}, {"ranks", 2}, {"topk", 8}, {"H", 7168}, {"I", 2048}}));
}

TEST(MoeLayer, LoadsTheForwardKernelsAndForTrainingTheBackwardOnes) {
  MoeLayerConfig training = deepseek();
  training.training = true;
  const auto backward = MoeLayer::kernelSpecs(training, 2);
  ASSERT_EQ(backward.size(), 10u);
  EXPECT_EQ(backward[1].second[7], (std::pair<std::string, int64_t>{"save_h", 1}));  // the forward keeps h
  EXPECT_EQ(backward[7].first, "grouped_gemm_tn_tma");  // dW2 on the warp-specialised engine
  const auto specs = MoeLayer::kernelSpecs(deepseek(), 2);
  ASSERT_EQ(specs.size(), 5u);
  EXPECT_EQ(specs[0].first, "dispatch_prologue");
  EXPECT_EQ(specs[1].first, "dispatch_grouped_gemm");
  EXPECT_EQ(specs[2].first, "grouped_gemm_combine");
  EXPECT_EQ(specs[3].first, "epoch_advance");
  EXPECT_EQ(specs[4].first, "stage_begin");  // profiling: the ranks meet before the combine
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"E", 256}, {"ranks", 2}, {"topk", 8}, {"H", 7168}, {"I", 2048}, {"clamp_milli", 0}, {"layout", 0}, {"save_h", 0},
      {"dedup", 0}};
  EXPECT_EQ(specs[1].second, expected);
  // Token deduplication changes the forward dispatch only; a training layer's backward re-dispatches stay plain.
  MoeLayerConfig dedup = training;
  dedup.dedupTokens = true;
  const auto dedupSpecs = MoeLayer::kernelSpecs(dedup, 2);
  ASSERT_EQ(dedupSpecs.size(), backward.size());
  EXPECT_EQ(dedupSpecs[1].second.back(), (std::pair<std::string, int64_t>{"dedup", 1}));
  for (size_t i = 2; i < dedupSpecs.size(); ++i) EXPECT_EQ(dedupSpecs[i], backward[i]) << dedupSpecs[i].first;
}

// Hardening item 2: every field has an upper bound, checked before any product of fields is formed (these wrapped
// around int64 and passed: 2^62 + 1 tokens x topk 4 made 4 picks).
TEST(MoeLayer, EveryFieldIsBoundedBeforeItsProducts) {
  struct Case {
    MoeLayerConfig config;
    int ranks;
    const char* names;
  };
  const int64_t huge = int64_t(1) << 62;
  const Case cases[] = {
      {{512, 256, 16, 4, huge + 1, 0}, 1, "max_tokens=4611686018427387905"},
      {{512, huge, 16, 4, 64, 0}, 1, "intermediate=4611686018427387904"},
      {{huge, 256, 16, 4, 64, 0}, 1, "hidden=4611686018427387904"},
      {{65536 + 128, 256, 16, 4, 64, 0}, 1, "hidden=65664"},
      {{512, 65536 + 128, 16, 4, 64, 0}, 1, "intermediate=65664"},
      {{512, 256, 64, 33, 64, 0}, 1, "topk=33"},
      {{512, 256, 1025, 4, 64, 0}, 1, "experts=1025"},
      {{512, 256, 16, 1, int64_t(1) << 24, 0}, 1, "max_tokens=16777216"},
      {{512, 256, 16, 4, 64, 1000000001}, 1, "swiglu_clamp_milli=1000000001"},
      {{-1, -1, -1, -1, -1, -1}, 1, "experts=-1"},  // an uninitialised config: the first field in check order
  };
  for (const Case& c : cases) {
    const std::string error = MoeLayer::validate(c.config, c.ranks);
    EXPECT_NE(error.find(c.names), std::string::npos) << "expected '" << c.names << "' in: " << error;
  }
  // Each bound itself is allowed.
  EXPECT_EQ(MoeLayer::validate({65536, 65536, 16, 4, 64, 0}, 1), "");
  EXPECT_EQ(MoeLayer::validate({512, 256, 32, 32, 64, 1000000000}, 1), "");
  EXPECT_EQ(MoeLayer::validate({128, 128, 1024, 1, (int64_t(1) << 24) - 1, 0}, 1), "");
  // A heap layout is never computed from a configuration that fails validation.
  EXPECT_THROW(MoeLayer::heapRegions({512, 256, 16, 4, huge + 1, 0}, 1), Error);
}

// Hardening item 13: the combine's weighted sum steps a 32-bit index i over [0, max_tokens * hidden / 8) by grid x
// block threads (at most 2^20): the last i + stride must still fit. hidden 2048 is 256 vectors a token.
TEST(MoeLayer, CombineIndexFitsInt32AtTheEdge) {
  const int64_t edge = ((int64_t(1) << 31) - (int64_t(1) << 20)) / 256;  // 8384512 tokens
  EXPECT_EQ(MoeLayer::validate({2048, 128, 1, 1, edge, 0}, 1), "");
  const std::string error = MoeLayer::validate({2048, 128, 1, 1, edge + 1, 0}, 1);
  EXPECT_NE(error.find("max_tokens * hidden / 8 = 2146435328"), std::string::npos) << error;
  EXPECT_NE(error.find("2^31 - 2^20"), std::string::npos) << error;
}

void expectInvalid(const std::function<void()>& call, const std::string& names) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming '" << names << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
  }
}

// A training layer of one rank on the fake HIP device (mode A), its kernels stand-ins that record their launch.
class MoeLayerOnFakeHip : public ::testing::Test {
 protected:
  static MoeLayerConfig config() {
    MoeLayerConfig c{512, 256, 16, 4, 64, 0};
    c.training = true;
    return c;
  }
  void SetUp() override {
    RuntimeEnv env = parseEnv();
    env.hipLibrary = test::FakeHip::path();
    env.cacheDir = dir.path();
    runtime = std::make_unique<Runtime>(BackendKind::kHip, 0, env);
    test::storeFakeLayerKernels(dir.path(), config(), 1);
    layer = std::move(MoeLayer::createLocal({runtime.get()}, config()).at(0));
  }
  // Device addresses are never dereferenced by the stand-ins: any aligned values do.
  static ForwardArgs forwardArgs() { return {0x10000, 4, 0x20000, 0x30000, 0x40000, 0x50000, 0x60000}; }
  static BackwardArgs backwardArgs() {
    return {0x70000, 0x10000, 4, 0x20000, 0x30000, 0x40000, 0x50000, 0x80000, 0x90000, 0xa0000, 0xb0000};
  }
  test::TempDir dir;
  std::unique_ptr<Runtime> runtime;
  std::unique_ptr<MoeLayer> layer;
};

// Hardening item 10: the routing arrays are read as i32 / f32 (kernels/DispatchPrologue.cpp, FusedMoe.cpp): a
// misaligned one is an invalid argument naming it, not a device fault; nothing is launched.
TEST_F(MoeLayerOnFakeHip, MisalignedRoutingArraysAreRefusedByName) {
  layer->forward(forwardArgs(), nullptr);
  const int launches = test::FakeHip::get().launchCount();
  ForwardArgs f = forwardArgs();
  f.topkIdx += 2;
  expectInvalid([&] { layer->forward(f, nullptr); }, "forward: topk_idx=0x20002 must be 4-byte aligned");
  f = forwardArgs();
  f.topkWeights += 1;
  expectInvalid([&] { layer->forward(f, nullptr); }, "forward: topk_weights=0x30001 must be 4-byte aligned");
  BackwardArgs b = backwardArgs();
  b.dTopkWeights += 2;
  expectInvalid([&] { layer->backward(b, nullptr); }, "backward: d_topk_weights=0x90002 must be 4-byte aligned");
  b = backwardArgs();
  b.topkIdx += 3;
  expectInvalid([&] { layer->backward(b, nullptr); }, "backward: topk_idx=0x20003 must be 4-byte aligned");
  b = backwardArgs();
  b.topkWeights += 2;
  expectInvalid([&] { layer->backward(b, nullptr); }, "backward: topk_weights=0x30002 must be 4-byte aligned");
  EXPECT_EQ(test::FakeHip::get().launchCount(), launches) << "nothing may be enqueued";
  layer->backward(backwardArgs(), nullptr);  // the aligned call still goes through
  EXPECT_GT(test::FakeHip::get().launchCount(), launches);
}

// The 16-byte checks name the argument too.
TEST_F(MoeLayerOnFakeHip, ForwardChecksNameTheArgument) {
  ForwardArgs f = forwardArgs();
  f.w2 += 8;
  expectInvalid([&] { layer->forward(f, nullptr); }, "forward: w2=0x50008 must be 16-byte aligned");
  f = forwardArgs();
  f.tokens = 65;
  expectInvalid([&] { layer->forward(f, nullptr); }, "tokens=65 must be in [0, max_tokens=64]");
  const int launches = test::FakeHip::get().launchCount();
  layer->forward(forwardArgs(), nullptr);
  FakeHipLaunch prologue{};
  test::FakeHip::get().launch(launches, &prologue);
  EXPECT_STREQ(prologue.name, "dispatch_prologue");
  EXPECT_EQ(prologue.params[1], 0x20000u);  // topk_idx
}

}  // namespace
}  // namespace megamoe
