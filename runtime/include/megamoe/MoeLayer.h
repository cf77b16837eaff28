// The expert-parallel MoE layer: one object per rank, over a symmetric heap shared by the ranks of one node.
// forward(x, topk_idx, topk_weights, w1, w2) -> y runs four kernels on one stream, with no host synchronisation:
//   dispatch_prologue      routing tables from topk_idx (counts all-gathered through the heap)
//   dispatch_grouped_gemm  token rows pushed into the owners' receive pools; each L1 tile starts once the rows it
//                          reads have arrived; SwiGLU in the tile's epilogue (act = silu(gate) * up)
//   grouped_gemm_combine   L2 tiles stored straight into the token's home rank, then the top-k weighted sum in fp32
//   epoch_advance          the next call's epoch (docs/decisions/epochs.md)
// Layouts (bf16 unless said): x [tokens, H]; topk_idx int32 (int64 with topkIdxInt64) [tokens, topk] (-1 = no
// expert; rank r owns experts [r * E/R, (r + 1) * E/R)); topk_weights fp32 [tokens, topk]; w1 [E/R, 2I, H] (rows
// [0, I) gate, [I, 2I) up); w2 [E/R, H, I]; y [tokens, H]. Token counts may differ between ranks and calls.
// Lifetimes: a layer uses its Runtime for every launch, so the Runtime must outlive it (the C ABI's handles keep
// it alive for the caller, see megamoe.h); the layer keeps its workspace (Workspace.h) alive. Streams: forward().
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
#include "megamoe/Workspace.h"

