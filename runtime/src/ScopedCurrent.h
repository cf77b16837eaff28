// The calling thread's current context or device, set by a backend for one call and given back when it returns:
// a process that drives several GPUs (torch on another device, createLocal over many) keeps its own.
#pragma once

namespace megamoe::detail {

// Api: the backend's table of entry points; Set: its member that sets the current Handle (cuCtxSetCurrent,
// hipSetDevice). Made by a backend's makeCurrent() (which reads `previous`), undone at the end of the scope.
template <typename Api, typename Handle, auto Set>
struct [[nodiscard]] ScopedCurrent {
  const Api* api;
  Handle previous;
  bool restore;  // false when the handle was current already
  ScopedCurrent(const ScopedCurrent&) = delete;
  ScopedCurrent& operator=(const ScopedCurrent&) = delete;
  ~ScopedCurrent() {
    if (restore) (api->*Set)(previous);
  }
};

}  // namespace megamoe::detail
