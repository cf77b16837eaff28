// GPU tier for the compute kernels (swiglu_fwd, gemm_nt[_fp8], grouped_gemm_nt_fp8, grouped_gemm_{nt,nn,tn}_tma) and
// topk_idx_narrow loaded from the kernel cache: fresh random inputs, a host reference (higher precision for the compute
// kernels), sentinel-filled outputs checked fully written, and a second launch that must be bitwise identical. Skips
// without a CUDA device; the cache comes from scripts/gen-gpu-test-cache.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "megamoe/KernelArgs.h"
#include "megamoe/Runtime.h"

namespace megamoe {
namespace {

using namespace gputest;

// Launch geometry constants of the specs in kernels/Kernels.h (not included: it pulls in MLIR).
constexpr int64_t kSwigluVector = 8, kSwigluBlockThreads = 256;
constexpr int64_t kGemmBlockM = 64, kGemmBlockN = 128, kGemmBlockThreads = 128;

constexpr uint16_t kSentinel = 0xFFFF;  // a NaN: no output of these kernels on finite inputs is one

// ‖out − ref‖ / ‖ref‖ over the given elements; NaN anywhere makes it NaN, which fails every `<=`.
struct ErrorNorm {
  double diff2 = 0, ref2 = 0;
  void add(double out, double ref) {
    diff2 += (out - ref) * (out - ref);
    ref2 += ref * ref;
  }
  double relative() const { return std::sqrt(diff2) / std::sqrt(ref2); }
};

// Device memory freed on scope exit.
class Buffer {
 public:
  Buffer(Device& device, size_t bytes) : device_(device), bytes_(bytes), ptr_(device.allocate(bytes)) {}
  ~Buffer() { device_.free(ptr_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  DevicePtr ptr() const { return ptr_; }
  template <typename T>
  void upload(const std::vector<T>& host) {
    ASSERT_LE(host.size() * sizeof(T), bytes_);
    uploadAndWait(device_, ptr_, host.data(), host.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> download() {
    std::vector<T> host(bytes_ / sizeof(T));
    device_.copyDeviceToHost(host.data(), ptr_, host.size() * sizeof(T));
    return host;
  }
  void poison() { upload(std::vector<uint16_t>(bytes_ / 2, kSentinel)); }

 private:
  Device& device_;
  size_t bytes_;
  DevicePtr ptr_;
};

// The runtime on device 0 and a stream, or a skip with the reason.
struct Gpu {
  std::unique_ptr<Runtime> runtime;
  StreamHandle stream = nullptr;
  Device& device() const { return *runtime->device(); }
  ~Gpu() {
    if (runtime && stream) runtime->device()->destroyStream(stream);
  }
};

#define MEGAMOE_REQUIRE_SM90A(gpu)                                                                     \
  MEGAMOE_REQUIRE_CUDA(backend_);                                                                      \
  Gpu gpu;                                                                                             \
  gpu.runtime = std::make_unique<Runtime>(BackendKind::kCuda, 0, parseEnv());                          \
  if (gpu.device().target() != kTarget)                                                                \
    GTEST_SKIP() << "the test cache holds sm_90a code; device 0 is " << gpu.device().target();         \
  gpu.stream = gpu.device().createStream()

// One launch into a sentinel-filled output, waited for, the output read back.
std::vector<uint16_t> launchPoisoned(Gpu& gpu, const Kernel& kernel, const LaunchDims& dims, KernelArgs& args,
                                     Buffer& out) {
  out.poison();
  gpu.runtime->launch(kernel, dims, gpu.stream, args);
  gpu.device().synchronize(gpu.stream);
  return out.download<uint16_t>();
}

// Elements [0, valid) must be written, [valid, end) left at the sentinel (a guard past the output).
struct Written {
  size_t unwritten = 0, guardTouched = 0;
};
Written checkWritten(const std::vector<uint16_t>& out, int64_t valid, int64_t end, const char* guard) {
  Written w;
  for (int64_t i = 0; i < valid; ++i) w.unwritten += out[size_t(i)] == kSentinel;
  for (int64_t i = valid; i < end; ++i) w.guardTouched += out[size_t(i)] != kSentinel;
  EXPECT_EQ(w.unwritten, 0u) << "outputs left at the sentinel";
  EXPECT_EQ(w.guardTouched, 0u) << "elements written past " << guard;
  return w;
}

// ---------------------------------------------------------------------------------------------------- swiglu_fwd

struct SwigluCase {
  int64_t rows, intermediate, clampMilli;
  float inputScale;
};

// out = silu(gate) * up from the same bf16 inputs, in double, with the kernel's clamp (gate <= L, |up| <= L).
double swigluReference(float gate, float up, double limit) {
  double g = gate, u = up;
  if (limit > 0) {
    g = std::min(g, limit);
    u = std::clamp(u, -limit, limit);
  }
  return g / (1.0 + std::exp(-g)) * u;
}

void runSwiglu(Gpu& gpu, const SwigluCase& c) {
  std::mt19937 rng = testRng();
  const int64_t m = c.rows, inter = c.intermediate;
  auto kernel = loadKernel(*gpu.runtime, "swiglu_fwd", {{"I", inter}, {"clamp_milli", c.clampMilli}});
  ASSERT_EQ(kernel->metadata().blockThreads, kSwigluBlockThreads);

  const std::vector<uint16_t> h = randomBf16(rng, size_t(m * 2 * inter), c.inputScale);  // [M, 2I]: gate | up
  Buffer hDev(gpu.device(), h.size() * 2);
  hDev.upload(h);
  Buffer out(gpu.device(), size_t((m + 1) * inter) * 2);  // one guard row past the end

  KernelArgs args("swiglu_fwd");
  args.ptr("h", hDev.ptr()).ptr("out", out.ptr()).i32("rows", m);
  LaunchDims dims;
  const int64_t vectors = m * inter / kSwigluVector;
  dims.grid.x = static_cast<uint32_t>((vectors + kSwigluBlockThreads - 1) / kSwigluBlockThreads);
  dims.block.x = static_cast<uint32_t>(kSwigluBlockThreads);
  auto launchOnce = [&] { return launchPoisoned(gpu, *kernel, dims, args, out); };
  const std::vector<uint16_t> first = launchOnce();
  const Written written = checkWritten(first, m * inter, (m + 1) * inter, "row M");

  const double limit = double(c.clampMilli) / 1000.0;
  ErrorNorm err, unclamped;
  size_t clampedInputs = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const float g = fromBf16(h[size_t(r * 2 * inter + i)]), u = fromBf16(h[size_t(r * 2 * inter + inter + i)]);
      const double got = fromBf16(first[size_t(r * inter + i)]);
      err.add(got, swigluReference(g, u, limit));
      unclamped.add(got, swigluReference(g, u, 0));
      clampedInputs += limit > 0 && (g > limit || std::fabs(u) > limit);
    }
  EXPECT_LE(err.relative(), 1e-2);
  if (limit > 0) {
    // The clamp must matter on these inputs, or this case would not test it.
    EXPECT_GT(clampedInputs, size_t(m * inter / 10));
    EXPECT_GT(unclamped.relative(), 0.1) << "the output does not depend on the clamp";
  }

  const std::vector<uint16_t> second = launchOnce();
  const bool identical = first == second;
  EXPECT_TRUE(identical) << "the second launch differs bitwise from the first";
  std::printf("SUMMARY swiglu_fwd I=%lld clamp_milli=%lld M=%lld scale=%g: rel_err=%.3e%s unwritten=%zu "
              "guard_touched=%zu rerun=%s\n",
              (long long)inter, (long long)c.clampMilli, (long long)m, c.inputScale, err.relative(),
              limit > 0 ? (" clamped_inputs=" + std::to_string(clampedInputs) + " err_vs_unclamped=" +
                           std::to_string(unclamped.relative())).c_str()
                        : "",
              written.unwritten, written.guardTouched, identical ? "identical" : "DIFFERENT");
}

TEST(GpuKernels, SwigluI2048M777) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runSwiglu(gpu, {777, 2048, 0, 1.f});
}

TEST(GpuKernels, SwigluI2048M1) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runSwiglu(gpu, {1, 2048, 0, 1.f});
}

TEST(GpuKernels, SwigluClamp7M777) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runSwiglu(gpu, {777, 2048, 7000, 10.f});  // inputs x10, so that |x| > 7 is common
}

// ---------------------------------------------------------------------------------------------------- gemm_nt

struct GemmCase {
  int64_t n, k, m;
  int checkRows;  // 0: every row against the reference; else this many random rows
  bool time;
};

// The one-expert GEMMs' launch: a block per 64 x 128 tile of C [M, N].
LaunchDims gemmDims(int64_t n, int64_t m) {
  LaunchDims dims;
  dims.grid = {static_cast<uint32_t>(n / kGemmBlockN), static_cast<uint32_t>((m + kGemmBlockM - 1) / kGemmBlockM), 1};
  dims.block.x = static_cast<uint32_t>(kGemmBlockThreads);
  return dims;
}
// Rows of C allocated for M rows: a whole spare tile of rows past M, which the kernel must leave at the sentinel.
int64_t gemmRowsAllocated(int64_t m) { return ((m + kGemmBlockM - 1) / kGemmBlockM + 1) * kGemmBlockM; }

// Counts (and expects none of) C's elements of rows < M left at the sentinel and of rows >= M written.
std::pair<size_t, size_t> expectOnlyRowsBelowMWritten(const std::vector<uint16_t>& c, int64_t m, int64_t n) {
  size_t unwritten = 0, pastM = 0;
  for (int64_t i = 0; i < m * n; ++i) unwritten += c[size_t(i)] == kSentinel;
  for (int64_t i = m * n; i < gemmRowsAllocated(m) * n; ++i) pastM += c[size_t(i)] != kSentinel;
  EXPECT_EQ(unwritten, 0u) << "outputs of rows < M left at the sentinel";
  EXPECT_EQ(pastM, 0u) << "elements written in rows >= M";
  return {unwritten, pastM};
}

// Every row (checkRows 0) or that many random ones.
std::vector<int64_t> rowsToCheck(int64_t m, int checkRows, std::mt19937& rng) {
  std::vector<int64_t> all(static_cast<size_t>(m));
  for (int64_t r = 0; r < m; ++r) all[size_t(r)] = r;
  if (checkRows == 0) return all;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(size_t(std::min<int64_t>(checkRows, m)));
  return all;
}

// " median_ms=... tflops=..." of 10 timed launches after 3 warm-up ones, for a GEMM of `flops`.
std::string timeGemm(Gpu& gpu, const Kernel& kernel, const LaunchDims& dims, KernelArgs& args, double flops) {
  EventHandle start = gpu.device().createEvent(), end = gpu.device().createEvent();
  for (int i = 0; i < 3; ++i) gpu.runtime->launch(kernel, dims, gpu.stream, args);
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    gpu.device().recordEvent(start, gpu.stream);
    gpu.runtime->launch(kernel, dims, gpu.stream, args);
    gpu.device().recordEvent(end, gpu.stream);
    gpu.device().synchronizeEvent(end);
    ms.push_back(gpu.device().elapsedMilliseconds(start, end));
  }
  gpu.device().destroyEvent(start);
  gpu.device().destroyEvent(end);
  const float median = medianMs(ms);
  char text[128];
  std::snprintf(text, sizeof text, " median_ms=%.4f tflops=%.1f", median, flops / (median * 1e-3) / 1e12);
  return text;
}

void runGemm(Gpu& gpu, const GemmCase& c) {
  std::mt19937 rng = testRng();
  const int64_t n = c.n, k = c.k, m = c.m;
  auto kernel = loadKernel(*gpu.runtime, "gemm_nt", {{"N", n}, {"K", k}});
  ASSERT_EQ(kernel->metadata().blockThreads, kGemmBlockThreads);
  ASSERT_EQ(n % kGemmBlockN, 0);

  const std::vector<uint16_t> a = randomBf16(rng, size_t(m * k)), b = randomBf16(rng, size_t(n * k));
  Buffer aDev(gpu.device(), a.size() * 2), bDev(gpu.device(), b.size() * 2);
  aDev.upload(a);
  bDev.upload(b);
  Buffer cDev(gpu.device(), size_t(gemmRowsAllocated(m) * n) * 2);

  KernelArgs args("gemm_nt");
  args.ptr("a", aDev.ptr()).ptr("b", bDev.ptr()).ptr("c", cDev.ptr()).i32("m", m);
  const LaunchDims dims = gemmDims(n, m);
  auto launchOnce = [&] {
    cDev.poison();
    gpu.runtime->launch(*kernel, dims, gpu.stream, args);
    gpu.device().synchronize(gpu.stream);
    return cDev.download<uint16_t>();
  };
  const std::vector<uint16_t> first = launchOnce();
  const auto [unwritten, pastM] = expectOnlyRowsBelowMWritten(first, m, n);
  const std::vector<int64_t> rows = rowsToCheck(m, c.checkRows, rng);
  std::vector<float> bf(b.size());
  for (size_t i = 0; i < b.size(); ++i) bf[i] = fromBf16(b[i]);
  std::vector<float> arow(static_cast<size_t>(k));
  ErrorNorm err;
  for (int64_t r : rows) {
    for (int64_t x = 0; x < k; ++x) arow[size_t(x)] = fromBf16(a[size_t(r * k + x)]);
    for (int64_t col = 0; col < n; ++col) {
      const float* brow = &bf[size_t(col * k)];
      double acc[4] = {0, 0, 0, 0};  // fp64 reference, four chains so that it is not one long dependency
      for (int64_t x = 0; x < k; x += 4)
        for (int j = 0; j < 4; ++j) acc[j] += double(arow[size_t(x + j)]) * brow[x + j];
      err.add(fromBf16(first[size_t(r * n + col)]), acc[0] + acc[1] + acc[2] + acc[3]);
    }
  }
  EXPECT_LE(err.relative(), 1e-2);

  const std::vector<uint16_t> second = launchOnce();
  const bool identical = first == second;
  EXPECT_TRUE(identical) << "the second launch differs bitwise from the first";

  const double flops = 2.0 * double(m) * double(n) * double(k);
  const std::string timing = c.time ? timeGemm(gpu, *kernel, dims, args, flops) : "";
  std::printf("SUMMARY gemm_nt N=%lld K=%lld M=%lld: rel_err=%.3e over %zu rows unwritten=%zu "
              "written_past_M=%zu rerun=%s%s\n",
              (long long)n, (long long)k, (long long)m, err.relative(), rows.size(), unwritten, pastM,
              identical ? "identical" : "DIFFERENT", timing.c_str());
}

TEST(GpuKernels, GemmNtSmallM1) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGemm(gpu, {256, 128, 1, 0, false});
}

