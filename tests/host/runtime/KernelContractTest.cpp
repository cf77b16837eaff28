// The kernel contract on the runtime's side (compiler/abi/KernelAbi.h): a cache entry built for another argument
// signature is refused naming the kernel, both hashes and the command that rebuilds it, launch arguments are
// filled by name, each checked against the declaration, and the layer's kernel list (compiler/abi/LayerKernels.h)
// names declared kernels with exactly their declared constants.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <iterator>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "TestSupport.h"
#include "compiler/abi/KernelAbi.h"
#include "compiler/abi/LayerKernels.h"
#include "compiler/cache/KernelCache.h"
#include "megamoe/Error.h"
#include "megamoe/KernelArgs.h"
#include "megamoe/KernelLoader.h"

namespace megamoe {
namespace {

cache::KernelKey swiglu() {
  cache::KernelKey key;
  key.kernel = "swiglu_fwd";
  key.spec = {{"I", 2048}, {"clamp_milli", 0}};
  key.target = "gfx950";
  key.fingerprint = test::ourFingerprint("fp");
  return key;
}

class StaleEntries : public ::testing::Test {
 protected:
  void SetUp() override { device = openBackend(BackendKind::kHip, test::FakeHip::path())->device(0); }
  // Loads swiglu_fwd stored with `members` after its launch metadata; "" when it loaded, else the error.
  std::string loadWith(const std::string& members, ErrorCode* code) {
    const std::string root = dir.file(std::to_string(++stores));  // a cache of its own: stores never replace
    cache::KernelCache(root)
        .store(swiglu(), test::fakeImage("FAKEHIP\nswiglu_fwd 1\n"),
               R"({"symbol":"swiglu_fwd","block_threads":256,"shared_bytes":0)" + members + "}");
    try {
      KernelLoader(root).load(device, swiglu(), "");
    } catch (const Error& e) {
      *code = e.code();
      return e.what();
    }
    return "";
  }
  test::TempDir dir;
  int stores = 0;
  std::shared_ptr<Device> device;
};

// The runtime's maps come from the declaration too: on a device without TMA they are zeros (an unused pointer),
// and an argument that is no tensor map of the kernel, or an empty matrix, is refused.
TEST_F(StaleEntries, TensorMapsAreEncodedFromTheDeclaration) {
  cache::KernelKey key = swiglu();
  key.kernel = "grouped_gemm_nn_tma";
  key.spec = {{"E", 8}, {"N", 512}, {"K", 256}, {"pairs", 0}};
  const std::string root = dir.file("maps");
  cache::KernelCache(root).store(key, test::fakeImage("FAKEHIP\ngrouped_gemm_nn_tma 1\n"),
                                 R"({"symbol":"grouped_gemm_nn_tma","block_threads":384,"shared_bytes":0)" +
                                     test::signatureMembers("grouped_gemm_nn_tma") + "}");
  auto kernel = KernelLoader(root).load(device, key, "");
  EXPECT_EQ(encodeTensorMap(*kernel, "map_b", 0x10000, 8 * 256, 512), TensorMapBytes{});
  auto codeOf = [&](const char* arg, int64_t rows) {
    try {
      encodeTensorMap(*kernel, arg, 0x10000, rows, 512);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
      return e.code();
    }
    return ErrorCode::kOk;
  };
  EXPECT_EQ(codeOf("map_a", 1), ErrorCode::kOk);
  EXPECT_EQ(codeOf("offsets", 1), ErrorCode::kInvalidArgument);
  EXPECT_EQ(codeOf("map_c", 1), ErrorCode::kInvalidArgument);
  EXPECT_EQ(codeOf("map_a", 0), ErrorCode::kInvalidArgument);
}

TEST_F(StaleEntries, TheDeclaredSignatureLoads) {
  ErrorCode code = ErrorCode::kOk;
  EXPECT_EQ(loadWith(test::signatureMembers("swiglu_fwd"), &code), "");
}

TEST_F(StaleEntries, AnotherSignatureIsRefusedNamingBothHashesAndTheCommand) {
  ErrorCode code = ErrorCode::kOk;
  const std::string e = loadWith(R"(,"signature":"0123456789abcdef","abi_version":1)", &code);
  EXPECT_EQ(code, ErrorCode::kStaleKernel) << e;
  EXPECT_NE(e.find("swiglu_fwd[I=2048,clamp_milli=0]"), std::string::npos) << e;
  EXPECT_NE(e.find("0123456789abcdef"), std::string::npos) << e;
  EXPECT_NE(e.find(abi::signatureHash(*abi::findKernelDecl("swiglu_fwd"))), std::string::npos) << e;
  EXPECT_NE(e.find("megamoe-cache generate --kernel swiglu_fwd --spec I=2048,clamp_milli=0 --targets gfx950 --force"),
            std::string::npos)
      << e;
}

TEST_F(StaleEntries, AnEntryWithoutASignatureOrOfAnotherAbiIsRefused) {
  ErrorCode code = ErrorCode::kOk;
  std::string e = loadWith("", &code);
  EXPECT_EQ(code, ErrorCode::kStaleKernel) << e;
  EXPECT_NE(e.find("(none recorded)"), std::string::npos) << e;
  code = ErrorCode::kOk;
  const std::string sig = abi::signatureHash(*abi::findKernelDecl("swiglu_fwd"));
  e = loadWith(R"(,"signature":")" + sig + R"(","abi_version":999)", &code);
  EXPECT_EQ(code, ErrorCode::kStaleKernel) << e;
  EXPECT_NE(e.find("kernel ABI 999"), std::string::npos) << e;
}

TEST(KernelDecls, NamesAreUniqueAndSignaturesDiffer) {
  std::set<std::string> names, hashes;
  for (const abi::KernelDecl& d : abi::kernelDecls()) {
    EXPECT_TRUE(names.insert(std::string(d.name)).second) << d.name;
    EXPECT_TRUE(hashes.insert(abi::signatureHash(d)).second) << d.name;
    std::set<std::string_view> args;
    for (const abi::ArgDecl& a : d.args) {
      EXPECT_TRUE(args.insert(a.name).second) << d.name << ": argument " << a.name << " declared twice";
      EXPECT_EQ(a.kind == abi::ArgKind::kPtr, a.elem != abi::Elem::kNone) << d.name << "." << a.name;
    }
  }
  // The hash covers every part of the text: one argument renamed gives another signature.
  abi::KernelDecl renamed = *abi::findKernelDecl("swiglu_fwd");
  renamed.args[2].name = "count";
  EXPECT_NE(abi::signatureHash(renamed), abi::signatureHash(*abi::findKernelDecl("swiglu_fwd")));
}

// The typed specs (compiler/abi/Kernels.def): fields in the declared order, names checked both ways, each value
// against its declared range and the rules between constants, every part of a declaration described for people.
TEST(TypedSpecs, KeepTheDeclaredOrderAndRefuseWhatTheDeclarationDoesNot) {
  abi::DispatchPrologue p;
  p.E = 256;
  p.topk = 8;
  p.ranks = 8;
  EXPECT_EQ(p.constants(), (abi::SpecConstants{{"E", 256}, {"topk", 8}, {"ranks", 8}}));  // its own order
  EXPECT_EQ(abi::DispatchPrologue::fromConstants({{"ranks", 8}, {"E", 256}, {"topk", 8}}).constants(), p.constants());
  auto refusal = [](const abi::SpecConstants& c) {
    try {
      abi::DispatchPrologue::fromConstants(c);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(refusal({{"E", 256}, {"topk", 8}}), "dispatch_prologue: constant 'ranks' is missing");
  EXPECT_EQ(refusal({{"E", 256}, {"topk", 8}, {"ranks", 8}, {"E", 2}}), "dispatch_prologue: constant 'E' is given twice");
  EXPECT_EQ(refusal({{"E", 256}, {"topk", 8}, {"ranks", 8}, {"H", 2}}), "dispatch_prologue has no constant 'H'");
  EXPECT_EQ(p.validate(), "");
  p.E = 100;  // not a multiple of ranks: a rule between constants
  EXPECT_EQ(p.validate(), "E % ranks == 0 must hold (each rank owns E / ranks experts)");
  p.E = 2048;  // above the range
  EXPECT_EQ(p.validate(), "E=2048 must be <= 1024 (experts of the layer (all ranks))");
  EXPECT_EQ(abi::validateSpec("dispatch_prologue", {{"E", 8}, {"topk", 9}, {"ranks", 1}}),
            "topk <= E must hold (a token picks distinct experts)");
  EXPECT_EQ(abi::validateSpec("grouped_gemm_nt_tma", {{"E", 8}, {"N", 384}, {"K", 256}, {"pairs", 1}}),
            "pairs == 0 || N % 256 == 0 must hold (each block of a pair loads one 128-row half of B's tile)");
  EXPECT_EQ(abi::validateSpec("gemm_nt", {{"N", 128}, {"K", 96}}),
            "K=96 must be a multiple of 64 (the reduction: a multiple of BLOCK_K, one swizzled 128-byte row)");
  EXPECT_EQ(abi::validateSpec("gemm_nt", {{"N", 128}}), "gemm_nt: constant 'K' is missing");
  EXPECT_EQ(abi::validateSpec("gemm_tt", {}), "no kernel is named 'gemm_tt'");
  EXPECT_EQ(&abi::GemmNt::decl(), abi::findKernelDecl("gemm_nt"));
}

TEST(TypedSpecs, EveryConstantAndArgumentIsDescribed) {
  for (const abi::KernelDecl& d : abi::kernelDecls()) {
    const std::string text = abi::describeDecl(d);
    EXPECT_FALSE(d.summary.empty()) << d.name;
    for (const abi::ConstDecl& c : d.constants) {
      EXPECT_FALSE(c.meaning.empty()) << d.name << "." << c.name;
      EXPECT_TRUE(c.range.contains(c.range.lo) && c.range.lo <= c.range.hi) << d.name << "." << c.name;
      EXPECT_NE(text.find(std::string(c.meaning)), std::string::npos) << d.name << "." << c.name;
    }
    for (const abi::ArgDecl& a : d.args) {
      EXPECT_FALSE(a.meaning.empty()) << d.name << "." << a.name;
      EXPECT_NE(text.find(std::string(a.meaning)), std::string::npos) << d.name << "." << a.name;
    }
    for (const abi::RuleDecl& r : d.rules) EXPECT_NE(text.find(std::string(r.condition)), std::string::npos);
  }
}

// A tensor-map argument's box comes from its declaration and the kernel's constants: the fused operators' by their
// layout, the grouped GEMMs' by the kernel; the signature covers it.
TEST(TensorMapBoxes, FollowTheDeclarationAndTheConstants) {
  auto box = [](const char* kernel, const char* arg, const abi::SpecConstants& spec) {
    const abi::TensorMapBox b = abi::tensorMapBox(*abi::findKernelDecl(kernel), arg, spec);
    EXPECT_EQ(b.elem, abi::Elem::kBf16);
    EXPECT_EQ(b.swizzle, abi::Swizzle::k128B);
    EXPECT_EQ(b.cols * abi::elemBytes(b.elem), 128) << kernel << "." << arg << ": one swizzled 128-byte row";
    return std::pair<int64_t, int64_t>{b.cols, b.rows};
  };
  using Shape = std::pair<int64_t, int64_t>;
  const abi::SpecConstants nt = {{"E", 8}, {"N", 512}, {"K", 256}, {"pairs", 0}};
  EXPECT_EQ(box("grouped_gemm_nt_tma", "map_a", nt), (Shape{64, 128}));
  EXPECT_EQ(box("grouped_gemm_nt_tma", "map_b", nt), (Shape{64, 128}));
  EXPECT_EQ(box("grouped_gemm_nn_tma", "map_a", nt), (Shape{64, 128}));
  EXPECT_EQ(box("grouped_gemm_nn_tma", "map_b", nt), (Shape{64, 64}));
  EXPECT_EQ(box("grouped_gemm_tn_tma", "map_a", nt), (Shape{64, 64}));
  EXPECT_EQ(box("grouped_gemm_tn_tma", "map_b", nt), (Shape{64, 64}));
  EXPECT_EQ(box("grouped_gemm_tn_tma", "map_c", nt), (Shape{64, 64}));  // dW's stores: one warpgroup's 64 rows
  for (int64_t layout : {abi::kLayoutNT, abi::kLayoutNN, abi::kLayoutTN}) {
    const abi::SpecConstants spec = {{"E", 256}, {"ranks", 2},      {"topk", 8},       {"H", 7168}, {"I", 2048},
                                     {"clamp_milli", 0}, {"layout", layout}, {"save_h", 0}, {"dedup", 0}};
    // The dispatch's maps: NT the pool and w1 in 128-row boxes, NN the pool and w2's K x 64 slabs, TN dh and the
    // pool as K x 64 slabs.
    EXPECT_EQ(box("dispatch_grouped_gemm", "map_a", spec), (Shape{64, layout == abi::kLayoutTN ? 64 : 128}));
    EXPECT_EQ(box("dispatch_grouped_gemm", "map_b", spec), (Shape{64, layout == abi::kLayoutNT ? 128 : 64}));
    EXPECT_EQ(box("dispatch_grouped_gemm", "map_c", spec), (Shape{64, 64}));  // TN's dW1 stores (others: unused)
    if (layout == abi::kLayoutTN) continue;
    const abi::SpecConstants combine = {{"E", 256}, {"ranks", 2}, {"topk", 8}, {"H", 7168}, {"I", 2048}, {"layout", layout}};
    EXPECT_EQ(box("grouped_gemm_combine", "map_a", combine), (Shape{64, 128}));
    EXPECT_EQ(box("grouped_gemm_combine", "map_b", combine), (Shape{64, layout == abi::kLayoutNT ? 128 : 64}));
  }
  const abi::KernelDecl& dispatch = *abi::findKernelDecl("dispatch_grouped_gemm");
  EXPECT_THROW(abi::tensorMapBox(dispatch, "map_b", {{"E", 256}}), std::invalid_argument);  // no layout given
  EXPECT_THROW(abi::tensorMapBox(dispatch, "pool", nt), std::invalid_argument);             // a pointer
  EXPECT_THROW(abi::tensorMapBox(dispatch, "map_d", nt), std::invalid_argument);            // no such argument
  // The box is part of the signature: another box, another hash.
  EXPECT_NE(abi::signatureText(dispatch).find("map_b:tensor_map:bf16:64x128:sw128[layout=1:64x64,layout=2:64x64]"),
            std::string::npos)
      << abi::signatureText(dispatch);
  abi::KernelDecl changed = dispatch;
  changed.args[size_t(dispatch.indexOf("map_b"))].boxWhen[1].rows = 128;
  EXPECT_NE(abi::signatureHash(changed), abi::signatureHash(dispatch));
}

// Every kernel a layer lists, for every option, is a valid spec of its declaration, and each role's index names a
// kernel of that role's name.
TEST(LayerKernels, EveryListedKernelIsValidAndEachRoleHasOne) {
  using abi::LayerKernel;
  const std::pair<LayerKernel, const char*> roleNames[] = {
      {LayerKernel::kPrologue, "dispatch_prologue"},      {LayerKernel::kDispatchNT, "dispatch_grouped_gemm"},
      {LayerKernel::kCombineNT, "grouped_gemm_combine"},  {LayerKernel::kEpochAdvance, "epoch_advance"},
      {LayerKernel::kStageBegin, "stage_begin"},          {LayerKernel::kDispatchNN, "dispatch_grouped_gemm"},
      {LayerKernel::kSwigluBwd, "swiglu_bwd"},            {LayerKernel::kWgradTN, "grouped_gemm_tn_tma"},
      {LayerKernel::kDispatchTN, "dispatch_grouped_gemm"}, {LayerKernel::kCombineNN, "grouped_gemm_combine"},
      {LayerKernel::kTopkIdxNarrow, "topk_idx_narrow"},   {LayerKernel::kQuantizeX, "quantize_tokens_fp8"},
      {LayerKernel::kQuantizeAct, "quantize_tokens_fp8"}};
  static_assert(std::size(roleNames) == size_t(LayerKernel::kCount));
  for (int options = 0; options < 32; ++options) {
    abi::LayerShape shape{7168, 2048, 256, 8, 2};
    shape.training = options & 1;
    shape.dedup = options & 2;
    shape.topkIdxInt64 = options & 4;
    shape.clampMilli = options & 8 ? 7000 : 0;
    shape.fp8 = options & 16;
    if (shape.fp8 && (shape.training || shape.dedup)) continue;  // the FP8 layer is inference without dedup
    const abi::LayerKernelList list = abi::layerKernels(shape);
    // Each spec comes from its kernel's typed declaration, so its names are the declared ones; its values must
    // also lie in the declared ranges and keep the rules for a valid layer.
    for (const abi::KernelSpec& spec : list.specs)
      EXPECT_EQ(abi::validateSpec(spec.kernel, spec.constants), "") << spec.kernel << " options=" << options;
    std::set<size_t> used;
    for (const auto& [role, name] : roleNames) {
      const bool expected = role == LayerKernel::kTopkIdxNarrow ? shape.topkIdxInt64
                            : role >= LayerKernel::kQuantizeX   ? shape.fp8
                            : role >= LayerKernel::kDispatchNN  ? shape.training
                                                                : true;
      ASSERT_EQ(list.has(role), expected) << name << " options=" << options;
      if (!expected) {
        EXPECT_THROW(list.at(role), std::out_of_range);
        continue;
      }
      const bool fp8Fused = shape.fp8 && (role == LayerKernel::kDispatchNT || role == LayerKernel::kCombineNT);
      EXPECT_EQ(list.specs.at(list.at(role)).kernel, fp8Fused ? std::string(name) + "_fp8" : std::string(name));
      EXPECT_TRUE(used.insert(list.at(role)).second) << name << ": two roles share one entry";
    }
    EXPECT_EQ(used.size(), list.specs.size()) << "every listed kernel has a role";
    // The options reach the constants they decide.
    const abi::SpecConstants& forward = list.specs[list.at(LayerKernel::kDispatchNT)].constants;
    if (shape.fp8) {
      EXPECT_EQ(forward[5], (std::pair<std::string, int64_t>{"clamp_milli", shape.clampMilli}));
      EXPECT_EQ(list.specs[list.at(LayerKernel::kQuantizeAct)].constants[0], (std::pair<std::string, int64_t>{"H", 2048}));
      continue;
    }
    EXPECT_EQ(forward[5], (std::pair<std::string, int64_t>{"clamp_milli", shape.clampMilli}));
    EXPECT_EQ(forward[7], (std::pair<std::string, int64_t>{"save_h", shape.training ? 1 : 0}));
    EXPECT_EQ(forward[8], (std::pair<std::string, int64_t>{"dedup", shape.dedup ? 1 : 0}));
  }
}

TEST(KernelArgsByName, FillsTheDeclaredOrderAndRefusesWhatTheDeclarationDoesNot) {
  KernelArgs a("swiglu_fwd");
  a.i32("rows", 7).ptr("out", 0x2000).ptr("h", 0x1000);  // any order
  void** p = a.params();
  uint64_t h = 0, out = 0;
  int32_t rows = 0;
  std::memcpy(&h, p[0], 8);
  std::memcpy(&out, p[1], 8);
  std::memcpy(&rows, p[2], 4);
  EXPECT_EQ(h, 0x1000u);
  EXPECT_EQ(out, 0x2000u);
  EXPECT_EQ(rows, 7);

  auto errorOf = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(errorOf([] { KernelArgs b("swiglu_fwd"); b.ptr("rows", 1); }).find("'rows' is a i32, set as a ptr"),
            std::string::npos);
  EXPECT_NE(errorOf([] { KernelArgs b("swiglu_fwd"); b.ptr("x", 1); }).find("has no argument 'x'"), std::string::npos);
  EXPECT_NE(errorOf([] { KernelArgs b("swiglu_fwd"); b.i32("rows", int64_t(1) << 31); }).find("does not fit an i32"),
            std::string::npos);
  EXPECT_NE(errorOf([] { KernelArgs b("swiglu_fwd"); b.ptr("h", 1).i32("rows", 1); b.params(); })
                .find("argument 'out' was not set"),
            std::string::npos);
  EXPECT_NE(errorOf([] { KernelArgs b("no_such_kernel"); }).find("no declaration"), std::string::npos);
}

}  // namespace
}  // namespace megamoe
