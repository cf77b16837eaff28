// A fake NVTX library for the profiler-range tests: the two NVTX v2 functions the runtime resolves with dlsym
// (nvtxRangePushA, nvtxRangePop), recording each call, and query functions for the tests (same dlopen handle as the
// runtime's, by path). Loaded by path, never linked.
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex mutex;
std::vector<std::string> events;  // "push <name>" or "pop", in call order
int depth = 0;

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int nvtxRangePushA(const char* message) {
  std::lock_guard<std::mutex> lock(mutex);
  events.push_back(std::string("push ") + (message ? message : "(null)"));
  return depth++;
}

__attribute__((visibility("default"))) int nvtxRangePop() {
  std::lock_guard<std::mutex> lock(mutex);
  events.push_back("pop");
  return --depth;
}

__attribute__((visibility("default"))) int fakenvtx_event_count() {
  std::lock_guard<std::mutex> lock(mutex);
  return static_cast<int>(events.size());
}

// Copies event `index` into `out` (NUL-terminated, cut to `size`); 0, or -1 for an index out of range.
__attribute__((visibility("default"))) int fakenvtx_event(int index, char* out, int size) {
  std::lock_guard<std::mutex> lock(mutex);
  if (index < 0 || index >= static_cast<int>(events.size()) || size < 1) return -1;
  std::strncpy(out, events[index].c_str(), static_cast<size_t>(size - 1));
  out[size - 1] = '\0';
  return 0;
}

__attribute__((visibility("default"))) void fakenvtx_clear() {
  std::lock_guard<std::mutex> lock(mutex);
  events.clear();
  depth = 0;
}

}  // extern "C"
