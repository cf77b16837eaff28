// Properties of the MMA atoms the lowerings consult: every fragment layout is a bijection onto its tile, has the
// shape the lowering's address arithmetic assumes, and the descriptor / swizzle match the hardware encoding.
// Each test names, in a comment, a broken layout it would catch.
#include "megamoe/Target/MmaAtoms.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace {

using megamoe::atoms::Coord;
using megamoe::atoms::Mfma32x32x16Bf16;
using megamoe::atoms::swizzledChunk;
using megamoe::atoms::WgmmaM64NK16Bf16;
using Wgmma = WgmmaM64NK16Bf16;
using Mfma = Mfma32x32x16Bf16;

// Counts how often each cell of a rows x cols tile is hit by layout(owner, index) over owners x perOwner; the
// layout is a bijection onto the tile exactly when every count is 1 and nothing falls outside.
template <typename Layout>
::testing::AssertionResult isBijection(Layout layout, int64_t owners, int64_t perOwner, int64_t rows, int64_t cols) {
  if (owners * perOwner != rows * cols)
    return ::testing::AssertionFailure() << owners << " x " << perOwner << " values cannot cover " << rows << " x "
                                         << cols;
  std::vector<int> hits(rows * cols, 0);
  for (int64_t o = 0; o < owners; ++o)
    for (int64_t i = 0; i < perOwner; ++i) {
      Coord c = layout(o, i);
      if (c.row < 0 || c.row >= rows || c.col < 0 || c.col >= cols)
        return ::testing::AssertionFailure() << "(" << o << ", " << i << ") -> (" << c.row << ", " << c.col
                                             << ") lies outside " << rows << " x " << cols;
      if (++hits[c.row * cols + c.col] > 1)
        return ::testing::AssertionFailure() << "(" << c.row << ", " << c.col << ") is owned twice, again by ("
                                             << o << ", " << i << ")";
    }
  return ::testing::AssertionSuccess();
}

// Every N the wgmma atom accepts (m64nNk16: N a multiple of 8 up to 256); mma_tile uses the multiples of 32.
std::vector<int64_t> wgmmaNs() {
  std::vector<int64_t> ns;
  for (int64_t n = 8; n <= 256; n += 8) ns.push_back(n);
  return ns;
}

//===----------------------------------------------------------------------===//
// sm_90a: wgmma m64nNk16
//===----------------------------------------------------------------------===//

// Catches: validN accepting an N the instruction lacks (0, 4, 12, 264) or rejecting one it has (8, 64, 128, 256).
TEST(WgmmaAtom, ValidNIsMultiplesOf8UpTo256) {
  for (int64_t n = -8; n <= 272; ++n) EXPECT_EQ(Wgmma::validN(n), n >= 8 && n <= 256 && n % 8 == 0) << "N = " << n;
}

// Catches: a per-thread accumulator count that does not split the 64 x N tile over 128 threads (e.g. N / 4).
TEST(WgmmaAtom, AccumulatorCountCoversTile) {
  for (int64_t n : wgmmaNs()) EXPECT_EQ(Wgmma::accPerThread(n) * Wgmma::kThreads, Wgmma::kM * n) << "N = " << n;
}

// Catches: two (thread, i) sharing a cell or a cell nobody owns, e.g. the 8-row half chosen by (i % 2) instead of
// ((i / 2) % 2) (pairs collide), or the column step (i / 4) * 4 instead of * 8 (columns overlap).
TEST(WgmmaAtom, AccumulatorIsBijectionOntoTile) {
  for (int64_t n : wgmmaNs())
    EXPECT_TRUE(isBijection(Wgmma::acc, Wgmma::kThreads, Wgmma::accPerThread(n), Wgmma::kM, n)) << "N = " << n;
}

// acc_store writes pairs (i, i + 1), even i, as one 2-element store. Catches: a layout whose pair members sit in
// different rows, in non-adjacent columns, or start at an odd column (misaligned 2-element store).
TEST(WgmmaAtom, EvenOddPairsAreAdjacentColumnsOfOneRow) {
  for (int64_t n : wgmmaNs())
    for (int64_t t = 0; t < Wgmma::kThreads; ++t)
      for (int64_t i = 0; i + 1 < Wgmma::accPerThread(n); i += 2) {
        Coord a = Wgmma::acc(t, i), b = Wgmma::acc(t, i + 1);
        ASSERT_EQ(a.row, b.row) << "N = " << n << ", t = " << t << ", i = " << i;
        ASSERT_EQ(a.col + 1, b.col) << "N = " << n << ", t = " << t << ", i = " << i;
        ASSERT_EQ(a.col % 2, 0) << "N = " << n << ", t = " << t << ", i = " << i;
      }
}

