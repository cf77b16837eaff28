// Profiler ranges through a dlopen'ed NVTX library (see Profile.h).
#include "megamoe/Profile.h"

#include <dlfcn.h>

#include <atomic>
#include <map>
#include <mutex>

#include "megamoe/Log.h"
#include "megamoe/env.h"

namespace megamoe {
namespace {

// The NVTX v2 C ABI (nvToolsExt.h): both return the depth of the thread's range stack, which nobody needs.
using RangePushA = int (*)(const char* message);
using RangePop = int (*)();

struct NvtxApi {
  RangePushA push = nullptr;
  RangePop pop = nullptr;
};

const NvtxApi kUnresolved{};  // MEGAMOE_NVTX not read yet
// nullptr: off. Otherwise an NvtxApi that is never freed, so that a range pushed before a reconfiguration still pops.
std::atomic<const NvtxApi*> current{&kUnresolved};

struct Loaded {
  std::mutex mutex;                              // decisions only; never held while logging
  std::map<std::string, const NvtxApi*> byPath;  // libraries opened so far (each once)
};
Loaded& loaded() {
  static Loaded* l = new Loaded;
  return *l;
}

// What a decision says in the log, once the lock is released.
struct Note {
  LogLevel level = LogLevel::kOff;
  std::string text;
};

// Under loaded().mutex: the API for `library`, or nullptr with the reason in `note`.
const NvtxApi* open(const std::string& library, Note* note) {
  auto it = loaded().byPath.find(library);
  if (it != loaded().byPath.end()) return it->second;
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = ::dlerror();
    *note = {LogLevel::kDebug, "profile ranges off: the NVTX library " + library + " cannot be loaded (" +
                                   (why ? why : "no reason given") + ")"};
    return nullptr;
  }
  auto push = reinterpret_cast<RangePushA>(::dlsym(handle, "nvtxRangePushA"));
  auto pop = reinterpret_cast<RangePop>(::dlsym(handle, "nvtxRangePop"));
  if (!push || !pop) {
    ::dlclose(handle);
    *note = {LogLevel::kDebug, "profile ranges off: " + library + " does not export nvtxRangePushA and nvtxRangePop"};
    return nullptr;
  }
  const NvtxApi* api = new NvtxApi{push, pop};
  loaded().byPath.emplace(library, api);
  *note = {LogLevel::kInfo, "profile ranges on: NVTX through " + library};
  return api;
}

void say(const Note& note) {
  if (note.level != LogLevel::kOff) MEGAMOE_LOG_AT(note.level, note.text);
}

// The first range's decision, from MEGAMOE_NVTX and MEGAMOE_NVTX_LIBRARY.
const NvtxApi* resolveFromEnv() noexcept {
  Note note;
  const NvtxApi* api = nullptr;
  try {
    std::lock_guard<std::mutex> lock(loaded().mutex);
    api = current.load(std::memory_order_acquire);
    if (api == &kUnresolved) {
      api = nullptr;
      try {
        const ProfileEnv env = parseProfileEnv();
        if (env.nvtx) api = open(env.nvtxLibrary, &note);
      } catch (const std::exception& e) {
        note = {LogLevel::kWarn, std::string(e.what()) + "; profile ranges off"};
      }
      current.store(api, std::memory_order_release);
    }
  } catch (...) {
    return nullptr;  // a lock or an allocation failed: no range this time
  }
  say(note);
  return api;
}

}  // namespace

ProfileRange::ProfileRange(const char* name) noexcept {
  const NvtxApi* api = current.load(std::memory_order_acquire);
  if (api == &kUnresolved) api = resolveFromEnv();
  if (!api) return;
  api->push(name ? name : "");
  pop_ = api->pop;
}

ProfileRange::~ProfileRange() {
  if (pop_) pop_();
}

bool setProfileRanges(bool on, const std::string& library) {
  Note note;
  const NvtxApi* api = nullptr;
  {
    std::lock_guard<std::mutex> lock(loaded().mutex);
    if (on) api = open(library.empty() ? parseProfileEnv().nvtxLibrary : library, &note);
    current.store(api, std::memory_order_release);
  }
  say(note);
  return api != nullptr;
}

bool profileRangesActive() {
  const NvtxApi* api = current.load(std::memory_order_acquire);
  if (api == &kUnresolved) api = resolveFromEnv();
  return api != nullptr;
}

void resetProfileRanges() {
  std::lock_guard<std::mutex> lock(loaded().mutex);
  current.store(&kUnresolved, std::memory_order_release);
}

}  // namespace megamoe