namespace megamoe {

class Runtime;
class Kernel;
namespace abi {
struct Model;
}

// The layer's number format (fp32 accumulation inside either way).
//   kBf16:     x, y, w1, w2 (and the gradients) bf16.
//   kFp8E4m3:  inference (no training): w1 and w2 e4m3 codes in their bf16 layouts with fp32 block scales,
//              w1_scales [E/R, 2I/128, H/128] and w2_scales [E/R, H/128, I/128] (one per 128 x 128 block: a
//              checkpoint's weight_scale_inv, dequantised = code x scale); x bf16 (the layer quantises it per token
//              and 128 channels, amax / 448) or e4m3 codes with their scales x_scales fp32 [tokens, H/128]; y bf16.
//              The rows pushed are e4m3 with their scales; act is quantised like x between the two GEMMs.
enum class DType : int { kBf16 = 0, kFp8E4m3 = 1 };

struct MoeLayerConfig {
  int64_t hidden = 0;        // H
  int64_t intermediate = 0;  // I
  int64_t experts = 0;       // E, over all ranks
  int64_t topk = 0;
  int64_t maxTokens = 0;     // per rank and call
  int64_t swigluClampMilli = 0;  // SwiGLU clamp (gate <= c, |up| <= c) in thousandths; 0 = off
  // Training: forward also keeps the L1 pre-activation h [received rows, 2I] and backward() is available.
  bool training = false;
  DType dtype = DType::kBf16;
  // Token deduplication: a token crosses to an owner rank once, however many of its experts that rank owns, and the
  // L1 tiles gather its row there (kernels/Kernels.h, DispatchGemmSpec::dedup). The forward only; the backward's
  // re-dispatches are unchanged.
  bool dedupTokens = false;
  // SMs this rank's persistent kernels may use (their grids), forward and backward, leaving the rest to other
  // streams (attention, a shared expert, NCCL). 0: MEGAMOE_SM_BUDGET, else every SM of the device shared evenly
  // (rounded down to even) by the ranks of one createLocal that share it. A budget must be even (the cluster-pair
  // kernels launch whole pairs), at most the device's SMs, and the budgets of ranks on one device must fit it
  // together, so that every rank's persistent kernels are resident at once.
  int64_t smBudget = 0;
  // Rows a rank may receive in one call (its receive pool; the saved state of a training forward is sized by it).
  // 0: the worst case, every pick of every rank (ranks * max_tokens * topk); larger values are the worst case too.
  // A call whose routing sends more to some rank writes nothing: every rank's error record says kCapacity with the
  // rank and the rows it needed (checkErrors names them), as for any device error. Twice the mean
  // (2 * max_tokens * topk) holds every routing but a skewed one.
  int64_t receiveCapacity = 0;
  // Past the capacity, drop instead of failing: the picks whose rows would lie past some owner's capacity (the
  // last ones of its pool: by local expert, then source rank, then pick order) are treated as -1 (no expert: they
  // add nothing to y and get d_topk_weights 0), the rest of the call runs, and their number is added to the
  // workspace's count (Workspace::droppedPicks). Not with dedupTokens.
  bool dropOverflow = false;
  // topk_idx holds int64 (torch.topk, DeepEP) instead of int32: each call first narrows it on the device
  // (topk_idx_narrow; a value outside [-1, 2^31) is a bad index, named in the error record).
  bool topkIdxInt64 = false;
};

// What each fused operator runs (benchmark legs). kFused is the layer; kCommOnly moves the same bytes between the
// same ranks with the GEMM skipped; kGemmOnly runs the GEMM on the pool as it is (filled by an earlier call), with
// no traffic and no waits. Only kFused computes y.
enum class Leg : int { kFused = 0, kCommOnly = 1, kGemmOnly = 2 };

// Kernel stages of one forward, in launch order (indices of stageMilliseconds()).
enum class Stage : int { kPrologue = 0, kDispatchGemm = 1, kGemmCombine = 2, kCount = 3 };
// Stages of one backward (indices of backwardStageMilliseconds()):
//   kDgradDispatch   dispatch_grouped_gemm NN: dy rows (and their routing weights) re-dispatched, g = dy . w2[e]
//   kSwigluBackward  swiglu_bwd: dh from g and the kept h, w * act for dW2, d_topk_weights to the home rank
//   kWgradW2         grouped_gemm_tn: dW2[e] = dy_e^T (w * act)_e
//   kWgradW1Dispatch dispatch_grouped_gemm TN: x re-dispatched (never kept), dW1[e] = dh_e^T x_e
//   kDgradCombine    grouped_gemm_combine NN: dx rows dh . w1[e] stored at home, summed per token
// A stage's time covers its own kernels, not the rank barrier that starts the communicating stages.
enum class BackwardStage : int {
  kDgradDispatch = 0, kSwigluBackward = 1, kWgradW2 = 2, kWgradW1Dispatch = 3, kDgradCombine = 4, kCount = 5
};

struct ForwardArgs {
  DevicePtr x = 0;
  int64_t tokens = 0;
  DevicePtr topkIdx = 0, topkWeights = 0;
  DevicePtr w1 = 0, w2 = 0;
  DevicePtr y = 0;
  // FP8 layers (DType::kFp8E4m3): the block scales of w1 and w2 (required), and x's per-token scales when x is
  // e4m3 codes (0: x is bf16 and the layer quantises it). 0 on a bf16 layer.
  DevicePtr xScales = 0, w1Scales = 0, w2Scales = 0;
  // Training layers: where this forward keeps what its backward needs (savedBytes(), 16-byte aligned, the
  // caller's). 0 on a layer created without a workspace: the layer's own buffer, i.e. the last forward's.
  DevicePtr saved = 0;
};

// Gradients of a forward: the same x, tokens, routing and weights, and the `saved` buffer that forward wrote
// (which the backward only reads: a saved state can be differentiated again). Any number of forwards may be
// outstanding, and their backwards may run in any order. dW1 and dW2 have w1's and w2's layouts (an expert without
// tokens gets zeros); d_topk_weights is fp32 [tokens, topk] (0 for -1).
struct BackwardArgs {
  DevicePtr dy = 0;
  DevicePtr x = 0;
  int64_t tokens = 0;
  DevicePtr topkIdx = 0, topkWeights = 0;
  DevicePtr w1 = 0, w2 = 0;
  DevicePtr dx = 0, dTopkWeights = 0, dW1 = 0, dW2 = 0;
  DevicePtr saved = 0;  // the forward's (0: the layer's own, as in ForwardArgs)
};

class MoeLayer {
 public:
  // "" when the layer can be built for `ranks` ranks; else the first violated constraint (field, value, bound):
  // ranks, then each field on its own (experts, topk, hidden, intermediate, max_tokens, swiglu_clamp_milli), then
  // their products (pool rows < 2^24, the i32 indices the kernels derive, the buffer sizes), then dtype.
  static std::string validate(const MoeLayerConfig& config, int ranks);
  // "" when the layer computes `model`'s routed experts right at `ranks` ranks; else the first thing it refuses:
  // validate()'s first rule for the model's shape (at max_tokens 4096, no options), else the first feature of the
  // model it lacks (compiler/abi/Models.h; shared experts excepted: the caller runs them beside the layer).
  static std::string validateModel(const abi::Model& model, int ranks);
  // The heap regions every rank allocates (same list on every rank). Throws Error(kInvalidArgument) for a
  // configuration that fails validate().
  static std::vector<RegionSpec> heapRegions(const MoeLayerConfig& config, int ranks);
  // The kernels a layer loads, as cache keys without target/options: compiler/abi/LayerKernels.h's list, which
  // megamoe-cache --preset generates too (kernels::layerKernels).
  static std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>> kernelSpecs(
      const MoeLayerConfig& config, int ranks);

  // Bytes of the saved state one training forward writes for its backward (0 without training): the L1
  // pre-activation h of the rows this rank may receive (received rows x 2I bf16). The routing is recomputed by the
  // backward from topk_idx, and the dispatched x is re-dispatched, so nothing else is kept.
  static uint64_t savedBytes(const MoeLayerConfig& config, int ranks);

