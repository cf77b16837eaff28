// Runtime over the fake HIP backend: kernel load from a temp cache, launch checks, and the unusable-heap refusal
// after a (fake) kernel reported a cross-rank wait timeout.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

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
    key.fingerprint = test::ourFingerprint("fp");
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

// A cache-only runtime never writes, so a read-only cache (a read-only mount, another user's cache) must serve it.
// Root ignores file modes, so the child drops to uid 65534 as well as the tree being made read-only.
TEST(Runtime, ReadOnlyCacheServesACacheOnlyRuntime) {
  test::TempDir dir;
  cache::KernelKey key;
  key.kernel = "probe";
  key.spec = {{"N", 4}};
  key.target = "gfx950";
  key.fingerprint = test::ourFingerprint("fp");
  cache::KernelCache(dir.path())
      .store(key, test::fakeImage("FAKEHIP\nfake_report_timeout 1\n"),
             R"({"symbol":"fake_report_timeout","block_threads":128,"shared_bytes":4096})");
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path()))
    ::chmod(entry.path().c_str(), entry.is_directory() ? 0555 : 0444);
  ::chmod(dir.path().c_str(), 0555);

  test::Child child([&]() -> std::string {
    // Loaded while still root: the build tree may sit in a folder uid 65534 cannot enter (a mktemp -d clone), and
    // the backend's dlopen of the same path then finds it loaded.
    test::FakeHip::get();
    if (::geteuid() == 0 && (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0))
      return std::string("SKIP: cannot drop root privileges to uid 65534: ") + std::strerror(errno);
    const std::string probe = dir.file("write-probe");
    if (const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600); fd >= 0) {
      ::close(fd);
      return "SKIP: the read-only cache is still writable here";
    }
    RuntimeEnv env = parseEnv();
    env.hipLibrary = test::FakeHip::path();
    env.cacheDir = dir.path();
    Runtime runtime(BackendKind::kHip, 0, env);
    cache::KernelKey wanted = key;
    wanted.fingerprint.clear();  // cache-only: any fingerprint
    return "loaded " + std::to_string(runtime.loadKernel(wanted, "")->metadata().blockThreads);
  });
  const test::ChildOutcome outcome = child.wait(60);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path()))
    ::chmod(entry.path().c_str(), entry.is_directory() ? 0755 : 0644);
  ::chmod(dir.path().c_str(), 0700);
  ASSERT_TRUE(outcome.finished);
  if (outcome.ok && outcome.text.rfind("SKIP: ", 0) == 0) GTEST_SKIP() << outcome.text.substr(6);
  EXPECT_TRUE(outcome.ok) << outcome.text;
  EXPECT_EQ(outcome.text, "loaded 128");
}

}  // namespace
}  // namespace megamoe
