// Device backends on a machine without GPUs: the HIP backend against the fake libamdhip64 (every Device call, and
// what a launch passes), and the CUDA backend's clean failure when the driver library is missing.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "TestSupport.h"
#include "megamoe/Backend.h"
#include "megamoe/Error.h"

namespace megamoe {
namespace {

TEST(CudaBackend, MissingDriverIsAClearError) {
  try {
    openBackend(BackendKind::kCuda, "/nonexistent/libcuda.so.1");
    FAIL() << "loading a nonexistent driver succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDriverNotFound);
    EXPECT_NE(std::string(e.what()).find("CUDA driver /nonexistent/libcuda.so.1 not found: "), std::string::npos)
        << e.what();
  }
}

TEST(CudaBackend, DefaultDriverLoadsOrFailsCleanly) {
  test::ScopedEnv unset("MEGAMOE_CUDA_LIBRARY", nullptr);
  try {
    auto backend = openBackend(BackendKind::kCuda);
    EXPECT_EQ(backend->libraryPath(), "libcuda.so.1");
    if (backend->deviceCount() == 0) GTEST_SKIP() << "no CUDA device: driver present, no devices";
    EXPECT_FALSE(backend->device(0)->target().empty());
  } catch (const Error& e) {
    // No driver (CI), or a driver without a usable device: a message, not a crash.
    EXPECT_TRUE(e.code() == ErrorCode::kDriverNotFound || e.code() == ErrorCode::kDriverError) << e.what();
    EXPECT_NE(std::string(e.what()).find("libcuda.so.1"), std::string::npos) << e.what();
    GTEST_SKIP() << "no CUDA device: " << e.what();
  }
}

TEST(CudaBackend, EnvironmentChoosesTheLibrary) {
  test::ScopedEnv path("MEGAMOE_CUDA_LIBRARY", "/nonexistent/from-env/libcuda.so.1");
  try {
    openBackend(BackendKind::kCuda);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/from-env/libcuda.so.1"), std::string::npos) << e.what();
  }
}

TEST(HipBackend, MissingLibraryIsAClearError) {
  test::ScopedEnv path("MEGAMOE_HIP_LIBRARY", "/nonexistent/libamdhip64.so");
  try {
    openBackend(BackendKind::kHip);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDriverNotFound);
    EXPECT_NE(std::string(e.what()).find("HIP runtime /nonexistent/libamdhip64.so not found: "), std::string::npos)
        << e.what();
  }
}

TEST(HipBackend, LibraryWithoutTheEntryPointsIsRejected) {
  // Any real shared library lacking HIP symbols: the C library itself.
  try {
    openBackend(BackendKind::kHip, "libc.so.6");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDriverNotFound);
    EXPECT_NE(std::string(e.what()).find("does not export hipGetErrorName"), std::string::npos) << e.what();
  }
}

class HipFake : public ::testing::Test {
 protected:
  void SetUp() override {
    backend = openBackend(BackendKind::kHip, test::FakeHip::path());
    device = backend->device(0);
  }
  std::shared_ptr<Backend> backend;
  std::shared_ptr<Device> device;
  test::FakeHip& fake = test::FakeHip::get();
};

TEST_F(HipFake, EnumeratesDevices) {
  EXPECT_EQ(backend->kind(), BackendKind::kHip);
  EXPECT_EQ(backend->deviceCount(), 4);
  EXPECT_EQ(device->target(), "gfx950");
  EXPECT_EQ(device->name(), "Fake gfx950 #0");
  EXPECT_EQ(backend->device(0).get(), device.get()) << "one Device per ordinal";
  try {
    backend->device(4);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HIP device 4 does not exist (4 visible)"), std::string::npos);
  }
  EXPECT_EQ(openBackend(BackendKind::kHip, test::FakeHip::path()).get(), backend.get()) << "loaded once";
}

// Each call makes its device current and gives the caller's current device back: a process that drives several
// GPUs (torch on another device, createLocal over many) keeps its own.
TEST_F(HipFake, CallsLeaveTheCallersCurrentDevice) {
  ASSERT_EQ(fake.setDevice(0), 0);
  std::shared_ptr<Device> other = backend->device(2);
  const DevicePtr p = other->allocate(64);
  StreamHandle stream = other->createStream();
  other->memsetZero(p, 64, stream);
  other->synchronize(stream);
  other->destroyStream(stream);
  other->free(p);
  int current = -1;
  ASSERT_EQ(fake.getDevice(&current), 0);
  EXPECT_EQ(current, 0);
}