// The hardware gives warp w of the warpgroup rows [16 w, 16 w + 16) of D. Catches: a bijective layout that
// interleaves the warps' rows (row = 8 (lane / 4) + 2 warp + (i / 2) % 2), which the hardware does not produce.
TEST(WgmmaAtom, WarpOwnsSixteenRowBand) {
  for (int64_t n : wgmmaNs())
    for (int64_t t = 0; t < Wgmma::kThreads; ++t)
      for (int64_t i = 0; i < Wgmma::accPerThread(n); ++i) {
        int64_t warp = t / 32;
        Coord c = Wgmma::acc(t, i);
        ASSERT_GE(c.row, 16 * warp) << "t = " << t << ", i = " << i;
        ASSERT_LT(c.row, 16 * warp + 16) << "t = " << t << ", i = " << i;
      }
}

// AccStoreFromWgmma computes acc(t, i) as a per-thread base plus acc(0, i). Catches: a layout in which the offset
// between threads depends on i (e.g. column pair (lane % 4) ^ (i / 4) % 4), which that lowering would get wrong.
TEST(WgmmaAtom, ThreadOffsetIsIndependentOfElement) {
  for (int64_t n : wgmmaNs())
    for (int64_t t = 0; t < Wgmma::kThreads; ++t) {
      Coord base{Wgmma::acc(t, 0).row - Wgmma::acc(0, 0).row, Wgmma::acc(t, 0).col - Wgmma::acc(0, 0).col};
      for (int64_t i = 0; i < Wgmma::accPerThread(n); ++i) {
        Coord c = Wgmma::acc(t, i), c0 = Wgmma::acc(0, i);
        ASSERT_EQ(c.row - c0.row, base.row) << "N = " << n << ", t = " << t << ", i = " << i;
        ASSERT_EQ(c.col - c0.col, base.col) << "N = " << n << ", t = " << t << ", i = " << i;
      }
    }
}

// Reference points of the PTX ISA figure "WGMMA .m64nNk16 register fragment layout for accumulator matrix D":
// thread 0 holds d0..d3 at (0, 0), (0, 1), (8, 0), (8, 1) and d4 at (0, 8); thread 1 starts at (0, 2), thread 4 at
// (1, 0), warp 1 at row 16. Catches: a layout that is a bijection with adjacent pairs but transposed or permuted
// relative to the hardware (e.g. rows and the quad index swapped).
TEST(WgmmaAtom, MatchesPtxFigureAnchors) {
  auto expectAt = [](int64_t t, int64_t i, int64_t row, int64_t col) {
    Coord c = Wgmma::acc(t, i);
    EXPECT_EQ(c.row, row) << "t = " << t << ", i = " << i;
    EXPECT_EQ(c.col, col) << "t = " << t << ", i = " << i;
  };
  expectAt(0, 0, 0, 0);
  expectAt(0, 1, 0, 1);
  expectAt(0, 2, 8, 0);
  expectAt(0, 3, 8, 1);
  expectAt(0, 4, 0, 8);
  expectAt(1, 0, 0, 2);
  expectAt(4, 0, 1, 0);
  expectAt(32, 0, 16, 0);
  expectAt(127, 127, 63, 255);
}

// Bit field [lo, lo + width) of a descriptor.
uint64_t bits(uint64_t v, int lo, int width) { return (v >> lo) & ((uint64_t(1) << width) - 1); }

