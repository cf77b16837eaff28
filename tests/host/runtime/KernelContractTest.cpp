// The kernel contract on the runtime's side (compiler/abi/KernelAbi.h): a cache entry built for another argument
// signature is refused naming the kernel, both hashes and the command that rebuilds it, and launch arguments are
// filled by name, each checked against the declaration.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <set>
#include <string>

#include "TestSupport.h"
#include "compiler/abi/KernelAbi.h"
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
  key.fingerprint = "fp";
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
