// A fake libamdhip64: exports the HIP entry points the runtime's HIP backend resolves, records every call, and fakes
// device memory with POSIX shared memory (so IPC handles work across fork()ed processes, like the real thing).
// Loaded through MEGAMOE_HIP_LIBRARY (or openBackend's path); tests query it through the fakehip_* functions.
#include <fcntl.h>
#include <cerrno>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "FakeHipControl.h"
#include "compiler/abi/DeviceAbi.h"

namespace {

using hipError_t = int;
constexpr hipError_t kSuccess = 0;
constexpr hipError_t kInvalidValue = 1;
constexpr hipError_t kOutOfMemory = 2;
constexpr hipError_t kInvalidDevice = 101;
constexpr hipError_t kInvalidImage = 200;
constexpr hipError_t kInvalidHandle = 400;
constexpr hipError_t kNotFound = 500;
constexpr hipError_t kPeerAlreadyEnabled = 704;

struct hipIpcMemHandle_t {
  char reserved[64];
};

struct Allocation {
  size_t bytes;
  int device;
  std::string shmName;
  bool imported;  // opened through IPC (closed, not freed)
};

struct FakeFunction {
  std::string name;
  int nparams;
};

struct FakeModule {
  std::vector<FakeFunction*> functions;
};

// A launch recorded while its stream was capturing; parameters kept as each one's first 8 bytes (as FakeHipLaunch).
struct RecordedLaunch {
  const FakeFunction* function;
  unsigned grid[3], block[3], shared;
  std::vector<uint64_t> params;
};
struct FakeGraph {
  std::vector<RecordedLaunch> launches;
};

struct State {
  std::mutex mutex;
  std::map<void*, FakeGraph*> capturing;  // stream -> graph being recorded
  std::map<void*, Allocation> allocations;
  std::map<std::string, int> calls;
  std::vector<FakeHipLaunch> launches;
  std::vector<std::pair<int, int>> peerEnabled;
  int modulesLoaded = 0;
  int modulesUnloaded = 0;
  int ipcOpen = 0;
  unsigned shmCounter = 0;
  int mallocsBeforeFailure = -1;  // fakehip_fail_malloc_after: the hipMalloc calls that still succeed (-1: all)
};

State& state() {
  static State* s = new State;  // never destroyed: the runtime may call in during static destruction
  return *s;
}

thread_local int currentDevice = 0;

int deviceCount() {
  const char* env = std::getenv("FAKEHIP_DEVICE_COUNT");
  return env ? std::atoi(env) : 4;
}

void record(const char* call) {
  std::lock_guard<std::mutex> lock(state().mutex);
  ++state().calls[call];
}

void* mapShared(const std::string& name, size_t bytes, bool create) {
  int fd = ::shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  // A name of ours that exists already was left by a dead process with our pid (names hold the creator's pid and
  // a counter; a crashed test leaves its objects behind): reuse after unlinking it.
  if (fd < 0 && create && errno == EEXIST) {
    ::shm_unlink(name.c_str());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return nullptr;
  if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return nullptr;
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return p == MAP_FAILED ? nullptr : p;
}

// The IPC handle's bytes: the shared-memory object's name and size.
struct HandleBytes {
  char name[48];
  uint64_t bytes;
  uint64_t magic;
};
static_assert(sizeof(HandleBytes) == 64, "handle layout");
constexpr uint64_t kHandleMagic = 0xfa6e41bull;

// Kernel behaviours, by name, for tests that need a "kernel" to do something.
void runFakeKernel(const FakeFunction& f, void** params) {
  if (f.name == "fake_report_timeout" && params) {
    // params[0]: DeviceContext* — behaves like the bounded wait helper giving up.
    uint64_t contextAddress = 0;
    std::memcpy(&contextAddress, params[0], sizeof contextAddress);
    const auto* ctx = reinterpret_cast<const megamoe::abi::DeviceContext*>(static_cast<uintptr_t>(contextAddress));
    auto* err = reinterpret_cast<megamoe::abi::DeviceError*>(static_cast<uintptr_t>(ctx->error));
    if (err->code == 0) {
      err->rank = ctx->rank;
      err->flag = 7;
      err->seen = 3;
      err->expected = 4;
      err->block = 12;
      err->code = static_cast<uint64_t>(megamoe::abi::ErrorCode::kWaitTimeout);
    }
  }
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- HIP API subset
const char* hipGetErrorName(hipError_t e) {
  switch (e) {
    case kSuccess: return "hipSuccess";
    case kInvalidValue: return "hipErrorInvalidValue";
    case kOutOfMemory: return "hipErrorOutOfMemory";
    case kInvalidDevice: return "hipErrorInvalidDevice";
    case kInvalidImage: return "hipErrorInvalidImage";
    case kInvalidHandle: return "hipErrorInvalidHandle";
    case kNotFound: return "hipErrorNotFound";
    case kPeerAlreadyEnabled: return "hipErrorPeerAccessAlreadyEnabled";
  }
  return "hipErrorUnknown";
}
const char* hipGetErrorString(hipError_t e) {
  switch (e) {
    case kSuccess: return "no error";
    case kInvalidImage: return "device kernel image is invalid";
    case kNotFound: return "named symbol not found";
    case kInvalidDevice: return "invalid device ordinal";
  }
  return "fake HIP error";
}
hipError_t hipInit(unsigned) {
  record("hipInit");
  return kSuccess;
}
hipError_t hipGetDeviceCount(int* n) {
  record("hipGetDeviceCount");
  *n = deviceCount();
  return kSuccess;
}
hipError_t hipSetDevice(int d) {
  if (d < 0 || d >= deviceCount()) return kInvalidDevice;
  currentDevice = d;
  return kSuccess;
}
hipError_t hipGetDevice(int* d) {
  *d = currentDevice;
  return kSuccess;
}
hipError_t hipDeviceGetName(char* name, int len, int d) {
  std::snprintf(name, static_cast<size_t>(len), "Fake gfx950 #%d", d);
  return kSuccess;
}
hipError_t hipDeviceSynchronize() {
  record("hipDeviceSynchronize");
  return kSuccess;
}
hipError_t hipMalloc(void** p, size_t bytes) {
  record("hipMalloc");
  if (!p || bytes == 0) return kInvalidValue;
  std::string name;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    if (state().mallocsBeforeFailure == 0) {
      state().mallocsBeforeFailure = -1;
      return kOutOfMemory;
    }
    if (state().mallocsBeforeFailure > 0) --state().mallocsBeforeFailure;
    name = "/fakehip-" + std::to_string(::getpid()) + "-" + std::to_string(state().shmCounter++);
  }
  void* mem = mapShared(name, bytes, true);
  if (!mem) return kOutOfMemory;
  std::memset(mem, 0xA5, bytes);  // like real memory, not zeroed: the runtime must clear what it relies on
  std::lock_guard<std::mutex> lock(state().mutex);
  state().allocations[mem] = Allocation{bytes, currentDevice, name, false};
  *p = mem;
  return kSuccess;
}
hipError_t hipFree(void* p) {
  record("hipFree");
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().allocations.find(p);
  if (it == state().allocations.end() || it->second.imported) return kInvalidValue;
  ::munmap(p, it->second.bytes);
  ::shm_unlink(it->second.shmName.c_str());
  state().allocations.erase(it);
  return kSuccess;
}
hipError_t hipMemsetD8Async(void* p, unsigned char v, size_t n, void*) {
  record("hipMemsetD8Async");
  std::memset(p, v, n);
  return kSuccess;
}
hipError_t hipMemcpyHtoD(void* d, const void* s, size_t n) {
  record("hipMemcpyHtoD");
  std::memcpy(d, s, n);
  return kSuccess;
}
hipError_t hipMemcpyDtoH(void* d, void* s, size_t n) {
  record("hipMemcpyDtoH");
  std::memcpy(d, s, n);
  return kSuccess;
}
hipError_t hipMemcpyDtoD(void* d, void* s, size_t n) {
  record("hipMemcpyDtoD");
  std::memmove(d, s, n);
  return kSuccess;
}
hipError_t hipMemcpyHtoDAsync(void* d, const void* s, size_t n, void*) {
  record("hipMemcpyHtoDAsync");
  std::memcpy(d, s, n);
  return kSuccess;
}
hipError_t hipMemcpyDtoHAsync(void* d, void* s, size_t n, void*) {
  record("hipMemcpyDtoHAsync");
  std::memcpy(d, s, n);
  return kSuccess;
}
hipError_t hipMemcpyDtoDAsync(void* d, void* s, size_t n, void*) {
  record("hipMemcpyDtoDAsync");
  std::memmove(d, s, n);
  return kSuccess;
}
hipError_t hipStreamCreateWithFlags(void** s, unsigned) {
  record("hipStreamCreateWithFlags");
  *s = new int(1);
  return kSuccess;
}
hipError_t hipStreamDestroy(void* s) {
  record("hipStreamDestroy");
  delete static_cast<int*>(s);
  return kSuccess;
}
hipError_t hipStreamSynchronize(void* s) {
  record("hipStreamSynchronize");
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().capturing.count(s) ? kInvalidValue : kSuccess;  // the real one fails (and breaks the capture)
}
hipError_t hipStreamIsCapturing(void* s, int* status) {
  record("hipStreamIsCapturing");
  std::lock_guard<std::mutex> lock(state().mutex);
  *status = state().capturing.count(s) ? 1 : 0;
  return kSuccess;
}
hipError_t hipEventCreate(void** e) {
  record("hipEventCreate");
  *e = new double(0);
  return kSuccess;
}
hipError_t hipEventDestroy(void* e) {
  record("hipEventDestroy");
  delete static_cast<double*>(e);
  return kSuccess;
}
hipError_t hipEventRecord(void* e, void*) {
  record("hipEventRecord");
  *static_cast<double*>(e) =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return kSuccess;
}
hipError_t hipEventSynchronize(void*) { return kSuccess; }
hipError_t hipEventElapsedTime(float* ms, void* a, void* b) {
  *ms = static_cast<float>(*static_cast<double*>(b) - *static_cast<double*>(a));
  return kSuccess;
}
// Image: "FAKEHIP\n" then one "name nparams" line per kernel, NUL-terminated.
hipError_t hipModuleLoadData(void** module, const void* image) {
  record("hipModuleLoadData");
  const char* text = static_cast<const char*>(image);
  if (std::strncmp(text, "FAKEHIP\n", 8) != 0) return kInvalidImage;
  auto* m = new FakeModule;
  std::istringstream lines(text + 8);
  std::string name;
  int nparams = 0;
  while (lines >> name >> nparams) m->functions.push_back(new FakeFunction{name, nparams});
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    ++state().modulesLoaded;
  }
  *module = m;
  return kSuccess;
}
hipError_t hipModuleUnload(void* module) {
  record("hipModuleUnload");
  auto* m = static_cast<FakeModule*>(module);
  for (auto* f : m->functions) delete f;
  delete m;
  std::lock_guard<std::mutex> lock(state().mutex);
  ++state().modulesUnloaded;
  return kSuccess;
}
hipError_t hipModuleGetFunction(void** function, void* module, const char* name) {
  record("hipModuleGetFunction");
  for (auto* f : static_cast<FakeModule*>(module)->functions)
    if (f->name == name) {
      *function = f;
      return kSuccess;
    }
  return kNotFound;
}
}  // extern "C"

