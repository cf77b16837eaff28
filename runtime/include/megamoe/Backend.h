// Device backends behind one small interface: CUDA (driver API, sm_90a) and HIP (module API, gfx950), both loaded
// with dlopen at run time so that nothing links a GPU driver and a machine without one still runs host code.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace megamoe {

enum class BackendKind { kCuda, kHip };
const char* backendKindName(BackendKind kind);  // "cuda" | "hip"

// Device addresses are plain 64-bit integers (CUdeviceptr, or a HIP pointer's value); 0 is null.
using DevicePtr = uint64_t;
// Native handles, passed through as-is (CUstream / hipStream_t ...); nullptr is the default stream.
using StreamHandle = void*;
using EventHandle = void*;
using ModuleHandle = void*;
using FunctionHandle = void*;
using GraphHandle = void*;  // an instantiated graph (CUgraphExec / hipGraphExec_t)

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

struct LaunchDims {
  Dim3 grid;
  Dim3 block;
  Dim3 cluster{0, 0, 0};   // all zero: no cluster launch; otherwise cuLaunchKernelEx with this cluster shape
  uint32_t sharedBytes = 0;  // dynamic shared memory
  bool hasCluster() const { return cluster.x != 0 || cluster.y != 0 || cluster.z != 0; }
};

// CUDA and HIP IPC handles are both 64 opaque bytes.
inline constexpr size_t kIpcHandleBytes = 64;
struct IpcHandle {
  std::array<uint8_t, kIpcHandleBytes> bytes{};
};

// One GPU. Every call makes the device current on the calling thread first; failures throw megamoe::Error
// naming the driver call and the driver's message.
class Device {
 public:
  virtual ~Device() = default;
  virtual BackendKind kind() const = 0;
  virtual int ordinal() const = 0;
  virtual std::string name() const = 0;
  // Code-object target this device runs: "sm_90a" (compute capability 9.0), "sm_XY" otherwise, or "gfx950".
  virtual std::string target() const = 0;
  // Streaming multiprocessors (CUDA) / compute units (HIP): the grid of persistent kernels.
  virtual int multiprocessors() const = 0;

  virtual DevicePtr allocate(size_t bytes) = 0;
  virtual void free(DevicePtr ptr) = 0;
  virtual void memsetZero(DevicePtr dst, size_t bytes, StreamHandle stream) = 0;
  virtual void copyHostToDevice(DevicePtr dst, const void* src, size_t bytes) = 0;
  virtual void copyDeviceToHost(void* dst, DevicePtr src, size_t bytes) = 0;
  virtual void copyDeviceToDevice(DevicePtr dst, DevicePtr src, size_t bytes) = 0;
  virtual void copyHostToDeviceAsync(DevicePtr dst, const void* src, size_t bytes, StreamHandle stream) = 0;
  virtual void copyDeviceToHostAsync(void* dst, DevicePtr src, size_t bytes, StreamHandle stream) = 0;
  virtual void copyDeviceToDeviceAsync(DevicePtr dst, DevicePtr src, size_t bytes, StreamHandle stream) = 0;

  virtual StreamHandle createStream() = 0;
  virtual void destroyStream(StreamHandle stream) = 0;
  virtual void synchronize(StreamHandle stream) = 0;
  virtual void synchronizeDevice() = 0;
  // Whether `stream` is being captured into a graph (then synchronising it would break the capture).
  virtual bool isCapturing(StreamHandle stream) = 0;
  // Throws Error(kInvalidArgument) naming `call` when `stream` is being captured: a call that waits for the device
  // belongs after the capture, and refusing it leaves the capture and the heap as they were.
  void requireNotCapturing(StreamHandle stream, const char* call);
  // A read-back ordered after `stream`'s work and waited for: the copy runs on `stream`, never on the legacy
  // default stream, whose other users (another rank's thread on the same GPU) may be waiting for this caller.
  void readBack(void* dst, DevicePtr src, size_t bytes, StreamHandle stream) {
    copyDeviceToHostAsync(dst, src, bytes, stream);
    synchronize(stream);
  }

  virtual EventHandle createEvent() = 0;
  virtual void destroyEvent(EventHandle event) = 0;
  virtual void recordEvent(EventHandle event, StreamHandle stream) = 0;
  virtual void synchronizeEvent(EventHandle event) = 0;
  virtual float elapsedMilliseconds(EventHandle start, EventHandle end) = 0;

  // A CUtensorMap (128 bytes, passed to a kernel by value) over a tensor of `rank` (1..5) dimensions of bf16, or of
  // bytes (u8: FP8 e4m3 codes), innermost first: dims in elements, strides in bytes for dimensions 1..rank-1, boxes
  // of `box` elements, the 128-byte swizzle (the b128 layout of the MMA tiles), zero fill outside the tensor. CUDA
  // only (sm_90a TMA).
  enum class MapElem { kBf16, kU8 };
  virtual std::array<uint8_t, 128> encodeTensorMap(MapElem elem, DevicePtr base, int rank, const uint64_t* dims,
                                                   const uint64_t* strides, const uint32_t* box) = 0;

  virtual ModuleHandle loadModule(const void* image, size_t bytes) = 0;
  virtual void unloadModule(ModuleHandle module) = 0;
  virtual FunctionHandle getFunction(ModuleHandle module, const std::string& symbol) = 0;
  // `params` is the usual array of pointers to each kernel argument. Raises the function's dynamic shared memory
  // limit first when sharedBytes exceeds the 48 KB default (CUDA).
  virtual void launch(FunctionHandle function, const LaunchDims& dims, StreamHandle stream, void** params) = 0;

  // Graphs: what is enqueued on `stream` between beginCapture and endCapture is recorded instead of run (kernel
  // arguments by value); endCapture returns it instantiated, to be replayed by launchGraph any number of times
  // without host synchronisation. Capture is thread-local; the default stream cannot be captured.
  virtual void beginCapture(StreamHandle stream) = 0;
  virtual GraphHandle endCapture(StreamHandle stream) = 0;
  virtual void launchGraph(GraphHandle graph, StreamHandle stream) = 0;
  virtual void destroyGraph(GraphHandle graph) = 0;

  virtual bool canAccessPeer(const Device& peer) = 0;
  // Idempotent: "already enabled" is success.
  virtual void enablePeerAccess(const Device& peer) = 0;

  // `ptr` must be the base of an allocation from allocate().
  virtual IpcHandle exportIpcHandle(DevicePtr ptr) = 0;
  // Maps a peer process's allocation into this process; the result is a local device address.
  virtual DevicePtr openIpcHandle(const IpcHandle& handle) = 0;
  virtual void closeIpcHandle(DevicePtr mapped) = 0;
};

// A loaded driver library. Devices are created once per ordinal and shared.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  virtual std::string libraryPath() const = 0;
  virtual int deviceCount() = 0;
  virtual std::shared_ptr<Device> device(int ordinal) = 0;
};

// Loads (once per kind and library path) the driver library and initialises it. `libraryPath` empty means the
// environment's choice (MEGAMOE_CUDA_LIBRARY / MEGAMOE_HIP_LIBRARY, see env.h). A missing library throws
// Error(kDriverNotFound, "CUDA driver libcuda.so.1 not found: ..."); a driver without devices throws
// Error(kDriverError, ...). The library stays loaded for the life of the process.
std::shared_ptr<Backend> openBackend(BackendKind kind, const std::string& libraryPath = "");

}  // namespace megamoe
