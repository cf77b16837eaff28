// Without a GPU (LayerTestCache.*): scripts/gen-gpu-test-cache.sh lists every kernel that the layers of
// gpu_layer_test's tests load, so that a cache generated on another machine holds them.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "GpuTestSupport.h"
#include "LayerHarness.h"
#include "megamoe/MoeLayer.h"

namespace megamoe::layertest {
namespace {

// Every (shape, options) a test of this binary opens a layer with: the test cache must hold their kernels
// (GpuTestCacheListsEveryLayerKernel). Keep in step with the tests.
std::vector<std::pair<Shape, LayerOptions>> testedLayers() {
  std::vector<std::pair<Shape, LayerOptions>> out;
  for (int ranks : kRankCounts) {
    for (int64_t clamp : {int64_t(0), int64_t(7000)})
      for (bool training : {false, true}) out.push_back({smallShape(ranks), {clamp, training, false, 0}});
    for (bool training : {false, true}) out.push_back({smallShape(ranks), {0, training, true, 0}});
    out.push_back({deepSeekShape(ranks), {0, true, false, 0}});
    out.push_back({chunkedShape(ranks), {0, true, false, 0}});
    out.push_back({oddHalvesShape(ranks), {0, true, false, 0}});
  }
  return out;
}

// scripts/gen-gpu-test-cache.sh lists every kernel (MoeLayer::kernelSpecs) of every layer this binary's tests open
// (testedLayers()), so that a cache generated on another machine holds them. No GPU needed; skips when the script
// is not found (the source tree at MEGAMOE_SOURCE_DIR, or the working directory, must hold it).
TEST(LayerTestCache, GpuTestCacheListsEveryLayerKernel) {
  std::ifstream script;
  std::string path;
  for (const std::string& dir : {std::string(MEGAMOE_SOURCE_DIR), std::string(".")}) {
    path = dir + "/scripts/gen-gpu-test-cache.sh";
    script.open(path);
    if (script) break;
  }
  if (!script) GTEST_SKIP() << "scripts/gen-gpu-test-cache.sh not found (source tree " << MEGAMOE_SOURCE_DIR << ")";
  // Entries: "kernel spec" lines inside the kernels=( ... ) array, the spec "-" for none.
  std::set<std::string> listed;
  std::string line;
  bool inList = false;
  while (std::getline(script, line)) {
    if (line.rfind("kernels=(", 0) == 0) inList = true;
    else if (inList && line.rfind(")", 0) == 0) inList = false;
    if (!inList) continue;
    const size_t open = line.find('"'), close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close == std::string::npos) continue;
    std::istringstream entry(line.substr(open + 1, close - open - 1));
    std::string kernel, spec;
    entry >> kernel >> spec;
    listed.insert(kernel + " " + spec);
  }
  ASSERT_FALSE(listed.empty()) << path << ": no kernels=( ... ) entries";
  std::set<std::string> missing;
  size_t needed = 0;
  for (const auto& [shape, options] : testedLayers())
    for (const auto& [kernel, spec] : MoeLayer::kernelSpecs(layerConfig(shape, options), shape.ranks)) {
      ++needed;
      const std::string entry = kernel + " " + (spec.empty() ? "-" : specText(spec));
      if (!listed.count(entry)) missing.insert(entry);
    }
  std::string lines;
  for (const std::string& m : missing) lines += "\n  \"" + m + "\"";
  EXPECT_TRUE(missing.empty()) << path << " lacks " << missing.size() << " of the layer tests' kernels:" << lines;
  std::printf("SUMMARY %zu kernel loads of %zu tested layers, %zu listed entries in %s\n", needed,
              testedLayers().size(), listed.size(), path.c_str());
}

}  // namespace
}  // namespace megamoe::layertest
