// HIP module-API backend for gfx950. libamdhip64.so is opened with dlopen (path from MEGAMOE_HIP_LIBRARY); the few
// types and signatures used are declared here because no ROCm headers exist on the build machines. Host tests run
// this file against a fake libamdhip64 (tests/host/runtime/FakeHip.cpp); it has never run on gfx950 hardware.
#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "BackendFactories.h"
#include "ScopedCurrent.h"
#include "megamoe/Error.h"

namespace megamoe::detail {
namespace {

// ---- The subset of the HIP ABI we call (hip_runtime_api.h, ROCm 6/7). ----
using hipError_t = int;
constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorPeerAccessAlreadyEnabled = 704;
using hipDevice_t = int;
using hipStream_t = void*;
using hipEvent_t = void*;
using hipModule_t = void*;
using hipFunction_t = void*;
using hipDeviceptr_t = void*;
using hipGraph_t = void*;
using hipGraphExec_t = void*;
struct hipIpcMemHandle_t {
  char reserved[64];
};
constexpr unsigned kHipIpcMemLazyEnablePeerAccess = 0x1;
constexpr unsigned kHipStreamNonBlocking = 0x1;
constexpr int kHipStreamCaptureModeThreadLocal = 1;  // hipStreamCaptureMode

template <typename Signature>
using Fn = Signature*;

// X(name, signature) for each entry point.
#define MEGAMOE_HIP_ENTRY_POINTS(X)                                                                  \
  X(hipGetErrorName, const char*(hipError_t))                                                    \
  X(hipGetErrorString, const char*(hipError_t))                                                  \
  X(hipInit, hipError_t(unsigned))                                                               \
  X(hipGetDeviceCount, hipError_t(int*))                                                         \
  X(hipSetDevice, hipError_t(int))                                                               \
  X(hipGetDevice, hipError_t(int*))                                                              \
  X(hipDeviceGetName, hipError_t(char*, int, hipDevice_t))                                       \
  X(hipDeviceSynchronize, hipError_t())                                                          \
  X(hipMalloc, hipError_t(void**, size_t))                                                       \
  X(hipFree, hipError_t(void*))                                                                  \
  X(hipMemsetD8Async, hipError_t(hipDeviceptr_t, unsigned char, size_t, hipStream_t))           \
  X(hipMemcpyHtoD, hipError_t(hipDeviceptr_t, const void*, size_t))                              \
  X(hipMemcpyDtoH, hipError_t(void*, hipDeviceptr_t, size_t))                                    \
  X(hipMemcpyDtoD, hipError_t(hipDeviceptr_t, hipDeviceptr_t, size_t))                           \
  X(hipMemcpyHtoDAsync, hipError_t(hipDeviceptr_t, const void*, size_t, hipStream_t))            \
  X(hipMemcpyDtoHAsync, hipError_t(void*, hipDeviceptr_t, size_t, hipStream_t))                  \
  X(hipMemcpyDtoDAsync, hipError_t(hipDeviceptr_t, hipDeviceptr_t, size_t, hipStream_t))         \
  X(hipStreamCreateWithFlags, hipError_t(hipStream_t*, unsigned))                                \
  X(hipStreamDestroy, hipError_t(hipStream_t))                                                   \
  X(hipStreamSynchronize, hipError_t(hipStream_t))                                               \
  X(hipEventCreate, hipError_t(hipEvent_t*))                                                     \
  X(hipEventDestroy, hipError_t(hipEvent_t))                                                     \
  X(hipEventRecord, hipError_t(hipEvent_t, hipStream_t))                                         \
  X(hipEventSynchronize, hipError_t(hipEvent_t))                                                 \
  X(hipEventElapsedTime, hipError_t(float*, hipEvent_t, hipEvent_t))                             \
  X(hipModuleLoadData, hipError_t(hipModule_t*, const void*))                                    \
  X(hipModuleUnload, hipError_t(hipModule_t))                                                    \
  X(hipModuleGetFunction, hipError_t(hipFunction_t*, hipModule_t, const char*))                  \
  X(hipModuleLaunchKernel, hipError_t(hipFunction_t, unsigned, unsigned, unsigned, unsigned,     \
                                          unsigned, unsigned, unsigned, hipStream_t, void**, void**)) \
  X(hipDeviceCanAccessPeer, hipError_t(int*, int, int))                                          \
  X(hipDeviceEnablePeerAccess, hipError_t(int, unsigned))                                        \
  X(hipIpcGetMemHandle, hipError_t(hipIpcMemHandle_t*, void*))                                   \
  X(hipIpcOpenMemHandle, hipError_t(void**, hipIpcMemHandle_t, unsigned))                        \
  X(hipIpcCloseMemHandle, hipError_t(void*))                                                     \
  X(hipStreamBeginCapture, hipError_t(hipStream_t, int))                                          \
  X(hipStreamIsCapturing, hipError_t(hipStream_t, int*))                                          \
  X(hipStreamEndCapture, hipError_t(hipStream_t, hipGraph_t*))                                    \
  X(hipGraphInstantiateWithFlags, hipError_t(hipGraphExec_t*, hipGraph_t, unsigned long long))    \
  X(hipGraphLaunch, hipError_t(hipGraphExec_t, hipStream_t))                                      \
  X(hipGraphExecDestroy, hipError_t(hipGraphExec_t))                                              \
  X(hipGraphDestroy, hipError_t(hipGraph_t))

struct HipRuntime {
  std::string path;
#define MEGAMOE_DECLARE_ENTRY(name, signature) Fn<signature> name = nullptr;
  MEGAMOE_HIP_ENTRY_POINTS(MEGAMOE_DECLARE_ENTRY)
#undef MEGAMOE_DECLARE_ENTRY

