// HeapLayout: placement checked by its properties (alignment, no overlap, order, determinism, 64-bit offsets) rather
// than by golden offsets.
#include <gtest/gtest.h>

#include <random>

#include "megamoe/Error.h"
#include "megamoe/HeapLayout.h"
#include "megamoe/SymmetricHeap.h"

namespace megamoe {
namespace {

std::vector<RegionSpec> randomSpecs(uint32_t seed, int count) {
  std::mt19937_64 rng(seed);
  std::vector<RegionSpec> specs;
  for (int i = 0; i < count; ++i) {
    const uint64_t size = 1 + rng() % (1u << (rng() % 24));
    const uint64_t alignment = uint64_t{1} << (rng() % 9);  // 1 .. 256
    specs.push_back({"region" + std::to_string(i), size, alignment});
  }
  return specs;
}

void expectValidPlacement(const std::vector<RegionSpec>& specs, const HeapLayout& layout) {
  ASSERT_EQ(layout.regions().size(), specs.size());
  uint64_t previousEnd = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const Region& r = layout.regions()[i];
    EXPECT_EQ(r.name, specs[i].name);
    EXPECT_EQ(r.size, specs[i].size);
    EXPECT_EQ(r.offset % specs[i].alignment, 0u) << r.name;
    EXPECT_GE(r.offset, previousEnd) << r.name << " overlaps its predecessor";
    EXPECT_LT(r.offset - previousEnd, specs[i].alignment) << r.name << " left a gap larger than its alignment";
    previousEnd = r.offset + r.size;
  }
  EXPECT_GE(layout.totalBytes(), previousEnd);
  EXPECT_EQ(layout.totalBytes() % HeapLayout::kMaxAlignment, 0u);
  EXPECT_LT(layout.totalBytes() - previousEnd, HeapLayout::kMaxAlignment);
}

TEST(HeapLayout, RandomRegionsAreAlignedOrderedAndDisjoint) {
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    const auto specs = randomSpecs(seed, 1 + seed % 17);
    expectValidPlacement(specs, HeapLayout::place(specs));
  }
}

TEST(HeapLayout, IdenticalInputsGiveIdenticalLayoutsAndHashes) {
  const auto specs = randomSpecs(7, 12);
  const HeapLayout a = HeapLayout::place(specs);
  const HeapLayout b = HeapLayout::place(specs);
  ASSERT_EQ(a.regions().size(), b.regions().size());
  for (size_t i = 0; i < a.regions().size(); ++i) EXPECT_EQ(a.regions()[i].offset, b.regions()[i].offset);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_EQ(a.totalBytes(), b.totalBytes());
}

TEST(HeapLayout, AnyChangeChangesTheHash) {
  const auto specs = randomSpecs(9, 6);
  const uint64_t base = HeapLayout::place(specs).hash();
  auto bigger = specs;
  bigger[3].size += 1;
  auto renamed = specs;
  renamed[2].name += "x";
  auto realigned = specs;
  realigned[4].alignment = realigned[4].alignment == 256 ? 128 : realigned[4].alignment * 2;
  auto reordered = specs;
  std::swap(reordered[0], reordered[1]);
  EXPECT_NE(HeapLayout::place(bigger).hash(), base);
  EXPECT_NE(HeapLayout::place(renamed).hash(), base);
  EXPECT_NE(HeapLayout::place(realigned).hash(), base);
  EXPECT_NE(HeapLayout::place(reordered).hash(), base);
}

TEST(HeapLayout, OffsetsPastFourGigabytes) {
  // A DeepSeek-V3-sized receive pool: 8 ranks x 8192 tokens x 8 picks x 7168 x 2 bytes = 7.5 GB.
  const uint64_t pool = 8ull * 8192 * 8 * 7168 * 2;
  const std::vector<RegionSpec> specs = {{"flags", 4096, 256}, {"pool", pool, 256}, {"combine", 3ull << 30, 128}};
  const HeapLayout layout = HeapLayout::place(specs);
  expectValidPlacement(specs, layout);
  EXPECT_GT(layout.region("combine").offset, uint64_t{1} << 32);
  EXPECT_GE(layout.totalBytes(), pool + (3ull << 30));
}

TEST(HeapLayout, RejectsBadRegionsWithClearErrors) {
  auto expectInvalid = [](const std::vector<RegionSpec>& specs, const std::string& needle) {
    try {
      HeapLayout::place(specs);
      ADD_FAILURE() << "expected an error containing: " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expectInvalid({{"a", 0, 16}}, "'a' has size 0");
  expectInvalid({{"a", 16, 3}}, "not a power of two");
  expectInvalid({{"a", 16, 0}}, "not a power of two");
  expectInvalid({{"a", 16, 4096}}, "exceeds 256");
  expectInvalid({{"a", 16, 16}, {"a", 32, 16}}, "'a' is declared twice");
  expectInvalid({{"", 16, 16}}, "empty name");
  expectInvalid({{"a", 16, 16}, {"huge", UINT64_MAX - 8, 16}}, "'huge'");
  expectInvalid({{"a", UINT64_MAX - 100, 1}}, "overflows");
}

TEST(HeapLayout, UnknownRegionNamesTheKnownOnes) {
  const HeapLayout layout = HeapLayout::place({{"flags", 64, 64}, {"pool", 128, 128}});
  try {
    layout.region("pol");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no region 'pol' (regions: flags, pool)"), std::string::npos) << e.what();
  }
}

TEST(HeapLayout, SymmetricHeapAddsRuntimeRegionsFirstAndReservesTheirPrefix) {
  const HeapLayout layout = SymmetricHeap::layoutFor({{"flags", 64, 64}});
  ASSERT_EQ(layout.regions().size(), 3u);
  EXPECT_EQ(layout.regions()[0].name, SymmetricHeap::kContextRegion);
  EXPECT_EQ(layout.regions()[1].name, SymmetricHeap::kErrorRegion);
  EXPECT_EQ(layout.regions()[0].size, sizeof(abi::DeviceContext));
  EXPECT_EQ(layout.regions()[1].size, sizeof(abi::DeviceError));
  EXPECT_THROW(SymmetricHeap::layoutFor({{"megamoe.mine", 64, 64}}), Error);
}

}  // namespace
}  // namespace megamoe