TEST(GpuKernels, GemmNtSmallM130) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGemm(gpu, {256, 128, 130, 0, false});  // 130 = 2 * 64 + 2: a last tile with two valid rows
}

TEST(GpuKernels, GemmNtDeepSeekV3L1) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGemm(gpu, {4096, 7168, 1000, 48, true});
}

TEST(GpuKernels, GemmNtDeepSeekV3L2) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGemm(gpu, {7168, 2048, 1000, 48, true});
}

// ------------------------------------------------------------------------------------------------ gemm_nt_fp8

// Random positive block scales: |e4m3| <= 448, so products stay well inside f32.
std::vector<float> randomScales(std::mt19937& rng, size_t count) {
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  std::vector<float> out(count);
  for (auto& v : out) v = u(rng) / 64;
  return out;
}
// C = sum over K blocks of (A_kb B_kb^T) a_scales[row, kb] b_scales[n / 128, kb] against an fp64 reference over the
// dequantised operands: random finite e4m3 codes (no NaN) and random positive scales.
void runGemmFp8(Gpu& gpu, const GemmCase& c) {
  std::mt19937 rng = testRng();
  const int64_t n = c.n, k = c.k, m = c.m, kBlocks = k / 128;
  auto kernel = loadKernel(*gpu.runtime, "gemm_nt_fp8", {{"N", n}, {"K", k}});
  ASSERT_EQ(kernel->metadata().blockThreads, kGemmBlockThreads);
  ASSERT_EQ(n % 128, 0);
  ASSERT_EQ(k % 128, 0);
  const std::vector<uint8_t> a = randomE4m3(rng, size_t(m * k)), b = randomE4m3(rng, size_t(n * k));
  const std::vector<float> sa = randomScales(rng, size_t(m * kBlocks)),
                           sb = randomScales(rng, size_t(n / 128 * kBlocks));
  Buffer aDev(gpu.device(), a.size()), bDev(gpu.device(), b.size());
  Buffer saDev(gpu.device(), sa.size() * 4), sbDev(gpu.device(), sb.size() * 4);
  aDev.upload(a);
  bDev.upload(b);
  saDev.upload(sa);
  sbDev.upload(sb);
  Buffer cDev(gpu.device(), size_t(gemmRowsAllocated(m) * n) * 2);

  KernelArgs args("gemm_nt_fp8");
  args.ptr("a", aDev.ptr()).ptr("a_scales", saDev.ptr()).ptr("b", bDev.ptr()).ptr("b_scales", sbDev.ptr());
  args.ptr("c", cDev.ptr()).i32("m", m);
  const LaunchDims dims = gemmDims(n, m);
  auto launchOnce = [&] {
    cDev.poison();
    gpu.runtime->launch(*kernel, dims, gpu.stream, args);
    gpu.device().synchronize(gpu.stream);
    return cDev.download<uint16_t>();
  };
  const std::vector<uint16_t> first = launchOnce();
  const auto [unwritten, pastM] = expectOnlyRowsBelowMWritten(first, m, n);
  const std::vector<int64_t> rows = rowsToCheck(m, c.checkRows, rng);
  std::vector<double> bd(b.size());
  for (int64_t col = 0; col < n; ++col)
    for (int64_t x = 0; x < k; ++x)
      bd[size_t(col * k + x)] = fromE4m3(b[size_t(col * k + x)]) * sb[size_t(col / 128 * kBlocks + x / 128)];
  ErrorNorm err;
  std::vector<double> arow(static_cast<size_t>(k));
  for (int64_t r : rows) {
    for (int64_t x = 0; x < k; ++x)
      arow[size_t(x)] = fromE4m3(a[size_t(r * k + x)]) * sa[size_t(r * kBlocks + x / 128)];
    for (int64_t col = 0; col < n; ++col) {
      double acc = 0;
      for (int64_t x = 0; x < k; ++x) acc += arow[size_t(x)] * bd[size_t(col * k + x)];
      err.add(fromBf16(first[size_t(r * n + col)]), acc);
    }
  }
  EXPECT_LE(err.relative(), 1e-2);
  const bool identical = first == launchOnce();
  EXPECT_TRUE(identical) << "the second launch differs bitwise from the first";

  const double flops = 2.0 * double(m) * double(n) * double(k);
  const std::string timing = c.time ? timeGemm(gpu, *kernel, dims, args, flops) : "";
  std::printf("SUMMARY gemm_nt_fp8 N=%lld K=%lld M=%lld: rel_err=%.3e over %zu rows unwritten=%zu "
              "written_past_M=%zu rerun=%s%s\n",
              (long long)n, (long long)k, (long long)m, err.relative(), rows.size(), unwritten, pastM,
              identical ? "identical" : "DIFFERENT", timing.c_str());
}