// The sm_90a shared-memory matrix descriptor: start address >> 4 in bits 0..13, leading byte offset (1, unused with
// swizzling) in 16..29, stride byte offset 1024 >> 4 = 64 in 32..45, base offset 0 in 49..51, swizzle mode 1
// (128-byte) in 62..63, everything else zero. Catches: a field in the wrong place (SBO at bit 30), the address
// not masked to 18 bits or not shifted by 4, a wrong swizzle mode (2 = 64B, 3 = 32B), stray bits.
TEST(WgmmaAtom, DescriptorBitFields) {
  const uint64_t addresses[] = {0, 16, 32, 1024, 8192, 0x1F3C0, 0x3FFF0, 0x40000, 0x40400, 0xFFFFFFF0ull,
                                0x7FFFFFFFFFFFFFF0ull};
  for (uint64_t addr : addresses) {
    uint64_t d = Wgmma::descriptor(addr);
    EXPECT_EQ(bits(d, 0, 14), (addr & 0x3FFFF) >> 4) << std::hex << "addr 0x" << addr;
    EXPECT_EQ(bits(d, 14, 2), 0u) << std::hex << "addr 0x" << addr;
    EXPECT_EQ(bits(d, 16, 14), 1u) << std::hex << "addr 0x" << addr;
    EXPECT_EQ(bits(d, 30, 2), 0u) << std::hex << "addr 0x" << addr;
    EXPECT_EQ(bits(d, 32, 14), 64u) << std::hex << "addr 0x" << addr;
    EXPECT_EQ(bits(d, 46, 16), 0u) << std::hex << "addr 0x" << addr;
    EXPECT_EQ(bits(d, 62, 2), 1u) << std::hex << "addr 0x" << addr;
  }
}

// The lowering ORs descriptor(0) onto the masked, shifted address and adds kDescriptorStepPerK16 per k-step.
// Catches: constant bits that overlap the address field (the OR would corrupt it), and a k-step that is not
// 16 bf16 = 32 bytes inside the swizzled row (e.g. 16 >> 4 = 1, half a step).
TEST(WgmmaAtom, DescriptorIsAddressFieldPlusConstantAndKStepIs32Bytes) {
  for (uint64_t addr = 0; addr < 0x40000; addr += 16)
    ASSERT_EQ(Wgmma::descriptor(addr), ((addr & 0x3FFFF) >> 4) | Wgmma::descriptor(0)) << std::hex << addr;
  EXPECT_EQ(Wgmma::kDescriptorStepPerK16 << 4, uint64_t(Wgmma::kK * 2));
  for (uint64_t addr : {0ull, 1024ull, 0x20000ull})
    EXPECT_EQ(Wgmma::descriptor(addr + 32), Wgmma::descriptor(addr) + Wgmma::kDescriptorStepPerK16);
}

//===----------------------------------------------------------------------===//
// gfx950: v_mfma_f32_32x32x16_bf16
//===----------------------------------------------------------------------===//

// Catches: per-lane counts that do not cover the 32 x 32 D (16 x 64) or the 32 x 16 A (8 x 64), e.g. the 8
// accumulators of the 16x16 variant.
TEST(MfmaAtom, CountsCoverTiles) {
  EXPECT_EQ(Mfma::kAccPerLane * Mfma::kLanes, Mfma::kM * Mfma::kN);
  EXPECT_EQ(Mfma::kOperandPerLane * Mfma::kLanes, Mfma::kM * Mfma::kK);
}

// Catches: an accumulator layout that loses or duplicates cells, e.g. the half-wave term 4 (l / 32) written as
// 8 (l / 32) (collides with the 8 (i / 4) block), or the column taken from l % 16.
TEST(MfmaAtom, AccumulatorIsBijectionOnto32x32) {
  EXPECT_TRUE(isBijection(Mfma::acc, Mfma::kLanes, Mfma::kAccPerLane, Mfma::kM, Mfma::kN));
}

// Catches: an operand layout that loses or duplicates (row, k) cells, e.g. the k half chosen by l % 2 with the row
// still l % 32 (two lanes read the same row and k range).
TEST(MfmaAtom, OperandIsBijectionOnto32x16) {
  EXPECT_TRUE(isBijection(Mfma::a, Mfma::kLanes, Mfma::kOperandPerLane, Mfma::kM, Mfma::kK));
}

// The lowering loads a lane's 8 operand values with one 16-byte LDS load (one swizzle chunk). Catches: a layout whose
// values of a lane are not 8 consecutive k of one row starting at a multiple of 8 (e.g. k = j * 2 + l / 32).
TEST(MfmaAtom, OperandOfLaneIsOneAlignedChunkOfOneRow) {
  for (int64_t l = 0; l < Mfma::kLanes; ++l) {
    Coord first = Mfma::a(l, 0);
    EXPECT_EQ(first.col % Mfma::kOperandPerLane, 0) << "lane " << l;
    EXPECT_EQ(first.row, l % 32) << "lane " << l;
    for (int64_t j = 0; j < Mfma::kOperandPerLane; ++j) {
      EXPECT_EQ(Mfma::a(l, j).row, first.row) << "lane " << l << ", j " << j;
      EXPECT_EQ(Mfma::a(l, j).col, first.col + j) << "lane " << l << ", j " << j;
    }
  }
}

