// Names of the runtime's error codes (for messages and the C ABI).
#include "megamoe/Error.h"

namespace megamoe {

const char* errorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kDriverNotFound: return "driver not found";
    case ErrorCode::kDriverError: return "driver error";
    case ErrorCode::kKernelNotFound: return "kernel not found";
    case ErrorCode::kBadMetadata: return "bad kernel metadata";
    case ErrorCode::kRendezvous: return "rendezvous failed";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kDeviceError: return "device error";
    case ErrorCode::kHeapUnusable: return "heap unusable";
    case ErrorCode::kInvalidEnv: return "invalid environment variable";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kStaleKernel: return "stale kernel";
  }
  return "unknown error";
}

}  // namespace megamoe
