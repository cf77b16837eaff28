// Runtime over the fake HIP backend: kernel load from a temp cache, launch checks, and the unusable-heap refusal
// after a (fake) kernel reported a cross-rank wait timeout.
#include <gtest/gtest.h>

#include "TestSupport.h"
#include "megamoe/Error.h"
#include "megamoe/Runtime.h"

namespace megamoe {
namespace {

class RuntimeOnFakeHip : public ::testing::Test {
 protected:
  void SetUp() override {
    RuntimeEnv env = parseEnv();
    env.hipLibrary = test::FakeHip::path();
    env.cacheDir = dir.path();
    runtime = std::make_unique<Runtime>(BackendKind::kHip, 0, env);
    cache::KernelKey key;
    key.kernel = "probe";
    key.spec = {{"N", 4}};
    key.target = "gfx950";
    key.fingerprint = "fp";
    const std::string image = "FAKEHIP\nfake_report_timeout 1\n";
    std::vector<uint8_t> bytes(image.begin(), image.end());
    bytes.push_back(0);
    cache::KernelCache(dir.path())
        .store(key, bytes, R"({"symbol":"fake_report_timeout","block_threads":128,"shared_bytes":4096})");
    key.fingerprint.clear();
    key.target.clear();  // the device's
    kernel = runtime->loadKernel(key, "");
  }
  test::TempDir dir;
  std::unique_ptr<Runtime> runtime;
  std::shared_ptr<const Kernel> kernel;
};

TEST_F(RuntimeOnFakeHip, LaunchUsesAtLeastTheKernelsSharedBytes) {
  uint64_t ctx = 0;
  auto heaps = SymmetricHeap::createSingleProcess({runtime->device()}, {{"flags", 64, 64}}, runtime->env());
  ctx = heaps[0]->contextAddress();
  void* params[] = {&ctx};
  LaunchDims dims;
  dims.grid = {8, 1, 1};
  dims.block = {128, 1, 1};
  runtime->launch(*kernel, dims, nullptr, params, heaps[0].get());
  const FakeHipLaunch l = test::FakeHip::get().lastLaunch();
  EXPECT_STREQ(l.name, "fake_report_timeout");
  EXPECT_EQ(l.sharedBytes, 4096u);
  EXPECT_EQ(l.params[0], ctx);
}

TEST_F(RuntimeOnFakeHip, LaunchWithTheWrongBlockSizeIsRejected) {
  LaunchDims dims;
  dims.block = {64, 1, 1};
  try {
    runtime->launch(*kernel, dims, nullptr, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("compiled for 128 threads per block, launched with 64"), std::string::npos);
  }
}

TEST_F(RuntimeOnFakeHip, KernelErrorMakesFurtherLaunchesOnTheHeapRefuse) {
  auto heaps = SymmetricHeap::createSingleProcess({runtime->device()}, {{"flags", 64, 64}}, runtime->env());
  SymmetricHeap& heap = *heaps[0];
  uint64_t ctx = heap.contextAddress();
  void* params[] = {&ctx};
  LaunchDims dims;
  dims.block = {128, 1, 1};
  runtime->launch(*kernel, dims, nullptr, params, &heap);  // the fake kernel gives up on flag 7
  try {
    heap.checkErrors(nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeviceError);
    EXPECT_NE(std::string(e.what()).find("rank 0: cross-rank wait timed out on flag 7 (seen 3, expected 4) in block 12"),
              std::string::npos)
        << e.what();
  }
  const int launches = test::FakeHip::get().launchCount();
  try {
    runtime->launch(*kernel, dims, nullptr, params, &heap);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kHeapUnusable);
    EXPECT_NE(std::string(e.what()).find("destroy it and create a new one"), std::string::npos) << e.what();
  }
  EXPECT_EQ(test::FakeHip::get().launchCount(), launches) << "nothing may reach the device";
  runtime->launch(*kernel, dims, nullptr, params);  // without the heap: allowed
}

TEST(Runtime, AutoBackendReportsWhyEachFailed) {
  RuntimeEnv env = parseEnv();
  env.cudaLibrary = "/nonexistent/libcuda.so.1";
  env.hipLibrary = "/nonexistent/libamdhip64.so";
  env.backend = "auto";
  try {
    Runtime runtime("auto", 0, env);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDriverNotFound);
    EXPECT_NE(std::string(e.what()).find("CUDA driver /nonexistent/libcuda.so.1 not found"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("HIP runtime /nonexistent/libamdhip64.so not found"), std::string::npos);
  }
  EXPECT_THROW(Runtime("opencl", 0, env), Error);
}

}  // namespace
}  // namespace megamoe
