// Small i32 tables in shared memory: sharedTable allocates one, PrefixTable turns per-entry counts into first
// indices so that "which entry holds item t" is a binary search in shared memory (the tile table, the push's units).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "dsl/Dsl.h"

namespace megamoe::kernels {

// Shared i32 table of n entries (rounded up to whole 16-byte rows), named `name` in the builder's messages.
inline dsl::SharedTile sharedTable(dsl::Kernel& k, std::string name, int64_t n) {
  return k.dynamicSharedTile(std::move(name), dsl::Elem::i32, 1, (n + 3) / 4 * 4, 1, dsl::Layout::rowMajor, 0,
                             /*align=*/16);
}

// first[i] = sum of count(j) for j < i, for i in [0, n], in shared memory, so that "which i holds item t" is a
// binary search in shared memory.
struct PrefixTable {
  dsl::Kernel& k;
  dsl::SharedTile first;  // >= n + 1 i32
  int64_t n;

  // Every thread of the block calls it; returns the total.
  dsl::I32 build(const std::function<dsl::I32(dsl::I32)>& count) const {
    using namespace dsl;
    k.forRange(k.threadIdx(), k.i32(n), k.i32(k.blockThreads()), [&](I32 i) { first.storeI32(i + 1, count(i)); });
    k.block().sync();
    k.ifThen(k.threadIdx() == 0, [&] {
      first.storeI32(k.i32(0), k.i32(0));
      k.forRange(k.i32(1), k.i32(n + 1), k.i32(1),
                 [&](I32 i) { first.storeI32(i, first.loadI32(i) + first.loadI32(i - 1)); });
    });
    k.block().sync();
    return first.loadI32(k.i32(n));
  }
  // The i with first[i] <= t < first[i + 1] (entries with count 0 have first[i] == first[i + 1]: the last such).
  dsl::I32 find(const dsl::I32& t) const {
    using namespace dsl;
    I32 lo = k.i32(0);  // invariant: first[lo] <= t; binary lifting finds the largest such index
    for (int64_t step = int64_t(1) << 12; step > 0; step >>= 1) {
      if (step >= 2 * n) continue;
      I32 probe = lo + step;
      Bool ok = probe < k.i32(n + 1);
      I32 safe = k.select(ok, probe, k.i32(n));
      lo = k.select(ok && (t >= first.loadI32(safe)), probe, lo);
    }
    return lo;
  }
  dsl::I32 at(const dsl::I32& i) const { return first.loadI32(i); }
};

}  // namespace megamoe::kernels
