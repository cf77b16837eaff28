// Internal: the subset of the CUDA driver API that CudaBackend.cpp calls, declared here so that the runtime builds
// without the CUDA toolkit (as HipBackend.cpp does for HIP). Values and layouts are those of CUDA 13's cuda.h;
// tests/host/runtime/CudaApiDeclsTest.cpp checks every one against cuda.h wherever the toolkit is installed.
// Signatures are the variants that cuGetProcAddress returns at API version 12000 (e.g. cuMemAlloc is cuMemAlloc_v2).
#pragma once
#include <cstddef>
#include <cstdint>

namespace megamoe::detail::cu {

using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;

enum CUresult : int {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
};

using CUdevice = int;
using CUdeviceptr = unsigned long long;
// Opaque handles: distinct incomplete types, so that a stream cannot be passed where an event goes.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
struct CUgraph_st;
struct CUgraphExec_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;
using CUgraph = CUgraph_st*;
using CUgraphExec = CUgraphExec_st*;

struct CUipcMemHandle {
  char reserved[64];
};

enum CUdevice_attribute : int {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
  CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
};
enum CUfunction_attribute : int { CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 };
enum CUstreamCaptureMode : int { CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1 };
enum CUstreamCaptureStatus : int { CU_STREAM_CAPTURE_STATUS_NONE = 0 };
enum CUdriverProcAddressQueryResult : int { CU_GET_PROC_ADDRESS_SUCCESS = 0 };
enum CUlaunchAttributeID : int { CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4 };
enum CUtensorMapDataType : int { CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9 };
enum CUtensorMapInterleave : int { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle : int { CU_TENSOR_MAP_SWIZZLE_128B = 3 };
enum CUtensorMapL2promotion : int { CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3 };
enum CUtensorMapFloatOOBfill : int { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };

// Flags (plain unsigned parameters in the API).
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DEFAULT = 0x0;
constexpr unsigned CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 0x1;
constexpr cuuint64_t CU_GET_PROC_ADDRESS_DEFAULT = 0;

// 128 opaque bytes; CUDA 13 aligns the map to 128 bytes (the driver requires 64).
struct alignas(128) CUtensorMap {
  cuuint64_t opaque[16];
};

struct CUlaunchAttribute {
  CUlaunchAttributeID id;
  char pad[8 - sizeof(CUlaunchAttributeID)];
  // cuda.h's union holds pointer-sized members: 64 bytes at 8-byte alignment.
  union Value {
    alignas(8) char pad[64];
    struct {
      unsigned x, y, z;
    } clusterDim;
  } value;
};

struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};

using GetProcAddress = CUresult (*)(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult* symbolStatus);

// X(name, signature) for each entry point resolved through cuGetProcAddress by its plain name.
#define MEGAMOE_CUDA_ENTRY_POINTS(X)                                                                              \
  X(cuGetErrorName, CUresult(CUresult, const char**))                                                             \
  X(cuGetErrorString, CUresult(CUresult, const char**))                                                           \
  X(cuInit, CUresult(unsigned))                                                                                   \
  X(cuDriverGetVersion, CUresult(int*))                                                                           \
  X(cuDeviceGetCount, CUresult(int*))                                                                             \
  X(cuDeviceGet, CUresult(CUdevice*, int))                                                                        \
  X(cuDeviceGetName, CUresult(char*, int, CUdevice))                                                              \
  X(cuDeviceGetAttribute, CUresult(int*, CUdevice_attribute, CUdevice))                                           \
  X(cuDevicePrimaryCtxRetain, CUresult(CUcontext*, CUdevice))                                                     \
  X(cuDevicePrimaryCtxRelease, CUresult(CUdevice))                                                                \
  X(cuCtxSetCurrent, CUresult(CUcontext))                                                                         \
  X(cuCtxGetCurrent, CUresult(CUcontext*))                                                                        \
  X(cuCtxSynchronize, CUresult())                                                                                 \
  X(cuMemAlloc, CUresult(CUdeviceptr*, size_t))                                                                   \
  X(cuMemFree, CUresult(CUdeviceptr))                                                                             \
  X(cuMemsetD8, CUresult(CUdeviceptr, unsigned char, size_t))                                                     \
  X(cuMemsetD8Async, CUresult(CUdeviceptr, unsigned char, size_t, CUstream))                                      \
  X(cuMemcpyHtoD, CUresult(CUdeviceptr, const void*, size_t))                                                     \
  X(cuMemcpyDtoH, CUresult(void*, CUdeviceptr, size_t))                                                           \
  X(cuMemcpyDtoD, CUresult(CUdeviceptr, CUdeviceptr, size_t))                                                     \
  X(cuMemcpyHtoDAsync, CUresult(CUdeviceptr, const void*, size_t, CUstream))                                      \
  X(cuMemcpyDtoHAsync, CUresult(void*, CUdeviceptr, size_t, CUstream))                                            \
  X(cuMemcpyDtoDAsync, CUresult(CUdeviceptr, CUdeviceptr, size_t, CUstream))                                      \
  X(cuStreamCreate, CUresult(CUstream*, unsigned))                                                                \
  X(cuStreamDestroy, CUresult(CUstream))                                                                          \
  X(cuStreamSynchronize, CUresult(CUstream))                                                                      \
  X(cuEventCreate, CUresult(CUevent*, unsigned))                                                                  \
  X(cuEventDestroy, CUresult(CUevent))                                                                            \
  X(cuEventRecord, CUresult(CUevent, CUstream))                                                                   \
  X(cuEventSynchronize, CUresult(CUevent))                                                                        \
  X(cuEventElapsedTime, CUresult(float*, CUevent, CUevent))                                                       \
  X(cuModuleLoadData, CUresult(CUmodule*, const void*))                                                           \
  X(cuModuleUnload, CUresult(CUmodule))                                                                           \
  X(cuModuleGetFunction, CUresult(CUfunction*, CUmodule, const char*))                                            \
  X(cuFuncSetAttribute, CUresult(CUfunction, CUfunction_attribute, int))                                          \
  X(cuLaunchKernel, CUresult(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,    \
                             CUstream, void**, void**))                                                           \
  X(cuLaunchKernelEx, CUresult(const CUlaunchConfig*, CUfunction, void**, void**))                                \
  X(cuDeviceCanAccessPeer, CUresult(int*, CUdevice, CUdevice))                                                    \
  X(cuCtxEnablePeerAccess, CUresult(CUcontext, unsigned))                                                         \
  X(cuIpcGetMemHandle, CUresult(CUipcMemHandle*, CUdeviceptr))                                                    \
  X(cuIpcOpenMemHandle, CUresult(CUdeviceptr*, CUipcMemHandle, unsigned))                                         \
  X(cuIpcCloseMemHandle, CUresult(CUdeviceptr))                                                                   \
  X(cuStreamBeginCapture, CUresult(CUstream, CUstreamCaptureMode))                                                \
  X(cuStreamIsCapturing, CUresult(CUstream, CUstreamCaptureStatus*))                                              \
  X(cuStreamEndCapture, CUresult(CUstream, CUgraph*))                                                             \
  X(cuGraphInstantiateWithFlags, CUresult(CUgraphExec*, CUgraph, unsigned long long))                             \
  X(cuGraphLaunch, CUresult(CUgraphExec, CUstream))                                                               \
  X(cuGraphExecDestroy, CUresult(CUgraphExec))                                                                    \
  X(cuGraphDestroy, CUresult(CUgraph))                                                                            \
  X(cuTensorMapEncodeTiled,                                                                                       \
    CUresult(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,          \
             const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,                     \
             CUtensorMapL2promotion, CUtensorMapFloatOOBfill))

}  // namespace megamoe::detail::cu
