// The runtime's one exception type: a stable numeric code (also returned by the C ABI) plus a message that names
// what failed and, where it can, how to fix it.
#pragma once
#include <stdexcept>
#include <string>

namespace megamoe {

// Values are part of the C ABI (megamoe.h mirrors them as MEGAMOE_ERROR_*); append only.
enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // a caller passed something unusable (null handle, bad size, ...)
  kDriverNotFound = 2,    // libcuda.so.1 / libamdhip64.so could not be loaded
  kDriverError = 3,       // a driver call failed; the message names the call and the driver's text
  kKernelNotFound = 4,    // cache miss without a JIT, or the JIT could not build it
  kBadMetadata = 5,       // a cache entry's JSON metadata is malformed or lacks a field
  kRendezvous = 6,        // ranks disagree (layout, rank count, duplicate rank) or a rank died during setup
  kTimeout = 7,           // a rank did not show up in time
  kDeviceError = 8,       // a kernel reported an error through the DeviceError record
  kHeapUnusable = 9,      // the symmetric heap saw a device error earlier and refuses further use
  kInvalidEnv = 10,       // a MEGAMOE_* environment variable holds a bad value
  kUnsupported = 11,      // the backend or device cannot do what was asked
  kInternal = 12,         // anything else (a bug, or an unexpected system error)
  kStaleKernel = 13,      // a cache entry's signature differs from the runtime's declaration of the kernel
};

const char* errorCodeName(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace megamoe