namespace {
void launchNow(const FakeFunction* f, const unsigned grid[3], const unsigned block[3], unsigned shared, void* stream,
               void** params) {
  FakeHipLaunch launch{};
  std::snprintf(launch.name, sizeof launch.name, "%s", f->name.c_str());
  std::memcpy(launch.grid, grid, sizeof launch.grid);
  std::memcpy(launch.block, block, sizeof launch.block);
  launch.sharedBytes = shared;
  launch.stream = stream;
  launch.device = currentDevice;
  launch.nparams = f->nparams < 32 ? f->nparams : 32;
  for (int i = 0; i < launch.nparams; ++i) std::memcpy(&launch.params[i], params[i], sizeof(uint64_t));
  runFakeKernel(*f, params);
  std::lock_guard<std::mutex> lock(state().mutex);
  state().launches.push_back(launch);
}
}  // namespace

extern "C" {

hipError_t hipModuleLaunchKernel(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned shared, void* stream, void** params, void** extra) {
  record("hipModuleLaunchKernel");
  if (extra) return kInvalidValue;
  const auto* f = static_cast<const FakeFunction*>(function);
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    auto capture = state().capturing.find(stream);
    if (capture != state().capturing.end()) {
      RecordedLaunch recorded{f, {gx, gy, gz}, {bx, by, bz}, shared, {}};
      for (int i = 0; i < f->nparams && i < 16; ++i) {
        uint64_t value = 0;
        std::memcpy(&value, params[i], sizeof value);
        recorded.params.push_back(value);
      }
      capture->second->launches.push_back(std::move(recorded));
      return kSuccess;
    }
  }
  launchNow(f, grid, block, shared, stream, params);
  return kSuccess;
}
// Graphs: capture records the stream's kernel launches (copies still run at once); launching the instantiated
// graph replays them.
hipError_t hipStreamBeginCapture(void* stream, int) {
  record("hipStreamBeginCapture");
  std::lock_guard<std::mutex> lock(state().mutex);
  if (!stream || state().capturing.count(stream)) return kInvalidValue;
  state().capturing[stream] = new FakeGraph;
  return kSuccess;
}
hipError_t hipStreamEndCapture(void* stream, void** graph) {
  record("hipStreamEndCapture");
  std::lock_guard<std::mutex> lock(state().mutex);
  auto capture = state().capturing.find(stream);
  if (capture == state().capturing.end()) return kInvalidValue;
  *graph = capture->second;
  state().capturing.erase(capture);
  return kSuccess;
}
hipError_t hipGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) {
  record("hipGraphInstantiateWithFlags");
  if (!graph) return kInvalidValue;
  *exec = new FakeGraph(*static_cast<FakeGraph*>(graph));
  return kSuccess;
}
hipError_t hipGraphLaunch(void* exec, void* stream) {
  record("hipGraphLaunch");
  if (!exec) return kInvalidValue;
  for (const RecordedLaunch& l : static_cast<FakeGraph*>(exec)->launches) {
    std::vector<uint64_t> values = l.params;
    std::vector<void*> params;
    for (uint64_t& v : values) params.push_back(&v);
    launchNow(l.function, l.grid, l.block, l.shared, stream, params.data());
  }
  return kSuccess;
}
hipError_t hipGraphExecDestroy(void* exec) {
  record("hipGraphExecDestroy");
  delete static_cast<FakeGraph*>(exec);
  return kSuccess;
}
hipError_t hipGraphDestroy(void* graph) {
  record("hipGraphDestroy");
  delete static_cast<FakeGraph*>(graph);
  return kSuccess;
}
hipError_t hipDeviceCanAccessPeer(int* can, int, int) {
  *can = std::getenv("FAKEHIP_NO_P2P") ? 0 : 1;
  return kSuccess;
}
hipError_t hipDeviceEnablePeerAccess(int peer, unsigned) {
  record("hipDeviceEnablePeerAccess");
  std::lock_guard<std::mutex> lock(state().mutex);
  for (auto& p : state().peerEnabled)
    if (p.first == currentDevice && p.second == peer) return kPeerAlreadyEnabled;
  state().peerEnabled.emplace_back(currentDevice, peer);
  return kSuccess;
}
hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t* handle, void* p) {
  record("hipIpcGetMemHandle");
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().allocations.find(p);
  if (it == state().allocations.end() || it->second.imported) return kInvalidValue;
  HandleBytes h{};
  std::snprintf(h.name, sizeof h.name, "%s", it->second.shmName.c_str());
  h.bytes = it->second.bytes;
  h.magic = kHandleMagic;
  std::memcpy(handle, &h, sizeof h);
  return kSuccess;
}
hipError_t hipIpcOpenMemHandle(void** p, hipIpcMemHandle_t handle, unsigned) {
  record("hipIpcOpenMemHandle");
  HandleBytes h;
  std::memcpy(&h, &handle, sizeof h);
  if (h.magic != kHandleMagic) return kInvalidHandle;
  void* mem = mapShared(h.name, h.bytes, false);
  if (!mem) return kInvalidHandle;
  std::lock_guard<std::mutex> lock(state().mutex);
  state().allocations[mem] = Allocation{h.bytes, currentDevice, h.name, true};
  ++state().ipcOpen;
  *p = mem;
  return kSuccess;
}
hipError_t hipIpcCloseMemHandle(void* p) {
  record("hipIpcCloseMemHandle");
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().allocations.find(p);
  if (it == state().allocations.end() || !it->second.imported) return kInvalidValue;
  ::munmap(p, it->second.bytes);
  state().allocations.erase(it);
  --state().ipcOpen;
  return kSuccess;
}