  void check(hipError_t result, const std::string& call) const {
    if (result == hipSuccess) return;
    const char* name = hipGetErrorName ? hipGetErrorName(result) : nullptr;
    const char* text = hipGetErrorString ? hipGetErrorString(result) : nullptr;
    std::ostringstream out;
    out << call << " failed: " << (name ? name : "hipErrorUnknown") << " (" << result
        << "): " << (text ? text : "no description");
    throw Error(ErrorCode::kDriverError, out.str());
  }
};

void* asPointer(DevicePtr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }
DevicePtr asAddress(const void* p) { return static_cast<DevicePtr>(reinterpret_cast<uintptr_t>(p)); }
std::string bytesText(size_t bytes) { return std::to_string(bytes) + " bytes"; }

class HipDevice final : public Device {
 public:
  HipDevice(std::shared_ptr<const HipRuntime> hip, int ordinal) : h_(std::move(hip)), ordinal_(ordinal) {
    const CurrentDevice current = makeCurrent();
    char name[256] = {};
    check(h_->hipDeviceGetName(name, sizeof name - 1, ordinal), "hipDeviceGetName");
    name_ = name;
  }

  BackendKind kind() const override { return BackendKind::kHip; }
  int ordinal() const override { return ordinal_; }
  std::string name() const override { return name_; }
  // The only AMD target the compiler generates; the device's real gcnArchName lives in hipDeviceProp_t, whose
  // layout changes between ROCm releases, so it is not read here (a wrong target fails at hipModuleLoadData).
  std::string target() const override { return "gfx950"; }
  // gfx950 parts (MI350X / MI355X) have 256 compute units; read from hipDeviceProp_t it would depend on its layout.
  int multiprocessors() const override { return 256; }