TEST(GpuKernels, GemmNtFp8SmallM130) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGemmFp8(gpu, {256, 128, 130, 0, false});  // one K block; a last tile with two valid rows
}

TEST(GpuKernels, GemmNtFp8DeepSeekV3L1) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGemmFp8(gpu, {4096, 7168, 1000, 24, true});  // 56 K blocks, each promoted with its scales
}

// ------------------------------------------------------------------------------------------ grouped_gemm_nt_fp8

// grouped_gemm_nt_fp8 (kernels/Kernels.h) over E groups of random sizes (1..maxRows rows; groups 2 and 5 empty, or
// `sizes`): C [rows, N] against an fp64 reference over the dequantised operands (every row, or checkRows random
// ones), a guard row past the last group left at the sentinel, a bitwise identical rerun, the tickets left zero;
// timed where `time` (TF/s over the rows' 2 M N K).
void runGroupedGemmFp8(Gpu& gpu, int64_t E, int64_t N, int64_t K, int32_t maxRows, int32_t grid = 0,
                       int checkRows = 0, bool time = false, const std::vector<int32_t>& sizes = {}) {
  std::mt19937 rng = testRng();
  std::vector<int32_t> offsets{0};
  std::uniform_int_distribution<int32_t> size(1, std::max(maxRows, 1));
  for (int64_t e = 0; e < E; ++e)
    offsets.push_back(offsets.back() + (!sizes.empty() ? sizes.at(size_t(e)) : e == 2 || e == 5 ? 0 : size(rng)));
  const int64_t rows = offsets.back(), kBlocks = K / 128;
  const char* name = "grouped_gemm_nt_fp8";
  auto kernel = loadKernel(*gpu.runtime, name, {{"E", E}, {"N", N}, {"K", K}});
  const std::vector<uint8_t> a = randomE4m3(rng, size_t(rows * K)), b = randomE4m3(rng, size_t(E * N * K));
  const std::vector<float> sa = randomScales(rng, size_t(rows * kBlocks)),
                           sb = randomScales(rng, size_t(E * (N / 128) * kBlocks));
  Buffer aDev(gpu.device(), a.size()), bDev(gpu.device(), b.size()), offDev(gpu.device(), offsets.size() * 4);
  Buffer saDev(gpu.device(), sa.size() * 4), sbDev(gpu.device(), sb.size() * 4);
  aDev.upload(a);
  bDev.upload(b);
  saDev.upload(sa);
  sbDev.upload(sb);
  offDev.upload(offsets);
  Buffer out(gpu.device(), size_t((rows + 1) * N) * 2);
  Buffer tickets(gpu.device(), 8);
  tickets.upload(std::vector<int32_t>{0, 0});
  if (grid == 0) grid = gpu.device().multiprocessors();
  KernelArgs args(name);
  args.ptr("a", aDev.ptr()).ptr("a_scales", saDev.ptr()).ptr("b", bDev.ptr()).ptr("b_scales", sbDev.ptr());
  args.ptr("c", out.ptr()).ptr("offsets", offDev.ptr()).ptr("tickets", tickets.ptr()).i32("grid", grid);
  args.tensorMap("map_a", encodeTensorMap(*kernel, "map_a", aDev.ptr(), rows, K));
  args.tensorMap("map_b", encodeTensorMap(*kernel, "map_b", bDev.ptr(), E * N, K));
  LaunchDims dims;
  dims.grid.x = uint32_t(grid);
  dims.block.x = uint32_t(kernel->metadata().blockThreads);
  auto launchOnce = [&] { return launchPoisoned(gpu, *kernel, dims, args, out); };
  const std::vector<uint16_t> first = launchOnce();
  const Written written = checkWritten(first, rows * N, (rows + 1) * N, "the last group");
  const std::vector<double>& value = e4m3Values();
  ErrorNorm err;
  std::vector<double> arow(size_t(K), 0.0);
  for (int64_t r : rowsToCheck(rows, checkRows, rng)) {
    const int64_t e = std::upper_bound(offsets.begin(), offsets.end(), int32_t(r)) - offsets.begin() - 1;
    for (int64_t x = 0; x < K; ++x) arow[size_t(x)] = value[a[size_t(r * K + x)]] * sa[size_t(r * kBlocks + x / 128)];
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* brow = &b[size_t((e * N + n) * K)];
      const float* bs = &sb[size_t((e * (N / 128) + n / 128) * kBlocks)];
      double ref = 0;
      for (int64_t kb = 0; kb < kBlocks; ++kb) {
        double block = 0;
        for (int64_t x = kb * 128; x < kb * 128 + 128; ++x) block += arow[size_t(x)] * value[brow[x]];
        ref += block * bs[kb];
      }
      err.add(fromBf16(first[size_t(r * N + n)]), ref);
    }
  }
  EXPECT_LE(err.relative(), 1e-2);
  const bool identical = first == launchOnce();
  EXPECT_TRUE(identical) << "the second launch differs bitwise from the first";
  EXPECT_EQ(tickets.download<int32_t>(), (std::vector<int32_t>{0, 0})) << "the launch left its tile tickets set";
  const std::string timing = time ? timeGemm(gpu, *kernel, dims, args, 2.0 * double(rows) * double(N) * double(K)) : "";
  std::printf("SUMMARY %s E=%lld N=%lld K=%lld rows=%lld grid=%d: rel_err=%.3e over %s rows unwritten=%zu "
              "guard_touched=%zu rerun=%s%s\n",
              name, (long long)E, (long long)N, (long long)K, (long long)rows, grid, err.relative(),
              checkRows ? std::to_string(checkRows).c_str() : "all", written.unwritten, written.guardTouched,
              identical ? "identical" : "DIFFERENT", timing.c_str());
}

