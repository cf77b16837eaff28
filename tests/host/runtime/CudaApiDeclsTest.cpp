// runtime/src/CudaDriverApi.h against the toolkit's cuda.h: every enum value, struct layout and entry-point
// signature the runtime declares for itself must match. Built only where cuda.h exists; the checks are static, so a
// mismatch fails the build of this test, naming the declaration.
#include "CudaDriverApi.h"  // first: its entry-point list must not be rewritten by cuda.h's macros

#include <cuda.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <type_traits>

namespace megamoe::detail::cu {
namespace {

// Two argument or result types agree in width and kind; pointers also in the width of what they point to when that
// is a scalar (struct layouts are checked below, opaque handles have none).
template <typename A, typename B>
constexpr bool sameArg() {
  if constexpr (std::is_pointer_v<A> != std::is_pointer_v<B>) {
    return false;
  } else if constexpr (std::is_pointer_v<A>) {
    using PA = std::remove_pointer_t<A>;
    using PB = std::remove_pointer_t<B>;
    if constexpr (std::is_scalar_v<PA> != std::is_scalar_v<PB>) return false;
    else if constexpr (std::is_scalar_v<PA>)
      return sizeof(PA) == sizeof(PB) && std::is_const_v<PA> == std::is_const_v<PB> && sameArg<PA, PB>();
    else return std::is_const_v<PA> == std::is_const_v<PB>;
  } else if constexpr (std::is_void_v<A> || std::is_void_v<B>) {
    return std::is_void_v<A> && std::is_void_v<B>;
  } else {
    return sizeof(A) == sizeof(B) && std::is_floating_point_v<A> == std::is_floating_point_v<B> &&
           std::is_class_v<A> == std::is_class_v<B>;
  }
}

template <typename A, typename B>
struct SameShape : std::false_type {};
template <typename R1, typename... A1, typename R2, typename... A2>
struct SameShape<R1(A1...), R2(A2...)> {
  static constexpr bool check() {
    if constexpr (sizeof...(A1) != sizeof...(A2)) return false;
    else return sameArg<R1, R2>() && (sameArg<A1, A2>() && ...);
  }
  static constexpr bool value = check();
};

// `::name` is cuda.h's default variant of each entry point (cuMemAlloc -> cuMemAlloc_v2), the one cuGetProcAddress
// returns for the plain name at API version 12000.
#define MEGAMOE_CHECK_ENTRY(name, signature)                                                     \
  static_assert(SameShape<signature, std::remove_pointer_t<decltype(&::name)>>::value,           \
                #name ": CudaDriverApi.h's signature differs from cuda.h's");
MEGAMOE_CUDA_ENTRY_POINTS(MEGAMOE_CHECK_ENTRY)
#undef MEGAMOE_CHECK_ENTRY
static_assert(SameShape<std::remove_pointer_t<GetProcAddress>, std::remove_pointer_t<decltype(&::cuGetProcAddress)>>::value,
              "cuGetProcAddress_v2's signature");

#define MEGAMOE_CHECK_VALUE(name) static_assert(static_cast<long long>(name) == static_cast<long long>(::name), #name);
MEGAMOE_CHECK_VALUE(CUDA_SUCCESS)
MEGAMOE_CHECK_VALUE(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
MEGAMOE_CHECK_VALUE(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
MEGAMOE_CHECK_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
MEGAMOE_CHECK_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
MEGAMOE_CHECK_VALUE(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
MEGAMOE_CHECK_VALUE(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
MEGAMOE_CHECK_VALUE(CU_STREAM_CAPTURE_STATUS_NONE)
MEGAMOE_CHECK_VALUE(CU_GET_PROC_ADDRESS_SUCCESS)
MEGAMOE_CHECK_VALUE(CU_GET_PROC_ADDRESS_DEFAULT)
MEGAMOE_CHECK_VALUE(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
MEGAMOE_CHECK_VALUE(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16)
MEGAMOE_CHECK_VALUE(CU_TENSOR_MAP_DATA_TYPE_UINT8)
MEGAMOE_CHECK_VALUE(CU_TENSOR_MAP_INTERLEAVE_NONE)
MEGAMOE_CHECK_VALUE(CU_TENSOR_MAP_SWIZZLE_128B)
MEGAMOE_CHECK_VALUE(CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
MEGAMOE_CHECK_VALUE(CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
MEGAMOE_CHECK_VALUE(CU_STREAM_NON_BLOCKING)
MEGAMOE_CHECK_VALUE(CU_EVENT_DEFAULT)
MEGAMOE_CHECK_VALUE(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
#undef MEGAMOE_CHECK_VALUE

#define MEGAMOE_CHECK_TYPE(name) \
  static_assert(sizeof(name) == sizeof(::name) && alignof(name) == alignof(::name), #name " size or alignment");
MEGAMOE_CHECK_TYPE(CUresult)
MEGAMOE_CHECK_TYPE(CUdevice)
MEGAMOE_CHECK_TYPE(CUdeviceptr)
MEGAMOE_CHECK_TYPE(CUipcMemHandle)
MEGAMOE_CHECK_TYPE(CUtensorMap)
MEGAMOE_CHECK_TYPE(CUlaunchAttribute)
MEGAMOE_CHECK_TYPE(CUlaunchConfig)
MEGAMOE_CHECK_TYPE(CUdevice_attribute)
MEGAMOE_CHECK_TYPE(CUtensorMapDataType)
#undef MEGAMOE_CHECK_TYPE

#define MEGAMOE_CHECK_FIELD(type, field) static_assert(offsetof(type, field) == offsetof(::type, field), #type "." #field);
MEGAMOE_CHECK_FIELD(CUlaunchAttribute, id)
MEGAMOE_CHECK_FIELD(CUlaunchAttribute, value)
MEGAMOE_CHECK_FIELD(CUlaunchConfig, gridDimX)
MEGAMOE_CHECK_FIELD(CUlaunchConfig, blockDimX)
MEGAMOE_CHECK_FIELD(CUlaunchConfig, sharedMemBytes)
MEGAMOE_CHECK_FIELD(CUlaunchConfig, hStream)
MEGAMOE_CHECK_FIELD(CUlaunchConfig, attrs)
MEGAMOE_CHECK_FIELD(CUlaunchConfig, numAttrs)
#undef MEGAMOE_CHECK_FIELD
static_assert(offsetof(CUlaunchAttribute, value.clusterDim.z) == offsetof(::CUlaunchAttribute, value.clusterDim.z),
              "CUlaunchAttribute.value.clusterDim");

// The checks above are static: reaching run time means they held. The shape check itself must be able to fail.
TEST(CudaApiDecls, MatchCudaH) {
  EXPECT_FALSE((SameShape<CUresult(CUdeviceptr*, size_t), CUresult(unsigned*, size_t)>::value));
  EXPECT_FALSE((SameShape<CUresult(CUstream), CUresult(CUstream, unsigned)>::value));
  EXPECT_FALSE((SameShape<CUresult(float*), CUresult(int*)>::value));
  EXPECT_TRUE((SameShape<CUresult(CUevent, CUstream), ::CUresult(::CUevent, ::CUstream)>::value));
}

}  // namespace
}  // namespace megamoe::detail::cu
