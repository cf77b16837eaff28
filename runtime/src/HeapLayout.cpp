// Region placement for the symmetric heap (see HeapLayout.h).
#include "megamoe/HeapLayout.h"

#include <set>

#include "megamoe/Error.h"

namespace megamoe {
namespace {

[[noreturn]] void invalid(const std::string& message) { throw Error(ErrorCode::kInvalidArgument, message); }

// value rounded up to a power-of-two alignment; false on overflow.
bool alignUp(uint64_t value, uint64_t alignment, uint64_t* out) {
  const uint64_t mask = alignment - 1;
  if (value > UINT64_MAX - mask) return false;
  *out = (value + mask) & ~mask;
  return true;
}

struct Fnv1a {
  uint64_t state = 1469598103934665603ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      state ^= p[i];
      state *= 1099511628211ull;
    }
  }
  void u64(uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, 8);
  }
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
};

}  // namespace

HeapLayout HeapLayout::place(const std::vector<RegionSpec>& specs) {
  HeapLayout layout;
  std::set<std::string> names;
  uint64_t cursor = 0;
  for (const RegionSpec& spec : specs) {
    if (spec.name.empty()) invalid("heap region with an empty name");
    if (!names.insert(spec.name).second) invalid("heap region '" + spec.name + "' is declared twice");
    if (spec.size == 0) invalid("heap region '" + spec.name + "' has size 0");
    if (spec.alignment == 0 || (spec.alignment & (spec.alignment - 1)) != 0)
      invalid("heap region '" + spec.name + "' alignment " + std::to_string(spec.alignment) +
              " is not a power of two");
    if (spec.alignment > kMaxAlignment)
      invalid("heap region '" + spec.name + "' alignment " + std::to_string(spec.alignment) + " exceeds " +
              std::to_string(kMaxAlignment) + ", the heap base's guaranteed alignment");
    uint64_t offset = 0;
    if (!alignUp(cursor, spec.alignment, &offset) || offset > UINT64_MAX - spec.size)
      invalid("heap region '" + spec.name + "' (" + std::to_string(spec.size) +
              " bytes) overflows the 64-bit heap size");
    layout.regions_.push_back(Region{spec.name, offset, spec.size, spec.alignment});
    cursor = offset + spec.size;
  }
  if (!alignUp(cursor, kMaxAlignment, &layout.totalBytes_)) invalid("heap size overflows 64 bits");

  Fnv1a h;
  h.u64(layout.regions_.size());
  for (const Region& r : layout.regions_) {
    h.str(r.name);
    h.u64(r.size);
    h.u64(r.alignment);
    h.u64(r.offset);
  }
  h.u64(layout.totalBytes_);
  layout.hash_ = h.state;
  return layout;
}

bool HeapLayout::contains(const std::string& name) const {
  for (const Region& r : regions_)
    if (r.name == name) return true;
  return false;
}

const Region& HeapLayout::region(const std::string& name) const {
  std::string known;
  for (const Region& r : regions_) {
    if (r.name == name) return r;
    known += (known.empty() ? "" : ", ") + r.name;
  }
  invalid("heap has no region '" + name + "' (regions: " + (known.empty() ? "none" : known) + ")");
}

}  // namespace megamoe
