// The model table, declared once: public MoE models with their routed experts' shape (as their Hugging Face
// config.json gives it), their usual expert-parallel degree, and what their MoE layer does that ours does not yet.
// Plain C++, no LLVM: the kernels' presets (kernels::presets, megamoe-cache --preset), `megamoe-cache presets`,
// the runtime's MoeLayer::validateModel and the C ABI (megamoe_model_get, which the Python package reads) read it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe::abi {

// What a model's MoE layer does besides routed experts computing silu(gate) * up between L1 and L2, each output
// weighted by its routing weight: one bit each.
enum ModelFeature : uint32_t {
  kSharedExperts = 1u << 0,  // experts every token passes through beside its routed ones (Model::sharedExperts)
  kExpertBiases = 1u << 1,   // a bias per expert after L1 and after L2 (gpt-oss: gate_up_proj_bias, down_proj_bias)
  kSwigluOai = 1u << 2,      // gpt-oss: gate <= 7, -7 <= up <= 7, then gate * sigmoid(1.702 gate) * (up + 1)
  kWeightOnInput = 1u << 3,  // Llama 4: the routing weight scales the expert's input x, not its output
};

// The features the layer computes today: none. A model with a feature the layer lacks is refused
// (MoeLayer::validateModel), except for shared experts: the caller runs them beside the layer, as a dense MLP.
inline constexpr uint32_t kLayerFeatures = 0;
inline constexpr uint32_t kBesideTheLayer = kSharedExperts;

struct ModelFeatureInfo {
  ModelFeature bit;
  const char* name;     // "shared_experts": the C ABI's and the Python package's name
  const char* lacking;  // the refusal's words: "the layer lacks <lacking>"
};
// Every feature, in bit order.
const std::vector<ModelFeatureInfo>& modelFeatures();

struct Model {
  const char* name;    // the preset's name (megamoe-cache generate --preset)
  const char* source;  // the Hugging Face repository whose config.json gives the numbers
  int64_t hidden;        // H: hidden_size
  int64_t intermediate;  // I of a routed expert: moe_intermediate_size (intermediate_size for Mixtral, gpt-oss,
                         // Llama 4)
  int64_t experts;       // E: n_routed_experts / num_experts / num_local_experts
  int64_t topk;          // num_experts_per_tok
  int64_t ep;            // the usual expert-parallel degree (ranks of one node)
  int64_t sharedExperts = 0;       // n_shared_experts (Qwen3-Next, Llama 4: one)
  int64_t sharedIntermediate = 0;  // I of one shared expert
  uint32_t features = 0;           // ModelFeature bits other than kSharedExperts (which sharedExperts gives)

  // Every feature of the model, kSharedExperts included.
  uint32_t allFeatures() const { return features | (sharedExperts > 0 ? uint32_t(kSharedExperts) : 0u); }
  // The features the layer lacks.
  uint32_t lacks() const { return allFeatures() & ~kLayerFeatures; }
  // The first lacking feature that makes the layer's result wrong (kBesideTheLayer excepted); nullptr if none.
  const ModelFeatureInfo* refusingFeature() const;
};

// The names of the features `m` lacks, in bit order, joined by ',' ("" for none): the C ABI's lacks_names.
std::string lackedFeatureNames(const Model& m);

// Every model, in the table's order.
const std::vector<Model>& models();
const Model* findModel(std::string_view name);

}  // namespace megamoe::abi