// Ragged groups (two empty; last m-tiles of 1..128 rows), every row checked; at the SM count and on 3 blocks (each
// running many tiles from tickets across groups).
TEST(GpuKernels, GroupedGemmNtFp8RaggedGroups) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGroupedGemmFp8(gpu, 8, 256, 512, 300);
  runGroupedGemmFp8(gpu, 8, 384, 256, 200, /*grid=*/3, 0, false, {64, 1, 384, 129, 0, 320, 63, 193});
}
// DeepSeek-V3's per-GPU L1 (gate | up: N = 2I = 4096, K = H = 7168) and L2 (N = H, K = I = 2048) at EP8: 32 local
// experts, 256 rows each on average; 24 random rows checked; timed.
TEST(GpuKernels, GroupedGemmNtFp8DeepSeekV3) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runGroupedGemmFp8(gpu, 32, 4096, 7168, 512, 0, /*checkRows=*/24, /*time=*/true);
  runGroupedGemmFp8(gpu, 32, 7168, 2048, 512, 0, /*checkRows=*/24, /*time=*/true);
}

// ------------------------------------------------------------------------------------------ quantize_tokens_fp8

// quantize_tokens_fp8 (kernels/Kernels.h QuantizeTokensSpec) on random bf16 rows (a wide range of magnitudes, one
// all-zero group): the codes and scales bitwise the host quantiser's (IEEE quotient, nearest even), every element
// written, a guard row untouched, a second launch identical. deviceRows: the row count read from the device
// (rows_at holds `rows`, the bound argument one more: the guard row), over `grid` blocks taking the rows in turn.
void runQuantizeTokens(Gpu& gpu, int64_t H, int32_t rows, bool deviceRows = false, int32_t grid = 0) {
  std::mt19937 rng = testRng();
  const int64_t groups = H / 128;
  auto kernel = loadKernel(*gpu.runtime, "quantize_tokens_fp8", {{"H", H}, {"device_rows", deviceRows ? 1 : 0}});
  std::vector<uint16_t> x = randomBf16(rng, size_t(rows * H));
  std::uniform_int_distribution<int> exponent(-20, 12);
  for (int64_t g = 0; g < rows * groups; ++g) {
    const float range = std::ldexp(1.f, exponent(rng));  // each group its own magnitude
    for (int64_t i = 0; i < 128; ++i) x[size_t(g * 128 + i)] = toBf16(fromBf16(x[size_t(g * 128 + i)]) * range);
  }
  for (int64_t i = 0; i < 128; ++i) x[size_t(i)] = toBf16(0.f);  // row 0's first group: scale 1, codes 0
  Buffer xDev(gpu.device(), x.size() * 2), q(gpu.device(), size_t((rows + 1) * H)),
      scales(gpu.device(), size_t((rows + 1) * groups) * 4);
  xDev.upload(x);
  Buffer rowsAt(gpu.device(), 4);
  rowsAt.upload(std::vector<int32_t>{rows});
  if (!grid) grid = int32_t((rows * groups + 255) / 256);
  KernelArgs args("quantize_tokens_fp8");
  args.ptr("x", xDev.ptr()).ptr("q", q.ptr()).ptr("scales", scales.ptr()).i32("rows", deviceRows ? rows + 1 : rows);
  args.ptr("rows_at", deviceRows ? rowsAt.ptr() : 0).i32("grid", grid);
  LaunchDims dims;
  dims.grid.x = uint32_t(grid);
  dims.block.x = uint32_t(kernel->metadata().blockThreads);
  auto launchOnce = [&] {
    q.upload(std::vector<uint8_t>(size_t((rows + 1) * H), 0xFF));  // the NaN code: never the result of a finite x
    scales.upload(std::vector<uint32_t>(size_t((rows + 1) * groups), 0xFFFFFFFFu));
    gpu.runtime->launch(*kernel, dims, gpu.stream, args);
    gpu.device().synchronize(gpu.stream);
    return std::make_pair(q.download<uint8_t>(), scales.download<float>());
  };
  const auto [codes, gotScales] = launchOnce();
  size_t codeDiffs = 0, scaleDiffs = 0, guard = 0;
  for (int64_t g = 0; g < rows * groups; ++g) {
    float amax = 0;
    for (int64_t i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(fromBf16(x[size_t(g * 128 + i)])));
    const float ratio = amax / 448.f, scale = ratio == 0.f ? 1.f : ratio;
    scaleDiffs += std::memcmp(&scale, &gotScales[size_t(g)], 4) != 0;
    for (int64_t i = 0; i < 128; ++i)
      codeDiffs += codes[size_t(g * 128 + i)] != toE4m3(fromBf16(x[size_t(g * 128 + i)]) / scale);
  }
  for (int64_t i = rows * H; i < (rows + 1) * H; ++i) guard += codes[size_t(i)] != 0xFF;
  for (int64_t g = rows * groups; g < (rows + 1) * groups; ++g) guard += !std::isnan(gotScales[size_t(g)]);
  EXPECT_EQ(codeDiffs, 0u);
  EXPECT_EQ(scaleDiffs, 0u);
  EXPECT_EQ(guard, 0u);
  EXPECT_EQ(gotScales[0], 1.f) << "an all-zero group's scale";
  // Bytes, not floats: the guard's scales are NaN, which never compare equal.
  const auto [codes2, scales2] = launchOnce();
  const bool identical = codes2 == codes && std::memcmp(scales2.data(), gotScales.data(), gotScales.size() * 4) == 0;
  EXPECT_TRUE(identical);
  std::printf("SUMMARY quantize_tokens_fp8 H=%lld rows=%d device_rows=%d grid=%d: code_diffs=%zu scale_diffs=%zu "
              "guard_touched=%zu rerun=%s\n",
              (long long)H, rows, int(deviceRows), grid, codeDiffs, scaleDiffs, guard, identical ? "identical" : "DIFFERENT");
}

