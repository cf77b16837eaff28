// Target options: one immutable, validated struct per compile, whose canonical text enters the cache key.
// LLVM-free so that tools and tests can parse targets without MLIR.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megamoe {

enum class Arch { sm_90a, gfx950 };

class TargetOptions {
 public:
  // "sm_90a" or "gfx950", with an optional optimisation level. Returns nullopt and sets *error (naming the
  // supported targets / the valid range) for anything else.
  static std::optional<TargetOptions> parse(std::string_view target, std::string* error, int optLevel = 3);
  static std::vector<std::string> supported() { return {"sm_90a", "gfx950"}; }

  Arch arch() const { return arch_; }
  int optLevel() const { return optLevel_; }
  std::string name() const;           // "sm_90a"
  std::string triple() const;         // "nvptx64-nvidia-cuda" | "amdgcn-amd-amdhsa"
  std::string cpu() const;            // "sm_90a" | "gfx950"
  std::string features() const;       // "+ptx80" | ""
  std::string canonical() const;      // "target=sm_90a;O=3;ptx=80": enters the cache key

 private:
  TargetOptions(Arch arch, int optLevel) : arch_(arch), optLevel_(optLevel) {}
  Arch arch_;
  int optLevel_;
};

}  // namespace megamoe
