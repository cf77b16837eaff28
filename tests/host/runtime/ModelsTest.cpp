// The model table (compiler/abi/Models.h): its numbers as the models' config.json files give them, what the layer
// refuses of each and why (MoeLayer::validateModel: the layer's own rule, word for word), and the C ABI's rows
// (megamoe_model_get, which the Python package reads) equal to the table.
#include <gtest/gtest.h>

#include <cstring>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "compiler/abi/Models.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/megamoe.h"

namespace megamoe {
namespace {

// What each model's config.json says (docs/decisions/model-table.md: how they were read), written out again so that
// an edit of the table that changes a number fails here.
struct Expected {
  const char* name;
  int64_t hidden, intermediate, experts, topk, ep, shared, sharedIntermediate;
  uint32_t features;
};
constexpr Expected kExpected[] = {
    {"deepseek-v3", 7168, 2048, 256, 8, 8, 1, 2048, 0},
    {"kimi-k2", 7168, 2048, 384, 8, 8, 1, 2048, 0},
    {"qwen3-235b-a22b", 4096, 1536, 128, 8, 8, 0, 0, 0},
    {"qwen3-30b-a3b", 2048, 768, 128, 8, 2, 0, 0, 0},
    {"qwen3-next-80b-a3b", 2048, 512, 512, 10, 8, 1, 512, 0},
    {"glm-4.5", 5120, 1536, 160, 8, 8, 1, 1536, 0},
    {"gpt-oss-120b", 2880, 2880, 128, 4, 8, 0, 0, abi::kExpertBiases | abi::kSwigluOai},
    {"gpt-oss-20b", 2880, 2880, 32, 4, 2, 0, 0, abi::kExpertBiases | abi::kSwigluOai},
    {"mixtral-8x7b", 4096, 14336, 8, 2, 2, 0, 0, 0},
    {"llama-4-maverick", 5120, 8192, 128, 1, 8, 1, 8192, abi::kWeightOnInput},
    {"deepseek-v2-lite", 2048, 1408, 64, 6, 2, 2, 1408, 0},
};

// A row's shape numbers, for comparing the table's rows with the expectations and the C ABI's.
std::vector<int64_t> numbers(const abi::Model& m) {
  return {m.hidden, m.intermediate, m.experts, m.topk, m.ep, m.sharedExperts, m.sharedIntermediate};
}
std::vector<int64_t> numbers(const Expected& e) {
  return {e.hidden, e.intermediate, e.experts, e.topk, e.ep, e.shared, e.sharedIntermediate};
}
std::vector<int64_t> numbers(const megamoe_model& r) {
  return {r.hidden, r.intermediate, r.experts, r.topk, r.ep, r.shared_experts, r.shared_intermediate};
}

TEST(Models, TheTableHoldsEachModelsConfigNumbers) {
  ASSERT_EQ(abi::models().size(), std::size(kExpected));
  for (size_t i = 0; i < std::size(kExpected); ++i) {
    const abi::Model& m = abi::models()[i];
    EXPECT_STREQ(m.name, kExpected[i].name);
    EXPECT_EQ(numbers(m), numbers(kExpected[i])) << m.name;
    EXPECT_EQ(m.features, kExpected[i].features) << m.name;
    EXPECT_EQ(abi::findModel(m.name), &m);
    EXPECT_NE(std::strchr(m.source, '/'), nullptr) << m.source;  // a Hugging Face owner/name
  }
  EXPECT_EQ(abi::findModel("deepseek-v4"), nullptr);
}

TEST(Models, NamesAreUniqueAndTheFirstPresetsStay) {
  std::set<std::string> names;
  for (const abi::Model& m : abi::models()) EXPECT_TRUE(names.insert(m.name).second) << m.name;
  for (const char* kept : {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b", "deepseek-v2-lite"})
    EXPECT_NE(abi::findModel(kept), nullptr) << kept;
}

TEST(Models, FeaturesAreListedOnceInBitOrder) {
  uint32_t seen = 0, previous = 0;
  for (const abi::ModelFeatureInfo& f : abi::modelFeatures()) {
    EXPECT_EQ(f.bit & (f.bit - 1), 0u) << f.name;  // one bit
    EXPECT_GT(f.bit, previous) << f.name;
    previous = f.bit;
    seen |= f.bit;
  }
  EXPECT_EQ(seen, abi::kSharedExperts | abi::kExpertBiases | abi::kSwigluOai | abi::kWeightOnInput);
  // kSharedExperts comes from sharedExperts alone.
  for (const abi::Model& m : abi::models()) {
    EXPECT_EQ(m.features & abi::kSharedExperts, 0u) << m.name;
    EXPECT_EQ((m.allFeatures() & abi::kSharedExperts) != 0, m.sharedExperts > 0) << m.name;
  }
}

MoeLayerConfig shapeOf(const abi::Model& m) { return {m.hidden, m.intermediate, m.experts, m.topk, 4096}; }

// A shape the layer refuses is refused with validate()'s own words; a shape it serves is refused only for a
// feature it lacks; shared experts alone refuse nothing.
TEST(Models, TheRefusalIsTheLayersRule) {
  const abi::Model& gptOss = *abi::findModel("gpt-oss-120b");
  const std::string rule = MoeLayer::validateModel(gptOss, 8);
  EXPECT_EQ(rule, MoeLayer::validate(shapeOf(gptOss), 8));
  EXPECT_EQ(rule, "hidden=2880 must be a positive multiple of 128 (the L2 tile width and the L1 K step)");

  const abi::Model& llama = *abi::findModel("llama-4-maverick");
  EXPECT_EQ(MoeLayer::validate(shapeOf(llama), 8), "");
  EXPECT_EQ(MoeLayer::validateModel(llama, 8),
            std::string("the layer lacks ") + llama.refusingFeature()->lacking);
  EXPECT_NE(MoeLayer::validateModel(llama, 8).find("routing weight on the input"), std::string::npos);

  abi::Model biased = *abi::findModel("qwen3-235b-a22b");
  EXPECT_EQ(MoeLayer::validateModel(biased, 8), "");
  biased.features = abi::kExpertBiases;
  EXPECT_EQ(MoeLayer::validateModel(biased, 8), "the layer lacks expert biases (its L1 and L2 take no bias)");

  const abi::Model& dsv3 = *abi::findModel("deepseek-v3");
  EXPECT_EQ(dsv3.lacks(), uint32_t(abi::kSharedExperts));
  EXPECT_EQ(abi::lackedFeatureNames(dsv3), "shared_experts");
  EXPECT_EQ(abi::lackedFeatureNames(gptOss), "expert_biases,swiglu_oai");
  EXPECT_EQ(abi::lackedFeatureNames(*abi::findModel("mixtral-8x7b")), "");
  EXPECT_EQ(dsv3.refusingFeature(), nullptr);
  EXPECT_EQ(MoeLayer::validateModel(dsv3, 8), "");
  EXPECT_EQ(MoeLayer::validateModel(dsv3, 3), "experts=256 must be 1..1024 and a multiple of ranks=3");
}

// Which models the layer runs at their usual EP today: the README's table says the same.
TEST(Models, WhatTheLayerRunsToday) {
  std::set<std::string> runs, refused;
  for (const abi::Model& m : abi::models())
    (MoeLayer::validateModel(m, int(m.ep)).empty() ? runs : refused).insert(m.name);
  EXPECT_EQ(refused, (std::set<std::string>{"gpt-oss-120b", "gpt-oss-20b", "llama-4-maverick"}));
  EXPECT_EQ(runs.size(), abi::models().size() - 3);
}

TEST(Models, TheCAbiRowsAreTheTable) {
  size_t count = 0;
  ASSERT_EQ(megamoe_model_count(&count), MEGAMOE_OK);
  ASSERT_EQ(count, abi::models().size());
  for (size_t i = 0; i < count; ++i) {
    const abi::Model& m = abi::models()[i];
    megamoe_model row{};
    row.struct_size = sizeof row;
    ASSERT_EQ(megamoe_model_get(i, &row), MEGAMOE_OK) << megamoe_last_error();
    EXPECT_STREQ(row.name, m.name);
    EXPECT_STREQ(row.source, m.source);
    EXPECT_EQ(numbers(row), numbers(m)) << m.name;
    EXPECT_EQ(row.lacks, m.lacks()) << m.name;
    EXPECT_EQ(row.lacks_names, abi::lackedFeatureNames(m));
    EXPECT_EQ(row.refusal, MoeLayer::validateModel(m, int(m.ep)));
  }
  megamoe_model row{};
  row.struct_size = sizeof row;
  EXPECT_EQ(megamoe_model_get(count, &row), MEGAMOE_ERROR_INVALID_ARGUMENT);
  row.struct_size = 8;
  EXPECT_EQ(megamoe_model_get(0, &row), MEGAMOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(megamoe_last_error()).find("out->struct_size=8"), std::string::npos);
  EXPECT_EQ(megamoe_model_get(0, nullptr), MEGAMOE_ERROR_INVALID_ARGUMENT);
}

}  // namespace
}  // namespace megamoe
