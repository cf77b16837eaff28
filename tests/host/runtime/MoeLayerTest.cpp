// MoeLayer's host side without a GPU: the configuration constraints, the heap regions every rank allocates, the
// kernels it loads, and the C ABI's argument checks. The forward itself runs in tests/gpu/LayerTest.cpp.
#include <gtest/gtest.h>

#include <string>

#include "megamoe/HeapLayout.h"
#include "megamoe/MoeLayer.h"

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
  MoeLayerConfig fp8 = deepseek();
  fp8.dtype = DType(1);
  EXPECT_NE(MoeLayer::validate(fp8, 2).find("dtype"), std::string::npos);
}

TEST(MoeLayer, HeapRegionsHoldTheWorstCaseRouting) {
  const MoeLayerConfig c = deepseek();
  const HeapLayout layout = HeapLayout::place(MoeLayer::heapRegions(c, 2));
  // Every rank may send every pick to one owner: 2 ranks x 8192 tokens x 8 picks rows of H bf16.
  EXPECT_EQ(layout.region("moe.pool").size, uint64_t(2) * 8192 * 8 * 7168 * 2);
  EXPECT_EQ(layout.region("moe.pool_src").size, uint64_t(2) * 8192 * 8 * 4);
  EXPECT_EQ(layout.region("moe.comb").size, uint64_t(8192) * 8 * 7168 * 2);
  EXPECT_EQ(layout.region("moe.counts").size, uint64_t(2) * 2 * 256 * 4);
  EXPECT_EQ(layout.region("moe.arrivals").size, uint64_t(2) * 2 * 128 * 8);
  EXPECT_EQ(layout.region("moe.done").size, uint64_t(2) * 2 * 8);
  EXPECT_EQ(layout.region("moe.pool_w").size, uint64_t(2) * 8192 * 8 * 4);
  EXPECT_EQ(layout.region("moe.dw").size, uint64_t(8192) * 8 * 4);
  // The same list on every rank: the layout's hash is what the rendezvous compares.
  EXPECT_EQ(layout.hash(), HeapLayout::place(MoeLayer::heapRegions(c, 2)).hash());
}

TEST(MoeLayer, LoadsTheForwardKernelsAndForTrainingTheBackwardOnes) {
  MoeLayerConfig training = deepseek();
  training.training = true;
  const auto backward = MoeLayer::kernelSpecs(training, 2);
  ASSERT_EQ(backward.size(), 10u);
  EXPECT_EQ(backward[1].second[7], (std::pair<std::string, int64_t>{"save_h", 1}));  // the forward keeps h
  EXPECT_EQ(backward[7].first, "grouped_gemm_tn_tma");  // dW2 on the TMA engine
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

}  // namespace
}  // namespace megamoe
