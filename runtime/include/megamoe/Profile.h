// Named ranges for profilers: with MEGAMOE_NVTX=1 the runtime opens the NVTX library (MEGAMOE_NVTX_LIBRARY,
// default libnvToolsExt.so.1) with dlopen at the first range, and a ProfileRange pushes its name on construction
// and pops it on destruction, so that Nsight Systems shows the runtime's stages on the thread's timeline:
//
//   {
//     megamoe::ProfileRange range("dispatch");  // a string literal or any string that outlives the constructor
//     ...                                        // the stage's host work and launches
//   }                                            // popped here, on the same thread
//
// Off (the default), or when the library cannot be loaded (said once in a debug log line), a range costs one
// atomic load and a branch and never allocates. No CUDA header or library is needed to build this: the two NVTX
// functions are declared here by hand (the NVTX v2 C ABI, which libnvToolsExt.so.1 exports and forwards to the
// profiler's injection library).
#pragma once
#include <string>

namespace megamoe {

class ProfileRange {
 public:
  explicit ProfileRange(const char* name) noexcept;
  ~ProfileRange();
  ProfileRange(const ProfileRange&) = delete;
  ProfileRange& operator=(const ProfileRange&) = delete;

 private:
  int (*pop_)() = nullptr;  // set when this range was pushed: popped through the same library
};

// Decides now, instead of at the first range: `on` opens `library` (empty: MEGAMOE_NVTX_LIBRARY's value, which
// throws Error(kInvalidEnv) when bad). Returns whether ranges are recorded (a library that cannot be loaded: false,
// said at debug). Ranges already open are popped through the library that pushed them.
bool setProfileRanges(bool on, const std::string& library = "");
// Whether ranges are recorded (resolves MEGAMOE_NVTX on first use).
bool profileRangesActive();
// Forgets the decision: the next range reads MEGAMOE_NVTX again, as at process start (tests).
void resetProfileRanges();

}  // namespace megamoe
