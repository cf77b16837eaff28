// The tile scheduler of the grouped GEMMs: which tile a block runs (tile order over experts, bands of m-tiles,
// cluster pairs' tiles) and the ticket counter that dynamic tile loops draw from.
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dsl/Dsl.h"
#include "kernels/Flags.h"
#include "kernels/Kernels.h"
#include "kernels/gemm/SharedTables.h"

namespace megamoe::kernels {

// Where a tile sits: its expert, the group's row range, and the tile's row/column origin.
struct TilePlace {
  dsl::I32 expert, groupStart, groupEnd, mTile, n0;

  // The place as values carried from one tile-loop iteration to the next, or through a hand-over table.
  std::vector<dsl::I32> pack() const { return {expert, groupStart, groupEnd, mTile, n0}; }
  static TilePlace unpack(const std::vector<dsl::I32>& v) { return {v[0], v[1], v[2], v[3], v[4]}; }
};

// Tile t -> place. Expert e owns mTiles(e) x (N / bn) consecutive tiles: ceil(size_e / bm) m-tiles for NT/NN (an
// empty expert none), M / bm for TN (every expert, so that an expert without tokens gets its dW = 0 written).
// Within an expert the tiles go n-fastest, or in bands of m-tiles, m fastest within a band (banded()):
// - wide problems, N / bn >= kBandFrom (NN, whose B slab an n-tile reads in 512-byte pieces of K rows, from
//   kBandFromNN), in bands of kBandM: n-fastest, the tiles in flight span about one m-tile, so all of B[e] streams
//   from HBM once per m-tile; in bands, once per band;
// - tiles drawn from tickets (`ticketed`: the `_tma` kernels and the fused operators' cluster pairs), NT and NN
//   below those widths too, in bands of kBandTicketsM: tickets start consecutive tiles within microseconds, so the
//   m-tiles sharing an n-tile's B slice read it from L2 together.
// Elsewhere (TN below the widths, the static order's blocks, which drift apart, and the fused operators on the
// single-role engine) the tiles stay n-fastest: bands measured slower or no faster there
// (docs/decisions/gemm-tiles.md, tile order).
//
// Pairs (blockInPair set; NT / NN): the tiles are pairs of m-tiles (2i, 2i + 1) of one expert and n-tile, run by
// the two blocks of a cluster (blocks 0 and 1 of the pair), which share B's tile; the second m-tile of an expert
// with an odd count lies past the group (its block computes it and stores nothing), unless the expert's n-tiles
// come in pairs (loneSplit): then the odd last m-tile runs as "lone" tiles, its n-tiles 2q and 2q + 1 on the two
// blocks, each loading its own A and B without multicast. Bands count pairs of m-tiles (half as many per band).
//
// Chunks (chunks > 1; the combine's early reduce): the N columns in `chunks` equal parts, each scheduled as above
// over its own n-tiles, the tiles chunk by chunk: every tile of chunk c comes before any of chunk c + 1.
struct TileScheduler {
  dsl::Kernel& k;
  const GroupedGemmSpec& s;
  dsl::GlobalPtr offsets;
  int64_t bm, bn;
  std::optional<dsl::I32> blockInPair = std::nullopt;
  bool ticketed = false;
  int64_t chunks = 1;

