// One descriptor per matrix-core instruction per target, with its fragment layouts as pure functions.
// The lowerings consult these; host tests check their algebra (every element owned exactly once).
// LLVM-free on purpose.
#pragma once
#include <cstdint>

namespace megamoe::atoms {

struct Coord {
  int64_t row, col;
};

// sm_90a: wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16, issued by one warpgroup (128 threads).
// A [64, 16] and B [N, 16] come from shared memory descriptors (K-major, 128-byte swizzle); D stays in registers.
struct WgmmaM64NK16Bf16 {
  static constexpr const char* kPtx = "wgmma.mma_async.sync.aligned.m64nNk16.f32.bf16.bf16";
  static constexpr const char* kSass = "HGMMA";
  static constexpr int64_t kM = 64, kK = 16, kThreads = 128;
  static constexpr bool validN(int64_t n) { return n >= 8 && n <= 256 && n % 8 == 0; }
  static constexpr int64_t accPerThread(int64_t n) { return n / 2; }
  // The distinct rows of a thread's accumulator elements (lane / 4 and 8 more), whatever n.
  static constexpr int64_t kAccRowsPerThread = 2;
  // Accumulator element i of thread t (0..127) of the warpgroup.
  static constexpr Coord acc(int64_t t, int64_t i) {
    int64_t warp = t / 32, lane = t % 32;
    return {warp * 16 + lane / 4 + 8 * ((i / 2) % 2), (i / 4) * 8 + (lane % 4) * 2 + (i % 2)};
  }
  // Shared-memory matrix descriptor, K-major with 128-byte swizzle: start address >> 4, leading byte offset 1
  // (unused when swizzled), stride byte offset 1024 (eight 128-byte rows) >> 4, layout type 1 (128B swizzle).
  static constexpr uint64_t descriptor(uint64_t sharedAddr) {
    return ((sharedAddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
  }
  // Advancing K by 16 bf16 moves 32 bytes inside the swizzled row: +2 in the descriptor's address field.
  static constexpr uint64_t kDescriptorStepPerK16 = 32 >> 4;

  // MN-major operands: 1024-byte atoms of 8 K-rows x 64 MN elements, each row swizzled like b128. Leading byte
  // offset = the bytes from one 64-element MN atom to the next, stride byte offset = from one 8-row K group to the
  // next; K advances by 16 = two K groups. Two placements are used: b128_mn tiles (tile_copy) put the atoms along
  // MN next to each other (lbo 1024, sbo = atomsMN * 1024); TMA boxes of 64 MN x kRows put the K groups of one
  // MN atom next to each other (lbo = kRows / 8 * 1024, sbo 1024).
  static constexpr uint64_t descriptorMN(uint64_t sharedAddr, uint64_t lbo, uint64_t sbo) {
    return ((sharedAddr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) | (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
  }
  static constexpr uint64_t descriptorStepPerK16MN(uint64_t sbo) { return 2 * sbo >> 4; }
};

// sm_90a: wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3, one warpgroup. FP8 operands must both be K-major
// (wgmma transposes only 16-bit types); a 128-byte swizzled shared row holds 128 e4m3, so K advances by 32 in the
// same 32 bytes as bf16's k16 and the descriptors are WgmmaM64NK16Bf16's. The accumulator fragment is the same.
struct WgmmaM64NK32E4m3 {
  static constexpr const char* kPtx = "wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3";
  static constexpr const char* kSass = "QGMMA";
  static constexpr int64_t kM = 64, kK = 32, kThreads = 128, kRowElements = 128;
  static constexpr bool validN(int64_t n) { return WgmmaM64NK16Bf16::validN(n); }
  static constexpr int64_t accPerThread(int64_t n) { return WgmmaM64NK16Bf16::accPerThread(n); }
  static constexpr int64_t kAccRowsPerThread = WgmmaM64NK16Bf16::kAccRowsPerThread;
  static constexpr Coord acc(int64_t t, int64_t i) { return WgmmaM64NK16Bf16::acc(t, i); }
  static constexpr uint64_t kDescriptorStepPerK32 = 32 >> 4;
};

// gfx950: v_mfma_f32_32x32x16_bf16, one wave (64 lanes). Never executed here: no AMD GPU exists in this project's
// machines; layouts follow the CDNA3/CDNA4 ISA guides and are checked only statically.
struct Mfma32x32x16Bf16 {
  static constexpr const char* kIsa = "v_mfma_f32_32x32x16_bf16";
  static constexpr int64_t kM = 32, kN = 32, kK = 16, kLanes = 64;
  static constexpr int64_t kAccPerLane = 16, kOperandPerLane = 8;
  // A element j (0..7) of lane l: A[row][k]. B is given as [n][k] (NT), same placement with row -> n.
  static constexpr Coord a(int64_t l, int64_t j) { return {l % 32, (l / 32) * 8 + j}; }
  // Accumulator element i (0..15) of lane l.
  static constexpr Coord acc(int64_t l, int64_t i) { return {8 * (i / 4) + 4 * (l / 32) + i % 4, l % 32}; }
};

// gfx950 (also gfx940+): v_mfma_f32_32x32x16_fp8_fp8, one wave: the bf16 atom's placement with 8 e4m3 (8 bytes, one
// i64) per lane and step. Never executed here (no AMD GPU); checked statically only. gfx950's faster
// v_mfma_scale_f32_32x32x64_f8f6f4 (hardware block scales) is not used yet.
struct Mfma32x32x16Fp8 {
  static constexpr const char* kIsa = "v_mfma_f32_32x32x16_fp8_fp8";
  static constexpr int64_t kM = 32, kN = 32, kK = 16, kLanes = 64;
  static constexpr int64_t kAccPerLane = 16, kOperandPerLane = 8, kOperandBytes = 8;
  // The distinct rows of a lane's accumulator elements: 16, the same in every 32-wide N tile.
  static constexpr int64_t kAccRowsPerLane = 16;
  static constexpr Coord a(int64_t l, int64_t j) { return Mfma32x32x16Bf16::a(l, j); }
  static constexpr Coord acc(int64_t l, int64_t i) { return Mfma32x32x16Bf16::acc(l, i); }
};

// The b128 swizzle shared by tile_copy and both MMA lowerings: 16-byte chunk c of row r sits at chunk c ^ (r % 8)
// of that 128-byte row.
constexpr int64_t swizzledChunk(int64_t row, int64_t chunk) { return chunk ^ (row % 8); }

}  // namespace megamoe::atoms
