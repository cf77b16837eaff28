// Writes stand-in kernels for every kernel one MoE layer loads into a cache, for the fake HIP device, so that the
// Python package's CPU tier (tests/python) can create workspaces and layers and call them with no GPU.
//   usage: megamoe_fake_layer_cache DIR HIDDEN INTERMEDIATE EXPERTS TOPK MAX_TOKENS RANKS
// Every variant a Python layer may load is stored: inference and training, int32 and int64 topk_idx.
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "FakeLayerKernels.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DIR HIDDEN INTERMEDIATE EXPERTS TOPK MAX_TOKENS RANKS\n", argv[0]);
    return 2;
  }
  try {
    megamoe::MoeLayerConfig c;
    c.hidden = std::atoll(argv[2]);
    c.intermediate = std::atoll(argv[3]);
    c.experts = std::atoll(argv[4]);
    c.topk = std::atoll(argv[5]);
    c.maxTokens = std::atoll(argv[6]);
    const int ranks = std::atoi(argv[7]);
    for (bool training : {false, true})
      for (bool int64 : {false, true}) {
        c.training = training;
        c.topkIdxInt64 = int64;
        megamoe::test::storeFakeLayerKernels(argv[1], c, ranks);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "megamoe_fake_layer_cache: %s\n", e.what());
    return 1;
  }
  return 0;
}