  DevicePtr allocate(size_t bytes) override {
    if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, "cannot allocate 0 bytes of device memory");
    const CurrentDevice current = makeCurrent();
    void* ptr = nullptr;
    check(h_->hipMalloc(&ptr, bytes), "hipMalloc(" + bytesText(bytes) + ")");
    return asAddress(ptr);
  }
  void free(DevicePtr ptr) override {
    if (!ptr) return;
    const CurrentDevice current = makeCurrent();
    check(h_->hipFree(asPointer(ptr)), "hipFree");
  }
  void memsetZero(DevicePtr dst, size_t bytes, StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipMemsetD8Async(asPointer(dst), 0, bytes, stream), "hipMemsetD8Async(" + bytesText(bytes) + ")");
  }
  void copyHostToDevice(DevicePtr dst, const void* src, size_t bytes) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipMemcpyHtoD(asPointer(dst), src, bytes), "hipMemcpyHtoD(" + bytesText(bytes) + ")");
  }
  void copyDeviceToHost(void* dst, DevicePtr src, size_t bytes) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipMemcpyDtoH(dst, asPointer(src), bytes), "hipMemcpyDtoH(" + bytesText(bytes) + ")");
  }
  void copyDeviceToDevice(DevicePtr dst, DevicePtr src, size_t bytes) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipMemcpyDtoD(asPointer(dst), asPointer(src), bytes), "hipMemcpyDtoD(" + bytesText(bytes) + ")");
  }
  void copyHostToDeviceAsync(DevicePtr dst, const void* src, size_t bytes, StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipMemcpyHtoDAsync(asPointer(dst), src, bytes, stream), "hipMemcpyHtoDAsync(" + bytesText(bytes) + ")");
  }
  void copyDeviceToHostAsync(void* dst, DevicePtr src, size_t bytes, StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipMemcpyDtoHAsync(dst, asPointer(src), bytes, stream), "hipMemcpyDtoHAsync(" + bytesText(bytes) + ")");
  }
  void copyDeviceToDeviceAsync(DevicePtr dst, DevicePtr src, size_t bytes, StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipMemcpyDtoDAsync(asPointer(dst), asPointer(src), bytes, stream),
          "hipMemcpyDtoDAsync(" + bytesText(bytes) + ")");
  }

  StreamHandle createStream() override {
    const CurrentDevice current = makeCurrent();
    hipStream_t stream = nullptr;
    check(h_->hipStreamCreateWithFlags(&stream, kHipStreamNonBlocking), "hipStreamCreateWithFlags");
    return stream;
  }
  void destroyStream(StreamHandle stream) override {
    if (!stream) return;
    const CurrentDevice current = makeCurrent();
    check(h_->hipStreamDestroy(stream), "hipStreamDestroy");
  }
  void synchronize(StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipStreamSynchronize(stream), "hipStreamSynchronize");
  }
  void synchronizeDevice() override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipDeviceSynchronize(), "hipDeviceSynchronize");
  }

  EventHandle createEvent() override {
    const CurrentDevice current = makeCurrent();
    hipEvent_t event = nullptr;
    check(h_->hipEventCreate(&event), "hipEventCreate");
    return event;
  }
  void destroyEvent(EventHandle event) override {
    if (!event) return;
    const CurrentDevice current = makeCurrent();
    check(h_->hipEventDestroy(event), "hipEventDestroy");
  }
  void recordEvent(EventHandle event, StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipEventRecord(event, stream), "hipEventRecord");
  }
  void synchronizeEvent(EventHandle event) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipEventSynchronize(event), "hipEventSynchronize");
  }
  float elapsedMilliseconds(EventHandle start, EventHandle end) override {
    const CurrentDevice current = makeCurrent();
    float ms = 0;
    check(h_->hipEventElapsedTime(&ms, start, end), "hipEventElapsedTime");
    return ms;
  }

  ModuleHandle loadModule(const void* image, size_t bytes) override {
    if (!image || bytes == 0) throw Error(ErrorCode::kInvalidArgument, "cannot load an empty code object");
    const CurrentDevice current = makeCurrent();
    hipModule_t module = nullptr;
    check(h_->hipModuleLoadData(&module, image), "hipModuleLoadData(" + bytesText(bytes) + ")");
    return module;
  }
  void unloadModule(ModuleHandle module) override {
    if (!module) return;
    const CurrentDevice current = makeCurrent();
    check(h_->hipModuleUnload(module), "hipModuleUnload");
  }
  FunctionHandle getFunction(ModuleHandle module, const std::string& symbol) override {
    const CurrentDevice current = makeCurrent();
    hipFunction_t function = nullptr;
    check(h_->hipModuleGetFunction(&function, module, symbol.c_str()), "hipModuleGetFunction(" + symbol + ")");
    return function;
  }

  // gfx950 has 160 KB of LDS per workgroup and HIP needs no opt-in attribute for dynamic LDS of module kernels.
  std::array<uint8_t, 128> encodeTensorMap(MapElem, DevicePtr, int, const uint64_t*, const uint64_t*,
                                           const uint32_t*) override {
    throw Error(ErrorCode::kUnsupported, "tensor maps are a CUDA (sm_90a TMA) feature; gfx950 kernels take none");
  }

  void launch(FunctionHandle function, const LaunchDims& dims, StreamHandle stream, void** params) override {
    if (!function) throw Error(ErrorCode::kInvalidArgument, "launch of a null function");
    if (!dims.grid.x || !dims.grid.y || !dims.grid.z || !dims.block.x || !dims.block.y || !dims.block.z)
      throw Error(ErrorCode::kInvalidArgument, "launch with an empty grid or block");
    if (dims.hasCluster())
      throw Error(ErrorCode::kUnsupported, "thread-block clusters are a CUDA feature; the HIP backend cannot "
                                           "launch with cluster dimensions");
    const CurrentDevice current = makeCurrent();
    check(h_->hipModuleLaunchKernel(function, dims.grid.x, dims.grid.y, dims.grid.z, dims.block.x, dims.block.y,
                                    dims.block.z, dims.sharedBytes, stream, params, nullptr),
          "hipModuleLaunchKernel");
  }

  bool isCapturing(StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    int status = 0;  // hipStreamCaptureStatus: 0 = none
    check(h_->hipStreamIsCapturing(stream, &status), "hipStreamIsCapturing");
    return status != 0;
  }
  void beginCapture(StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipStreamBeginCapture(stream, kHipStreamCaptureModeThreadLocal), "hipStreamBeginCapture");
  }
  GraphHandle endCapture(StreamHandle stream) override {
    const CurrentDevice current = makeCurrent();
    hipGraph_t graph = nullptr;
    check(h_->hipStreamEndCapture(stream, &graph), "hipStreamEndCapture");
    hipGraphExec_t exec = nullptr;
    const hipError_t result = h_->hipGraphInstantiateWithFlags(&exec, graph, 0);
    h_->hipGraphDestroy(graph);  // an instantiated graph does not depend on its template
    check(result, "hipGraphInstantiateWithFlags");
    return exec;
  }
  void launchGraph(GraphHandle graph, StreamHandle stream) override {
    if (!graph) throw Error(ErrorCode::kInvalidArgument, "launch of a null graph");
    const CurrentDevice current = makeCurrent();
    check(h_->hipGraphLaunch(graph, stream), "hipGraphLaunch");
  }
  void destroyGraph(GraphHandle graph) override {
    if (!graph) return;
    const CurrentDevice current = makeCurrent();
    check(h_->hipGraphExecDestroy(graph), "hipGraphExecDestroy");
  }

  bool canAccessPeer(const Device& peer) override {
    const int other = asHip(peer)->ordinal_;
    if (other == ordinal_) return true;
    int can = 0;
    check(h_->hipDeviceCanAccessPeer(&can, ordinal_, other), "hipDeviceCanAccessPeer");
    return can != 0;
  }
  void enablePeerAccess(const Device& peer) override {
    const int other = asHip(peer)->ordinal_;
    if (other == ordinal_) return;
    const CurrentDevice current = makeCurrent();
    const hipError_t result = h_->hipDeviceEnablePeerAccess(other, 0);
    if (result == hipErrorPeerAccessAlreadyEnabled) return;
    check(result, "hipDeviceEnablePeerAccess(device " + std::to_string(ordinal_) + " -> device " +
                      std::to_string(other) + ")");
  }

  IpcHandle exportIpcHandle(DevicePtr ptr) override {
    const CurrentDevice current = makeCurrent();
    hipIpcMemHandle_t handle{};
    check(h_->hipIpcGetMemHandle(&handle, asPointer(ptr)), "hipIpcGetMemHandle");
    static_assert(sizeof(handle) == kIpcHandleBytes, "hipIpcMemHandle_t is 64 bytes");
    IpcHandle out;
    std::memcpy(out.bytes.data(), &handle, sizeof handle);
    return out;
  }
  DevicePtr openIpcHandle(const IpcHandle& handle) override {
    const CurrentDevice current = makeCurrent();
    hipIpcMemHandle_t native{};
    std::memcpy(&native, handle.bytes.data(), sizeof native);
    void* ptr = nullptr;
    check(h_->hipIpcOpenMemHandle(&ptr, native, kHipIpcMemLazyEnablePeerAccess), "hipIpcOpenMemHandle");
    return asAddress(ptr);
  }
  void closeIpcHandle(DevicePtr mapped) override {
    const CurrentDevice current = makeCurrent();
    check(h_->hipIpcCloseMemHandle(asPointer(mapped)), "hipIpcCloseMemHandle");
  }

 private:
  static const HipDevice* asHip(const Device& device) {
    const auto* hip = dynamic_cast<const HipDevice*>(&device);
    if (!hip) throw Error(ErrorCode::kInvalidArgument, "peer device is not a HIP device");
    return hip;
  }
  void check(hipError_t result, const std::string& call) const {
    if (result != hipSuccess) h_->check(result, call + " on device " + std::to_string(ordinal_));
  }
  // This device, current on the calling thread for one call (ScopedCurrent.h).
  using CurrentDevice = ScopedCurrent<HipRuntime, int, &HipRuntime::hipSetDevice>;
  CurrentDevice makeCurrent() {
    int previous = 0;
    check(h_->hipGetDevice(&previous), "hipGetDevice");
    if (previous == ordinal_) return {h_.get(), previous, false};
    check(h_->hipSetDevice(ordinal_), "hipSetDevice");
    return {h_.get(), previous, true};
  }

  std::shared_ptr<const HipRuntime> h_;
  int ordinal_;
  std::string name_;
};