// AccStoreFromMfma computes acc(l, i) as (4 (l / 32), l % 32) + acc(0, i). Catches: a layout where a lane's offset
// depends on i, or whose column is not the lane within its half-wave (the store would scatter to the wrong column).
TEST(MfmaAtom, LaneOffsetIsIndependentOfElement) {
  for (int64_t l = 0; l < Mfma::kLanes; ++l)
    for (int64_t i = 0; i < Mfma::kAccPerLane; ++i) {
      Coord c = Mfma::acc(l, i), c0 = Mfma::acc(0, i);
      ASSERT_EQ(c.row - c0.row, 4 * (l / 32)) << "lane " << l << ", i " << i;
      ASSERT_EQ(c.col - c0.col, l % 32) << "lane " << l << ", i " << i;
    }
}

//===----------------------------------------------------------------------===//
// FP8 e4m3: sm_90a wgmma m64nNk32, gfx950 v_mfma_f32_32x32x16_fp8_fp8
//===----------------------------------------------------------------------===//

using megamoe::atoms::Mfma32x32x16Fp8;
using megamoe::atoms::WgmmaM64NK32E4m3;

// The FP8 lowering steps the bf16 descriptors: k32 of 1-byte e4m3 is the 32 bytes of bf16's k16, and the k steps of
// a stage tile exactly one 128-byte swizzled row. Catches: a K of 16 or 64 per step (the stage would read half a
// row, or past it), or a step that is not 32 bytes.
TEST(WgmmaE4m3Atom, KStepsTileOne128ByteRowAtBf16sDescriptorStep) {
  using A = WgmmaM64NK32E4m3;
  EXPECT_EQ(A::kK * 1, 32);                                                   // bytes per step
  EXPECT_EQ(A::kDescriptorStepPerK32, WgmmaM64NK16Bf16::kDescriptorStepPerK16);
  EXPECT_EQ((A::kRowElements / A::kK) * (A::kDescriptorStepPerK32 << 4), 128u);
  EXPECT_EQ(std::string(A::kPtx).find("k32.f32.e4m3.e4m3") != std::string::npos, true) << A::kPtx;
}

// Catches: an e4m3 accumulator fragment that differs from the one AccStoreFromWgmma walks (the f32 D fragment is
// the same for every wgmma input type), or one that is not a bijection onto the 64 x N tile.
TEST(WgmmaE4m3Atom, AccumulatorIsBf16sAndABijection) {
  using A = WgmmaM64NK32E4m3;
  for (int64_t n : wgmmaNs()) {
    EXPECT_EQ(A::validN(n), Wgmma::validN(n));
    EXPECT_TRUE(isBijection([&](int64_t t, int64_t i) { return A::acc(t, i); }, A::kThreads, A::accPerThread(n),
                            A::kM, n))
        << "N = " << n;
    for (int64_t t = 0; t < A::kThreads; t += 37)
      for (int64_t i = 0; i < A::accPerThread(n); ++i) {
        EXPECT_EQ(A::acc(t, i).row, Wgmma::acc(t, i).row);
        EXPECT_EQ(A::acc(t, i).col, Wgmma::acc(t, i).col);
      }
  }
}

// The gfx950 lowering loads a lane's 8 e4m3 (one i64) at byte row * 128 + chunk * 16 + (lane / 32) * 8 of a k-step's
// 16-byte chunk. Catches: an operand layout that is not a bijection onto 32 x 16, or whose 8 values of a lane are not
// 8 consecutive k of one row starting at 8 (lane / 32): the i64 load would gather the wrong bytes.
TEST(MfmaFp8Atom, OperandIsOneAlignedEightByteRunOfOneRow) {
  using A = Mfma32x32x16Fp8;
  EXPECT_TRUE(isBijection(A::a, A::kLanes, A::kOperandPerLane, A::kM, A::kK));
  EXPECT_EQ(A::kOperandPerLane * 1, A::kOperandBytes);
  for (int64_t l = 0; l < A::kLanes; ++l) {
    EXPECT_EQ(A::a(l, 0).col, 8 * (l / 32)) << "lane " << l;
    for (int64_t j = 0; j < A::kOperandPerLane; ++j) EXPECT_EQ(A::a(l, j).col, A::a(l, 0).col + j);
  }
  EXPECT_TRUE(isBijection(A::acc, A::kLanes, A::kAccPerLane, A::kM, A::kN));
}