  // A layer on `workspace` (Workspace.h), which it keeps alive; `config` must fit it (Workspace::fits). Kernels come
  // from the cache. Layers are cheap: their kernels, their tensor maps, their profiling events.
  static std::unique_ptr<MoeLayer> create(std::shared_ptr<Workspace> workspace, const MoeLayerConfig& config);
  // A layer with a workspace of its own (and for training its own saved state: the last forward's).
  // Mode A: one process drives every rank; layer i on runtimes[i]'s device. Several ranks may share a device
  // (runtimes on one ordinal): each then needs its own stream, and its budget (smBudget) is its share of the SMs.
  static std::vector<std::unique_ptr<MoeLayer>> createLocal(const std::vector<Runtime*>& runtimes,
                                                            const MoeLayerConfig& config);
  // Mode B: this process is `rank` of `ranks`; all meet at `rendezvousPath`.
  static std::unique_ptr<MoeLayer> create(Runtime& runtime, const MoeLayerConfig& config, int rank, int ranks,
                                          const std::string& rendezvousPath);
  ~MoeLayer();
  MoeLayer(const MoeLayer&) = delete;
  MoeLayer& operator=(const MoeLayer&) = delete;

  const MoeLayerConfig& config() const { return config_; }
  // The layer's number on its workspace: 0, 1, ... in the order the workspace's layers were created on this rank.
  // Every call publishes it and its role (forward or backward, profiled, legs) to the peers, and a call whose layer
  // or role differs from a peer's is a device error on every rank (kCallMismatch, naming both), so every rank must
  // create a workspace's layers in the same order and call them in the same order.
  uint32_t number() const;
  int rank() const { return workspace_->rank(); }
  int ranks() const { return workspace_->ranks(); }
  // The SMs this rank's kernels use (the workspace's resolved smBudget).
  int smBudget() const { return workspace_->smBudget(); }
  SymmetricHeap& heap() { return workspace_->heap(); }
  Workspace& workspace() { return *workspace_; }
  uint64_t savedBytes() const { return savedBytes(config_, ranks()); }

  // Enqueues one forward on `stream` (capturable in a graph). Host-visible bad input (a null pointer, tokens out
  // of [0, max_tokens], x / y / w1 / w2 not 16-byte or topk_idx / topk_weights not 4-byte aligned, topk_idx not
  // 8-byte aligned when int64) throws
  // Error(kInvalidArgument) naming the argument before anything is enqueued; an expert index outside [-1, E) is
  // seen on the device: it sets the rank's error record (kBadIndex), the later kernels of the call write nothing,
  // and the peers' waits end in a bounded timeout. A call of another layer or role than a peer's call at the same
  // point (number()) sets every rank's record (kCallMismatch) before a row moves, and the later kernels of the call
  // write nothing (the backward's dW2 GEMM, which takes no device context, excepted).
  // Returning means enqueued, not done: a device error recorded by this call (or an earlier one) surfaces only at
  // checkErrors(); until then calls keep returning normally. Every call of one layer (forward, backward, the stage
  // times, checkErrors) must be ordered on one stream, or by the caller across streams: the next call reuses the
  // layer's buffers without a host synchronisation, and calls on unordered streams race on them (not detected).
  void forward(const ForwardArgs& args, StreamHandle stream);

  // Enqueues a backward (config.training must be set), ordered with the forwards as above. Throws
  // Error(kInvalidArgument) when a pointer is null or misaligned (16 bytes; topk_idx, topk_weights and
  // d_topk_weights 4 bytes), or, on a layer without a workspace of the caller's, when there was no forward or tokens
  // differ from the last one; nothing is enqueued then. The backward recomputes the forward's routing (its
  // dispatch_prologue) from topk_idx: the same topk_idx, tokens and weights as the forward's, or the result is
  // undefined.
  void backward(const BackwardArgs& args, StreamHandle stream);

  // Legs of the fused operators, forward and backward (the backward's dispatches take `dispatch`).
  void setLegs(Leg dispatch, Leg combine);
  // When on, forward() records events around each stage; stageMilliseconds() synchronises and returns them. The
  // ranks then meet before the combine, so its time is its own (as every backward stage's), not the wait for a peer
  // that finished its dispatch later.
  void setProfiling(bool on);
  std::array<float, size_t(Stage::kCount)> stageMilliseconds();
  std::array<float, size_t(BackwardStage::kCount)> backwardStageMilliseconds();
  // Bytes a training forward keeps for the backward on this rank (savedBytes()); x is the caller's.
  // keptBytesWithoutRecompute() adds the dispatched x (received rows x H) that a backward without recomputation
  // would keep as well.
  uint64_t keptBytes() const { return savedBytes(); }
  uint64_t keptBytesWithoutRecompute() const;
  // Bytes of the workspace's working memory on this rank (heap and buffers: receive pool, act, combine buffer, and
  // for training dh), shared by every layer on it.
  uint64_t activationBytes() const { return workspace_->bytes().total(); }
  // The picks this rank's forwards on the layer's workspace dropped so far (dropOverflow); synchronises `stream`.
  uint64_t droppedPicks(StreamHandle stream) const { return workspace_->droppedPicks(stream); }

  // Synchronises `stream` and throws Error(kDeviceError) naming the first device error (see SymmetricHeap).
  void checkErrors(StreamHandle stream) { heap().checkErrors(stream); }

 private:
  struct Impl;
  MoeLayer(std::shared_ptr<Workspace> workspace, const MoeLayerConfig& config);
  MoeLayerConfig config_;
  std::shared_ptr<Workspace> workspace_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace megamoe