TEST(GpuKernels, QuantizeTokensFp8MatchesTheHostQuantiser) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runQuantizeTokens(gpu, 128, 33);
  runQuantizeTokens(gpu, 7168, 300);  // DeepSeek-V3's hidden size
  runQuantizeTokens(gpu, 128, 33, false, /*grid=*/1);  // one block loops over every chunk of rows
  // The FP8 layer's act: the count from the device, a bound one row more, fewer blocks than chunks.
  runQuantizeTokens(gpu, 2048, 301, true, /*grid=*/7);
  runQuantizeTokens(gpu, 7168, 300, true, /*grid=*/132);
}

// ------------------------------------------------------------------------------------ grouped_gemm_{nt,nn,tn}_tma

enum class Layout { kNT, kNN, kTN };

// The TMA variants (kernels/Kernels.h buildGroupedGemm) over groups of random sizes (1..maxRows rows, two empty);
// the tensor maps are encoded from the kernel's declaration (encodeTensorMap) over these matrices:
//   NT / NN: C [rows, N] = A [rows, K] . B[e] (NT: B [E, N, K]; NN: B [E, K, N]); a guard row past the last group;
//   TN: C[e] [M, N] = A_e^T B_e with A [rows, M], B [rows, N] (K = the group's size: most groups end inside a
//   64-row step, whose rows past the group the kernel must zero; empty groups give C[e] = 0); a guard expert.
// The guard must stay at the sentinel. N >= 48 x 256 takes the scheduler's banded tile order (TileScheduler::banded;
// groups of up to 1400 rows, i.e. a full band of 8 m-tiles and a partial one).
// grid 0: the SM count (pairs: rounded down to whole clusters of two).
// maxSplit: the split-K tail's limit (0: none); the partial tiles of the split scratch start as NaN, so that a
// finite one afterwards shows a tail split ran (expectSplit 1 requires it, 0 forbids it, -1 either).
void runTmaGroupedGemm(Gpu& gpu, Layout layout, int64_t E = 8, int64_t N = 512, int64_t K = 256,
                       int32_t maxRows = 400, int64_t pairs = 0, int32_t grid = 0, int32_t maxSplit = 8,
                       int expectSplit = -1, const std::vector<int32_t>& sizes = {}) {
  std::mt19937 rng = testRng();
  const bool nn = layout == Layout::kNN, tn = layout == Layout::kTN;  // TN: K is M, C's rows per expert
  std::vector<int32_t> offsets{0};
  std::uniform_int_distribution<int32_t> size(1, std::max(maxRows, 1));
  for (int64_t e = 0; e < E; ++e)
    offsets.push_back(offsets.back() + (!sizes.empty() ? sizes.at(size_t(e)) : e == 2 || e == 5 ? 0 : size(rng)));
  const int64_t rows = offsets.back();
  const char* name = tn ? "grouped_gemm_tn_tma" : nn ? "grouped_gemm_nn_tma" : "grouped_gemm_nt_tma";
  auto kernel = loadKernel(*gpu.runtime, name, {{"E", E}, {"N", N}, {tn ? "M" : "K", K}, {"pairs", pairs}});
  const std::vector<uint16_t> a = randomBf16(rng, size_t(rows * K)),
                              b = randomBf16(rng, size_t(tn ? rows * N : E * N * K));
  Buffer aDev(gpu.device(), a.size() * 2), bDev(gpu.device(), b.size() * 2), offDev(gpu.device(), offsets.size() * 4);
  aDev.upload(a);
  bDev.upload(b);
  offDev.upload(offsets);
  const int64_t outRows = tn ? E * K : rows, guardRows = tn ? K : 1;  // TN: one guard expert of M rows
  Buffer out(gpu.device(), size_t((outRows + guardRows) * N) * 2);
  // A [rows, K]; B [E * N, K] (NT), [E * K, N] (NN) or [rows, N] (TN); boxes as the kernel declares them.
  auto mapA = encodeTensorMap(*kernel, "map_a", aDev.ptr(), rows, K);
  auto mapB = encodeTensorMap(*kernel, "map_b", bDev.ptr(), tn ? rows : nn ? E * K : E * N, nn || tn ? N : K);

  // Tile tickets, zero before the first launch; every launch must leave them zero for the next one (the rerun
  // below is bitwise identical only if it runs every tile).
  Buffer tickets(gpu.device(), 8);
  tickets.upload(std::vector<int32_t>{0, 0});
  if (grid == 0) grid = gpu.device().multiprocessors() / (pairs ? 2 : 1) * (pairs ? 2 : 1);
  // Split scratch: counters zero, partial tiles NaN (0xffffffff).
  const size_t counterInts = size_t(abi::splitCounterBytes(grid) / 4),
               scratchInts = size_t(abi::splitScratchBytes(grid) / 4);
  std::vector<uint32_t> scratchInit(scratchInts, 0xffffffffu);
  std::fill(scratchInit.begin(), scratchInit.begin() + ptrdiff_t(counterInts), 0u);
  Buffer scratch(gpu.device(), scratchInts * 4);
  scratch.upload(scratchInit);
  KernelArgs args(name);
  args.ptr("a", aDev.ptr()).ptr("b", bDev.ptr()).ptr("c", out.ptr()).ptr("offsets", offDev.ptr());
  args.ptr("tickets", tickets.ptr()).ptr("split", scratch.ptr()).i32("max_split", maxSplit).i32("grid", grid);
  args.tensorMap("map_a", mapA).tensorMap("map_b", mapB);
  // TN stores dW [E * M, N] through a map of exactly its rows: the guard expert past them must stay untouched.
  if (tn) args.tensorMap("map_c", encodeTensorMap(*kernel, "map_c", out.ptr(), E * K, N));
  LaunchDims dims;
  dims.grid.x = uint32_t(grid);
  dims.block.x = uint32_t(kernel->metadata().blockThreads);
  auto launchOnce = [&] { return launchPoisoned(gpu, *kernel, dims, args, out); };
  const std::vector<uint16_t> first = launchOnce();
  const Written written = checkWritten(first, outRows * N, (outRows + guardRows) * N, tn ? "the last expert" : "the last group");
  ErrorNorm err;
  size_t nonzeroEmpty = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t lo = offsets[size_t(e)], hi = offsets[size_t(e + 1)];
    if (tn) {
      for (int64_t m = 0; m < K; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double ref = 0;
          for (int64_t r = lo; r < hi; ++r) ref += double(fromBf16(a[size_t(r * K + m)])) * fromBf16(b[size_t(r * N + n)]);
          const uint16_t got = first[size_t((e * K + m) * N + n)];
          if (lo == hi) nonzeroEmpty += fromBf16(got) != 0.f;
          err.add(fromBf16(got), ref);
        }
      continue;
    }
    for (int64_t r = lo; r < hi; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) {
          const size_t bAt = nn ? size_t((e * K + k) * N + n) : size_t((e * N + n) * K + k);
          ref += double(fromBf16(a[size_t(r * K + k)])) * fromBf16(b[bAt]);
        }
        err.add(fromBf16(first[size_t(r * N + n)]), ref);
      }
  }
  EXPECT_LE(err.relative(), 1e-2);
  EXPECT_EQ(nonzeroEmpty, 0u) << "an expert without rows got a non-zero C[e]";
  const bool identical = first == launchOnce();
  EXPECT_TRUE(identical) << "the second launch differs bitwise from the first";
  EXPECT_EQ(tickets.download<int32_t>(), (std::vector<int32_t>{0, 0})) << "the launch left its tile tickets set";
  const std::vector<uint32_t> after = scratch.download<uint32_t>();
  const size_t countersSet = size_t(std::count_if(after.begin(), after.begin() + ptrdiff_t(counterInts),
                                                  [](uint32_t v) { return v != 0; }));
  EXPECT_EQ(countersSet, 0u) << "the launch left split counters set";
  const size_t partialsWritten = size_t(std::count_if(after.begin() + ptrdiff_t(counterInts), after.end(),
                                                      [](uint32_t v) { return v != 0xffffffffu; }));
  if (expectSplit == 1) {
    EXPECT_GT(partialsWritten, 0u) << "no split of the tail ran";
  }
  if (expectSplit == 0) {
    EXPECT_EQ(partialsWritten, 0u) << "a split ran (max_split " << maxSplit << ")";
  }
  std::printf("SUMMARY %s E=%lld N=%lld %s=%lld pairs=%lld rows=%lld grid=%d max_split=%d: rel_err=%.3e unwritten=%zu "
              "guard_touched=%zu nonzero_empty=%zu rerun=%s partial_floats=%zu\n",
              name, (long long)E, (long long)N, tn ? "M" : "K", (long long)K, (long long)pairs, (long long)rows, grid,
              maxSplit, err.relative(), written.unwritten, written.guardTouched, nonzeroEmpty,
              identical ? "identical" : "DIFFERENT", partialsWritten);
}

