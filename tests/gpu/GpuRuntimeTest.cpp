// GPU tier for the runtime: real CUDA memory, streams, events, module loading (PTX through the driver's JIT), launch
// with more than 48 KB of dynamic shared memory and with clusters, a kernel-reported device error, and at 2 and 8
// ranks (GpuRuntimeRanks.*/Ranks2, /Ranks8; rank r on GPU r % deviceCount, so ranks share a GPU when there are fewer)
// the single-process symmetric heap and the multi-process heap over CUDA IPC (processes on one GPU map each other's
// memory too). Skips, saying why, where there is no CUDA device; never for too few GPUs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "GpuTestSupport.h"
#include "compiler/abi/DeviceAbi.h"
#include "megamoe/Runtime.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {
namespace {

// nvcc -ptx -arch=compute_90 of two small kernels (.version lowered to 8.0 so that CUDA 12 drivers JIT it). No
// declaration (compiler/abi/KernelAbi.h) names them, so their launches pass positional parameter arrays:
//   megamoe_test_fill(unsigned* out, unsigned value, unsigned n): out[i] = value + i through dynamic shared memory.
//   megamoe_test_report_timeout(const DeviceContext*, uint64 flag): the last block claims the DeviceError record by
//     CAS and reports a wait timeout on `flag` (seen 3, expected 4), as the bounded-wait helper does.
const char* kTestPtx = R"PTX(.version 8.0
.target sm_90
.address_size 64

	// .globl	megamoe_test_fill
.extern .shared .align 16 .b8 stage[];

.visible .entry megamoe_test_fill(
	.param .u64 megamoe_test_fill_param_0,
	.param .u32 megamoe_test_fill_param_1,
	.param .u32 megamoe_test_fill_param_2
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<12>;
	.reg .b64 	%rd<5>;


	ld.param.u64 	%rd1, [megamoe_test_fill_param_0];
	ld.param.u32 	%r3, [megamoe_test_fill_param_1];
	ld.param.u32 	%r4, [megamoe_test_fill_param_2];
	mov.u32 	%r5, %ctaid.x;
	mov.u32 	%r6, %ntid.x;
	mov.u32 	%r7, %tid.x;
	mad.lo.s32 	%r1, %r5, %r6, %r7;
	add.s32 	%r8, %r1, %r3;
	shl.b32 	%r9, %r7, 2;
	mov.u32 	%r10, stage;
	add.s32 	%r2, %r10, %r9;
	st.shared.u32 	[%r2], %r8;
	bar.sync 	0;
	setp.ge.u32 	%p1, %r1, %r4;
	@%p1 bra 	$L__BB0_2;

	cvta.to.global.u64 	%rd2, %rd1;
	ld.shared.u32 	%r11, [%r2];
	mul.wide.u32 	%rd3, %r1, 4;
	add.s64 	%rd4, %rd2, %rd3;
	st.global.u32 	[%rd4], %r11;

$L__BB0_2:
	ret;

}
	// .globl	megamoe_test_report_timeout
.visible .entry megamoe_test_report_timeout(
	.param .u64 megamoe_test_report_timeout_param_0,
	.param .u64 megamoe_test_report_timeout_param_1
)
{
	.reg .pred 	%p<5>;
	.reg .b32 	%r<5>;
	.reg .b64 	%rd<14>;


	ld.param.u64 	%rd3, [megamoe_test_report_timeout_param_0];
	ld.param.u64 	%rd4, [megamoe_test_report_timeout_param_1];
	mov.u32 	%r2, %tid.x;
	setp.ne.s32 	%p1, %r2, 0;
	mov.u32 	%r3, %nctaid.x;
	add.s32 	%r4, %r3, -1;
	mov.u32 	%r1, %ctaid.x;
	setp.ne.s32 	%p2, %r1, %r4;
	or.pred  	%p3, %p1, %p2;
	@%p3 bra 	$L__BB1_3;

	cvta.to.global.u64 	%rd5, %rd3;
	add.s64 	%rd1, %rd5, 88;
	ld.global.u64 	%rd2, [%rd5+88];
	mov.u64 	%rd6, 0;
	mov.u64 	%rd7, -1;
	atom.cas.b64 	%rd8, [%rd2], %rd6, %rd7;
	setp.ne.s64 	%p4, %rd8, 0;
	@%p4 bra 	$L__BB1_3;

	ld.global.u32 	%rd9, [%rd1+-16];
	st.u64 	[%rd2+8], %rd9;
	st.u64 	[%rd2+16], %rd4;
	mov.u64 	%rd10, 3;
	st.u64 	[%rd2+24], %rd10;
	mov.u64 	%rd11, 4;
	st.u64 	[%rd2+32], %rd11;
	cvt.u64.u32 	%rd12, %r1;
	st.u64 	[%rd2+40], %rd12;
	membar.sys;
	atom.exch.b64 	%rd13, [%rd2], 1;

$L__BB1_3:
	ret;

}

)PTX";

