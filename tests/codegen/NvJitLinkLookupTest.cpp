// The compiler opens nvJitLink only for sm_90a code (compiler/lib/Target/Codegen.cpp). megamoe-cache runs as a child
// process here, because the library is looked up once per process: with the lookup forced to fail
// (MEGAMOE_NVJITLINK_LIBRARY), gfx950 generation still works and sm_90a generation fails naming the library.
// The same child-process harness checks the tool's --emit-asm directory handling and its JSON reports.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace {

struct ChildResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

ChildResult run(const std::string& command) {
  ChildResult r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) r.output.append(buffer, n);
  const int rc = ::pclose(pipe);
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return r;
}

class NvJitLinkLookup : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir); }
  // epoch_advance: no constants, and on sm_90a it goes through nvJitLink (not ptxas, which is for warp-specialised
  // kernels).
  std::string generate(const std::string& library, const std::string& target) const {
    return "MEGAMOE_NVJITLINK_LIBRARY='" + library + "' '" MEGAMOE_CACHE_TOOL "' generate --kernel epoch_advance " +
           "--targets " + target + " --cache-dir '" + dir + "' --quiet";
  }
  // epoch_advance for gfx950 (no nvJitLink needed) with its assembly written into asmDir.
  std::string emitAsm(const std::string& asmDir) const {
    return "'" MEGAMOE_CACHE_TOOL "' generate --kernel epoch_advance --targets gfx950 --cache-dir '" + dir +
           "/cache' --emit-asm '" + asmDir + "' --quiet";
  }
  std::string dir =
      (std::filesystem::temp_directory_path() / ("megamoe-nvjitlink-" + std::to_string(::getpid()))).string();
};

