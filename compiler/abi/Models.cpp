// The model table (Models.h). Each row's numbers are its config.json's (the repository in `source`); EP is the
// degree the model is usually served or trained at on one node; docs/decisions/model-table.md says how each was
// checked.
#include "compiler/abi/Models.h"

namespace megamoe::abi {

const std::vector<ModelFeatureInfo>& modelFeatures() {
  static const std::vector<ModelFeatureInfo> features = {
      {kSharedExperts, "shared_experts",
       "shared experts (it computes the routed experts only: run the shared ones beside it, as a dense MLP)"},
      {kExpertBiases, "expert_biases", "expert biases (its L1 and L2 take no bias)"},
      {kSwigluOai, "swiglu_oai",
       "gpt-oss's activation (it computes silu(gate) * up, optionally clamped to gate <= c, |up| <= c; not "
       "gate * sigmoid(1.702 gate) * (up + 1))"},
      {kWeightOnInput, "weight_on_input",
       "the routing weight on the input (it weights each expert's output; this model scales the expert's input)"},
  };
  return features;
}

const ModelFeatureInfo* Model::refusingFeature() const {
  for (const ModelFeatureInfo& f : modelFeatures())
    if ((lacks() & ~kBesideTheLayer) & f.bit) return &f;
  return nullptr;
}

std::string lackedFeatureNames(const Model& m) {
  std::string names;
  for (const ModelFeatureInfo& f : modelFeatures())
    if (m.lacks() & f.bit) names += (names.empty() ? "" : ",") + std::string(f.name);
  return names;
}

const std::vector<Model>& models() {
  // name, source, H, I, E, top-k, EP, shared experts, their I, features.
  static const std::vector<Model> table = {
      {"deepseek-v3", "deepseek-ai/DeepSeek-V3", 7168, 2048, 256, 8, 8, 1, 2048},
      {"kimi-k2", "moonshotai/Kimi-K2-Instruct", 7168, 2048, 384, 8, 8, 1, 2048},
      {"qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", 4096, 1536, 128, 8, 8},
      // EP2: the whole model (~61 GB in bf16) fits two GPUs, and two is what the layer is measured at.
      {"qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", 2048, 768, 128, 8, 2},
      {"qwen3-next-80b-a3b", "Qwen/Qwen3-Next-80B-A3B-Instruct", 2048, 512, 512, 10, 8, 1, 512},
      {"glm-4.5", "zai-org/GLM-4.5", 5120, 1536, 160, 8, 8, 1, 1536},
      {"gpt-oss-120b", "openai/gpt-oss-120b", 2880, 2880, 128, 4, 8, 0, 0, kExpertBiases | kSwigluOai},
      {"gpt-oss-20b", "openai/gpt-oss-20b", 2880, 2880, 32, 4, 2, 0, 0, kExpertBiases | kSwigluOai},
      // EP2: eight experts, four a rank (the bench's layer runs measured it there).
      {"mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1", 4096, 14336, 8, 2, 2},
      // The shared expert is an MLP of intermediate_size (8192); intermediate_size_mlp (16384) is the dense layers'.
      {"llama-4-maverick", "meta-llama/Llama-4-Maverick-17B-128E-Instruct", 5120, 8192, 128, 1, 8, 1, 8192,
       kWeightOnInput},
      {"deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite", 2048, 1408, 64, 6, 2, 2, 1408},
  };
  return table;
}

const Model* findModel(std::string_view name) {
  for (const Model& m : models())
    if (name == m.name) return &m;
  return nullptr;
}

}  // namespace megamoe::abi