std::vector<uint8_t> ptxImage() {
  std::vector<uint8_t> bytes(kTestPtx, kTestPtx + std::strlen(kTestPtx) + 1);  // the driver wants the NUL
  return bytes;
}

// Rank r's device for `ranks` ranks: device r % deviceCount.
std::vector<std::shared_ptr<Device>> rankDevices(Backend& backend, int ranks) {
  std::vector<std::shared_ptr<Device>> devices;
  for (int r = 0; r < ranks; ++r) devices.push_back(backend.device(gputest::rankOrdinal(r, backend.deviceCount())));
  return devices;
}

TEST(GpuRuntime, MemoryCopiesStreamsAndEvents) {
  MEGAMOE_REQUIRE_CUDA(backend);
  auto device = backend->device(0);
  std::printf("device 0: %s (%s)\n", device->name().c_str(), device->target().c_str());
  const size_t n = 1 << 20;
  std::vector<uint32_t> in(n), out(n, 0);
  for (size_t i = 0; i < n; ++i) in[i] = static_cast<uint32_t>(i * 2654435761u + 17);
  const DevicePtr a = device->allocate(n * 4), b = device->allocate(n * 4);
  device->copyHostToDevice(a, in.data(), n * 4);
  device->copyDeviceToDevice(b, a, n * 4);
  device->copyDeviceToHost(out.data(), b, n * 4);
  EXPECT_EQ(in, out);

  StreamHandle stream = device->createStream();
  EventHandle start = device->createEvent(), end = device->createEvent();
  std::fill(out.begin(), out.end(), 1);
  device->recordEvent(start, stream);
  device->memsetZero(b, n * 4, stream);
  device->copyDeviceToDeviceAsync(b, a, n * 2, stream);
  device->copyDeviceToHostAsync(out.data(), b, n * 4, stream);
  device->recordEvent(end, stream);
  device->synchronize(stream);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], i < n / 2 ? in[i] : 0u) << i;
  EXPECT_GE(device->elapsedMilliseconds(start, end), 0.0f);
  device->destroyEvent(start);
  device->destroyEvent(end);
  device->destroyStream(stream);
  device->free(a);
  device->free(b);
}

TEST(GpuRuntime, LaunchWithLargeDynamicSharedMemoryAndClusters) {
  MEGAMOE_REQUIRE_CUDA(backend);
  auto device = backend->device(0);
  const auto image = ptxImage();
  ModuleHandle module = device->loadModule(image.data(), image.size());
  FunctionHandle fill = device->getFunction(module, "megamoe_test_fill");
  const uint32_t n = 1000 * 256;
  const DevicePtr out = device->allocate(n * 4);
  uint64_t outArg = out;
  uint32_t value = 7, count = n;
  void* params[] = {&outArg, &value, &count};
  StreamHandle stream = device->createStream();

  LaunchDims dims;
  dims.grid = {1000, 1, 1};
  dims.block = {256, 1, 1};
  dims.sharedBytes = 100 * 1024;  // above the 48 KB default: needs MAX_DYNAMIC_SHARED_SIZE
  device->launch(fill, dims, stream, params);
  std::vector<uint32_t> host(n);
  device->copyDeviceToHostAsync(host.data(), out, n * 4, stream);
  device->synchronize(stream);
  for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(host[i], 7 + i) << i;

  if (device->target() == "sm_90a") {
    value = 1000;
    dims.cluster = {2, 1, 1};
    dims.sharedBytes = 64 * 1024;
    device->launch(fill, dims, stream, params);
    device->copyDeviceToHostAsync(host.data(), out, n * 4, stream);
    device->synchronize(stream);
    for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(host[i], 1000 + i) << i;
  }
  EXPECT_THROW(device->getFunction(module, "no_such_kernel"), Error);
  device->destroyStream(stream);
  device->free(out);
  device->unloadModule(module);
}