  dsl::I32 offset(const dsl::I32& e) const { return (offsets + k.widen(e)).loadI32(); }
  static constexpr int64_t kBandFrom = 48, kBandFromNN = 28, kBandM = 8, kBandTicketsM = 4;
  int64_t nTiles() const { return s.n / bn / chunks; }  // of one chunk
  int64_t chunkColumns() const { return nTiles() * bn; }
  bool wide() const { return nTiles() >= (s.layout == GroupedGemmSpec::kNN ? kBandFromNN : kBandFrom); }
  bool banded() const { return wide() || (ticketed && s.layout != GroupedGemmSpec::kTN); }
  // Pairs with an even number of n-tiles split an expert's odd last m-tile by n-tiles ("lone" tiles, below).
  bool loneSplit() const { return blockInPair && nTiles() % 2 == 0; }
  // The scheduler's rows: m-tiles, or with pairs pairs of m-tiles (a band then holds half as many).
  dsl::I32 units(const dsl::I32& mTiles) const {
    return blockInPair ? (loneSplit() ? mTiles / 2 : (mTiles + 1) / 2) : mTiles;
  }
  // Tiles of an expert with m m-tiles: its rows' tiles, then with loneSplit the odd last m-tile's n-tile pairs.
  dsl::I32 expertTiles(const dsl::I32& m) const {
    dsl::I32 n = units(m) * nTiles();
    return loneSplit() ? n + m % 2 * (nTiles() / 2) : n;
  }
  int64_t bandUnits() const { return (wide() ? kBandM : kBandTicketsM) / (blockInPair ? 2 : 1); }
  dsl::I32 mTiles(const dsl::I32& start, const dsl::I32& end) const {
    if (s.layout == GroupedGemmSpec::kTN) return k.i32(s.kOrM / bm);
    return (end - start + (bm - 1)) / bm;
  }
  PrefixTable table(const dsl::SharedTile& first) const { return {k, first, s.experts}; }
  // Once per block: the first tile of every expert (within one chunk). Returns the total (of every chunk).
  dsl::I32 buildTable(const dsl::SharedTile& first) const {
    if (s.n % (bn * chunks) != 0)
      throw std::logic_error("tile chunks: N = " + std::to_string(s.n) + " must be whole n-tiles of " +
                             std::to_string(bn) + " in each of " + std::to_string(chunks) + " chunks");
    dsl::I32 perChunk = table(first).build([&](dsl::I32 e) {
      return expertTiles(mTiles(offset(e), offset(e + 1)));
    });
    return chunks > 1 ? perChunk * k.i32(chunks) : perChunk;
  }
  // Tile t's place for this block; with loneSplit, *lone (if given) tells whether the pair's two blocks share
  // the tile's rows (a lone tile: n-tiles 2q and 2q + 1 of the expert's last m-tile) instead of its B slice.
  TilePlace place(const dsl::I32& ticket, const dsl::SharedTile& first, std::optional<dsl::Bool>* lone = nullptr) const {
    PrefixTable tab = table(first);
    // Chunks: the ticket's chunk, and its tile within the chunk (no tile at all: chunk 0; the place is unused).
    dsl::I32 t = ticket, chunk = k.i32(0);
    if (chunks > 1) {
      dsl::I32 perChunk = tab.at(k.i32(s.experts));
      chunk = ticket / k.select(perChunk == 0, k.i32(1), perChunk);
      t = ticket - chunk * perChunk;
    }
    TilePlace p = placeInChunk(t, tab, lone);
    if (chunks > 1) p.n0 = p.n0 + chunk * k.i32(chunkColumns());
    return p;
  }
  // place() within one chunk (its first n-tile at n0 = 0).
  TilePlace placeInChunk(const dsl::I32& t, const PrefixTable& tab, std::optional<dsl::Bool>* lone) const {
    // t past the last tile finds index n; clamped so that no offset past the table is read (the place is unused).
    dsl::I32 found = tab.find(t);
    dsl::I32 e = k.select(found < k.i32(s.experts), found, k.i32(s.experts - 1));
    dsl::I32 local = t - tab.at(e);
    dsl::I32 start = offset(e), end = offset(e + 1), m = mTiles(start, end);
    dsl::I32 unit = local / nTiles(), nTile = local % nTiles();
    if (banded()) {
      const int64_t b = bandUnits();
      dsl::I32 band = local / (b * nTiles()), u0 = band * b;
      dsl::I32 left = units(m) - u0;  // lone tiles: garbage, replaced below
      dsl::I32 rows = k.select(left < k.i32(b), left, k.i32(b));
      // Past the last tile (t clamped above) rows can be 0: divide by 1 there (the place is unused).
      rows = k.select(k.i32(0) < rows, rows, k.i32(1));
      dsl::I32 r = local - band * (b * nTiles());
      unit = u0 + r % rows;
      nTile = r / rows;
    }
    if (!loneSplit()) return {e, start, end, blockInPair ? unit * 2 + *blockInPair : unit, nTile * bn};
    dsl::I32 rowTiles = units(m) * nTiles();
    dsl::Bool isLone = local >= rowTiles;
    if (lone) *lone = isLone;
    dsl::I32 q = local - rowTiles;
    return {e, start, end, k.select(isLone, m - 1, unit * 2 + *blockInPair),
            k.select(isLone, q * 2 + *blockInPair, nTile) * bn};
  }
};

// The end of a dynamic tile loop (tickets drawn from tickets[0], global i32 [2] zero at launch): the calling thread,
// one per block, counts its block done in tickets[1]; the last of `grid` blocks resets both for the next launch.
inline void resetTicketsIfLast(dsl::Kernel& k, const dsl::GlobalPtr& tickets, const dsl::I32& grid) {
  resetIfLastBlock(k, tickets + k.i64(1), grid, [&] {
    tickets.storeI32(k.i32(0));
    (tickets + k.i64(1)).storeI32(k.i32(0));
  });
}

}  // namespace megamoe::kernels