// ---------------------------------------------------------------- test controls
int fakehip_call_count(const char* call) {
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().calls.find(call);
  return it == state().calls.end() ? 0 : it->second;
}
int fakehip_launch_count(void) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return static_cast<int>(state().launches.size());
}
int fakehip_launch(int index, FakeHipLaunch* out) {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (index < 0 || index >= static_cast<int>(state().launches.size())) return 0;
  *out = state().launches[index];
  return 1;
}
int fakehip_live_allocations(void) {
  std::lock_guard<std::mutex> lock(state().mutex);
  int n = 0;
  for (auto& a : state().allocations) n += a.second.imported ? 0 : 1;
  return n;
}
// The next n hipMalloc calls succeed, the one after them fails (out of memory), then all succeed again.
void fakehip_fail_malloc_after(int n) {
  std::lock_guard<std::mutex> lock(state().mutex);
  state().mallocsBeforeFailure = n;
}
int fakehip_open_ipc_mappings(void) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().ipcOpen;
}
int fakehip_modules_loaded(void) {
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().modulesLoaded - state().modulesUnloaded;
}
int fakehip_peer_enabled(int from, int to) {
  std::lock_guard<std::mutex> lock(state().mutex);
  for (auto& p : state().peerEnabled)
    if (p.first == from && p.second == to) return 1;
  return 0;
}

}  // extern "C"
