// Every kernel's declaration (KernelAbi.h). kernels/Kernels.h says what each argument means.
#include "compiler/abi/KernelAbi.h"

#include <cstdio>
#include <stdexcept>

namespace megamoe::abi {
namespace {

// Shorthands for the table below.
ArgDecl bf16(std::string_view n) { return {n, ArgKind::kPtr, Elem::kBf16}; }
ArgDecl f32(std::string_view n) { return {n, ArgKind::kPtr, Elem::kF32}; }
ArgDecl e4m3(std::string_view n) { return {n, ArgKind::kPtr, Elem::kE4m3}; }
ArgDecl i32p(std::string_view n) { return {n, ArgKind::kPtr, Elem::kI32}; }
ArgDecl i64p(std::string_view n) { return {n, ArgKind::kPtr, Elem::kI64}; }
ArgDecl i32(std::string_view n) { return {n, ArgKind::kI32}; }
// A tensor map over a bf16 matrix loaded in boxes of 64 columns (one 128-byte swizzled row) x `rows`, or of the
// shapes `when` selects by the kernel's constants. The grouped GEMMs' boxes (kernels/Kernels.h buildGroupedGemm):
// 64 x 128 for a K-major operand's 128 rows of a tile (NT / NN A, NT B), 64 x 64 for an MN-major K x 64 slab (NN B,
// TN A and B).
ArgDecl map(std::string_view n, int64_t rows, std::vector<BoxWhen> when = {}) {
  return {n, ArgKind::kTensorMap, Elem::kNone, {Elem::kBf16, 64, rows, Swizzle::k128B}, std::move(when)};
}
// A tensor map over an e4m3 matrix loaded in boxes of 128 columns (one 128-byte swizzled row) x `rows`.
ArgDecl mapE4m3(std::string_view n, int64_t rows) {
  return {n, ArgKind::kTensorMap, Elem::kNone, {Elem::kE4m3, 128, rows, Swizzle::k128B}, {}};
}

std::vector<ArgDecl> concat(std::vector<ArgDecl> head, const std::vector<ArgDecl>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}
// The fused kernels' arguments before their scales and maps; `rows` the type of the rows they move and multiply
// (bf16, or e4m3 in the FP8 kernels).
std::vector<ArgDecl> dispatchArgs(ArgDecl (*rows)(std::string_view)) {
  return {{"ctx", ArgKind::kContext}, rows("src"), f32("topk_weights"), i32p("send_list"), i32p("send_off"),
          i32p("send_base"), i32p("counts"), i64p("arrivals"), i64p("route_epoch"), rows("pool"), i32p("pool_src"),
          f32("pool_w"), i32p("pool_offsets"), rows("weights"), bf16("extra"), bf16("out"), i32p("tickets"),
          i32("push_blocks"), i32("grid"), i32("legs"), i32p("topk_idx"), i32("recv_stride"), i32("capacity")};
}
std::vector<ArgDecl> combineArgs(ArgDecl (*rows)(std::string_view)) {
  return {{"ctx", ArgKind::kContext}, rows("a"), rows("b"), i32p("pool_offsets"), i32p("pool_src"), bf16("comb"),
          i64p("done"), i32p("topk_idx"), f32("topk_weights"), i32("tokens"), bf16("y"), f32("dw"),
          f32("d_topk_weights"), i32p("tickets"), i32("grid"), i32("legs")};
}

std::vector<KernelDecl> declarations() {
  const ArgDecl ctx{"ctx", ArgKind::kContext};
  // TN also stores dW through a map: C [E * M, N] in boxes of 64 x 64 (one MMA warpgroup's rows, one 128-byte row).
  auto groupedTma = [](int64_t aRows, int64_t bRows, bool mapC = false) {
    std::vector<ArgDecl> args{bf16("a"),       bf16("b"),     bf16("c"),          i32p("offsets"),
                              i32p("tickets"), i32p("split"), i32("max_split"),   i32("grid"),
                              map("map_a", aRows), map("map_b", bRows)};
    if (mapC) args.push_back(map("map_c", 64));
    return args;
  };
  const std::vector<ArgDecl> grouped = {bf16("a"), bf16("b"), bf16("c"), i32p("offsets"), i32("grid")};
  return {
      {"swiglu_fwd", {"I", "clamp_milli"}, {bf16("h"), bf16("out"), i32("rows")}, GridRule::kCovering},
      {"quantize_tokens_fp8",
       {"H", "device_rows"},
       {bf16("x"), e4m3("q"), f32("scales"), i32("rows"), i32p("rows_at"), i32("grid")},
       GridRule::kCovering},
      {"gemm_nt", {"N", "K"}, {bf16("a"), bf16("b"), bf16("c"), i32("m")}, GridRule::kCovering},
      {"gemm_nt_fp8", {"N", "K"}, {e4m3("a"), f32("a_scales"), e4m3("b"), f32("b_scales"), bf16("c"), i32("m")},
       GridRule::kCovering},
      {"grouped_gemm_nt", {"E", "N", "K"}, grouped, GridRule::kResident},
      {"grouped_gemm_nn", {"E", "N", "K"}, grouped, GridRule::kResident},
      {"grouped_gemm_tn", {"E", "N", "M"}, grouped, GridRule::kResident},
      {"grouped_gemm_nt_tma", {"E", "N", "K", "pairs"}, groupedTma(128, 128), GridRule::kResidentPairs},
      {"grouped_gemm_nn_tma", {"E", "N", "K", "pairs"}, groupedTma(128, 64), GridRule::kResidentPairs},
      {"grouped_gemm_tn_tma", {"E", "N", "M", "pairs"}, groupedTma(64, 64, true), GridRule::kResident},
      {"grouped_gemm_nt_fp8",
       {"E", "N", "K"},
       {e4m3("a"), f32("a_scales"), e4m3("b"), f32("b_scales"), bf16("c"), i32p("offsets"), i32p("tickets"),
        i32("grid"), mapE4m3("map_a", 128), mapE4m3("map_b", 128)},
       GridRule::kResident},
      {"dispatch_prologue",
       {"E", "topk", "ranks"},
       {ctx, i32p("topk_idx"), i32("tokens"), i32p("counts"), i64p("flags"), i32p("send_slot"),
        i32p("pool_offsets"), i32p("send_list"), i32p("send_off"), i32p("send_base"), i64p("arrivals"),
        i64p("done"), i64p("route_epoch"), i32p("scratch"), i32("blocks"), i32("capacity"), i32("drop"),
        i64p("dropped"), i64p("calls"), i32("layer"), i32("role")},
       GridRule::kResident},
      {"topk_idx_narrow", {}, {ctx, i64p("src"), i32p("dst"), i32("count"), i32("grid")}, GridRule::kCovering},
      {"dispatch_grouped_gemm",
       {"E", "ranks", "topk", "H", "I", "clamp_milli", "layout", "save_h", "dedup"},
       concat(dispatchArgs(bf16),
              // NT: the pool and w1 (as grouped_gemm_nt_tma); NN: the pool and w2 (as _nn_tma); TN: dh and the pool,
              // and dW1 [E / R * 2I, H] (as grouped_gemm_tn_tma's map_c; NT / NN leave it unused)
              {map("map_a", 128, {{"layout", 2, 64, 64}}),
               map("map_b", 128, {{"layout", 1, 64, 64}, {"layout", 2, 64, 64}}), map("map_c", 64)}),
       GridRule::kResidentPairs},
      {"dispatch_grouped_gemm_fp8",
       {"E", "ranks", "topk", "H", "I", "clamp_milli"},
       concat(dispatchArgs(e4m3),
              // the pool (a 128 x 128 stage) and w1 (a tile's gate or up half: 64 rows, one block of a pair's)
              {f32("src_scales"), f32("pool_scales"), f32("weight_scales"), mapE4m3("map_a", 128),
               mapE4m3("map_b", 64)}),
       GridRule::kResidentPairs},
      {"grouped_gemm_combine",
       {"E", "ranks", "topk", "H", "I", "layout"},
       concat(combineArgs(bf16),
              // NT: act and w2 (as grouped_gemm_nt_tma); NN: dh and w1 (as _nn_tma)
              {map("map_a", 128), map("map_b", 128, {{"layout", 1, 64, 64}})}),
       GridRule::kResidentPairs},
      {"grouped_gemm_combine_fp8",
       {"E", "ranks", "topk", "H", "I"},
       concat(combineArgs(e4m3),
              // act (a 128 x 128 stage) and w2 (half a tile's 128 rows: one block of a pair's)
              {f32("a_scales"), f32("b_scales"), mapE4m3("map_a", 128), mapE4m3("map_b", 64)}),
       GridRule::kResidentPairs},
      {"swiglu_bwd",
       {"I", "clamp_milli"},
       {ctx, bf16("g"), bf16("h"), bf16("dh"), f32("pool_w"), i32p("pool_src"), i32p("rows_at"), f32("dw"),
        i32("grid")},
       GridRule::kCovering},
      {"stage_begin", {"E", "ranks"}, {ctx, i64p("arrivals"), i64p("done"), i64p("barrier")}, GridRule::kOne},
      {"epoch_advance", {}, {ctx}, GridRule::kOne},
      {"ping_pong", {"rounds"}, {ctx, i64p("flag"), i64p("log")}, GridRule::kOne},
      {"a2a_rows", {"H"}, {ctx, bf16("send"), bf16("recv"), i64p("flags"), i32("rows")}, GridRule::kResident},
      {"peer_store", {}, {ctx, bf16("src"), bf16("dst"), i32("chunks"), i32("peer"), i32("grid")},
       GridRule::kCovering},
  };
}

}  // namespace

const char* argKindName(ArgKind kind) {
  switch (kind) {
    case ArgKind::kPtr: return "ptr";
    case ArgKind::kI32: return "i32";
    case ArgKind::kI64: return "i64";
    case ArgKind::kContext: return "context";
    case ArgKind::kTensorMap: return "tensor_map";
  }
  return "?";
}

const char* elemName(Elem elem) {
  switch (elem) {
    case Elem::kNone: return "";
    case Elem::kBf16: return "bf16";
    case Elem::kF32: return "f32";
    case Elem::kI32: return "i32";
    case Elem::kI64: return "i64";
    case Elem::kE4m3: return "e4m3";
  }
  return "?";
}

int64_t elemBytes(Elem elem) {
  switch (elem) {
    case Elem::kNone: return 0;
    case Elem::kE4m3: return 1;
    case Elem::kBf16: return 2;
    case Elem::kF32:
    case Elem::kI32: return 4;
    case Elem::kI64: return 8;
  }
  return 0;
}

const char* swizzleName(Swizzle swizzle) {
  switch (swizzle) {
    case Swizzle::k128B: return "sw128";
  }
  return "?";
}

int64_t TensorMapBox::bytes() const { return cols * rows * elemBytes(elem); }

std::string signatureText(const KernelDecl& d) {
  std::string s = "v" + std::to_string(kKernelAbiVersion) + " " + std::string(d.name) + "(";
  for (size_t i = 0; i < d.constants.size(); ++i) s += (i ? "," : "") + std::string(d.constants[i]);
  s += ")";
  for (size_t i = 0; i < d.args.size(); ++i) {
    const ArgDecl& a = d.args[i];
    s += (i ? "," : " ") + std::string(a.name) + ":" + argKindName(a.kind);
    if (a.kind == ArgKind::kPtr) s += std::string(":") + elemName(a.elem);
    if (a.kind == ArgKind::kTensorMap) {
      s += std::string(":") + elemName(a.box.elem) + ":" + std::to_string(a.box.cols) + "x" +
           std::to_string(a.box.rows) + ":" + swizzleName(a.box.swizzle);
      for (size_t w = 0; w < a.boxWhen.size(); ++w)
        s += (w ? "," : "[") + std::string(a.boxWhen[w].constant) + "=" + std::to_string(a.boxWhen[w].value) + ":" +
             std::to_string(a.boxWhen[w].cols) + "x" + std::to_string(a.boxWhen[w].rows) +
             (w + 1 == a.boxWhen.size() ? "]" : "");
    }
  }
  return s;
}

std::string signatureHash(const KernelDecl& decl) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : signatureText(decl)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

const std::vector<KernelDecl>& kernelDecls() {
  static const std::vector<KernelDecl> all = declarations();
  return all;
}

const KernelDecl* findKernelDecl(std::string_view name) {
  for (const KernelDecl& d : kernelDecls())
    if (d.name == name) return &d;
  return nullptr;
}

TensorMapBox tensorMapBox(const KernelDecl& decl, std::string_view arg, const SpecConstants& constants) {
  const int at = decl.indexOf(arg);
  if (at < 0 || decl.args[size_t(at)].kind != ArgKind::kTensorMap)
    throw std::invalid_argument(std::string(decl.name) + " has no tensor-map argument '" + std::string(arg) + "'");
  const ArgDecl& a = decl.args[size_t(at)];
  for (const BoxWhen& w : a.boxWhen) {
    const std::pair<std::string, int64_t>* found = nullptr;
    for (const auto& c : constants)
      if (c.first == w.constant) found = &c;
    if (!found)
      throw std::invalid_argument(std::string(decl.name) + "." + std::string(arg) + ": the box depends on constant '" +
                                  std::string(w.constant) + "', which the spec does not give");
    if (found->second == w.value) return {a.box.elem, w.cols, w.rows, a.box.swizzle};
  }
  return a.box;
}

}  // namespace megamoe::abi
