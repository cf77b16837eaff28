// The expert-parallel MoE layer: one object per rank, over a symmetric heap shared by the ranks of one node.
// forward(x, topk_idx, topk_weights, w1, w2) -> y runs four kernels on one stream, with no host synchronisation:
//   dispatch_prologue      routing tables from topk_idx (counts all-gathered through the heap)
//   dispatch_grouped_gemm  token rows pushed into the owners' receive pools; each L1 tile starts once the rows it
//                          reads have arrived; SwiGLU in the tile's epilogue (act = silu(gate) * up)
//   grouped_gemm_combine   L2 tiles stored straight into the token's home rank, then the top-k weighted sum in fp32
//   epoch_advance          the next call's epoch (docs/decisions/epochs.md)
// Layouts (bf16 unless said): x [tokens, H]; topk_idx int32 [tokens, topk] (-1 = no expert; rank r owns experts
// [r * E/R, (r + 1) * E/R)); topk_weights fp32 [tokens, topk]; w1 [E/R, 2I, H] (rows [0, I) gate, [I, 2I) up);
// w2 [E/R, H, I]; y [tokens, H]. Token counts may differ between ranks and calls (0 .. max_tokens).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "compiler/cache/KernelCache.h"
#include "megamoe/Backend.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {

class Runtime;
class Kernel;

struct MoeLayerConfig {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int64_t experts = 0;       // E, over all ranks
  int64_t topk = 0;
  int64_t maxTokens = 0;     // per rank and call
  int64_t swigluClampMilli = 0;  // SwiGLU clamp (gate <= c, |up| <= c) in thousandths; 0 = off
};

// What each fused operator runs (benchmark legs). kFused is the layer; kCommOnly moves the same bytes between the
// same ranks with the GEMM skipped; kGemmOnly runs the GEMM on the pool as it is (filled by an earlier call), with
// no traffic and no waits. Only kFused computes y.
enum class Leg : int { kFused = 0, kCommOnly = 1, kGemmOnly = 2 };

// Kernel stages of one forward, in launch order (indices of stageMilliseconds()).
enum class Stage : int { kPrologue = 0, kDispatchGemm = 1, kGemmCombine = 2, kCount = 3 };

struct ForwardArgs {
  DevicePtr x = 0;
  int64_t tokens = 0;
  DevicePtr topkIdx = 0, topkWeights = 0;
  DevicePtr w1 = 0, w2 = 0;
  DevicePtr y = 0;
};

class MoeLayer {
 public:
  // "" when the layer can be built for `ranks` ranks; else the violated constraint.
  static std::string validate(const MoeLayerConfig& config, int ranks);
  // The heap regions every rank allocates (same list on every rank).
  static std::vector<RegionSpec> heapRegions(const MoeLayerConfig& config, int ranks);
  // The kernels a layer loads, as cache keys without target/options (the list megamoe-cache must generate; the
  // codegen tier checks it against kernels::layerKernels).
  static std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> kernelSpecs(
      const MoeLayerConfig& config, int ranks);

  // Mode A: one process drives every rank; layer i on runtimes[i]'s device. Kernels come from the cache.
  static std::vector<std::unique_ptr<MoeLayer>> createLocal(const std::vector<Runtime*>& runtimes,
                                                            const MoeLayerConfig& config);
  // Mode B: this process is `rank` of `ranks`; all meet at `rendezvousPath`.
  static std::unique_ptr<MoeLayer> create(Runtime& runtime, const MoeLayerConfig& config, int rank, int ranks,
                                          const std::string& rendezvousPath);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  const MoeLayerConfig& config() const { return config_; }
  int rank() const { return heap_->rank(); }
  int ranks() const { return heap_->nranks(); }
  SymmetricHeap& heap() { return *heap_; }

  // Enqueues one forward on `stream` (capturable in a graph). Host-visible bad input (a null pointer, tokens out
  // of [0, max_tokens]) throws Error(kInvalidArgument) naming the constraint before anything is enqueued; an expert
  // index outside [-1, E) is seen on the device: it sets the rank's error record (kBadIndex), the later kernels of
  // the call write nothing, and the peers' waits end in a bounded timeout.
  void forward(const ForwardArgs& args, StreamHandle stream);

  void setLegs(Leg dispatch, Leg combine);
  // When on, forward() records events around each stage; stageMilliseconds() synchronises and returns them.
  void setProfiling(bool on);
  std::array<float, size_t(Stage::kCount)> stageMilliseconds();
  // Bytes of activations one forward keeps on this rank at max_tokens (receive pool, act, combine buffer).
  uint64_t activationBytes() const;

  // Synchronises `stream` and throws Error(kDeviceError) naming the first device error (see SymmetricHeap).
  void checkErrors(StreamHandle stream) { heap_->checkErrors(stream); }

 private:
  struct Impl;
  MoeLayer(Runtime& runtime, const MoeLayerConfig& config, std::unique_ptr<SymmetricHeap> heap);
  MoeLayerConfig config_;
  std::unique_ptr<SymmetricHeap> heap_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megamoe
