// The runtime's cache miss, with and without the JIT linked in: without it the error names the kernel and the
// command that generates it; with it the kernel is compiled in process, stored, and found again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "kernels/Kernels.h"
#include "megamoe/Error.h"
#include "megamoe/KernelLoader.h"
#include "megamoe/MoeLayer.h"
#include "megamoe/Target/Target.h"
#include "tools/jit/RuntimeJit.h"

using namespace megamoe;

namespace {

struct TempDir {
  std::string path = (std::filesystem::temp_directory_path() / ("megamoe-jit-" + std::to_string(getpid()))).string();
  ~TempDir() { std::filesystem::remove_all(path); }
};

cache::KernelKey gemmKey() {
  return {"gemm_nt", {{"N", 128}, {"K", 64}}, "sm_90a", "target=sm_90a;O=3;ptx=80", ""};
}

TEST(RuntimeJit, MissWithoutJitNamesTheCommand) {
  TempDir dir;
  KernelLoader::setJitCompiler({});
  KernelLoader loader(dir.path);
  try {
    loader.find(gemmKey(), "megamoe-cache generate --kernel gemm_nt --spec N=128,K=64 --targets sm_90a");
    FAIL() << "a miss without a JIT must throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("gemm_nt[N=128,K=64]@sm_90a"), std::string::npos) << m;
    EXPECT_NE(m.find("megamoe-cache generate --kernel gemm_nt"), std::string::npos) << m;
  }
}

TEST(RuntimeJit, MissWithJitCompilesStoresAndHits) {
  TempDir dir;
  installRuntimeJit(dir.path);
  KernelLoader loader(dir.path);
  cache::CacheEntry first = loader.find(gemmKey(), "");
  EXPECT_FALSE(first.binary.empty());
  EXPECT_NE(first.metadata.find("\"symbol\":\"gemm_nt\""), std::string::npos);
  // Stored: a loader with no JIT now finds it.
  KernelLoader::setJitCompiler({});
  cache::CacheEntry again = KernelLoader(dir.path).find(gemmKey(), "");
  EXPECT_EQ(again.binary, first.binary);
}

TEST(RuntimeJit, ForeignOptionsAreRefused) {
  TempDir dir;
  installRuntimeJit(dir.path);
  cache::KernelKey key = gemmKey();
  key.options = "target=sm_90a;O=1";
  EXPECT_THROW(KernelLoader(dir.path).find(key, ""), Error);
  KernelLoader::setJitCompiler({});
}

// The layer's one kernel list (compiler/abi/LayerKernels.h) names kernels the compiler can build: every spec it
// lists for a preset whose shape the layer accepts (all but gpt-oss's: H = 2880), at any option, passes the
// registry's own validation, and the preset path generates it.
TEST(RuntimeJit, EveryLayerKernelIsOneTheCompilerBuilds) {
  for (const auto& preset : kernels::presets())
    for (int ranks : {2, 8})
      for (int options = 0; options < 16; ++options) {
        MoeLayerConfig config{preset.hidden, preset.intermediate, preset.experts, preset.topk, 1024, 0};
        if (preset.name.rfind("gpt-oss", 0) == 0) {
          EXPECT_NE(MoeLayer::validate(config, ranks), "") << preset.name;
          continue;
        }
        config.training = options & 1;
        config.dedupTokens = options & 2;
        config.topkIdxInt64 = options & 4;
        config.swigluClampMilli = options & 8 ? 7000 : 0;
        ASSERT_EQ(MoeLayer::validate(config, ranks), "") << preset.name;
        const std::vector<kernels::KernelSpec> generated = kernels::layerKernels(preset, ranks);
        for (const auto& [name, spec] : MoeLayer::kernelSpecs(config, ranks)) {
          const kernels::KernelInfo* info = kernels::find(name);
          ASSERT_NE(info, nullptr) << name;
          EXPECT_EQ(info->validate({name, spec}), "") << preset.name << " ranks=" << ranks << ": " << name;
          if (config.swigluClampMilli) continue;  // the presets are generated without a clamp
          bool listed = false;
          for (const auto& k : generated) listed = listed || (k.kernel == name && k.constants == spec);
          EXPECT_TRUE(listed) << preset.name << " ranks=" << ranks << " options=" << options << ": " << name;
        }
      }
}

TEST(RuntimeJit, DefaultOptionsMatchTheCompiler) {
  for (const std::string& name : TargetOptions::supported()) {
    std::string error;
    auto options = TargetOptions::parse(name, &error);
    ASSERT_TRUE(options) << error;
    EXPECT_EQ(defaultTargetOptions(name), options->canonical()) << name;
  }
  EXPECT_EQ(defaultTargetOptions("sm_80"), "");
}

}  // namespace