// The tests over several ranks, at every count of gputest::kRankCounts.
class GpuRuntimeRanks : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(, GpuRuntimeRanks, ::testing::ValuesIn(gputest::kRankCounts), gputest::rankCountName);

TEST_P(GpuRuntimeRanks, SingleProcessHeapRoundTripsTheContext) {
  MEGAMOE_REQUIRE_CUDA(backend);
  auto devices = rankDevices(*backend, GetParam());
  RuntimeEnv env = parseEnv();
  env.waitTimeoutMs = 1234;
  const std::vector<RegionSpec> regions = {{"flags", 4096, 256}, {"pool", 64 << 20, 256}};
  auto heaps = SymmetricHeap::createSingleProcess(devices, regions, env);
  const int nranks = static_cast<int>(heaps.size());
  ASSERT_EQ(nranks, GetParam());
  std::printf("single-process heap of %s, %llu bytes each\n", gputest::placement(*backend, nranks).c_str(),
              static_cast<unsigned long long>(heaps[0]->layout().totalBytes()));
  for (int r = 0; r < nranks; ++r) {
    const SymmetricHeap& heap = *heaps[r];
    abi::DeviceContext ctx{};
    heap.device().copyDeviceToHost(&ctx, heap.contextAddress(), sizeof ctx);
    EXPECT_EQ(std::memcmp(&ctx, &heap.context(), sizeof ctx), 0) << "rank " << r;
    EXPECT_EQ(ctx.heap_base, heap.base());
    EXPECT_EQ(ctx.rank, static_cast<uint32_t>(r));
    EXPECT_EQ(ctx.nranks, static_cast<uint32_t>(nranks));
    EXPECT_EQ(ctx.timeout_ns, 1234ull * 1000 * 1000);
    EXPECT_EQ(ctx.error, heap.errorAddress());
    EXPECT_EQ(ctx.epoch, 0u);
    for (int p = 0; p < nranks; ++p) EXPECT_EQ(heap.base() + ctx.peer_offset[p], heaps[p]->base());
    abi::DeviceError err{};
    heap.device().copyDeviceToHost(&err, heap.errorAddress(), sizeof err);
    EXPECT_EQ(err.code, 0u);
    std::vector<uint8_t> flags(4096, 0xff);
    heap.device().copyDeviceToHost(flags.data(), heap.regionAddress("flags"), flags.size());
    EXPECT_EQ(std::count(flags.begin(), flags.end(), 0), 4096) << "rank " << r;
  }
  // Each rank writes into its right neighbour through the peer address (P2P over NVLink between GPUs; a plain device
  // pointer between ranks of one GPU).
  for (int r = 0; r < nranks; ++r) {
    const int peer = (r + 1) % nranks;
    const uint64_t value = 0xabc000 + r;
    const DevicePtr local = heaps[r]->regionAddress("pool") + 8 * r;
    heaps[r]->device().copyHostToDevice(heaps[r]->peerAddress(peer, local), &value, sizeof value);
  }
  for (int p = 0; p < nranks; ++p) {
    const int writer = (p + nranks - 1) % nranks;
    uint64_t seen = 0;
    heaps[p]->device().copyDeviceToHost(&seen, heaps[p]->regionAddress("pool") + 8 * writer, sizeof seen);
    EXPECT_EQ(seen, 0xabc000u + writer) << "rank " << p;
  }
  for (auto& heap : heaps) heap->checkErrors();
}

