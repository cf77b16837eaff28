// CUDA driver-API backend. libcuda.so.1 is opened with dlopen (never linked: CI machines have no driver); the
// driver's types and signatures come from CudaDriverApi.h, so no CUDA toolkit is needed to build. Entry points come
// from cuGetProcAddress at ABI version 12000, which picks the right _v2/_v3 variant of each; contexts are the
// devices' primary contexts (CUDA 13 changed cuCtxCreate).
#include <dlfcn.h>

#include <cstring>
#include <iterator>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "BackendFactories.h"
#include "CudaDriverApi.h"
#include "ScopedCurrent.h"
#include "megamoe/Error.h"

namespace megamoe::detail {
namespace {

constexpr int kRequestedDriverApi = 12000;
constexpr uint32_t kDefaultSharedLimit = 48 * 1024;

using namespace cu;

template <typename Signature>
using Fn = Signature*;

struct CudaDriver {
  std::string path;
#define MEGAMOE_DECLARE_ENTRY(name, signature) Fn<signature> name = nullptr;
  MEGAMOE_CUDA_ENTRY_POINTS(MEGAMOE_DECLARE_ENTRY)
#undef MEGAMOE_DECLARE_ENTRY

  std::string describe(CUresult result) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (cuGetErrorName) cuGetErrorName(result, &name);
    if (cuGetErrorString) cuGetErrorString(result, &text);
    std::ostringstream out;
    out << (name ? name : "CUDA_ERROR_UNKNOWN") << " (" << static_cast<int>(result) << "): "
        << (text ? text : "no description");
    return out.str();
  }

  void check(CUresult result, const std::string& call) const {
    if (result != CUDA_SUCCESS) throw Error(ErrorCode::kDriverError, call + " failed: " + describe(result));
  }
};

std::string bytesText(size_t bytes) { return std::to_string(bytes) + " bytes"; }

class CudaDevice final : public Device {
 public:
  CudaDevice(std::shared_ptr<const CudaDriver> driver, int ordinal) : d_(std::move(driver)), ordinal_(ordinal) {
    const std::string where = "(device " + std::to_string(ordinal) + ")";
    d_->check(d_->cuDeviceGet(&device_, ordinal), "cuDeviceGet" + where);
    d_->check(d_->cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain" + where);
    char name[256] = {};
    d_->check(d_->cuDeviceGetName(name, sizeof name - 1, device_), "cuDeviceGetName" + where);
    name_ = name;
    int major = 0, minor = 0;
    d_->check(d_->cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_),
              "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)" + where);
    d_->check(d_->cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_),
              "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)" + where);
    d_->check(d_->cuDeviceGetAttribute(&multiprocessors_, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_),
              "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)" + where);
    // Our Hopper kernels use wgmma/TMA, which exist only in the arch-specific sm_90a.
    target_ = "sm_" + std::to_string(major) + std::to_string(minor) + (major == 9 && minor == 0 ? "a" : "");
  }
  ~CudaDevice() override { d_->cuDevicePrimaryCtxRelease(device_); }

  BackendKind kind() const override { return BackendKind::kCuda; }
  int ordinal() const override { return ordinal_; }
  std::string name() const override { return name_; }
  std::string target() const override { return target_; }
  int multiprocessors() const override { return multiprocessors_; }

