// The operators, written once in the DSL, and the registry that names them for the cache and the tools.
// Each kernel keeps its compile-time constants in one spec; a spec's constants are the cache key's specialisation.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "compiler/abi/DeviceAbi.h"
#include "compiler/abi/KernelAbi.h"
#include "megamoe/Target/Target.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"

namespace megamoe::kernels {

// A kernel name plus its specialisation constants, in the kernel's declared order.
struct KernelSpec {
  std::string kernel;
  std::vector<std::pair<std::string, int64_t>> constants;
  int64_t get(std::string_view name) const;  // throws std::out_of_range naming the missing constant
  std::string describe() const;              // "gemm_nt[N=4096,K=7168]"
};
// The spec of a kernel's typed declaration (compiler/abi/Kernels.def), e.g. specOf(abi::GemmNt{...}).
template <class Declared>
KernelSpec specOf(const Declared& k) {
  return {std::string(Declared::kName), k.constants()};
}

// A registered kernel: its declaration (compiler/abi/Kernels.def: constants, their ranges and rules, arguments) and
// its builder.
struct KernelInfo {
  std::string name;
  // The IR is target-neutral; `arch` only picks tuning choices (tile shapes) where one size does not fit both.
  std::function<mlir::OwningOpRef<mlir::ModuleOp>(mlir::MLIRContext&, const KernelSpec&, Arch)> build;