// Groups whose last m-tile holds 1..64 rows run it as a half tile (64 x BN, the MMA warpgroups splitting its
// columns: WarpSpecializedEngine::halfTile); 65..128 rows as a whole one. Sizes with tails of 64, 1, 63, 65 and
// 128 rows, one group of a single half tile and an empty one; single blocks and cluster pairs (2 n-tiles: lone
// half tiles; 3 n-tiles: a pair's second m-tile past the group, 64 rows past it at 320, just past it at 384), NT
// and NN, 256- and 128-wide tiles (N = 384: half tiles of 64 columns a warpgroup), no split.
const std::vector<int32_t> kHalfTileSizes{64, 1, 384, 192, 0, 320, 63, 193};
TEST(GpuKernels, TmaGroupedGemmNtHalfTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 512, 256, 0, /*pairs=*/0, /*grid=*/0, /*maxSplit=*/0, 0, kHalfTileSizes);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 384, 256, 0, /*pairs=*/0, /*grid=*/3, /*maxSplit=*/0, 0, kHalfTileSizes);
}
TEST(GpuKernels, TmaGroupedGemmNnHalfTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNN, 8, 512, 256, 0, /*pairs=*/0, /*grid=*/3, /*maxSplit=*/0, 0, kHalfTileSizes);
  runTmaGroupedGemm(gpu, Layout::kNN, 8, 384, 256, 0, /*pairs=*/0, /*grid=*/0, /*maxSplit=*/0, 0, kHalfTileSizes);
}
TEST(GpuKernels, TmaGroupedGemmNtPairsHalfTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 512, 256, 0, /*pairs=*/1, /*grid=*/2, /*maxSplit=*/0, 0, kHalfTileSizes);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 768, 256, 0, /*pairs=*/1, /*grid=*/0, /*maxSplit=*/0, 0, kHalfTileSizes);
}
TEST(GpuKernels, TmaGroupedGemmNnPairsHalfTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNN, 8, 512, 256, 0, /*pairs=*/1, /*grid=*/2, /*maxSplit=*/0, 0, kHalfTileSizes);
}

// Fewer tiles than blocks: every tile is the tail, split over the K steps (4 here: up to 4 ways).
TEST(GpuKernels, TmaGroupedGemmNtRaggedGroups) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 512, 256, 400, 0, 0, /*maxSplit=*/8, /*expectSplit=*/1);
}

TEST(GpuKernels, TmaGroupedGemmNnRaggedGroups) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNN, 8, 512, 256, 400, 0, 0, /*maxSplit=*/8, /*expectSplit=*/1);
}

// The same without the split (max_split 0): the scratch's partial tiles stay untouched.
TEST(GpuKernels, TmaGroupedGemmNtNoSplit) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 512, 256, 400, 0, 0, /*maxSplit=*/0, /*expectSplit=*/0);
}

// A tail after whole rounds: 9 blocks over ~45 tiles of 16 K steps leave a last round of a few tiles, split 2-4
// ways, while the earlier tiles run whole (tickets below the tail, split tickets after them).
TEST(GpuKernels, TmaGroupedGemmNtSplitTailAfterRounds) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 512, 1024, 700, 0, /*grid=*/9, /*maxSplit=*/8, /*expectSplit=*/-1);
}

// Three K steps a tile: consecutive tiles start their K loops at ring slots 0, 3, 2, 1, ... in alternating
// phases, which the MMA loop carries from one step to the next (kernels/gemm/WarpSpecializedEngine.h, compute); one cluster
// (grid 2) or three blocks run every tile.
TEST(GpuKernels, TmaGroupedGemmNtPairsThreeStepTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 512, 192, 400, /*pairs=*/1, /*grid=*/2, /*maxSplit=*/0, /*expectSplit=*/0);
}