  DevicePtr allocate(size_t bytes) override {
    if (bytes == 0) throw Error(ErrorCode::kInvalidArgument, "cannot allocate 0 bytes of device memory");
    const CurrentContext current = makeCurrent();
    CUdeviceptr ptr = 0;
    check(d_->cuMemAlloc(&ptr, bytes), "cuMemAlloc(" + bytesText(bytes) + ")");
    return ptr;
  }
  void free(DevicePtr ptr) override {
    if (!ptr) return;
    const CurrentContext current = makeCurrent();
    check(d_->cuMemFree(ptr), "cuMemFree");
  }
  void memsetZero(DevicePtr dst, size_t bytes, StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuMemsetD8Async(dst, 0, bytes, asStream(stream)), "cuMemsetD8Async(" + bytesText(bytes) + ")");
  }
  void copyHostToDevice(DevicePtr dst, const void* src, size_t bytes) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD(" + bytesText(bytes) + ")");
  }
  void copyDeviceToHost(void* dst, DevicePtr src, size_t bytes) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH(" + bytesText(bytes) + ")");
  }
  void copyDeviceToDevice(DevicePtr dst, DevicePtr src, size_t bytes) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuMemcpyDtoD(dst, src, bytes), "cuMemcpyDtoD(" + bytesText(bytes) + ")");
  }
  void copyHostToDeviceAsync(DevicePtr dst, const void* src, size_t bytes, StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuMemcpyHtoDAsync(dst, src, bytes, asStream(stream)), "cuMemcpyHtoDAsync(" + bytesText(bytes) + ")");
  }
  void copyDeviceToHostAsync(void* dst, DevicePtr src, size_t bytes, StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuMemcpyDtoHAsync(dst, src, bytes, asStream(stream)), "cuMemcpyDtoHAsync(" + bytesText(bytes) + ")");
  }
  void copyDeviceToDeviceAsync(DevicePtr dst, DevicePtr src, size_t bytes, StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuMemcpyDtoDAsync(dst, src, bytes, asStream(stream)), "cuMemcpyDtoDAsync(" + bytesText(bytes) + ")");
  }

  StreamHandle createStream() override {
    const CurrentContext current = makeCurrent();
    CUstream stream = nullptr;
    check(d_->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return stream;
  }
  void destroyStream(StreamHandle stream) override {
    if (!stream) return;
    const CurrentContext current = makeCurrent();
    check(d_->cuStreamDestroy(asStream(stream)), "cuStreamDestroy");
  }
  void synchronize(StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuStreamSynchronize(asStream(stream)), "cuStreamSynchronize");
  }
  void synchronizeDevice() override {
    const CurrentContext current = makeCurrent();
    check(d_->cuCtxSynchronize(), "cuCtxSynchronize");
  }

  EventHandle createEvent() override {
    const CurrentContext current = makeCurrent();
    CUevent event = nullptr;
    check(d_->cuEventCreate(&event, CU_EVENT_DEFAULT), "cuEventCreate");
    return event;
  }
  void destroyEvent(EventHandle event) override {
    if (!event) return;
    const CurrentContext current = makeCurrent();
    check(d_->cuEventDestroy(static_cast<CUevent>(event)), "cuEventDestroy");
  }
  void recordEvent(EventHandle event, StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuEventRecord(static_cast<CUevent>(event), asStream(stream)), "cuEventRecord");
  }
  void synchronizeEvent(EventHandle event) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuEventSynchronize(static_cast<CUevent>(event)), "cuEventSynchronize");
  }
  float elapsedMilliseconds(EventHandle start, EventHandle end) override {
    const CurrentContext current = makeCurrent();
    float ms = 0;
    check(d_->cuEventElapsedTime(&ms, static_cast<CUevent>(start), static_cast<CUevent>(end)),
          "cuEventElapsedTime");
    return ms;
  }

  ModuleHandle loadModule(const void* image, size_t bytes) override {
    if (!image || bytes == 0) throw Error(ErrorCode::kInvalidArgument, "cannot load an empty code object");
    const CurrentContext current = makeCurrent();
    CUmodule module = nullptr;
    check(d_->cuModuleLoadData(&module, image), "cuModuleLoadData(" + bytesText(bytes) + ")");
    return module;
  }
  void unloadModule(ModuleHandle module) override {
    if (!module) return;
    const CurrentContext current = makeCurrent();
    check(d_->cuModuleUnload(static_cast<CUmodule>(module)), "cuModuleUnload");
    // The driver may hand a later module's function the same handle: forget the limits raised for this one's.
    std::lock_guard<std::mutex> lock(sharedMutex_);
    for (auto it = sharedLimit_.begin(); it != sharedLimit_.end();)
      it = it->second.module == module ? sharedLimit_.erase(it) : std::next(it);
  }
  FunctionHandle getFunction(ModuleHandle module, const std::string& symbol) override {
    const CurrentContext current = makeCurrent();
    CUfunction function = nullptr;
    check(d_->cuModuleGetFunction(&function, static_cast<CUmodule>(module), symbol.c_str()),
          "cuModuleGetFunction(" + symbol + ")");
    std::lock_guard<std::mutex> lock(sharedMutex_);
    sharedLimit_[function] = {module, 0};
    return function;
  }

  std::array<uint8_t, 128> encodeTensorMap(MapElem elem, DevicePtr base, int rank, const uint64_t* dims,
                                           const uint64_t* strides, const uint32_t* box) override {
    if (rank < 1 || rank > 5) throw Error(ErrorCode::kInvalidArgument, "a tensor map has 1..5 dimensions");
    // The driver encodes against the current context (CUDA_ERROR_INVALID_CONTEXT on a thread without one).
    const CurrentContext current = makeCurrent();
    CUtensorMap map{};
    cuuint64_t d[5], st[5];
    cuuint32_t b[5], one[5] = {1, 1, 1, 1, 1};
    for (int i = 0; i < rank; ++i) {
      d[i] = dims[i];
      b[i] = box[i];
      if (i + 1 < rank) st[i] = strides[i];
    }
    const CUtensorMapDataType type =
        elem == MapElem::kU8 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    check(d_->cuTensorMapEncodeTiled(&map, type, cuuint32_t(rank), reinterpret_cast<void*>(base),
                                     d, st, b, one, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "cuTensorMapEncodeTiled");
    std::array<uint8_t, 128> out{};
    std::memcpy(out.data(), &map, sizeof(map));
    return out;
  }

  void launch(FunctionHandle function, const LaunchDims& dims, StreamHandle stream, void** params) override {
    if (!function) throw Error(ErrorCode::kInvalidArgument, "launch of a null function");
    if (!dims.grid.x || !dims.grid.y || !dims.grid.z || !dims.block.x || !dims.block.y || !dims.block.z)
      throw Error(ErrorCode::kInvalidArgument, "launch with an empty grid or block");
    const CurrentContext current = makeCurrent();
    auto* f = static_cast<CUfunction>(function);
    if (dims.sharedBytes > kDefaultSharedLimit) raiseSharedLimit(f, dims.sharedBytes);
    if (!dims.hasCluster()) {
      check(d_->cuLaunchKernel(f, dims.grid.x, dims.grid.y, dims.grid.z, dims.block.x, dims.block.y, dims.block.z,
                               dims.sharedBytes, asStream(stream), params, nullptr),
            "cuLaunchKernel");
      return;
    }
    CUlaunchAttribute cluster{};
    cluster.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    cluster.value.clusterDim.x = dims.cluster.x ? dims.cluster.x : 1;
    cluster.value.clusterDim.y = dims.cluster.y ? dims.cluster.y : 1;
    cluster.value.clusterDim.z = dims.cluster.z ? dims.cluster.z : 1;
    CUlaunchConfig config{};
    config.gridDimX = dims.grid.x;
    config.gridDimY = dims.grid.y;
    config.gridDimZ = dims.grid.z;
    config.blockDimX = dims.block.x;
    config.blockDimY = dims.block.y;
    config.blockDimZ = dims.block.z;
    config.sharedMemBytes = dims.sharedBytes;
    config.hStream = asStream(stream);
    config.attrs = &cluster;
    config.numAttrs = 1;
    check(d_->cuLaunchKernelEx(&config, f, params, nullptr), "cuLaunchKernelEx(cluster)");
  }

  bool isCapturing(StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    check(d_->cuStreamIsCapturing(asStream(stream), &status), "cuStreamIsCapturing");
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  }
  void beginCapture(StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuStreamBeginCapture(asStream(stream), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "cuStreamBeginCapture");
  }
  GraphHandle endCapture(StreamHandle stream) override {
    const CurrentContext current = makeCurrent();
    CUgraph graph = nullptr;
    check(d_->cuStreamEndCapture(asStream(stream), &graph), "cuStreamEndCapture");
    CUgraphExec exec = nullptr;
    const CUresult result = d_->cuGraphInstantiateWithFlags(&exec, graph, 0);
    d_->cuGraphDestroy(graph);  // an instantiated graph does not depend on its template
    check(result, "cuGraphInstantiateWithFlags");
    return exec;
  }
  void launchGraph(GraphHandle graph, StreamHandle stream) override {
    if (!graph) throw Error(ErrorCode::kInvalidArgument, "launch of a null graph");
    const CurrentContext current = makeCurrent();
    check(d_->cuGraphLaunch(static_cast<CUgraphExec>(graph), asStream(stream)), "cuGraphLaunch");
  }
  void destroyGraph(GraphHandle graph) override {
    if (!graph) return;
    const CurrentContext current = makeCurrent();
    check(d_->cuGraphExecDestroy(static_cast<CUgraphExec>(graph)), "cuGraphExecDestroy");
  }

  bool canAccessPeer(const Device& peer) override {
    const auto* other = asCuda(peer);
    if (other->ordinal_ == ordinal_) return true;
    int can = 0;
    check(d_->cuDeviceCanAccessPeer(&can, device_, other->device_), "cuDeviceCanAccessPeer");
    return can != 0;
  }
  void enablePeerAccess(const Device& peer) override {
    const auto* other = asCuda(peer);
    if (other->ordinal_ == ordinal_) return;
    const CurrentContext current = makeCurrent();
    const CUresult result = d_->cuCtxEnablePeerAccess(other->context_, 0);
    if (result == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) return;
    check(result, "cuCtxEnablePeerAccess(device " + std::to_string(ordinal_) + " -> device " +
                      std::to_string(other->ordinal_) + ")");
  }

  IpcHandle exportIpcHandle(DevicePtr ptr) override {
    const CurrentContext current = makeCurrent();
    CUipcMemHandle handle{};
    check(d_->cuIpcGetMemHandle(&handle, ptr), "cuIpcGetMemHandle");
    static_assert(sizeof(handle) == kIpcHandleBytes, "CUipcMemHandle size changed");
    IpcHandle out;
    std::memcpy(out.bytes.data(), &handle, sizeof handle);
    return out;
  }
  DevicePtr openIpcHandle(const IpcHandle& handle) override {
    const CurrentContext current = makeCurrent();
    CUipcMemHandle native{};
    std::memcpy(&native, handle.bytes.data(), sizeof native);
    CUdeviceptr ptr = 0;
    check(d_->cuIpcOpenMemHandle(&ptr, native, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle");
    return ptr;
  }
  void closeIpcHandle(DevicePtr mapped) override {
    const CurrentContext current = makeCurrent();
    check(d_->cuIpcCloseMemHandle(mapped), "cuIpcCloseMemHandle");
  }

 private:
  static CUstream asStream(StreamHandle stream) { return static_cast<CUstream>(stream); }
  static const CudaDevice* asCuda(const Device& device) {
    const auto* cuda = dynamic_cast<const CudaDevice*>(&device);
    if (!cuda) throw Error(ErrorCode::kInvalidArgument, "peer device is not a CUDA device");
    return cuda;
  }
  void check(CUresult result, const std::string& call) const {
    if (result != CUDA_SUCCESS)
      d_->check(result, call + " on device " + std::to_string(ordinal_));
  }
  // This device's context, current on the calling thread for one call (ScopedCurrent.h).
  using CurrentContext = ScopedCurrent<CudaDriver, CUcontext, &CudaDriver::cuCtxSetCurrent>;
  CurrentContext makeCurrent() {
    CUcontext previous = nullptr;
    check(d_->cuCtxGetCurrent(&previous), "cuCtxGetCurrent");
    if (previous == context_) return {d_.get(), previous, false};
    check(d_->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
    return {d_.get(), previous, true};
  }

  void raiseSharedLimit(CUfunction f, uint32_t bytes) {
    std::lock_guard<std::mutex> lock(sharedMutex_);
    uint32_t& current = sharedLimit_[f].bytes;
    if (current >= bytes) return;
    check(d_->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes)),
          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES=" + std::to_string(bytes) + ")");
    current = bytes;
  }

  std::shared_ptr<const CudaDriver> d_;
  int ordinal_;
  int multiprocessors_ = 0;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::string name_, target_;
  std::mutex sharedMutex_;
  struct SharedLimit {
    ModuleHandle module = nullptr;
    uint32_t bytes = 0;  // the dynamic shared memory limit raised so far (0: the 48 KB default)
  };
  std::unordered_map<CUfunction, SharedLimit> sharedLimit_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(std::shared_ptr<const CudaDriver> driver) : d_(std::move(driver)) {
    int count = 0;
    d_->check(d_->cuDeviceGetCount(&count), "cuDeviceGetCount");
    devices_.resize(count);
  }
  BackendKind kind() const override { return BackendKind::kCuda; }
  std::string libraryPath() const override { return d_->path; }
  int deviceCount() override { return static_cast<int>(devices_.size()); }
  std::shared_ptr<Device> device(int ordinal) override {
    if (ordinal < 0 || ordinal >= deviceCount())
      throw Error(ErrorCode::kInvalidArgument, "CUDA device " + std::to_string(ordinal) + " does not exist (" +
                                                   std::to_string(deviceCount()) + " visible)");
    std::lock_guard<std::mutex> lock(mutex_);
    if (!devices_[ordinal]) devices_[ordinal] = std::make_shared<CudaDevice>(d_, ordinal);
    return devices_[ordinal];
  }

 private:
  std::shared_ptr<const CudaDriver> d_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<Device>> devices_;
};

}  // namespace

