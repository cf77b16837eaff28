// Shared by every GPU-tier test: open the CUDA backend or skip with the reason. Tests of the DSL kernels (to come
// from kernels/) use the same helper, so that a machine without a GPU skips them all the same way.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "megamoe/Backend.h"
#include "megamoe/Error.h"

namespace megamoe::gputest {

// The CUDA backend with at least one device, or nullptr and why not.
inline std::shared_ptr<Backend> cudaBackendOrReason(std::string* reason) {
  try {
    auto backend = openBackend(BackendKind::kCuda);
    if (backend->deviceCount() > 0) return backend;
    *reason = "the driver reports 0 devices";
  } catch (const Error& e) {
    *reason = e.what();
  }
  return nullptr;
}

}  // namespace megamoe::gputest

// Declares `backend` (std::shared_ptr<megamoe::Backend>) or skips the test.
#define MEGAMOE_REQUIRE_CUDA(backend)                                            \
  std::string megamoe_skip_reason_;                                              \
  auto backend = ::megamoe::gputest::cudaBackendOrReason(&megamoe_skip_reason_); \
  if (!backend) GTEST_SKIP() << "no CUDA device: " << megamoe_skip_reason_