TEST(GpuKernels, TmaGroupedGemmNnThreeStepTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNN, 8, 512, 192, 400, /*pairs=*/0, /*grid=*/3, /*maxSplit=*/0, /*expectSplit=*/0);
}

// Pairs with a split tail, lone tiles among the split units: at most 24 units over 66 clusters (132 SMs).
TEST(GpuKernels, TmaGroupedGemmNnPairsSplitTail) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNN, 8, 512, 256, 400, /*pairs=*/1, /*grid=*/0, /*maxSplit=*/8, /*expectSplit=*/1);
}

// Cluster pairs (B multicast into both blocks of a pair; the pair's first block draws the tickets and copies each
// into the second's shared mailbox, two slots in turn): odd m-tile counts (2 n-tiles: the odd last m-tile runs as
// lone tiles, one n-tile per block), empty groups, and tickets left zero across launches. One cluster (grid 2)
// draws every ticket, so both mailbox slots are reused many times over.
TEST(GpuKernels, TmaGroupedGemmNtPairsRaggedGroups) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 512, 256, 400, /*pairs=*/1, /*grid=*/2);
}

TEST(GpuKernels, TmaGroupedGemmNnPairsRaggedGroups) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNN, 8, 512, 256, 400, /*pairs=*/1, /*grid=*/2);
}

// Pairs over every SM with several tiles per cluster (~290 pair tiles).
TEST(GpuKernels, TmaGroupedGemmNtPairsFullGrid) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 2048, 256, 1400, /*pairs=*/1);
}

// Pairs with an odd number of n-tiles (3): no lone tiles, an odd expert's second block computes a tile past the
// group and must store nothing.
TEST(GpuKernels, TmaGroupedGemmNtPairsOddNTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, 8, 768, 256, 700, /*pairs=*/1);
}

// Pairs on a wide problem (48 n-tiles): bands of 4 pairs of m-tiles, lone tiles after them.
TEST(GpuKernels, TmaGroupedGemmNtPairsBandedWide) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, /*E=*/6, /*N=*/12288, /*K=*/128, /*maxRows=*/1400, /*pairs=*/1);
}

TEST(GpuKernels, TmaGroupedGemmNtBandedOrder) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNT, /*E=*/6, /*N=*/12288, /*K=*/128, /*maxRows=*/1400);
}

// NN at 28 n-tiles: the banded order NN takes from kBandFromNN (TileScheduler).
TEST(GpuKernels, TmaGroupedGemmNnBandedOrder) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kNN, /*E=*/6, /*N=*/7168, /*K=*/128, /*maxRows=*/1400);
}

// TN: C[e] [256, 512] over groups of 1..300 rows (two empty): tails inside a 64-row step in almost every group.
TEST(GpuKernels, TmaGroupedGemmTnRaggedGroups) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kTN, /*E=*/8, /*N=*/512, /*M=*/256, /*maxRows=*/300);
}

// TN where N is not a multiple of 256: 128-wide tiles on the TMA engine (two B boxes a step), C[e] [512, 640].
TEST(GpuKernels, TmaGroupedGemmTnNarrowTiles) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kTN, /*E=*/4, /*N=*/640, /*M=*/512, /*maxRows=*/200);
}

// TN's last K step multiplies only the 16-wide K slices holding rows (WarpSpecializedEngine::tailSlices): groups
// whose last step holds 1, 16, 17, 33, 48 and 49 rows (slices [3, 4), [3, 4), [2, 4), [1, 4), [1, 4) and the whole
// step) and groups under one step of 15 and 17 rows (slices [0, 1) and [0, 2)).
TEST(GpuKernels, TmaGroupedGemmTnTailSlices) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kTN, /*E=*/8, /*N=*/512, /*M=*/256, /*maxRows=*/0, /*pairs=*/0, /*grid=*/0,
                    /*maxSplit=*/8, /*expectSplit=*/-1, /*sizes=*/{65, 80, 81, 97, 112, 113, 15, 17});
}

// TN over few blocks: 3 blocks run ~11 tiles each (tile after tile through the same ring and staging tile), over
// groups of 0 whole K steps and a tail (15, 64 rows; an empty group), 1 (65, 128), 2 (129) and more (300, 1000).
TEST(GpuKernels, TmaGroupedGemmTnFewBlocks) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runTmaGroupedGemm(gpu, Layout::kTN, /*E=*/8, /*N=*/512, /*M=*/256, /*maxRows=*/0, /*pairs=*/0, /*grid=*/3,
                    /*maxSplit=*/0, /*expectSplit=*/-1, /*sizes=*/{15, 64, 0, 65, 128, 129, 300, 1000});
}

// ---------------------------------------------------------------------------------------------------- topk_idx_narrow

// TopkIdxNarrowSpec (kernels/Kernels.h).
constexpr int64_t kNarrowBlockThreads = 256;
constexpr int64_t kNarrowLimit = int64_t(1) << 31;  // entries in [-1, kNarrowLimit) are narrowed as they are
constexpr int32_t kNarrowBadValue = 2147483647;     // what every other entry becomes
constexpr int32_t kIdxSentinel = 0x5A5A5A5A;        // neither a narrowed index of these inputs nor kNarrowBadValue
constexpr int64_t kIdxGuard = 64;                   // elements past each buffer's end (and src's guards are bad values)

struct NarrowCase {
  int64_t count;
  uint32_t grid;                   // 0: covering ((count / 2 + 255) / 256, at least 1)
  int64_t srcOffset, dstOffset;    // elements past the allocations' starts: 1 misaligns the pair path's vectors
  std::vector<int64_t> bad;        // values outside [-1, 2^31): the first at count - 1, the second at 0, the rest
                                   // at random distinct positions
};

// The kernel's contract on the host: the entry itself where it is a valid int32 index or -1, else the bad value.
int32_t narrowReference(int64_t v) { return v >= -1 && v < kNarrowLimit ? int32_t(v) : kNarrowBadValue; }

