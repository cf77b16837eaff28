// See Jit.h.
#include "kernels/Jit.h"

#include <chrono>
#include <stdexcept>

#include "megamoe/Dialect/Registration.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"

namespace megamoe::kernels {

cache::KernelKey keyFor(const KernelSpec& spec, const TargetOptions& target) {
  return {spec.kernel, spec.constants, target.name(), target.canonical(), compilerFingerprint(target.name())};
}

JitResult getKernel(const KernelSpec& spec, const TargetOptions& target, const cache::KernelCache& cache, bool force) {
  const KernelInfo* info = find(spec.kernel);
  if (!info) throw std::invalid_argument("unknown kernel '" + spec.kernel + "'");
  if (std::string e = info->validate(spec); !e.empty()) throw std::invalid_argument(spec.describe() + ": " + e);
  auto t0 = std::chrono::steady_clock::now();
  JitResult r;
  cache::KernelKey key = keyFor(spec, target);
  if (!force) {
    if (auto hit = cache.lookup(key)) {
      r.entry = std::move(*hit);
      r.hit = true;
      r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }
  }
  mlir::DialectRegistry registry;
  registerAllDialects(registry);
  mlir::MLIRContext ctx(registry, mlir::MLIRContext::Threading::DISABLED);
  mlir::OwningOpRef<mlir::ModuleOp> module = info->build(ctx, spec, target.arch());
  std::string error;
  r.compiled = compileKernel(*module, target, &error);
  if (!r.compiled) throw std::runtime_error(spec.describe() + "@" + target.name() + ": " + error);
  // --force: the fresh build replaces an entry that is there (a stale cubin), instead of yielding to it.
  r.entry = cache.store(key, r.compiled->binary, r.compiled->metadataJson(),
                        force ? cache::KernelCache::StoreMode::kReplace : cache::KernelCache::StoreMode::kKeepValid);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace megamoe::kernels
