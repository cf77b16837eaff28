// openBackend(): one loaded driver per (kind, library path), kept for the life of the process.
#include <map>
#include <mutex>
#include <utility>

#include "BackendFactories.h"
#include "megamoe/Error.h"
#include "megamoe/env.h"

namespace megamoe {

const char* backendKindName(BackendKind kind) { return kind == BackendKind::kCuda ? "cuda" : "hip"; }

void Device::requireNotCapturing(StreamHandle stream, const char* call) {
  if (isCapturing(stream))
    throw Error(ErrorCode::kInvalidArgument, std::string(call) +
                                                 ": the stream is being captured into a graph; this call waits for the "
                                                 "device, so make it after the capture ends");
}

std::shared_ptr<Backend> openBackend(BackendKind kind, const std::string& libraryPath) {
  std::string path = libraryPath;
  if (path.empty()) {
    const RuntimeEnv env = parseEnv();
    path = kind == BackendKind::kCuda ? env.cudaLibrary : env.hipLibrary;
  }
  // Deliberately leaked: backends own driver state that must not be torn down by static destructors after the
  // driver library itself may have run its own exit handlers.
  static std::mutex* mutex = new std::mutex;
  static auto* loaded = new std::map<std::pair<BackendKind, std::string>, std::shared_ptr<Backend>>;
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = loaded->find({kind, path});
  if (it != loaded->end()) return it->second;
  // A failure is not remembered: the caller may fix the environment and retry.
  std::shared_ptr<Backend> backend =
      kind == BackendKind::kCuda ? detail::makeCudaBackend(path) : detail::makeHipBackend(path);
  loaded->emplace(std::make_pair(kind, path), backend);
  return backend;
}

}  // namespace megamoe
