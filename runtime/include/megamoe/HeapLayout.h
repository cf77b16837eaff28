// Placement of named regions in the symmetric heap. A pure function of the region list, so every rank that asks
// for the same regions gets the same offsets (which is what makes "peer address = local address + offset" work).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace megamoe {

struct RegionSpec {
  std::string name;
  uint64_t size = 0;        // bytes, > 0
  uint64_t alignment = 16;  // power of two, <= HeapLayout::kMaxAlignment
};

struct Region {
  std::string name;
  uint64_t offset = 0;  // from the heap base; 64-bit, so heaps past 4 GB work
  uint64_t size = 0;
  uint64_t alignment = 0;
};

class HeapLayout {
 public:
  // cuMemAlloc and hipMalloc both guarantee at least this alignment of the heap base, so no region may ask more.
  static constexpr uint64_t kMaxAlignment = 256;

  // Places regions in the given order, each at the lowest offset past the previous one that meets its alignment;
  // the total is rounded up to kMaxAlignment. Throws Error(kInvalidArgument) for an empty or duplicate name, a
  // zero size, an alignment that is zero / not a power of two / above kMaxAlignment, or a total past 2^64.
  static HeapLayout place(const std::vector<RegionSpec>& regions);

  HeapLayout() = default;
  const std::vector<Region>& regions() const { return regions_; }
  uint64_t totalBytes() const { return totalBytes_; }
  bool contains(const std::string& name) const;
  // Throws Error(kInvalidArgument) naming the region and the ones that exist.
  const Region& region(const std::string& name) const;
  // 64-bit FNV-1a of every region's name, size, alignment and offset: equal hashes mean equal layouts (what the
  // rendezvous compares across ranks).
  uint64_t hash() const { return hash_; }

 private:
  std::vector<Region> regions_;
  uint64_t totalBytes_ = 0;
  uint64_t hash_ = 0;
};

}  // namespace megamoe