//===----------------------------------------------------------------------===//
// The b128 swizzle
//===----------------------------------------------------------------------===//

// Catches: a swizzle that maps two chunks of a row to one place (e.g. (c + r) % 7, or c ^ (r % 16) leaving the
// 8-chunk row for rows 8..15), which would overwrite data in shared memory.
TEST(Swizzle, PermutesTheEightChunksOfEveryRow) {
  for (int64_t r = 0; r < 256; ++r) {
    std::set<int64_t> seen;
    for (int64_t c = 0; c < 8; ++c) {
      int64_t p = swizzledChunk(r, c);
      ASSERT_GE(p, 0) << "row " << r << ", chunk " << c;
      ASSERT_LT(p, 8) << "row " << r << ", chunk " << c;
      seen.insert(p);
    }
    EXPECT_EQ(seen.size(), 8u) << "row " << r;
  }
}

// Rows that are multiples of 8 are stored as is (the 1024-byte swizzle atom starts unpermuted, as the wgmma
// 128B-swizzle mode expects). Catches: c ^ ((r + 1) % 8), or a swizzle keyed on r / 8.
TEST(Swizzle, IdentityOnRowsThatAreMultiplesOf8) {
  for (int64_t r = 0; r < 256; r += 8)
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(swizzledChunk(r, c), c) << "row " << r << ", chunk " << c;
}

// The pattern repeats every 8 rows (1024 bytes, the descriptor's stride byte offset). Catches: a swizzle keyed on
// more than the low three row bits, e.g. one that also flips chunk bit 0 in odd 8-row groups.
TEST(Swizzle, PeriodicInEightRows) {
  for (int64_t r = 0; r < 248; ++r)
    for (int64_t c = 0; c < 8; ++c) EXPECT_EQ(swizzledChunk(r + 8, c), swizzledChunk(r, c)) << "row " << r;
}

// Why the swizzle exists: 8 consecutive rows reading the same logical chunk (an MFMA operand fetch, a column of a
// tile) hit 8 different physical chunks, i.e. different shared-memory banks. Catches: the identity swizzle, or
// c ^ (r % 4) (two rows per bank group).
TEST(Swizzle, SameChunkOfEightRowsSpreadsOverAllChunks) {
  for (int64_t base = 0; base < 64; base += 8)
    for (int64_t c = 0; c < 8; ++c) {
      std::set<int64_t> seen;
      for (int64_t r = base; r < base + 8; ++r) seen.insert(swizzledChunk(r, c));
      EXPECT_EQ(seen.size(), 8u) << "rows " << base << ".." << base + 7 << ", chunk " << c;
    }
}

}  // namespace

// The FP8 promotion loads one scale per distinct row of a thread's accumulator elements (acc_row_scales), as many
// as the kernels ask for (kAccRowsPerThread / kAccRowsPerLane). Catches: a count that differs from the fragment's
// distinct rows for any thread and N (a scale would be missing, or a register wasted on every promotion).
TEST(Fp8PromotionAtoms, ScaleRowsAreTheFragmentsDistinctRows) {
  auto distinctRows = [](auto acc, int64_t thread, int64_t elements) {
    std::set<int64_t> rows;
    for (int64_t i = 0; i < elements; ++i) rows.insert(acc(thread, i).row);
    return int64_t(rows.size());
  };
  for (int64_t n : wgmmaNs())
    for (int64_t t = 0; t < WgmmaM64NK32E4m3::kThreads; ++t)
      EXPECT_EQ(distinctRows(WgmmaM64NK32E4m3::acc, t, WgmmaM64NK32E4m3::accPerThread(n)),
                WgmmaM64NK32E4m3::kAccRowsPerThread)
          << "N = " << n << ", thread " << t;
  for (int64_t l = 0; l < Mfma32x32x16Fp8::kLanes; ++l)
    EXPECT_EQ(distinctRows(Mfma32x32x16Fp8::acc, l, Mfma32x32x16Fp8::kAccPerLane), Mfma32x32x16Fp8::kAccRowsPerLane)
        << "lane " << l;
}