TEST_F(NvJitLinkLookup, Gfx950NeedsNoNvJitLink) {
  const ChildResult r = run(generate("/nonexistent/libnvJitLink.so.13", "gfx950"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("1 entries, 0 failed"), std::string::npos) << r.output;
}

TEST_F(NvJitLinkLookup, Sm90aWithoutNvJitLinkNamesTheLibraryAndTheVariable) {
  const ChildResult r = run(generate("/nonexistent/libnvJitLink.so.13", "sm_90a"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("sm_90a code needs NVIDIA's nvJitLink"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("libnvJitLink.so.13"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/nonexistent/libnvJitLink.so.13: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MEGAMOE_NVJITLINK_LIBRARY is set, so nothing else was tried"), std::string::npos)
      << r.output;
}

TEST_F(NvJitLinkLookup, ALibraryWithoutTheCuda13EntryPointsIsRefusedByName) {
  const ChildResult r = run(generate("libm.so.6", "sm_90a"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("libm.so.6: lacks __nvJitLinkCreate_13_0"), std::string::npos) << r.output;
}

TEST_F(NvJitLinkLookup, TheVariableCanPointAtTheToolkitsLibrary) {
  const std::string library = MEGAMOE_CUDA_HOME_DEFAULT "/lib64/libnvJitLink.so.13";
  if (!std::filesystem::exists(library)) GTEST_SKIP() << "no CUDA toolkit at " MEGAMOE_CUDA_HOME_DEFAULT;
  const ChildResult r = run(generate(library, "sm_90a"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("1 entries, 0 failed"), std::string::npos) << r.output;
}

// The toolkit is part of an sm_90a entry's fingerprint: another ptxas (here a wrapper that reports another version)
// makes the same kernel a miss that is built again, the same one a hit; --version names both tools.
TEST_F(NvJitLinkLookup, AnotherToolkitsEntryIsBuiltAgain) {
  const std::string ptxas = MEGAMOE_CUDA_HOME_DEFAULT "/bin/ptxas";
  if (!std::filesystem::exists(ptxas)) GTEST_SKIP() << "no CUDA toolkit at " MEGAMOE_CUDA_HOME_DEFAULT;
  std::filesystem::create_directories(dir);
  const std::string wrapper = dir + "/ptxas";
  {
    std::FILE* f = std::fopen(wrapper.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "#!/bin/sh\n[ \"$1\" = --version ] && { echo 'Cuda compilation tools, release 99.1, V99.1.7'; "
                    "exit 0; }\nexec '%s' \"$@\"\n", ptxas.c_str());
    std::fclose(f);
  }
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  const std::string version = run("MEGAMOE_PTXAS='" + wrapper + "' '" MEGAMOE_CACHE_TOOL "' --version").output;
  EXPECT_NE(version.find("sm_90a toolkit: nvJitLink 13."), std::string::npos) << version;
  EXPECT_NE(version.find("; ptxas V99.1.7"), std::string::npos) << version;
  const std::string library = MEGAMOE_CUDA_HOME_DEFAULT "/lib64/libnvJitLink.so.13";
  auto once = [&](const std::string& with) {
    const ChildResult r = run("MEGAMOE_PTXAS='" + with + "' " + generate(library, "sm_90a") + " --json '" + dir +
                              "/r.json'");
    EXPECT_EQ(r.status, 0) << r.output;
    std::FILE* f = std::fopen((dir + "/r.json").c_str(), "r");
    std::string json;
    if (f) {
      char buffer[4096];
      for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) json.append(buffer, n);
      std::fclose(f);
    }
    return json;
  };
  EXPECT_NE(once(wrapper).find("\"hit\":false"), std::string::npos);
  EXPECT_NE(once(wrapper).find("\"hit\":true"), std::string::npos);
  EXPECT_NE(once(ptxas).find("\"hit\":false"), std::string::npos);  // another ptxas: built again
  EXPECT_NE(once(ptxas).find("\"hit\":true"), std::string::npos);
}

// A JSON report that cannot be written whole (here: a full disk) fails the command instead of a success with a
// missing or truncated file.
TEST_F(NvJitLinkLookup, AJsonReportThatCannotBeWrittenIsAFailure) {
  for (const std::string& command :
       {emitAsm(dir + "/asm") + " --json /dev/full", "'" MEGAMOE_CACHE_TOOL "' list --cache-dir '" + dir +
                                                         "/cache' --json /dev/full"}) {
    const ChildResult r = run(command);
    EXPECT_EQ(r.status, 1) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("cannot write /dev/full: No space left on device"), std::string::npos) << r.output;
  }
}

// Not linked: the tool starts on a machine without the CUDA toolkit.
TEST(NvJitLinkLinking, TheToolDoesNotNeedNvJitLink) {
  const ChildResult r = run("objdump -p '" MEGAMOE_CACHE_TOOL "'");
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_NE(r.output.find("NEEDED"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("nvJitLink"), std::string::npos) << r.output;
}

}  // namespace

// --emit-asm creates its directory (nested too) and writes one assembly file per compiled kernel; a directory that
// cannot be created fails the run before any kernel is compiled, naming it.
TEST_F(NvJitLinkLookup, EmitAsmCreatesItsDirectory) {
  const std::string asmDir = dir + "/asm/nested";
  const ChildResult r = run(emitAsm(asmDir));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(asmDir + "/epoch_advance[].gfx950.s")) << r.output;
}

TEST_F(NvJitLinkLookup, EmitAsmIntoAFileFailsNamingIt) {
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/not-a-directory";
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  const ChildResult r = run(emitAsm(file + "/asm"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--emit-asm " + file + "/asm: cannot create the directory"), std::string::npos) << r.output;
}

// --dtype fp8 with a shape builds the FP8 grouped GEMMs at its L1 ([E/R, 2I, H]) and L2 ([E/R, H, I]) shapes and
// the FP8 layer's kernels; deepseek-v2-lite at EP8: 8 experts a rank, H = 2048, I = 1408.
TEST_F(NvJitLinkLookup, DtypeFp8BuildsTheFp8KernelsOfTheShape) {
  const ChildResult r = run("'" MEGAMOE_CACHE_TOOL "' generate --preset deepseek-v2-lite --ep 8 --dtype fp8 "
                            "--targets gfx950 --quiet --cache-dir '" + dir + "/cache'");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("grouped_gemm_nt_fp8[E=8,N=2816,K=2048]"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("grouped_gemm_nt_fp8[E=8,N=2048,K=1408]"), std::string::npos) << r.output;
  for (const char* layer : {"quantize_tokens_fp8[H=2048,device_rows=0]", "quantize_tokens_fp8[H=1408,device_rows=1]",
                            "dispatch_grouped_gemm_fp8[E=64,ranks=8,topk=6,H=2048,I=1408,clamp_milli=0]",
                            "grouped_gemm_combine_fp8[E=64,ranks=8,topk=6,H=2048,I=1408]", "topk_idx_narrow[]"})
    EXPECT_NE(r.output.find(layer), std::string::npos) << layer << "\n" << r.output;
  EXPECT_NE(r.output.find("10 entries, 0 failed"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("dispatch_grouped_gemm["), std::string::npos) << "no bf16 layer kernel\n" << r.output;
}

TEST_F(NvJitLinkLookup, DtypeRulesAreNamed) {
  const std::string tool = "'" MEGAMOE_CACHE_TOOL "' generate --targets gfx950 --quiet --cache-dir '" + dir + "/c' ";
  for (auto [args, message] :
       {std::pair<std::string, std::string>{"--preset deepseek-v3 --dtype fp4",
                                            "--dtype must be bf16 or fp8 (got 'fp4')"},
        {"--kernel epoch_advance --dtype fp8", "--dtype goes with a shape"},
        {"--hidden 128 --intermediate 256 --experts 8 --topk 2 --ep 1 --dtype fp8", "K=128 must be >= 256"}}) {
    const ChildResult r = run(tool + args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
}
