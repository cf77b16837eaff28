// Fills a kernel cache with stand-ins for every kernel a MoeLayer loads (MoeLayer::kernelSpecs), for the fake HIP
// device: layers can then be created and called on the host, their launches recorded but never run.
#pragma once
#include <algorithm>
#include <string>

#include "TestSupport.h"
#include "compiler/cache/KernelCache.h"
#include "megamoe/KernelLoader.h"
#include "megamoe/MoeLayer.h"

namespace megamoe::test {

// Each stand-in records its first 8-byte arguments (the context; for dispatch_prologue topk_idx too) in
// FakeHipLaunch::params: the fake reads 8 bytes of each, so none of the i32 ones.
// With `recordArguments`, each records its first 32 arguments instead (safe with KernelArgs, whose every slot holds
// 128 bytes; only the 8-byte arguments among them are meaningful).
inline void storeFakeLayerKernels(const std::string& cacheDir, const MoeLayerConfig& config, int ranks,
                                  bool recordArguments = false) {
  const cache::KernelCache cache(cacheDir);
  for (const auto& [name, spec] : MoeLayer::kernelSpecs(config, ranks)) {
    const int declared = int(abi::findKernelDecl(name)->args.size());
    const int recordedParams = recordArguments ? std::min(32, declared) : name == "dispatch_prologue" ? 2 : 1;
    cache::KernelKey key{name, spec, "gfx950", defaultTargetOptions("gfx950"), ourFingerprint("fake")};
    cache.store(key, fakeImage("FAKEHIP\n" + name + " " + std::to_string(recordedParams) + "\n"),
                R"({"symbol":")" + name + R"(","block_threads":256,"shared_bytes":0)" + signatureMembers(name) + "}");
  }
}

}  // namespace megamoe::test