TEST(GpuRuntime, KernelReportedTimeoutMarksTheHeapUnusable) {
  MEGAMOE_REQUIRE_CUDA(backend);
  // The full path: cache entry -> KernelLoader -> module -> Runtime::launch with a heap -> checkErrors.
  const std::string cacheDir = (std::filesystem::temp_directory_path() / ("megamoe-gpu-" + std::to_string(::getpid()))).string();
  RuntimeEnv env = parseEnv();
  env.cacheDir = cacheDir;
  env.cacheAnyGenerator = true;  // the entry below is written by hand: its fingerprint names no kernel generator
  Runtime runtime(BackendKind::kCuda, 0, env);
  cache::KernelKey key;
  key.kernel = "test_report_timeout";
  key.target = runtime.device()->target();
  key.fingerprint = "gpu-test";
  cache::KernelCache(cacheDir).store(key, ptxImage(),
                                     R"({"symbol":"megamoe_test_report_timeout","block_threads":32,"shared_bytes":0})");
  key.fingerprint.clear();
  auto kernel = runtime.loadKernel(key, "");
  auto heaps = SymmetricHeap::createSingleProcess({runtime.device()}, {{"flags", 256, 256}}, env);
  SymmetricHeap& heap = *heaps[0];
  uint64_t ctx = heap.contextAddress(), flag = 7;
  void* params[] = {&ctx, &flag};
  LaunchDims dims;
  dims.grid = {4, 1, 1};
  dims.block = {32, 1, 1};
  runtime.launch(*kernel, dims, nullptr, params, &heap);
  try {
    heap.checkErrors(nullptr);
    ADD_FAILURE() << "the kernel's report was not seen";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeviceError);
    EXPECT_STREQ(e.what(), "rank 0: cross-rank wait timed out on flag 7 (seen 3, expected 4) in block 3; the "
                           "symmetric heap is now marked unusable");
  }
  EXPECT_THROW(runtime.launch(*kernel, dims, nullptr, params, &heap), Error);
  std::error_code ignored;
  std::filesystem::remove_all(cacheDir, ignored);
}

// ---- Mode B: one process per rank over CUDA IPC. The test re-executes this binary as workers (fork+exec through
// gputest::runSelfWorkers: a process that has initialised CUDA must not use it in a plain fork()ed child).

int runModeBWorker(int rank, int nranks, const std::string& path) {
  try {
    auto backend = openBackend(BackendKind::kCuda);
    auto device = backend->device(rank % backend->deviceCount());
    auto heap = SymmetricHeap::createMultiProcess(device, {{"flags", 4096, 256}, {"pool", 1 << 20, 256}}, rank,
                                                  nranks, path, parseEnv());
    for (int p = 0; p < nranks; ++p) {
      abi::DeviceContext peer{};
      device->copyDeviceToHost(&peer, heap->peerAddress(p, heap->contextAddress()), sizeof peer);
      if (peer.rank != static_cast<uint32_t>(p) || peer.nranks != static_cast<uint32_t>(nranks)) {
        std::fprintf(stderr, "rank %d: peer %d's context reads rank %u of %u\n", rank, p, peer.rank, peer.nranks);
        return 1;
      }
    }
    heap->checkErrors();
    heap.reset();
    std::printf("rank %d: mapped %d peer heap(s) over IPC and tore down\n", rank, nranks - 1);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
}

// One process per rank, rank r on device r % deviceCount: CUDA IPC works between processes on the same device too.
TEST_P(GpuRuntimeRanks, MultiProcessHeapOverIpc) {
  MEGAMOE_REQUIRE_CUDA(backend);
  const int nranks = GetParam();
  const std::string path =
      "/tmp/megamoe-gpu-ipc-" + std::to_string(::getpid()) + "-" + std::to_string(nranks) + ".sock";
  std::vector<std::vector<std::string>> workers;
  for (int r = 0; r < nranks; ++r)
    workers.push_back({"--mode-b-worker", std::to_string(r), std::to_string(nranks), path});
  std::vector<gputest::WorkerExit> exits;
  if (!gputest::runSelfWorkers(workers, std::chrono::seconds(120), std::chrono::milliseconds(50), &exits)) return;
  for (size_t r = 0; r < exits.size(); ++r) {
    if (exits[r].hung) ADD_FAILURE() << "rank " << r << " hung";
    else EXPECT_TRUE(exits[r].succeeded()) << "rank " << r << " failed (see its stderr)";
  }
}

// DSL kernel tests (dispatch_grouped_gemm, grouped_gemm_combine, swiglu, ...) go in tests/gpu/kernels/, one file
// per operator, using MEGAMOE_REQUIRE_CUDA and the Runtime above; see tests/gpu/CMakeLists.txt.

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) {
  megamoe::gputest::initGpuTestProcess();
  if (argc == 5 && std::strcmp(argv[1], "--mode-b-worker") == 0)
    return megamoe::runModeBWorker(std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