// count random entries in [-1, 255] with c.bad placed among them, narrowed into a sentinel-filled dst (guards on both
// sides), twice: every entry < count written as the reference says, the guards untouched, the second launch bitwise
// identical. Without bad values the error record stays clear (src's guards hold bad values, so an entry read past
// the range would claim it); with them it names one of them: kBadIndex, the pick, its int64 value, bound 2^31.
void runNarrow(Gpu& gpu, const NarrowCase& c) {
  std::mt19937 rng = testRng();
  auto kernel = loadKernel(*gpu.runtime, "topk_idx_narrow", {});
  ASSERT_EQ(kernel->metadata().blockThreads, kNarrowBlockThreads);
  auto heaps = SymmetricHeap::createSingleProcess({gpu.runtime->device()}, {}, parseEnv());  // ctx + error record
  SymmetricHeap& heap = *heaps[0];

  const int64_t n = c.count;
  std::vector<int64_t> src(static_cast<size_t>(n));
  std::uniform_int_distribution<int64_t> expert(-1, 255);
  for (int64_t& v : src) v = expert(rng);
  ASSERT_LE(c.bad.size(), size_t(n)) << "more bad values than entries";
  std::vector<int64_t> positions;
  std::uniform_int_distribution<int64_t> where(0, std::max<int64_t>(n - 1, 0));
  for (size_t k = 0; k < c.bad.size(); ++k) {
    int64_t p = k == 0 ? n - 1 : k == 1 ? 0 : where(rng);
    while (std::find(positions.begin(), positions.end(), p) != positions.end()) p = where(rng);
    positions.push_back(p);
    src[size_t(p)] = c.bad[k];
  }
  std::vector<int32_t> ref(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ref[size_t(i)] = narrowReference(src[size_t(i)]);
  for (int64_t p : positions) ASSERT_EQ(ref[size_t(p)], kNarrowBadValue);

  // src inside guards of INT64_MIN (out of range: an entry read outside [0, count) would claim the record).
  std::vector<int64_t> srcHost(size_t(c.srcOffset + n + kIdxGuard), std::numeric_limits<int64_t>::min());
  std::copy(src.begin(), src.end(), srcHost.begin() + c.srcOffset);
  Buffer srcDev(gpu.device(), srcHost.size() * 8);
  srcDev.upload(srcHost);
  const size_t dstElems = size_t(c.dstOffset + n + kIdxGuard);
  Buffer dstDev(gpu.device(), dstElems * 4);

  const uint32_t grid = c.grid ? c.grid : uint32_t(std::max<int64_t>(1, (n / 2 + kNarrowBlockThreads - 1) / kNarrowBlockThreads));
  KernelArgs args("topk_idx_narrow");
  args.context(heap.contextAddress())
      .ptr("src", srcDev.ptr() + uint64_t(c.srcOffset) * 8)
      .ptr("dst", dstDev.ptr() + uint64_t(c.dstOffset) * 4)
      .i32("count", n)
      .i32("grid", grid);
  auto launchOnce = [&] {
    dstDev.upload(std::vector<int32_t>(dstElems, kIdxSentinel));
    launch1d(*gpu.runtime, *kernel, grid, gpu.stream, args, &heap);
    gpu.device().synchronize(gpu.stream);
    return dstDev.download<int32_t>();
  };
  const std::vector<int32_t> first = launchOnce();
  size_t wrong = 0, unwritten = 0, guardTouched = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t got = first[size_t(c.dstOffset + i)];
    unwritten += got == kIdxSentinel;
    if (got != ref[size_t(i)] && wrong++ < 5)
      ADD_FAILURE() << "dst[" << i << "] = " << got << " for src " << src[size_t(i)] << ", expected " << ref[size_t(i)];
  }
  for (size_t i = 0; i < dstElems; ++i)
    if (int64_t(i) < c.dstOffset || int64_t(i) >= c.dstOffset + n) guardTouched += first[i] != kIdxSentinel;
  EXPECT_EQ(wrong, 0u) << "entries differing from the reference";
  EXPECT_EQ(unwritten, 0u) << "entries left at the sentinel";
  EXPECT_EQ(guardTouched, 0u) << "elements written outside dst[0, count)";
  const std::vector<int32_t> second = launchOnce();
  const bool identical = first == second;
  EXPECT_TRUE(identical) << "the second launch differs bitwise from the first";

  const abi::DeviceError record = readBack<abi::DeviceError>(gpu.device(), heap.errorAddress(), 1)[0];
  std::string message;
  try {
    heap.checkErrors(gpu.stream);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDeviceError);
    message = e.what();
  }
  if (c.bad.empty()) {
    EXPECT_EQ(record.code, 0u) << "the error record was claimed without a bad entry: " << describeDeviceError(record);
    EXPECT_EQ(message, "");
  } else {
    EXPECT_EQ(record.code, uint64_t(abi::ErrorCode::kBadIndex)) << describeDeviceError(record);
    EXPECT_EQ(record.rank, 0u);
    EXPECT_EQ(record.expected, uint64_t(kNarrowLimit));
    EXPECT_LT(record.block, grid);
    bool named = false;
    for (size_t k = 0; k < positions.size(); ++k)
      named = named || (record.flag == uint64_t(positions[k]) && int64_t(record.seen) == c.bad[k]);
    EXPECT_TRUE(named) << "the record names no bad entry: " << describeDeviceError(record);
    const std::string expected = describeDeviceError(record);
    EXPECT_EQ(message.rfind(expected, 0), 0u) << message;  // checkErrors reports the record as it is
    EXPECT_EQ(message.rfind("rank 0: index out of range at site ", 0), 0u) << message;
  }
  std::printf("SUMMARY topk_idx_narrow count=%lld grid=%u src_offset=%lld dst_offset=%lld bad=%zu: wrong=%zu "
              "unwritten=%zu guard_touched=%zu rerun=%s record=\"%s\"\n",
              (long long)n, grid, (long long)c.srcOffset, (long long)c.dstOffset, c.bad.size(), wrong, unwritten,
              guardTouched, identical ? "identical" : "DIFFERENT",
              record.code ? describeDeviceError(record).c_str() : "clear");
}

// Out-of-range values: below -1, and >= 2^31, including those whose low 32 bits are a valid expert (2^32 + 7 -> 7,
// 2^32 -> 0) or -1 (2^32 - 1, INT64_MAX), or INT32_MIN (-2^31).
const std::vector<int64_t> kBadIndices = {-2,
                                          int64_t(1) << 31,
                                          std::numeric_limits<int64_t>::min(),
                                          (int64_t(1) << 32) + 7,
                                          int64_t(1) << 32,
                                          (int64_t(1) << 32) - 1,
                                          std::numeric_limits<int64_t>::max(),
                                          -(int64_t(1) << 31)};

// 1001 tokens x topk 7: an odd count, not a multiple of the block (the pair path plus the odd last entry).
TEST(GpuKernels, TopkIdxNarrowOddCount) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runNarrow(gpu, {1001 * 7, 0, 0, 0, {}});
}

// Three blocks for 3504 pairs: each thread takes several grid-stride steps.
TEST(GpuKernels, TopkIdxNarrowFewBlocks) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runNarrow(gpu, {1001 * 7, 3, 0, 0, {}});
}

TEST(GpuKernels, TopkIdxNarrowOutOfRangeValues) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runNarrow(gpu, {1001 * 7, 0, 0, 0, kBadIndices});
}

// src 8 bytes past a 16-byte boundary (a view into a larger tensor): one entry per thread and step.
TEST(GpuKernels, TopkIdxNarrowMisalignedSource) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runNarrow(gpu, {4097, 2, 1, 0, kBadIndices});
}

TEST(GpuKernels, TopkIdxNarrowMisalignedDestination) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runNarrow(gpu, {4097, 0, 0, 1, {}});
}

// One entry (the odd last entry alone, out of range), and none (nothing written, the record clear).
TEST(GpuKernels, TopkIdxNarrowSingleAndEmpty) {
  MEGAMOE_REQUIRE_SM90A(gpu);
  runNarrow(gpu, {1, 0, 0, 0, {std::numeric_limits<int64_t>::min()}});
  runNarrow(gpu, {0, 0, 0, 0, {}});
}

}  // namespace
}  // namespace megamoe

int main(int argc, char** argv) { return megamoe::gputest::runGpuTests(argc, argv); }