class HipBackend final : public Backend {
 public:
  explicit HipBackend(std::shared_ptr<const HipRuntime> hip) : h_(std::move(hip)) {
    int count = 0;
    h_->check(h_->hipGetDeviceCount(&count), "hipGetDeviceCount");
    devices_.resize(count);
  }
  BackendKind kind() const override { return BackendKind::kHip; }
  std::string libraryPath() const override { return h_->path; }
  int deviceCount() override { return static_cast<int>(devices_.size()); }
  std::shared_ptr<Device> device(int ordinal) override {
    if (ordinal < 0 || ordinal >= deviceCount())
      throw Error(ErrorCode::kInvalidArgument, "HIP device " + std::to_string(ordinal) + " does not exist (" +
                                                   std::to_string(deviceCount()) + " visible)");
    std::lock_guard<std::mutex> lock(mutex_);
    if (!devices_[ordinal]) devices_[ordinal] = std::make_shared<HipDevice>(h_, ordinal);
    return devices_[ordinal];
  }

 private:
  std::shared_ptr<const HipRuntime> h_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<Device>> devices_;
};

}  // namespace

std::shared_ptr<Backend> makeHipBackend(const std::string& libraryPath) {
  // Never closed, like the CUDA driver (see openBackend).
  void* library = ::dlopen(libraryPath.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = ::dlerror();
    throw Error(ErrorCode::kDriverNotFound, "HIP runtime " + libraryPath + " not found: " +
                                                (why ? why : "dlopen failed") +
                                                " (no ROCm on this machine, or set MEGAMOE_HIP_LIBRARY)");
  }
  auto hip = std::make_shared<HipRuntime>();
  hip->path = libraryPath;
  std::string missing;
#define MEGAMOE_RESOLVE_ENTRY(name, signature)                            \
  hip->name = reinterpret_cast<Fn<signature>>(::dlsym(library, #name));   \
  if (!hip->name) missing += (missing.empty() ? "" : ", ") + std::string(#name);
  MEGAMOE_HIP_ENTRY_POINTS(MEGAMOE_RESOLVE_ENTRY)
#undef MEGAMOE_RESOLVE_ENTRY
  if (!missing.empty())
    throw Error(ErrorCode::kDriverNotFound, "HIP runtime " + libraryPath + " does not export " + missing);
  hip->check(hip->hipInit(0), "hipInit");
  return std::make_shared<HipBackend>(std::move(hip));
}

}  // namespace megamoe::detail
