// Internal: constructors of the concrete backends, called once per (kind, library path) by openBackend().
#pragma once
#include <memory>
#include <string>

#include "megamoe/Backend.h"

namespace megamoe::detail {

std::shared_ptr<Backend> makeCudaBackend(const std::string& libraryPath);
std::shared_ptr<Backend> makeHipBackend(const std::string& libraryPath);

}  // namespace megamoe::detail