TEST_F(HipFake, MemoryRoundTripsSyncAndAsync) {
  const size_t n = 1000;
  std::vector<uint32_t> in(n), out(n, 0);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint32_t>(i * 2654435761u);
  const int liveBefore = fake.liveAllocations();
  const DevicePtr a = device->allocate(n * 4);
  const DevicePtr b = device->allocate(n * 4);
  EXPECT_EQ(fake.liveAllocations(), liveBefore + 2);
  device->copyHostToDevice(a, in.data(), n * 4);
  device->copyDeviceToDevice(b, a, n * 4);
  device->copyDeviceToHost(out.data(), b, n * 4);
  EXPECT_EQ(in, out);

  StreamHandle stream = device->createStream();
  std::fill(out.begin(), out.end(), 0);
  device->memsetZero(a, n * 4, stream);
  device->copyHostToDeviceAsync(b, in.data(), n * 4, stream);
  device->copyDeviceToDeviceAsync(a, b, n * 2, stream);
  device->copyDeviceToHostAsync(out.data(), a, n * 4, stream);
  device->synchronize(stream);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i < n / 2 ? in[i] : 0u) << i;
  device->destroyStream(stream);

  device->free(a);
  device->free(b);
  EXPECT_EQ(fake.liveAllocations(), liveBefore);
  EXPECT_THROW(device->allocate(0), Error);
}

TEST_F(HipFake, EventsMeasureElapsedTime) {
  EventHandle start = device->createEvent(), end = device->createEvent();
  device->recordEvent(start, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  device->recordEvent(end, nullptr);
  device->synchronizeEvent(end);
  EXPECT_GE(device->elapsedMilliseconds(start, end), 15.0f);
  device->destroyEvent(start);
  device->destroyEvent(end);
}

TEST_F(HipFake, LaunchPassesDimsSharedBytesStreamAndParams) {
  const auto image = test::fakeImage("FAKEHIP\nscale 3\nother 1\n");
  ModuleHandle module = device->loadModule(image.data(), image.size());
  FunctionHandle function = device->getFunction(module, "scale");
  StreamHandle stream = device->createStream();
  uint64_t a = 0x1234, b = 0xdeadbeefcafe;
  double c = 2.5;
  void* params[] = {&a, &b, &c};
  LaunchDims dims;
  dims.grid = {132, 2, 1};
  dims.block = {256, 1, 1};
  dims.sharedBytes = 160 * 1024;
  const int before = fake.launchCount();
  device->launch(function, dims, stream, params);
  ASSERT_EQ(fake.launchCount(), before + 1);
  const FakeHipLaunch l = fake.lastLaunch();
  EXPECT_STREQ(l.name, "scale");
  EXPECT_EQ(l.grid[0], 132u);
  EXPECT_EQ(l.grid[1], 2u);
  EXPECT_EQ(l.block[0], 256u);
  EXPECT_EQ(l.sharedBytes, 160u * 1024);
  EXPECT_EQ(l.stream, stream);
  ASSERT_EQ(l.nparams, 3);
  EXPECT_EQ(l.params[0], a);
  EXPECT_EQ(l.params[1], b);
  double seen = 0;
  std::memcpy(&seen, &l.params[2], sizeof seen);
  EXPECT_EQ(seen, c);

  dims.cluster = {2, 1, 1};
  try {
    device->launch(function, dims, stream, params);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  dims.cluster = {0, 0, 0};
  dims.grid.x = 0;
  EXPECT_THROW(device->launch(function, dims, stream, params), Error);
  device->destroyStream(stream);
  device->unloadModule(module);
}

TEST_F(HipFake, DriverErrorsNameTheCallAndTheDriversText) {
  const auto junk = test::fakeImage("ELF?");
  try {
    device->loadModule(junk.data(), junk.size());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDriverError);
    EXPECT_NE(std::string(e.what()).find("hipModuleLoadData(5 bytes) on device 0 failed: hipErrorInvalidImage (200): "
                                         "device kernel image is invalid"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(HipFake, PeerAccessIsIdempotent) {
  auto peer = backend->device(3);
  EXPECT_TRUE(device->canAccessPeer(*peer));
  device->enablePeerAccess(*peer);
  device->enablePeerAccess(*peer);  // "already enabled" is success
  EXPECT_EQ(fake.peerEnabled(0, 3), 1);
}

TEST_F(HipFake, IpcHandlesRoundTrip) {
  const DevicePtr mine = device->allocate(4096);
  const IpcHandle handle = device->exportIpcHandle(mine);
  // The fake maps the same memory again, as a peer process would.
  const DevicePtr mapped = backend->device(1)->openIpcHandle(handle);
  EXPECT_NE(mapped, mine);
  const uint64_t value = 0x5151;
  device->copyHostToDevice(mine + 64, &value, sizeof value);
  uint64_t seen = 0;
  backend->device(1)->copyDeviceToHost(&seen, mapped + 64, sizeof seen);
  EXPECT_EQ(seen, value);
  backend->device(1)->closeIpcHandle(mapped);
  device->free(mine);
}

}  // namespace
}  // namespace megamoe