std::shared_ptr<Backend> makeCudaBackend(const std::string& libraryPath) {
  // Never closed: code and data of the driver must outlive every module and context (see openBackend).
  void* library = ::dlopen(libraryPath.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    const char* why = ::dlerror();
    throw Error(ErrorCode::kDriverNotFound, "CUDA driver " + libraryPath + " not found: " +
                                                (why ? why : "dlopen failed") +
                                                " (no NVIDIA driver on this machine, or set MEGAMOE_CUDA_LIBRARY)");
  }
  auto getProcAddress = reinterpret_cast<GetProcAddress>(::dlsym(library, "cuGetProcAddress_v2"));
  if (!getProcAddress)
    throw Error(ErrorCode::kDriverNotFound, "CUDA driver " + libraryPath +
                                                " lacks cuGetProcAddress_v2: a CUDA 12 or newer driver is required");
  auto driver = std::make_shared<CudaDriver>();
  driver->path = libraryPath;
  std::vector<std::string> missing;
#define MEGAMOE_RESOLVE_ENTRY(name, signature)                                                                   \
  {                                                                                                              \
    void* fn = nullptr;                                                                                          \
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;                                         \
    if (getProcAddress(#name, &fn, kRequestedDriverApi, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS || \
        status != CU_GET_PROC_ADDRESS_SUCCESS || !fn)                                                            \
      missing.push_back(#name);                                                                                  \
    driver->name = reinterpret_cast<decltype(driver->name)>(fn);                                                 \
  }
  MEGAMOE_CUDA_ENTRY_POINTS(MEGAMOE_RESOLVE_ENTRY)
#undef MEGAMOE_RESOLVE_ENTRY
  if (!missing.empty()) {
    std::string names;
    for (const auto& n : missing) names += (names.empty() ? "" : ", ") + n;
    throw Error(ErrorCode::kDriverNotFound, "CUDA driver " + libraryPath + " does not provide " + names +
                                                " at API version " + std::to_string(kRequestedDriverApi));
  }
  driver->check(driver->cuInit(0), "cuInit");
  return std::make_shared<CudaBackend>(std::move(driver));
}

}  // namespace megamoe::detail