  const abi::KernelDecl& decl() const;
  std::string_view summary() const { return decl().summary; }
  // The specialisation constants, in the cache key's order: the declaration's.
  std::vector<std::string> constantNames() const;
  // "" when the spec is valid; otherwise a message naming the violated range or rule (abi::validateSpec).
  std::string validate(const KernelSpec& spec) const { return abi::validateSpec(name, spec.constants); }
};

const std::vector<KernelInfo>& registry();
const KernelInfo* find(std::string_view name);

// ---- specs of the kernels in this folder ----

// SwiGLU forward: out[m, i] = silu(h[m, i]) * h[m, I + i] over h [M, 2I] (gate | up) in bf16, optional clamp
// (gate <= limit, |up| <= limit; limit given in thousandths, 0 = off). One 16-byte vector per thread.
struct SwigluSpec {
  static constexpr std::string_view kName = abi::SwigluFwd::kName;
  static constexpr int64_t kBlockThreads = 256, kVector = 8;
  int64_t intermediate;
  int64_t clampMilli = 0;
  KernelSpec spec() const {
    abi::SwigluFwd k;
    k.I = intermediate;
    k.clamp_milli = clampMilli;
    return specOf(k);
  }
};

// One-expert bf16 GEMM, NT: C [M, N] = A [M, K] * B [N, K]^T, fp32 accumulation, bf16 out. A 64 x 128 tile per block
// over 64-wide K stages through swizzled shared memory and the target's MMA atom. M is a run-time argument.
struct GemmNtSpec {
  static constexpr std::string_view kName = abi::GemmNt::kName;
  static constexpr int64_t kBlockThreads = 128, kBlockM = 64, kBlockN = 128, kBlockK = 64;
  int64_t n, k;
  KernelSpec spec() const {
    abi::GemmNt g;
    g.N = n;
    g.K = k;
    return specOf(g);
  }
};

// One-expert FP8 GEMM, NT, with 128 x 128 block scales (DeepSeek-V3's recipe): C [M, N] (bf16) = sum over K blocks
// kb of (A_kb B_kb^T) * a_scales[row, kb] * b_scales[n / 128, kb], with A [M, K] and B [N, K] e4m3, a_scales
// [M, K / 128] and b_scales [N / 128, K / 128] f32 (dequantised = e4m3 value x scale). Each 128-wide K block is
// one stage: its product starts from zero and is promoted into the f32 accumulator with its scales (acc_scale_add).
// A 64 x 128 tile per block, M a run-time argument.
struct GemmNtFp8Spec {
  static constexpr std::string_view kName = abi::GemmNtFp8::kName;
  static constexpr int64_t kBlockThreads = 128, kBlockM = 64, kBlockN = 128, kBlockK = 128, kScaleBlock = 128;
  int64_t n, k;
  KernelSpec spec() const {
    abi::GemmNtFp8 g;
    g.N = n;
    g.K = k;
    return specOf(g);
  }
};

// Per-token FP8 quantisation of activations: x [rows, H] bf16 -> q [rows, H] e4m3 codes and scales [rows, H / 128]
// f32, each 128-channel group g of a row with scale s = amax(|x_g|) / 448 (1 where that is 0) and q = e4m3(x / s)
// (IEEE quotient, nearest even, saturating): bitwise python/megamoe/fp8.py quantize_tokens (scale_format fp32) for
// finite inputs. One thread per (row, group); a block takes chunkRows() rows at a time, `grid` blocks in turn.
// Args: x, q, scales, rows, rows_at, grid. device_rows = 0: `rows` rows (rows_at unused; the op launches
// ceil(rows / chunkRows()) blocks); device_rows = 1: min(rows, *rows_at) rows, a count the device wrote (the FP8
// layer's act: the rows this rank received, pool_offsets[E/R]), over a resident grid.
struct QuantizeTokensSpec {
  static constexpr std::string_view kName = abi::QuantizeTokensFp8::kName;
  static constexpr int64_t kBlockThreads = 256, kGroup = 128, kVector = 8;
  int64_t hidden;
  bool deviceRows = false;
  int64_t chunkRows() const { return std::max<int64_t>(1, kBlockThreads / (hidden / kGroup)); }
  KernelSpec spec() const {
    abi::QuantizeTokensFp8 q;
    q.H = hidden;
    q.device_rows = deviceRows;
    return specOf(q);
  }
};

// Grouped bf16 GEMMs over experts, one persistent kernel each, driven by device-side group offsets: offsets is an
// i32 [E + 1] array of row starts (offsets[e + 1] - offsets[e] = group e's size, 0 included; no host sync and no
// padding needed). The kernels trust them: 0 <= offsets[0] <= ... <= offsets[E] <= the rows of A and C (a caller
// who cannot promise it clamps them on the device first, as python/megamoe/ops.py group_starts does). `grid` blocks
// loop over the tiles (shapes: tiles() below), and `grid` must be the launched block count. fp32 accumulation.
//   grouped_gemm_nt: C [M_total, N] = A [M_total, K] * B[e] [N, K]^T   (forward L1 / L2)
//   grouped_gemm_nn: C [M_total, N] = A [M_total, K] * B[e] [K, N]     (backward dgrad)
//   grouped_gemm_tn: C[e] [M, N]    = A_e [K_e, M]^T * B_e [K_e, N]    (weight gradients; K_e = group size;
//                    an expert without tokens gets C[e] = 0, written)
// Args: A, B, C, offsets, grid. Rows of C outside the groups are never written.
// Tiles (docs/decisions/gemm-tiles.md): 128 x BN tiles (BN = 256 when N allows, else 128) on two warpgroups with a
// 3-stage ring of asynchronous copies; K x MN operands (NN's B, TN's A and B) stay MN-major in shared memory and the
// MMA reads them transposed.
struct GroupedGemmSpec {
  enum Layout : int64_t { kNT = 0, kNN = 1, kTN = 2 };
  // What every tile shape below divides: N by the narrowest BLOCK_N, K by BLOCK_K, TN's M by BLOCK_M.
  static constexpr int64_t kBlockM = 128, kBlockN = 128, kBlockK = 64;
  struct Tiles {
    int64_t threads, m, n, k, stages;
    // The target can send epilogue rows as bulk copies (Kernel::bulkStore) that drain while the next tile runs.
    // One bulk copy per 512-byte row is slower than the block's 16-byte stores into local memory, so only the
    // combines, whose rows go to their home rank, use them (docs/decisions/gemm-tiles.md, epilogue stores).
    bool bulkStores;
    // Warp-specialised (sm_90a): threads [0, mmaThreads) are the MMA warpgroups (one per 64 rows), the last
    // warpgroup only copies (the producer); ring slots pass between them on mbarriers.
    bool warpSpecialized = false;
    // FP8 (grouped_gemm_nt_fp8): A and B are e4m3, k counts elements (one 128-byte swizzled row a stage, as bf16's
    // 64), and each stage's MMA is promoted into the fp32 accumulator with its block scales.
    bool e4m3 = false;
    int64_t mmaThreads() const { return m / 64 * 128; }
    int64_t elemBytes() const { return e4m3 ? 1 : 2; }
  };
  // gfx950 keeps BN = 128: its copies into shared memory are synchronous (transposing for K x MN operands), and a
  // 128 x 256 fragment plus that copy code does not fit the 512 VGPR + AGPR budget. It has no bulk-copy engine in
  // use here either: its rows leave through the block's stores. `warpSpecialized` is an sm_90a choice (gfx950 has
  // neither mbarriers nor register hand-over between waves).
  // FP8 tiles are 128 x 128 x 128 e4m3: each MMA warpgroup holds two 64 x 128 fp32 fragments (the running sum and
  // the stage's partial product), which 128 x 256 would double past the register file.
  Tiles tiles(Arch arch, bool warpSpecialized = false) const {
    bool wide = n % 256 == 0 && arch == Arch::sm_90a && !fp8;
    bool ws = warpSpecialized && arch == Arch::sm_90a;
    return {ws ? 384 : 256, 128, wide ? 256 : 128, fp8 ? kScaleBlock : 64, 3, arch == Arch::sm_90a, ws, fp8};
  }
  Layout layout;
  int64_t experts;
  int64_t n;
  int64_t kOrM;  // K for NT/NN, M for TN
  bool fp8 = false;  // grouped_gemm_nt_fp8 (NT only)
  static constexpr int64_t kScaleBlock = 128;  // FP8: the block scales' 128 x 128 (B) and 1 x 128 (A)
  static constexpr std::string_view kFp8Name = abi::GroupedGemmNtFp8::kName;
  static std::string_view name(Layout l) {
    return l == kNT ? abi::GroupedGemmNt::kName : l == kNN ? abi::GroupedGemmNn::kName : abi::GroupedGemmTn::kName;
  }
  // The TMA variants: warp-specialised, loading through tensor-map arguments (see buildGroupedGemm).
  static std::string_view tmaName(Layout l) {
    return l == kNT ? abi::GroupedGemmNtTma::kName
           : l == kNN ? abi::GroupedGemmNnTma::kName
                      : abi::GroupedGemmTnTma::kName;
  }
  KernelSpec spec() const {
    if (fp8) return specOf(withShape<abi::GroupedGemmNtFp8>());
    if (layout == kNT) return specOf(withShape<abi::GroupedGemmNt>());
    return layout == kNN ? specOf(withShape<abi::GroupedGemmNn>()) : specOf(withShape<abi::GroupedGemmTn>());
  }
  KernelSpec tmaSpec(int64_t pairs = 0) const {
    if (layout == kNT) return specOf(withShape<abi::GroupedGemmNtTma>(pairs));
    return layout == kNN ? specOf(withShape<abi::GroupedGemmNnTma>(pairs)) : specOf(withShape<abi::GroupedGemmTnTma>(pairs));
  }
  // A grouped GEMM declaration of this shape: E, N and K (or TN's M), and `pairs` where it has one.
  template <class Declared>
  Declared withShape(int64_t pairs = 0) const {
    Declared d;
    d.E = experts;
    d.N = n;
    if constexpr (std::is_same_v<Declared, abi::GroupedGemmTn> || std::is_same_v<Declared, abi::GroupedGemmTnTma>)
      d.M = kOrM;
    else
      d.K = kOrM;
    if constexpr (std::is_same_v<Declared, abi::GroupedGemmNtTma> || std::is_same_v<Declared, abi::GroupedGemmNnTma> ||
                  std::is_same_v<Declared, abi::GroupedGemmTnTma>)
      d.pairs = pairs;
    return d;
  }
};

// The grouped GEMM kernel of spec s. warpSpecialized (sm_90a; ignored for gfx950) builds the producer / MMA
// warpgroup split (kernels/gemm/WarpSpecializedEngine.h) instead of the single-role engine: correct on the H200,
// measured slower with cp.async as the producer's copy (docs/decisions/gemm-tiles.md); no registered kernel builds
// it (codegen_test keeps it buildable).
// tensorMaps builds grouped_gemm_{nt,nn,tn}_tma: args A, B, C, offsets, tickets (i32 [2], zero before the first
// launch, left zero by each launch), split (scratch of abi::splitScratchBytes(grid) bytes whose first
// abi::splitCounterBytes(grid) are zero before the first launch and left zero by each), max_split (i32), grid,
// mapA, mapB. On sm_90a NT / NN the last round's tiles, which would leave most blocks idle, run split over K in up
// to max_split parts (at most 255; 0 or 1: never; kernels/gemm/SplitTail.h); TN and gfx950
// ignore both (split may then be 0). On sm_90a the maps are CUtensorMaps (bf16, 128-byte swizzle, zero fill;
// Device::encodeTensorMap) and the kernel is warp-specialised with TMA loads. gfx950 builds the single-role
// kernel and ignores the maps (any pointer):
//   mapA, NT / NN: A [rows, K]: dims {K, rows}, row stride K * 2 bytes, box {64, 128};
//   mapB, NT: B [E * N, K]: dims {K, E * N}, row stride K * 2, box {64, 128};
//   mapB, NN: B [E * K, N]: dims {N, E * K}, row stride N * 2, box {64, 64};
//   TN: mapA A [tokens, M]: dims {M, tokens}, row stride M * 2, box {64, 64}; mapB B [tokens, N]: dims {N, tokens},
//   row stride N * 2, box {64, 64}. A group's partial last K step is loaded ending at the group's end (groups under
//   one step: the next group's rows or the map's zero fill) and the MMA warpgroups zero the rows it must not count
//   in shared memory before multiplying.
// pairs (tensorMaps NT / NN, N a multiple of 256; the spec constant "pairs"): clusters of two blocks running
// m-tile pairs that load B's tile once for both (multicast), an expert's odd last m-tile split by n-tiles when N is
// a multiple of 512; the grid must then be even. The fastest build on sm_90a (docs/decisions/gemm-tiles.md).
mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemm(mlir::MLIRContext& ctx, const GroupedGemmSpec& s, Arch arch,
                                                   bool warpSpecialized = false, bool tensorMaps = false,
                                                   bool pairs = false);

// grouped_gemm_nt_fp8: C [M_total, N] (bf16) = dequant(A) * dequant(B[e])^T over the group offsets of the grouped
// GEMMs above (i32 [E + 1] row starts), with fp32 accumulation promoted every 128 K:
//   A [M_total, K] e4m3 with per-token scales a_scales f32 [M_total, K / 128] (1 x 128 blocks),
//   B [E, N, K] e4m3 with block scales b_scales f32 [E, N / 128, K / 128] (128 x 128 blocks),
// C[r, n] = sum over K blocks kb of a_scales[r, kb] * b_scales[e, n / 128, kb] * (A[r, kb] . B[e][n, kb]) (each
// block's 128-K dot product exact in fp32 before its scales multiply it). N and K multiples of 128.
// Args: a, a_scales, b, b_scales, c, offsets, tickets (i32 [2], zero before the first launch, left zero), grid,
// map_a (A [M_total, K] as bytes: dims {K, rows}, row stride K, box {128, 128}), map_b (B [E * N, K] likewise).
// sm_90a: 128 x 128 tiles on the warp-specialised engine with TMA loads, each stage's wgmma (m64n128k32 e4m3)
// promoted while the next stage's runs; gfx950: the single-role engine over the same arguments (maps unused).
// Rows of C outside the groups are never written.
mlir::OwningOpRef<mlir::ModuleOp> buildGroupedGemmFp8(mlir::MLIRContext& ctx, const GroupedGemmSpec& s, Arch arch);
// The FP8 promotion's scales per MMA thread on `arch`: its accumulator fragment's distinct rows (dsl rowScales).
int64_t fp8ScaleRows(Arch arch);

// dispatch_prologue: the routing tables of one layer call, on the device, from topk_idx (first step of the fused
// dispatch). Several blocks per rank (they meet once on a grid barrier). Counts the picks per expert (entries of -1
// are skipped; an entry outside [-1, E) claims the error record with kBadIndex and is skipped), all-gathers the
// [R][E] count matrix through the symmetric heap (double-buffered by epoch parity, one flag per source rank), then
// writes
//   send_slot [T * topk]: the row of each pick in its owner rank's receive pool (-1 when skipped), and
//   pool_offsets [E/R + 1]: this rank's receive pool layout by local expert (rows of expert e_l start at
//   pool_offsets[e_l]; the pool is grouped by local expert, then by source rank; pool_offsets[E/R] = rows received).
// Within one (source, expert) rows follow pick order (deterministic), so sums over a group's rows, such as the
// weight gradients, are the same in every run. It also lists my picks by expert for the push (send_list [T * topk]: pick indices,
// expert e's at [send_off[e], send_off[e + 1]); send_base [E]: the first pool row of (me, e) at e's owner) and
// zeroes the arrival counters of the other epoch parity (see DispatchGemmSpec).
// Args: ctx, topk_idx (i32), tokens (i32), counts (heap i32 [2][R][E]), flags (heap u64 [R]), send_slot (i32),
// pool_offsets (i32), send_list (i32), send_off (i32 [E + 1]), send_base (i32 [E]), arrivals (heap i64
// [2][R][E/R]), done (heap i64 [2][R]), route_epoch (i64: the epoch whose counts slab later stages read), scratch
// (i32 [kScratchHeader + blocks * E], zero before the first launch; every launch leaves its counters zero), blocks
// (i32: the launch's grid; blocks past it return at once), capacity (i32: the rows every owner's receive pool holds;
// when the routing would send more to any owner, every rank claims its error record with kCapacity (flag = that
// owner, seen = its rows, expected = the capacity) before a row moves, and the later kernels of the call write
// nothing), drop (i32: 1 or 2 instead drops the picks whose rows would lie past the capacity: they become -1 in
// topk_idx, which must then be the layer's own copy, and are left out of every table; 1 also adds their number to
// dropped), dropped (i64 [1]: picks dropped so far), calls (heap i64 [2][R]: each source's call word by epoch
// parity), layer, role (i32: this call's, abi::callWord; a peer's word that differs claims every rank's record with
// kCallMismatch (flag = the first such peer, seen = its word, expected = mine) before a row moves).
struct DispatchPrologueSpec {
  static constexpr std::string_view kName = abi::DispatchPrologue::kName;
  static constexpr int64_t kBlockThreads = 1024;
  // Any number of blocks (all resident: they meet once), each counting a contiguous range of the picks; scratch
  // holds their meeting counters (i32 [kScratchHeader]) and per-block counts (i32 [blocks][E]).
  static constexpr int64_t kScratchHeader = abi::kPrologueScratchHeader;
  int64_t experts, topk, ranks;
  KernelSpec spec() const {
    abi::DispatchPrologue p;
    p.E = experts;
    p.topk = topk;
    p.ranks = ranks;
    return specOf(p);
  }
};

// topk_idx_narrow: the caller's int64 top-k indices (torch.topk, DeepEP) as the int32 the layer's kernels read;
// launched before dispatch_prologue when the caller declares int64 indices. dst[i] = src[i] for src[i] in
// [-1, 2^31); any other value (below -1, or >= 2^31, which truncated would wrap into a valid expert or into -1)
// becomes kBadValue, which dispatch_prologue skips as a bad index (it is >= E for every layer), and claims the
// error record with kBadIndex as dispatch_prologue does for its bad indices: flag = the pick i, seen = the int64
// value, expected = kLimit (2^31). The record is claimed here rather than left to the prologue because only this
// kernel still sees the caller's value (the prologue would report kBadValue); the first claim wins, so the
// prologue's own report of the same pick is dropped. Grid-stride over the launch's `grid` blocks: with src 16-byte
// and dst 8-byte aligned, each thread narrows pairs (one 16-byte load, one 8-byte store; an odd count's last entry
// is thread 0's), else one entry at a time.
// Args: ctx, src (i64 [count], 8-byte aligned), dst (i32 [count], 4-byte aligned), count (i32; <= 0 writes nothing;
// count + grid * kBlockThreads < 2^31), grid (i32: the blocks launched, any number >= 1; covering:
// (count / 2 + kBlockThreads - 1) / kBlockThreads, at least 1).
struct TopkIdxNarrowSpec {
  static constexpr std::string_view kName = abi::TopkIdxNarrow::kName;
  static constexpr int64_t kBlockThreads = 256;
  static constexpr int64_t kLimit = int64_t(1) << 31;  // valid entries are [-1, kLimit)
  static constexpr int32_t kBadValue = 2147483647;     // INT32_MAX, written for every entry outside them
  KernelSpec spec() const { return specOf(abi::TopkIdxNarrow{}); }
};

// ---- the fused operators of the MoE layer (runtime/include/megamoe/MoeLayer.h runs them) ----
// Both run the grouped GEMM engine (GroupedGemmSpec's NT tiles) with tiles handed out by a global ticket counter,
// so blocks that start late still take their share; `legs` selects what runs (benchmark legs, kLeg* bits).
// Pool rows of (source s, local expert e) at the owner are counted in arrivals[parity][s][e] (zeroed by the
// prologue of the next call); pool_src[row] = s * 2^24 + the pick's index at s (t * topk + j).
enum LegBits : int64_t { kLegComm = 1, kLegGemm = 2 };

// dispatch_grouped_gemm: blocks [0, push_blocks) first push my picks' source rows (x, or dy in the backward) into
// the owners' pools (units of up to kPushRows rows of one expert, experts in order of their local index, peers
// before myself), with each pick's routing weight into pool_w, and count them into the owner's arrivals; then every
// block takes GEMM tiles, each waiting until every source's rows of its expert have arrived:
//   NT (forward):  h = pool . w1[e]^T with w1's gate and up rows side by side in one 2 x (BN/2) tile; the epilogue
//                  writes act = silu(gate) * up (optional clamp) and, with save_h, h itself (kept for training);
//   NN (backward): g = pool (dy rows) . w2[e]  -> out [rows, I];
//   TN (backward): dW1[e] = a_e^T pool_e with a = dh [rows, 2I] and the pool holding x rows -> out [E/R, 2I, H].
// The counts slab is the one the prologue filled at the epoch it stored in route_epoch. Comm-only: block 0 waits
// for all arrivals at the end.
// dedup (NT only): a token crosses to an owner once, however many of the owner's experts it picked. Only the pick
// of the token's lowest expert at that owner (its carrier) copies the row, into the owner's receive rows
// pool[s * recv_stride + t] (s: the source rank, t: the token); every pick still writes its pool_src / pool_w entry
// and is counted. An L1 tile gathers its A rows from there through pool_src (copyTileGather) and waits, per
// source, for the units of every expert up to its own (a token's carrier comes at or before any expert it picked).
// Args: ctx, src [T, H] (x or dy), topk_weights (f32), send_list, send_off, send_base (from the prologue), counts
// (heap), arrivals (heap), route_epoch (i64), pool (heap bf16 [cap, H]), pool_src (heap i32 [cap]), pool_w (heap
// f32 [cap]), pool_offsets (i32 [E/R + 1]), weights (w1 for NT and TN's shape, w2 for NN), extra (NT: h out when
// save_h; TN: dh), out, tickets (i32 [2], zero), push_blocks, grid, legs (i32), topk_idx (i32 [T, topk]; read with
// dedup), recv_stride (i32: max tokens per rank; with dedup), capacity (i32: the prologue's; the rows waited for
// from a source leave out those past it, which the prologue dropped), map_a, map_b: TN on sm_90a runs the warp-specialised
// engine with TMA loads and takes CUtensorMaps of dh [cap, 2I] and of the pool [cap, H] (64 x 64 boxes, as
// grouped_gemm_tn_tma); NT without dedup (2I a multiple of 256) runs it as cluster pairs (an even grid and
// push_blocks) and takes maps of the pool [cap, H] and of w1 [E/R * 2I, H] (64 x 128 boxes, as grouped_gemm_nt_tma;
// the gate and up halves of a tile load as two boxes); NN (I a multiple of 256) too, with maps of the pool [cap, H]
// (64 x 128 boxes) and of w2 [E/R * H, I] (64 x 64 boxes, as grouped_gemm_nn_tma); every other kernel two unused
// pointers.
// dispatch_grouped_gemm_fp8 (fp8; the forward, NT, inference): the same with e4m3 rows. src is x's codes [T, H]
// with per-token scales src_scales f32 [T, H / 128] (1 x 128 blocks); the push copies each row's H bytes into the
// pool (heap e4m3 [cap, H]) and its H / 128 scales into pool_scales (heap f32 [cap, H / 128]); weights is w1's
// codes [E/R, 2I, H] with block scales weight_scales f32 [E/R, 2I / 128, H / 128] (I a multiple of 128: a tile's
// gate and up halves each lie inside one 128-row block, promoted with their own scale); act = SwiGLU(h) out bf16
// as in NT. 128 x 128 tiles (GroupedGemmSpec::tiles fp8); on sm_90a the warp-specialised engine with TMA loads as
// cluster pairs (an even grid and push_blocks; each block loads B's gate or up half, multicast into both): map_a
// over the pool [cap, H] (e4m3, 128 x 128 boxes), map_b over w1 [E/R * 2I, H] (e4m3, 128 x 64: one half of a
// tile). Args: those of dispatch_grouped_gemm up to capacity (extra unused), then src_scales,
// pool_scales, weight_scales, map_a, map_b (no map_c).
struct DispatchGemmSpec {
  static constexpr std::string_view kName = abi::DispatchGroupedGemm::kName;
  static constexpr std::string_view kFp8Name = abi::DispatchGroupedGemmFp8::kName;
  static constexpr int64_t kPushRows = 32;  // rows per push unit (warps take rows in turn); one signal per unit
  int64_t experts, ranks, topk, hidden, intermediate, clampMilli = 0;
  GroupedGemmSpec::Layout layout = GroupedGemmSpec::kNT;
  int64_t saveH = 0;
  int64_t dedup = 0;
  bool fp8 = false;  // dispatch_grouped_gemm_fp8: NT, no save_h, no dedup
  GroupedGemmSpec gemm() const {
    const int64_t local = experts / ranks;
    if (layout == GroupedGemmSpec::kNN) return {GroupedGemmSpec::kNN, local, intermediate, hidden};
    if (layout == GroupedGemmSpec::kTN) return {GroupedGemmSpec::kTN, local, hidden, 2 * intermediate};
    return {GroupedGemmSpec::kNT, local, 2 * intermediate, hidden, fp8};
  }
  KernelSpec spec() const {
    if (fp8) return specOf(withShape<abi::DispatchGroupedGemmFp8>());
    abi::DispatchGroupedGemm d = withShape<abi::DispatchGroupedGemm>();
    d.layout = layout;
    d.save_h = saveH;
    d.dedup = dedup;
    return specOf(d);
  }
  template <class Declared>
  Declared withShape() const {
    Declared d;
    d.E = experts;
    d.ranks = ranks;
    d.topk = topk;
    d.H = hidden;
    d.I = intermediate;
    d.clamp_milli = clampMilli;
    return d;
  }
};

// grouped_gemm_combine: grouped GEMM tiles whose epilogue stores each row straight into its home rank's combine
// buffer at the pick's slot (comb [T_max * topk, H] on the heap); every block then counts itself done at every
// home rank; once all blocks of all ranks are done, each rank sums its tokens' rows in fp32 in pick order:
//   NT (forward):  out = act . w2[e]^T; y[t] = sum_j w[t, j] * comb[t * topk + j] over the valid picks;
//   NN (backward): dx rows = dh . w1[e]; dx[t] = sum_j comb[t * topk + j]; d_topk_weights[t, j] = dw[t * topk + j]
//                  (heap f32, stored there by swiglu_bwd), 0 for -1 picks.
// Gemm-only: rows go into my own combine buffer and nothing is summed.
// Args: ctx, a (act / dh), b (w2 / w1), pool_offsets, pool_src (heap), comb (heap), done (heap i64 [2][R]),
// topk_idx, topk_weights (f32), tokens (i32), y (y / dx), dw (heap f32), d_topk_weights (f32), tickets, grid, legs,
// map_a, map_b: the NN combine on sm_90a runs the warp-specialised engine with TMA and takes CUtensorMaps of dh
// [cap, 2I] (64 x 128 boxes) and of w1 [E/R * 2I, H] (64 x 64 boxes), as grouped_gemm_nn_tma; the NT combine (H a
// multiple of 256) runs it as cluster pairs (an even grid) and takes maps of act [cap, I] and of w2 [E/R * H, I]
// (64 x 128 boxes, as grouped_gemm_nt_tma); otherwise two unused pointers.
// grouped_gemm_combine_fp8 (fp8; the forward, NT): the same with a = act's codes [cap, I] and their per-token
// scales a_scales f32 [cap, I / 128], b = w2's codes [E/R, H, I] with block scales b_scales f32
// [E/R, H / 128, I / 128]; comb, y and the sum as in NT (bf16 rows, fp32 sum). 128 x 128 tiles; on sm_90a the
// warp-specialised engine with TMA loads as cluster pairs (an even grid; each block loads half of B's 128 rows,
// multicast into both): map_a over act [cap, I] (e4m3 128 x 128 boxes), map_b over w2 [E/R * H, I] (e4m3
// 128 x 64). legs without the GEMM (comm-only) still multiply on sm_90a: its FP8 K loop has no skip. Args: those
// of grouped_gemm_combine up to legs, then a_scales, b_scales, map_a, map_b.
struct GemmCombineSpec {
  static constexpr std::string_view kName = abi::GroupedGemmCombine::kName;
  static constexpr std::string_view kFp8Name = abi::GroupedGemmCombineFp8::kName;
  int64_t experts, ranks, topk, hidden, intermediate;
  GroupedGemmSpec::Layout layout = GroupedGemmSpec::kNT;
  bool fp8 = false;  // grouped_gemm_combine_fp8: NT
  GroupedGemmSpec gemm() const {
    const int64_t local = experts / ranks;
    if (layout == GroupedGemmSpec::kNN) return {GroupedGemmSpec::kNN, local, hidden, 2 * intermediate};
    return {GroupedGemmSpec::kNT, local, hidden, intermediate, fp8};
  }
  KernelSpec spec() const {
    if (fp8) return specOf(withShape<abi::GroupedGemmCombineFp8>());
    abi::GroupedGemmCombine c = withShape<abi::GroupedGemmCombine>();
    c.layout = layout;
    return specOf(c);
  }
  template <class Declared>
  Declared withShape() const {
    Declared d;
    d.E = experts;
    d.ranks = ranks;
    d.topk = topk;
    d.H = hidden;
    d.I = intermediate;
    return d;
  }
};

// swiglu_bwd: per received row r (of rows_at[0]): from g = dy . w2[e] [rows, I], the kept h [rows, 2I] and the
// pick's routing weight pool_w[r]: dact = w * g; dh = [dact * up * silu'(gate) | dact * silu(gate)] written into
// dh (h is only read: it is the caller's saved state; dh may be h; clamped components get 0); w * act written over
// g (dW2's right operand); and <g, act> = d topk_weight, stored at the pick's home rank in dw[pick] (heap f32). One
// block per row at a time, a fixed-order reduction.
// Args: ctx, g, h, dh, pool_w (heap), pool_src (heap), rows_at (i32 pointer), dw (heap f32), grid (i32).
struct SwigluBwdSpec {
  static constexpr std::string_view kName = abi::SwigluBwd::kName;
  static constexpr int64_t kBlockThreads = 256;
  int64_t intermediate, clampMilli = 0;
  KernelSpec spec() const {
    abi::SwigluBwd k;
    k.I = intermediate;
    k.clamp_milli = clampMilli;
    return specOf(k);
  }
};

// stage_begin: starts a backward stage that reuses the forward's routing: zeroes this rank's arrival and done
// counters of the other epoch parity (as the prologue does for a forward), then all ranks meet (rank barrier on
// `barrier`, value epoch + 1), so no rank pushes into counters a late rank has not zeroed yet. A profiled forward
// also launches it before the combine (once per epoch, as the barrier's value requires), so that the combine's
// stage time does not include waiting for a peer's later dispatch.
// Args: ctx, arrivals (heap), done (heap), barrier (heap u64 [R]).
struct StageBeginSpec {
  static constexpr std::string_view kName = abi::StageBegin::kName;
  int64_t experts, ranks;
  KernelSpec spec() const {
    abi::StageBegin k;
    k.E = experts;
    k.ranks = ranks;
    return specOf(k);
  }
};

// ---- communication kernels over the symmetric heap (runtime tests and benchmarks) ----
// All take the rank's DeviceContext first. Flags are monotonic: a call at epoch e waits for values derived from e + 1;
// epoch_advance (launched last, stream-ordered) moves the epoch on, so nothing is reset and graphs can replay.

// epoch_advance: ctx.epoch += 1 (one thread).
struct EpochAdvanceSpec {
  static constexpr std::string_view kName = abi::EpochAdvance::kName;
  KernelSpec spec() const { return specOf(abi::EpochAdvance{}); }
};

// ping_pong between ranks 0 and 1: in round i the rank i % 2 writes value e * rounds + i + 1 into the peer's slot
// log[i] and signals the peer's flag; the other rank waits for it. Args: ctx, flag (heap u64), log (heap i64[rounds]).
struct PingPongSpec {
  static constexpr std::string_view kName = abi::PingPong::kName;
  int64_t rounds;
  KernelSpec spec() const {
    abi::PingPong k;
    k.rounds = rounds;
    return specOf(k);
  }
};

// a2a_rows: all-to-all of rows. send [nranks][rows][H] bf16 (local), recv [nranks][rows][H] (heap): rank r's block
// group p copies send[p] into peer p's recv[r] with 16-byte stores, then adds 1 to peer p's flags[r]; block (p, 0)
// then waits until flags[p] reaches (e + 1) * kBlocksPerPeer. Args: ctx, send, recv, flags (heap u64[nranks]), rows.
struct AllToAllRowsSpec {
  static constexpr std::string_view kName = abi::A2aRows::kName;
  static constexpr int64_t kBlockThreads = 256, kBlocksPerPeer = 16;
  int64_t hidden;
  KernelSpec spec() const {
    abi::A2aRows k;
    k.H = hidden;
    return specOf(k);
  }
};

// peer_store: bandwidth kernel, dst (on peer `peer`'s heap) = src, in 16-byte chunks, grid-stride.
// Args: ctx, src, dst (local heap address), chunks (i32), peer (i32), grid (i32: the blocks launched).
struct PeerStoreSpec {
  static constexpr std::string_view kName = abi::PeerStore::kName;
  static constexpr int64_t kBlockThreads = 512, kUnroll = 4;
  KernelSpec spec() const { return specOf(abi::PeerStore{}); }
};

// ---- model shapes ----

struct ModelShape {
  std::string name;
  int64_t hidden, intermediate, experts, topk;
};
// The routed-expert shapes of the model table (compiler/abi/Models.h), every model, also those the layer refuses
// (validateShape, MoeLayer::validateModel say why).
const std::vector<ModelShape>& presets();
const ModelShape* findPreset(std::string_view name);
// "" when the shape can be served at `ranks` expert-parallel ranks; else the violated constraint.
std::string validateShape(const ModelShape& shape, int64_t ranks);
// The kernels one MoE layer of this shape needs at `ranks` ranks, for every option that changes them: the union of
// compiler/abi/LayerKernels.h's lists (what the runtime loads) over training, dedup and int64 topk_idx, without a
// clamp (deduplicated, stable order).
std::vector<KernelSpec> layerKernels(const ModelShape& shape, int64_t ranks);
// The FP8 kernels of this shape at `ranks` ranks: the grouped GEMMs (grouped_gemm_nt_fp8) at its L1 ([E/R, 2I, H])
// and L2 ([E/R, H, I]), then the FP8 layer's list (compiler/abi/LayerKernels.h, fp8) with and without int64
// topk_idx: what `megamoe-cache generate --dtype fp8` builds. Throws std::invalid_argument naming the rule a shape
// breaks (validateShape's, or H and I below 256).
std::vector<KernelSpec> fp8Kernels(const ModelShape& shape, int64_t ranks);

}  // namespace megamoe::kernels
