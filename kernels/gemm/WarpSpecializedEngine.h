// The warp-specialised engine (sm_90a): a producer warpgroup loads the ring (TMA boxes, or cp.async), the MMA
// warpgroups multiply and store; ring slots, tiles and the staging tile pass between them on mbarriers.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <vector>

#include "dsl/Dsl.h"
#include "kernels/Kernels.h"
#include "kernels/gemm/Operands.h"
#include "kernels/gemm/PairMailbox.h"
#include "megamoe/Target/TargetLimits.h"
#include "kernels/gemm/SplitTail.h"
#include "kernels/gemm/TileScheduler.h"

namespace megamoe::kernels {

// The warp-specialised engine (sm_90a, Tiles::warpSpecialized): the last warpgroup (the producer) issues every
// copy, the MMA warpgroups only wait, multiply and store. Ring slot s passes from producer to MMA on full[s] (its
// copies have landed: one cp.async arrival per producer thread) and back on empty[s] (the MMA that read it has
// finished: one arrival per MMA warpgroup). The producer runs up to `stages` slots ahead, across tiles, so the next
// tile's first stages load while the MMA warpgroups run the epilogue. Tiles reach the MMA warpgroups through a
// two-entry hand-over table in shared memory (tileFull / tileEmpty), the last entry marked invalid. Each MMA
// warpgroup runs its own loop over its 64 rows of every tile (of a half tile: its half of the columns, halfTile);
// the two take turns on a 64-row staging tile.
// Registers move to the MMA warpgroups (setmaxnreg): at 384 threads a block starts at 168 each; the producer gives
// 112 of them back and the MMA warpgroups take them (56 + 2 x 216 fits the 168 x 3 launched; at 48 the producer
// spilled).
//
// With tensor maps (sm_90a TMA) one producer thread loads each stage as boxes completing on full[s] (expected
// bytes), so the producer's copies cost a few instructions instead of 24 cp.async with their addresses per thread.
// The boxes are the maps' declared ones (compiler/abi/Kernels.def), which the runtime encodes the maps with:
// NT / NN's A [rows, K] in boxes of 128 rows x 64 K, NT's B [E * N, K] in boxes of 128 rows x 64 K, NN's B
// [E * K, N] and TN's A [tokens, M] and B [tokens, N] in boxes of 64 K x 64 MN (MN atoms outermost: the rings'
// mn128BBoxes layout, allocateRings; TN's partial last step of a group: tnStepRow, zeroTail). Every
// registered kernel on this engine has tensor maps; the cp.async producers (runStatic) only codegen_test builds.
struct WarpSpecializedEngine {
  static constexpr int64_t kHandover = 2, kFields = 8, kProducerRegisters = 56, kMmaRegisters = 216;
  GemmOperands gemm;
  // mbarriers: full[S], empty[S], tileFull[2], tileEmpty[2], with pairs the mailbox's 4, then turn[2];
  // info: i32 [2][8]
  dsl::SharedTile bars, info;
  TensorMapArgs maps;
  // Pairs (with tensor maps, BN = 256; FP8 128): blocks 2c and 2c + 1 form a cluster running the scheduler's m-tile
  // pairs; each loads its own A and one half of B (of its boxes), multicast into both, so B's traffic from L2 halves.
  std::optional<dsl::I32> blockInPair = std::nullopt;
  // Pairs drawing tickets: block 0 of the pair draws, and sends each ticket into block 1's mailbox.
  std::optional<PairMailbox> mailbox = std::nullopt;
  // The split-K tail (enableSplit).
  std::optional<SplitTail> split = std::nullopt;
  // Fused operators (with tensor maps): called by the producer leader alone before a tile's loads, e.g. to wait for
  // the tile's rows to arrive.
  std::function<void(const TilePlace&)> leaderBeforeLoads;
  // Replaces the default row stores: called by the 128 threads of MMA warpgroup `wg` (its own group: wg.sync() is
  // its barrier; warpgroup wg.first() / 128 of the block) once its 64 rows of the tile, from firstRow on, are in the
  // staging tile.
  std::function<void(const TilePlace&, const dsl::I32& firstRow, const dsl::Threads& wg)> epilogue;
  // The epilogue sends staging rows out as bulk copies (committed): they have read the staging tile before the
  // other warpgroup takes its turn, and are written before the MMA warpgroups leave the engine.
  bool bulkEpilogue = false;
  // TN with a map over C (maps.c): the staging tile holds TMA's boxes, and a storer thread of the producer
  // warpgroup sends each warpgroup's staged rows out as tmaStores and passes the turn once they have read them.
  // Shared memory's banks bound these kernels (each step's wgmmas and ring fills take them all: bench/results/
  // 2026-12-02-h200-tn-3stages); the default TN epilogue's staging loads and global stores (which pass the banks
  // twice) cost 192 KB of bank traffic a 128 x 256 tile, the copy engine's reads 64 KB. storePlace: the staged
  // rows' first C row and column (row -1: no more).
  std::optional<dsl::SharedTile> storePlace = std::nullopt;
  bool tmaStores() const { return storePlace.has_value(); }
  // Fused operators: called by every thread of MMA warpgroup wg before each tile's K loop with the value it
  // returned before the warpgroup's previous tile (the first: 0); afterTiles gets the last value once the
  // warpgroup's bulk stores are written. The combine counts each warpgroup past a chunk of columns with them.
  std::function<dsl::I32(const dsl::Threads& wg, const TilePlace& p, const dsl::I32& state)> beforeTile;
  std::function<void(const dsl::Threads& wg, const dsl::I32& state)> afterTiles;
  // Fused operators: run by the producer warpgroup's warps 1 .. 3 (kSideThreads, their named barrier kSideBarrier)
  // beside the leader's loads (not with tmaStores: its storer is warp 1), e.g. the combine's early reduce; the
  // producer warpgroup then keeps kSideWorkRegisters.
  std::function<void()> sideWork;
  static constexpr int64_t kSideThreads = 96, kSideWorkRegisters = 72;
  static constexpr int kSideBarrier = 8;
  int64_t producerRegisters() const { return sideWork ? kSideWorkRegisters : kProducerRegisters; }


  // Ring stages: 4 when they fit the 227 KB beside the 64-row staging tile, the engine's barriers (1024-byte
  // aligned, as every mbarriers() tile) and hand-over table and the kernel's own shared i32 tables (entries each;
  // sharedTable rounds to 16 bytes), else 3.
  static int64_t stagesFor(const GroupedGemmSpec::Tiles& c, std::initializer_list<int64_t> tables, bool pairs = false) {
    // 16 barriers: full / empty at 4 stages, the tile hand-over's 4 and the staging turns' 2 (pairs: 4 more).
    int64_t bytes = 1024 + 16 * 8 + kHandover * kFields * 4 + 64 * (c.n + 8) * 2;
    if (pairs) bytes += PairMailbox::kSharedBytes;
    for (int64_t n : tables) bytes += (n + 3) / 4 * 16;
    return bytes + 4 * (c.m + c.n) * c.k * c.elemBytes() <= kSm90aLimits.sharedBytesPerBlock ? 4 : 3;
  }

  // The staging tile holds one warpgroup's 64 rows (allocateRings(..., 64)): the MMA warpgroups run their own K
  // loops over the shared ring and take turns storing, so one stores while the other multiplies. Without tensor
  // maps the producer warpgroup copies with cp.async.
  static WarpSpecializedEngine allocate(const GemmOperands& gemm, const TensorMapArgs& maps,
                                        std::optional<dsl::I32> blockInPair = std::nullopt) {
    if (maps.a.has_value() != maps.b.has_value() || (maps.a && gemm.gatherA) ||
        (maps.a && gemm.gateUpRows && gemm.s.layout != GroupedGemmSpec::kNT))
      throw std::logic_error("tensor maps: both operands, no gathered rows; gate | up halves only in NT (two boxes)");
    if (blockInPair && (!maps.a || (gemm.c.n != 256 && !(gemm.c.e4m3 && gemm.c.n == 128)) || gemm.tn()))
      throw std::logic_error("pairs: tensor maps, NT / NN, BN = 256 (FP8: 128)");
    if (gemm.rings.staging.rows() != 64) throw std::logic_error("warp-specialised: a 64-row staging tile");
    // A K-major operand's box is one whole stage (A) or a band of whole rows (NT's B); an MN-major slab's box is one
    // 64-wide K step of an MN atom (boxRows).
    const auto& c = gemm.c;
    if (maps.a && !gemm.tn() && (maps.a->box().cols != c.k || maps.a->box().rows != c.m))
      throw std::logic_error("tensor maps: A's declared box must be one " + std::to_string(c.k) + " x " +
                             std::to_string(c.m) + " stage");
    const int64_t bRows = maps.b ? maps.b->box().rows : 0;
    if (maps.b && gemm.s.layout == GroupedGemmSpec::kNT &&
        (maps.b->box().cols != c.k || c.n % bRows != 0 || (gemm.gateUpRows && c.n != 2 * bRows)))
      throw std::logic_error("tensor maps: NT's B box must be whole " + std::to_string(c.k) + "-wide rows of the tile "
                             "(with gate | up halves, one half)");
    dsl::Kernel& k = gemm.k;
    const bool stores = maps.c.has_value();
    if (stores != (maps.a && gemm.tn()) ||
        (stores && (gemm.rings.staging.layout() != dsl::Layout::mn128BBoxes || maps.c->box().rows != 64 ||
                    gemm.c.n % maps.c->box().cols != 0)))
      throw std::logic_error("tensor-map stores: TN with tensor maps stores through map_c, the staging tile in TMA's "
                             "boxes, boxes of one warpgroup's 64 rows");
    WarpSpecializedEngine engine{
        gemm,
        k.mbarriers(2 * gemm.c.stages + 2 * kHandover + (blockInPair ? PairMailbox::kBarriers : 0) + 2 +
                    (stores ? 1 : 0)),
        k.dynamicSharedTile("tile_handover", dsl::Elem::i32, 1, kHandover * kFields, 1, dsl::Layout::rowMajor, 0,
                            /*align=*/16), maps, blockInPair};
    if (blockInPair)
      engine.mailbox.emplace(PairMailbox::allocate(k, engine.bars, 2 * gemm.c.stages + 2 * kHandover, *blockInPair));
    if (stores) engine.storePlace = sharedTable(k, "store_place", 2);
    return engine;
  }
  // The split-K tail (SplitTail.h) over `scratch` (abi::splitScratchBytes(grid)); the kernel's tables must count
  // the shared i32 [2] it allocates (stagesFor(c, {..., 2})).
  void enableSplit(const dsl::GlobalPtr& scratch, const dsl::I32& maxSplit, const dsl::I32& grid) {
    if (!tma() || gemm.tn() || epilogue || gemm.mmaOn) throw std::logic_error("split-K tail: plain NT / NN with TMA");
    split = SplitTail::over(gemm.k, scratch, maxSplit, grid, blockInPair);
  }
  int64_t warpgroups() const { return gemm.c.mmaThreads() / 128; }
  // The staging tile passes between the MMA warpgroups in turns (Turns; warpgroup w's turn): the other
  // warpgroup's 128 threads arrive once done with it (release), w waits before using it (acquire). Named barriers
  // (bar.arrive / bar.sync) ordered the same accesses, but compute-sanitizer racecheck does not follow bar.arrive
  // and reported every hand-over as a hazard; it follows mbarriers.
  Turns turns() const {
    return {gemm.k, bars, 2 * stages() + 2 * kHandover + (blockInPair ? PairMailbox::kBarriers : 0)};
  }
  // tmaStores: one warpgroup's rows are staged (its threads arrive; the storer waits), after the turns' barriers.
  dsl::I32 staged() const { return gemm.k.i32(turns().at + 2); }
  // TN with TMA: both MMA warpgroups meet here once they have zeroed their share of a group's last K step.
  static constexpr int kTailBarrier = 7;
  // Rows of one MN x K TMA box (64 x 64: 8 KB, 64 K rows of 128 bytes) in a [K][MN] ring tile of `cols` elements.
  static int64_t boxRows(const dsl::SharedTile& t, const dsl::TensorMap& map) {
    return map.box().bytes() / (t.cols() * 2);
  }
  bool tma() const { return maps.a.has_value(); }
  int64_t stages() const { return gemm.c.stages; }
  // The ring slots (full[S], empty[S]) and the tile hand-over table's entries (tileFull[2], tileEmpty[2]).
  BarrierRing slots() const { return {gemm.k, bars, stages(), 0, stages()}; }
  BarrierRing handOvers() const { return {gemm.k, bars, kHandover, 2 * stages(), 2 * stages() + kHandover}; }

  // Thread 0 sets up the barriers; every thread of the block calls it.
  void init() const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    k.ifThen(k.threadIdx() == 0, [&] {
      slots().init(tma() ? 1 : k.blockThreads() - gemm.c.mmaThreads(), warpgroups() * (blockInPair ? 2 : 1));
      handOvers().init(1, gemm.c.mmaThreads());  // empty: every reader of the entry
      turns().init(tmaStores() ? 1 : 128);  // tmaStores: the storer passes the turns
      if (tmaStores()) k.mbarrierInit(bars, staged(), 128);  // a warpgroup's threads
      if (mailbox) mailbox->init();
    });
    if (blockInPair)
      k.clusterSync();  // both blocks' barriers exist before either multicasts or arrives on the other's
    else
      k.block().sync();
  }

  // Producer leader: hands tile number j (its place, or the end mark) to the MMA warpgroups.
  void handOver(const dsl::I32& j, const TilePlace* p, const std::optional<KSlice>& slice = std::nullopt) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const BarrierRing ring = handOvers();
    I32 q = ring.entry(j);
    ring.acquire(j, q);
    I32 at = q * kFields;
    info.storeI32(at, k.i32(p ? 1 : 0));
    if (p) {
      std::vector<I32> v = p->pack();
      for (size_t f = 0; f < v.size(); ++f) info.storeI32(at + int64_t(f + 1), v[f]);
      if (slice) {  // fields 6 and 7 (K steps below 2^16)
        info.storeI32(at + 6, slice->k0 + slice->steps * 65536);
        info.storeI32(at + 7, slice->code);
      }
    }
    ring.commit(q);
  }
  // MMA warpgroups: waits for tile number j's entry; returns its valid flag.
  dsl::I32 receive(const dsl::I32& j) const {
    handOvers().wait(j);
    return info.loadI32((j % kHandover) * kFields);
  }
  TilePlace placeOf(const dsl::I32& q) const {
    std::vector<dsl::I32> v;
    for (int64_t f = 1; f <= 5; ++f) v.push_back(info.loadI32(q * kFields + f));
    return TilePlace::unpack(v);
  }
  KSlice sliceOf(const dsl::I32& q) const {
    dsl::I32 ks = info.loadI32(q * kFields + 6);
    return {ks % 65536, ks / 65536, info.loadI32(q * kFields + 7)};
  }

  // The producer warpgroup's threads: the copies of tile p's K steps from stage counter g on; returns the counter
  // after them.
  dsl::I32 load(const dsl::Threads& producer, const TilePlace& p, const dsl::I32& g) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    I32 steps = gemm.kTiles(p);
    const BarrierRing ring = slots();
    k.forRange(k.i32(0), steps, k.i32(1), [&](I32 kt) {
      I32 gi = g + kt, slot = ring.entry(gi);
      ring.acquire(gi, slot);  // refilling a slot waits until the MMA of its previous round has read it
      gemm.issue(producer, p, kt, slot);
      ring.commitAsync(slot);
    });
    return g + steps;
  }

  // Producer leader with tensor maps: hands tile p over as tile number j, then (after leaderBeforeLoads) loads its
  // boxes from stage counter g on; returns the counter after them.
  dsl::I32 produceBoxes(const TilePlace& p, const dsl::I32& j, const dsl::I32& g, const std::optional<dsl::Bool>& lone,
                        const std::optional<KSlice>& slice) const {
    handOver(j, &p, slice);
    if (leaderBeforeLoads) leaderBeforeLoads(p);
    return loadBoxes(p, g, lone, slice);
  }

  // Producer leader with tensor maps: tile p's boxes from stage counter g on; returns the counter after them. Pairs:
  // each block loads its A and half of B multicast into both, or all of its own B where the tile is lone.
  dsl::I32 loadBoxes(const TilePlace& p, const dsl::I32& g, const std::optional<dsl::Bool>& lone,
                     const std::optional<KSlice>& slice) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const auto& c = gemm.c;
    const auto& s = gemm.s;
    I32 steps = slice ? slice->steps : gemm.kTiles(p);
    const BarrierRing ring = slots();
    k.forRange(k.i32(0), steps, k.i32(1), [&](I32 kt) {
      I32 gi = g + kt, slot = ring.entry(gi), kk = (slice ? slice->k0 + kt : kt) * c.k;
      ring.acquire(gi, slot);
      ring.commitExpecting(slot, (c.m + c.n) * c.k * c.elemBytes());
      if (gemm.tn()) {  // K x MN slabs of the group's rows: A's M atoms and B's N atoms, one box each
        SharedTile a = gemm.rings.a.stage(slot), b = gemm.rings.b.stage(slot);
        const int64_t aMN = maps.a->box().cols, bMN = maps.b->box().cols, aRows = boxRows(a, *maps.a),
                      bRows = boxRows(b, *maps.b);
        I32 row = tnStepRow(p, kk);
        for (int64_t at = 0; at < c.m / aMN; ++at)
          k.tmaLoad(*maps.a, {gemm.m0(p) + aMN * at, row}, a.rowSlice(aRows * at, aRows), bars, ring.full(slot));
        for (int64_t at = 0; at < c.n / bMN; ++at)
          k.tmaLoad(*maps.b, {p.n0 + bMN * at, row}, b.rowSlice(bRows * at, bRows), bars, ring.full(slot));
        return;
      }
      k.tmaLoad(*maps.a, {kk, gemm.m0(p)}, gemm.rings.a.stage(slot), bars, ring.full(slot));
      SharedTile stage = gemm.rings.b.stage(slot);
      // B's boxes: all of them, or with pairs this block's half, multicast into both blocks of the cluster.
      auto loadB = [&](int64_t half, int64_t halves, int64_t multicast) {
        if (s.layout == GroupedGemmSpec::kNT) {
          const int64_t rows = maps.b->box().rows, boxes = c.n / rows;
          for (int64_t h = half * boxes / halves; h < (half + 1) * boxes / halves; ++h) {
            // Rows of B[e]: the tile's, or with gate | up halves n0 / 2 .. of the gate rows, then of the up rows.
            I32 row = gemm.gateUpRows ? p.n0 / 2 + h * gemm.gateUpRows : p.n0 + rows * h;
            k.tmaLoad(*maps.b, {kk, p.expert * s.n + row}, stage.rowSlice(rows * h, rows), bars, ring.full(slot), multicast);
          }
        } else {  // K x MN boxes (64 x 64: 64 rows of 128 bytes), MN atom a at a * 8 KB
          const int64_t mn = maps.b->box().cols, rows = boxRows(stage, *maps.b), atoms = c.n / mn;
          for (int64_t a = half * atoms / halves; a < (half + 1) * atoms / halves; ++a)
            k.tmaLoad(*maps.b, {p.n0 + mn * a, p.expert * s.kOrM + kk}, stage.rowSlice(rows * a, rows), bars,
                      ring.full(slot), multicast);
        }
      };
      if (blockInPair) {
        if (lone) {
          k.ifThen(!*lone && *blockInPair == 0, [&] { loadB(0, 2, 0b11); });
          k.ifThen(!*lone && *blockInPair == 1, [&] { loadB(1, 2, 0b11); });
          k.ifThen(*lone, [&] { loadB(0, 1, 0); });
        } else {
          k.ifThen(*blockInPair == 0, [&] { loadB(0, 2, 0b11); });
          k.ifThen(*blockInPair == 1, [&] { loadB(1, 2, 0b11); });
        }
      } else {
        loadB(0, 1, 0);
      }
    });
    return g + steps;
  }


  // Tiles whose rows inside the group fit one warpgroup's 64 ("half tiles": an expert's last m-tile holding at most 64
  // rows, or a pair's m-tile past the group) run as 64 x BN tiles whose columns the two MMA warpgroups split
  // (halfTile): half the MMAs of a whole tile. NT / NN with tensor maps; not a split of the K tail.
  // (Not FP8: its promotion reads the scales of warpgroup w's own rows 64w ..)
  bool halfTiles() const { return tma() && !gemm.tn() && warpgroups() == 2 && !gemm.c.e4m3; }

  // MMA warpgroup w (`wg`, its own thread group): tile number j, at p, its K loop from stage counter g on, then its
  // rows' epilogue; returns the counter after it.
  dsl::I32 compute(const dsl::Threads& wg, const TilePlace& p, const dsl::I32& g, const dsl::I32& j,
                   const std::optional<KSlice>& slice) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    I32 steps = slice ? slice->steps : gemm.kTiles(p);
    if (!halfTiles()) {
      wholeTile(wg, p, g, j, slice, steps);
      return g + steps;
    }
    // (groupEnd - m0 is negative for a pair's m-tile past the group: compared as groupEnd < m0 + 65, both
    // non-negative, since the DSL's < is unsigned.)
    Bool half = p.groupEnd < gemm.m0(p) + 65;
    if (split && slice) half = half && slice->code == 0;
    k.ifThen(half, [&] { halfTile(wg, p, g, j, steps); });
    k.ifThen(!half, [&] { wholeTile(wg, p, g, j, slice, steps); });
    return g + steps;
  }

  // One warpgroup's K loop over `steps` ring stages from stage counter g on: acc (m = 64, n = BN or BN / 2) +=
  // A's stage (its rows 64w .., or with aFirstRows rows 0 ..) times bOf(B's stage); returns the drained accumulator.
  // Every slot goes back to the producer(s) once this warpgroup's MMA of it has finished.
  dsl::Acc kLoop(const dsl::Threads& wg, const TilePlace& p, const dsl::I32& g, const dsl::I32& steps, int64_t n,
                 const std::function<dsl::SharedTile(const dsl::SharedTile&)>& bOf, bool aFirstRows) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const int64_t w = wg.first() / 128;
    Bool wgLeader = k.threadIdx() % 128 == 0;
    // The step's ring slot and phase are carried, computed one step ahead: the barrier and operand addresses then
    // do not wait for arithmetic behind the previous step's MMA wait (bench/results/2026-12-01-h200-stall-sites).
    const BarrierRing ring = slots();
    const RingPosition first = ring.position(g);
    // K step kt at the carried position: waits for its slot, multiplies it (mma), and gives the slot of step kt - 1
    // back to the producer(s), whose MMA has finished in this warpgroup (with pairs to both blocks' producers: both
    // multicast into this block's copy of the slot).
    auto step = [&](const I32& kt, const Acc& acc, const std::vector<I32>& carried,
                    const std::function<Acc(const I32&, const Acc&, const I32&)>& mma) {
      const RingPosition at{carried[0], carried[1]};
      const I32 slot = at.entry;
      const BarrierRing::Step next = ring.step(at);
      ring.wait(at);
      if (!tma()) k.proxyFence();  // the producer's cp.async wrote through the generic proxy (TMA: the async one)
      Acc out = mma(kt, acc, slot);
      k.ifThen(k.i32(0) < kt && wgLeader, [&] { ring.release(next.previous, blockInPair); });
      return std::pair<Acc, std::vector<I32>>{out, {next.next.entry, next.next.phase}};
    };
    auto whole = [&](const I32& kt, const Acc& acc, const I32& slot, const std::optional<I32>& k16 = std::nullopt) {
      return gemm.multiply(wg, acc, gemm.rings.a.stage(slot), bOf(gemm.rings.b.stage(slot)), p, kt, /*pending=*/1,
                           aFirstRows, k16);
    };
    if (gemm.c.e4m3) {
      Acc acc = fp8Steps(wg, p, first, step, bOf);
      k.ifThen(wgLeader, [&] { ring.release(ring.entryBefore(g + steps), blockInPair); });
      return acc;
    }
    // TN with TMA: every step but a group's last is whole; the last (tnTail) multiplies only its 16-wide K slices
    // that hold the group's rows.
    const bool tnTail = tma() && gemm.tn();
    I32 wholeSteps = tnTail ? k.select(steps == 0, k.i32(0), steps - 1) : steps;
    auto looped = k.forRange(
        k.i32(0), wholeSteps, k.i32(1), wg.zeroAcc(64, n), {first.entry, first.phase},
        [&](I32 kt, Acc acc, const std::vector<I32>& carried) {
          return step(kt, acc, carried, [&](const I32& t, const Acc& a, const I32& slot) { return whole(t, a, slot); });
        });
    if (tnTail)
      looped = k.forRange(wholeSteps, steps, k.i32(1), looped.first, looped.second,
                          [&](I32 kt, Acc acc, const std::vector<I32>& carried) {
                            return step(kt, acc, carried, [&](const I32& t, const Acc& a, const I32& slot) {
                              const TailStep tail = tailStep(p, t);
                              zeroTail(wg, tail, slot, w);
                              return tailSlices(tail, a, [&](const Acc& x, const std::optional<I32>& k16) {
                                return whole(t, x, slot, k16);
                              });
                            });
                          });
    Acc acc = k.drain(looped.first);
    k.ifThen(k.i32(0) < steps && wgLeader, [&] { ring.release(ring.entryBefore(g + steps), blockInPair); });
    return acc;
  }

  // FP8's K loop (NT: K / 128 steps, each one 128-K scale block): each step's product, complete, is promoted into
  // the running sum with scales loaded one step earlier, so that their L2 latency hides behind a step's MMA instead
  // of idling the tensor cores after it (the other MMA warpgroup's wgmma runs beside this one's promotion). A step's
  // scale loads come after its slot is full, never before: the A scales may be rows a dispatch is still pushing,
  // which the producer leader has seen arrive before it loads the tile's first slot (so step 0, whose own scales
  // have no earlier step to ride on, loads them with step 1's). The product reuses the previous one's registers
  // (Threads::mmaFresh: no zero fill). Two products in turn, promoted while the next one multiplies, need a third
  // fragment (3 x 64 f32 a thread): ptxas then spilled and serialised the wgmmas at 224 registers. Returns the sum;
  // the caller gives the last step's slot back.
  template <typename Step>
  dsl::Acc fp8Steps(const dsl::Threads& wg, const TilePlace& p, const RingPosition& first, const Step& step,
                    const std::function<dsl::SharedTile(const dsl::SharedTile&)>& bOf) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    if (gemm.mmaOn || gemm.tn()) throw std::logic_error("FP8 K loop: NT, every step multiplied");
    const int64_t steps = gemm.s.kOrM / gemm.c.k;
    Acc zero = wg.zeroAcc(64, gemm.c.n);
    auto scalesOf = [&](const I32& kt) { return gemm.stageScales(wg, zero, p, kt); };
    // Step kt into the registers of `regs` once its slot is full, loading the scales of step kt + 1 (clamped) and,
    // for step 0, its own; returns the finished product, those scales and the next ring position.
    struct Done {
      Acc product;
      std::optional<Vec> own;
      Vec next;
      std::vector<I32> at;
    };
    auto run = [&](const I32& kt, const Acc& regs, const std::vector<I32>& at, bool loadOwn) {
      std::optional<Vec> own, next;
      auto [product, pos] = step(kt, regs, at, [&](const I32&, const Acc& r, const I32& slot) {
        if (loadOwn) own = scalesOf(kt);
        next = scalesOf(k.select(kt + 1 < k.i32(steps), kt + 1, kt));
        return wg.mmaFresh(r, gemm.rings.a.stage(slot), bOf(gemm.rings.b.stage(slot)));
      });
      return Done{k.drain(product), own, *next, pos};
    };
    Done d0 = run(k.i32(0), zero, {first.entry, first.phase}, /*loadOwn=*/true);
    // Carried: the sum, the last product (its registers), the scales of the step about to run, the ring position.
    Kernel::Carried init{{wg.scaleAdd(zero, d0.product, *d0.own), d0.product}, {d0.next}, d0.at};
    Kernel::Carried c = k.forRange(k.i32(1), k.i32(steps), k.i32(1), init, [&](I32 kt, const Kernel::Carried& in) {
      Done d = run(kt, in.accs[1], in.scalars, /*loadOwn=*/false);
      return Kernel::Carried{{wg.scaleAdd(in.accs[0], d.product, in.vecs[0]), d.product}, {d.next}, d.at};
    });
    return c.accs[0];
  }

  // TN with TMA: a group's last K step, kt: how many of its token rows are the group's (valid, at least 1), and
  // whether the group is smaller than one step (small: its rows come first in the step; else the step was loaded
  // ending at the group's end, tnStepRow, and they come last).
  struct TailStep {
    dsl::I32 valid;
    dsl::Bool small;
  };
  TailStep tailStep(const TilePlace& p, const dsl::I32& kt) const {
    dsl::I32 size = p.groupEnd - p.groupStart;
    return {size - kt * gemm.c.k, size < gemm.k.i32(gemm.c.k)};
  }

  // TN's last K step: the 16-wide K slices that hold the group's rows, [f, e) of the 4 (each a wgmma step of its
  // own: mma(acc, k16)), or the whole step at once (mma(acc, nullopt)) where they all do: f = (64 - valid) / 16,
  // e = 4, or for a small group f = 0, e = ceil(valid / 16). The rows zeroTail zeroed inside [f, e) still multiply
  // as zeros. Returns the accumulator after them.
  dsl::Acc tailSlices(const TailStep& tail, const dsl::Acc& acc,
                      const std::function<dsl::Acc(const dsl::Acc&, const std::optional<dsl::I32>&)>& mma) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const int64_t slices = gemm.c.k / 16;
    const I32& valid = tail.valid;
    const Bool& small = tail.small;
    I32 f = k.select(small, k.i32(0), (k.i32(gemm.c.k) - valid) / 16);
    I32 e = k.select(small, (valid + 15) / 16, k.i32(slices));
    Bool all = f == 0 && e == slices;
    Acc once = k.forRange(k.i32(0), k.select(all, k.i32(1), k.i32(0)), k.i32(1), acc,
                          [&](I32, Acc a) { return mma(a, std::nullopt); });
    return k.forRange(f, k.select(all, f, e), k.i32(1), once, [&](I32 q, Acc a) { return mma(a, q); });
  }

  // A half tile (halfTiles): warpgroup w multiplies A's first 64 rows by B's columns [BN / 2 w, + BN / 2) (its half
  // of the stage's B bytes: NT's N rows, NN's MN atoms). In its turn warpgroup 0 stages its half and passes the
  // tile on; warpgroup 1 stages the other half and runs the epilogue on the 64 rows (from the tile's first row).
  void halfTile(const dsl::Threads& wg, const TilePlace& p, const dsl::I32& g, const dsl::I32& j,
                const dsl::I32& steps) const {
    const int64_t w = wg.first() / 128, n = gemm.c.n / 2;
    dsl::Acc acc = kLoop(
        wg, p, g, steps, n, [&](const dsl::SharedTile& b) { return b.rowSlice(b.rows() / 2 * w, b.rows() / 2); },
        /*aFirstRows=*/true);
    turns().wait(w, j);
    wg.storeAcc(acc, gemm.rings.staging.colSlice(n * w, n).asRowsOf(64 * w));
    if (w == 1) {
      wg.sync();
      storeOrEpilogue(wg, p, gemm.m0(p));
    }
    turns().pass(w);
  }

  // Warpgroup w's 64 staged rows from firstRow on: the kernel's epilogue, or the default row stores; with a bulk
  // epilogue its copies have read the staging tile (every thread's) when this returns.
  void storeOrEpilogue(const dsl::Threads& wg, const TilePlace& p, const dsl::I32& firstRow) const {
    if (epilogue)
      epilogue(p, firstRow, wg);
    else
      gemm.storeStaged(wg, p, firstRow);
    if (bulkEpilogue) {
      gemm.k.bulkWait(/*readOnly=*/true);  // this thread's copies have read their staging rows ...
      wg.sync();                           // ... and every thread's, before the other warpgroup may overwrite them
    }
  }

  // A whole tile: warpgroup w's rows 64w .. of the tile, all BN columns.
  void wholeTile(const dsl::Threads& wg, const TilePlace& p, const dsl::I32& g, const dsl::I32& j,
                 const std::optional<KSlice>& slice, const dsl::I32& steps) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const auto& c = gemm.c;
    const int64_t w = wg.first() / 128;
    // Both warpgroups multiply every whole tile, even where one's 64 rows lie past the group: letting that one only
    // pass the ring slots on was slower on groups of random sizes (docs/decisions/gemm-tiles.md, not kept).
    Acc acc = kLoop(wg, p, g, steps, c.n, [](const SharedTile& b) { return b; }, /*aFirstRows=*/false);
    // A split of the tail: its partial out, and whether this warpgroup is its tile's last split (then it stores).
    std::optional<Bool> isSplit, reduce;
    if (split && slice) {
      isSplit = !(slice->code == 0);
      reduce = *isSplit && split->arrive(k, wg, c.n, acc, *slice);
    }
    // Warpgroup 0 stores tile j after warpgroup 1 has stored tile j - 1; warpgroup 1 after warpgroup 0 tile j.
    turns().wait(w, j);
    // The staging tile's rows out (once filled: by the accumulator, or by the split's sum), every thread.
    auto stageAndStore = [&](const std::function<void()>& fill) {
      fill();
      wg.sync();
      storeOrEpilogue(wg, p, gemm.m0(p) + 64 * w);
    };
    // (TMA's boxes take warpgroup w's rows 64w .. at their rows 0 ..: Threads::storeAcc.)
    auto fromAcc = [&] { wg.storeAcc(acc, tmaStores() ? gemm.rings.staging : gemm.rings.staging.asRowsOf(64 * w)); };
    if (isSplit) {
      k.ifThen(!*isSplit, [&] { stageAndStore(fromAcc); });
      k.ifThen(*reduce, [&] { stageAndStore([&] { split->sum(k, c.n, gemm.rings.staging, *slice, w); }); });
      turns().pass(w);
    } else if (tmaStores()) {  // (runDynamic refuses them beside a kernel epilogue)
      // The storer sends these rows out and passes the turn (storeStagedBoxes). Every thread arrives once its
      // rows are in (racecheck follows each thread's arrival, not a leader's after a group barrier).
      fromAcc();
      k.ifThen(k.threadIdx() == k.i32(wg.first()), [&] {
        storePlace->storeI32(k.i32(0), p.expert * k.i32(gemm.s.kOrM) + gemm.m0(p) + 64 * w);
        storePlace->storeI32(k.i32(1), p.n0);
      });
      k.mbarrierArrive(bars, staged());
    } else {
      stageAndStore(fromAcc);
      turns().pass(w);
    }
  }

  // TN with TMA: the first token row of the K step at kk (a multiple of the step) of tile p. A partial last step of a
  // group of at least one step's rows ends at the group's end instead, overlapping the step before (zeroTail zeroes
  // the overlap in A), so that no box reads past the group.
  dsl::I32 tnStepRow(const TilePlace& p, const dsl::I32& kk) const {
    dsl::Kernel& k = gemm.k;
    const dsl::I32 step = k.i32(gemm.c.k), row = p.groupStart + kk;
    return k.select(!(p.groupEnd - p.groupStart < step) && p.groupEnd < row + step, p.groupEnd - step, row);
  }

  // TN with TMA, a group's last K step (tail) in `slot`, where it is partial:
  // - a group of at least one step's rows: its box was loaded ending at the group's end (tnStepRow), so its first
  //   rows repeat tokens the step before counted. Warpgroup w zeroes them in its own A box, which only its MMAs
  //   read: every B row is the group's own, so each product with such a row is zero, and the warpgroups do not wait
  //   for each other (one running ahead keeps the tensor cores busy while the other stores its rows);
  // - a group smaller than one step: the K rows past the group (the next group's tokens, or zero fill) become zeros
  //   before any MMA reads them. Warpgroup w clears its own A box and its half of B's boxes; both then meet on
  //   kTailBarrier, so that neither multiplies the slot before the other's zeros are in.
  // Either way after a proxy fence: wgmma reads through the async proxy.
  void zeroTail(const dsl::Threads& wg, const TailStep& tail, const dsl::I32& slot, int64_t w) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const auto& c = gemm.c;
    const I32& valid = tail.valid;
    const Bool& small = tail.small;
    I32 lane = k.threadIdx() % 128;
    // K rows [first, first + count) of box `at` of `ring`'s stage, in 16-byte chunks (128 bytes a K row: the
    // swizzle only permutes chunks within a row).
    auto clear = [&](const SharedTile& ring, const TensorMap& map, int64_t at, const I32& first, const I32& count) {
      SharedTile box = ring.stage(slot).rowSlice(boxRows(ring, map) * at, boxRows(ring, map));
      const int64_t rowBytes = box.cols() * 2;
      k.forRange(lane, count * 8, k.i32(128), [&](I32 q) {
        I32 at8 = (first + q / 8) * 128 + (q % 8) * 16;
        box.store(at8 / rowBytes, at8 % rowBytes / 2, k.zeros(8, Elem::bf16));
      });
    };
    k.ifThen(valid < k.i32(c.k) && !small, [&] {
      clear(gemm.rings.a, *maps.a, w, k.i32(0), k.i32(c.k) - valid);
      k.proxyFence();
      wg.sync();
    });
    k.ifThen(small, [&] {
      clear(gemm.rings.a, *maps.a, w, valid, k.i32(c.k) - valid);
      const int64_t bBoxes = c.n / maps.b->box().cols, share = bBoxes / warpgroups();
      for (int64_t at = w * share; at < (w + 1) * share; ++at)
        clear(gemm.rings.b, *maps.b, at, valid, k.i32(c.k) - valid);
      k.proxyFence();
      k.namedBarrier(kTailBarrier, int(gemm.c.mmaThreads()), /*arriveOnly=*/false);
    });
  }

  // tmaStores: the storer thread's loop. Staging n is warpgroup n % 2's (the turns alternate, so one is pending at
  // a time): its boxes go out as tmaStores, and once they have read the staging tile the other warpgroup's turn
  // begins. Warpgroup 0 ends it (row -1) in the turn after its last tile.
  void storeStagedBoxes() const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const SharedTile& staging = gemm.rings.staging;
    const int64_t rows = boxRows(staging, *maps.c), boxes = gemm.c.n / maps.c->box().cols;
    k.whileLoop({k.i32(0), k.i32(1)}, [&](const std::vector<I32>& v) { return v[1] == 1; },
                [&](const std::vector<I32>& v) {
                  k.mbarrierWait(bars, staged(), v[0] % 2);
                  I32 row = storePlace->loadI32(k.i32(0)), col = storePlace->loadI32(k.i32(1));
                  Bool more = !(row == k.i32(-1));  // (the DSL's comparisons are unsigned)
                  k.ifThen(more, [&] {
                    for (int64_t q = 0; q < boxes; ++q)
                      k.tmaStore(*maps.c, {col + maps.c->box().cols * q, row}, staging.rowSlice(rows * q, rows));
                    k.bulkCommit();
                    k.bulkWait(/*readOnly=*/true);
                    turns().passFor(v[0] % 2);
                  });
                  return std::vector<I32>{v[0] + 1, k.select(more, k.i32(1), k.i32(0))};
                });
    k.bulkWait(/*readOnly=*/false);
  }
  // tmaStores: warpgroup 0's threads, after its last tile j: end the storer's loop in their turn.
  void endStores(const dsl::I32& j) const {
    dsl::Kernel& k = gemm.k;
    turns().wait(0, j);
    k.ifThen(k.threadIdx() == k.i32(0), [&] { storePlace->storeI32(k.i32(0), k.i32(-1)); });
    k.mbarrierArrive(bars, staged());
  }

  // Static persistent loop (block b runs tiles b, b + grid, ...) with cp.async producers: every producer thread
  // copies, the leader hands the tiles over. (The kernels with tensor maps draw tickets: runDynamic.)
  void runStatic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::I32& grid) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const auto& c = gemm.c;
    if (tma() || blockInPair) throw std::logic_error("the static loop: cp.async producers, single blocks");
    I32 total = sched.buildTable(first);
    init();
    k.group(c.mmaThreads(), k.blockThreads() - c.mmaThreads(), /*barrier=*/2, [&](const Threads& producer) {
      k.setMaxRegisters(kProducerRegisters, /*increase=*/false);
      Bool leader = k.threadIdx() == k.i32(c.mmaThreads());
      std::vector<I32> end = k.forRange(k.blockIdx(), total, grid, {k.i32(0), k.i32(0)},
                                        [&](I32 t, const std::vector<I32>& v) {
                                          TilePlace p = sched.place(t, first);
                                          k.ifThen(leader, [&] { handOver(v[1], &p); });
                                          return std::vector<I32>{load(producer, p, v[0]), v[1] + 1};
                                        });
      k.ifThen(leader, [&] { handOver(end[1], nullptr); });
      k.asyncCommit();
      k.asyncWait(0);
    });
    multiply();
  }

  // The MMA warpgroups, each in its own group: tiles as handed over until the end mark.
  void multiply() const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    for (int64_t w = 0; w < warpgroups(); ++w) {
      k.group(128 * w, 128, /*barrier=*/3 + int(w), [&](const Threads& wg) {
        k.setMaxRegisters(kMmaRegisters, /*increase=*/true);
        // Carried: the entry's valid flag, the tile number, the stage counter (and beforeTile's value).
        std::vector<I32> start{receive(k.i32(0)), k.i32(0), k.i32(0)};
        if (beforeTile) start.push_back(k.i32(0));
        std::vector<I32> end = k.whileLoop(
            start, [&](const std::vector<I32>& v) { return !(v[0] == 0); },
            [&](const std::vector<I32>& v) {
              I32 j = v[1];
              std::optional<KSlice> slice;
              if (split) slice = sliceOf(j % kHandover);
              TilePlace p = placeOf(j % kHandover);
              std::optional<I32> state;
              if (beforeTile) state = beforeTile(wg, p, v[3]);
              I32 g = compute(wg, p, v[2], j, slice);
              // Entry j has been read: each thread gives it back itself (racecheck does not follow a warpgroup
              // leader's arrival after a barrier of its group, and flagged the producer's rewrite of the entry).
              handOvers().release(handOvers().entry(j));
              std::vector<I32> next{receive(j + 1), j + 1, g};
              if (state) next.push_back(*state);
              return next;
            });
        if (bulkEpilogue) k.bulkWait(/*readOnly=*/false);  // written before what follows the engine (e.g. a signal)
        if (afterTiles) afterTiles(wg, end[3]);
        if (tmaStores() && w == 0) endStores(end[1]);
      });
    }
  }

  // Dynamic loop with tensor maps (SingleRoleEngine::runDynamic's protocol): the producer leader draws tickets from
  // tickets[0] (global i32, zero at launch) and hands each tile over; the last of `grid` blocks to run out resets
  // tickets[0..1]. Every thread of the block calls it, after the kernel's own block-wide work.
  void runDynamic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::GlobalPtr& tickets,
                  const dsl::I32& total, const dsl::I32& grid) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const auto& c = gemm.c;
    if (!tma()) throw std::logic_error("runDynamic: tensor maps");
    // The storer serves the default TN epilogue's turns; a kernel epilogue would leave it waiting for stagings.
    if (tmaStores() && (epilogue || bulkEpilogue))
      throw std::logic_error("tensor-map stores (map_c): the default TN epilogue only, no kernel epilogue");
    // (A block of 384 threads starts at 168 registers a thread: 65536 / 384, in whole 8s.)
    const int64_t launched = 65536 / k.blockThreads() / 8 * 8 * (k.blockThreads() / 128);
    if (sideWork && (tmaStores() || k.blockThreads() - c.mmaThreads() != 32 + kSideThreads ||
                     producerRegisters() + warpgroups() * kMmaRegisters > launched))
      throw std::logic_error("side work: a 128-thread producer warpgroup without a storer, the warpgroups' registers "
                             "within the block's " + std::to_string(launched));
    init();
    // The producer warpgroup: its leader alone issues the boxes (thread-scope ops).
    k.group(c.mmaThreads(), k.blockThreads() - c.mmaThreads(), /*barrier=*/2, [&](const Threads&) {
      k.setMaxRegisters(producerRegisters(), /*increase=*/false);
      k.ifThen(k.threadIdx() == k.i32(c.mmaThreads()), [&] {
        // Ticket number j of this block (pairs: of the pair; both blocks get the same).
        auto draw = [&](const I32& j) {
          return mailbox ? mailbox->draw(tickets, j) : tickets.atomicAddI32(k.i32(1));
        };
        // Split-K tail: which tickets are whole units and which a share of one (without it: all whole).
        SplitTail::Rounds rounds{total, k.i32(1), total};
        const int64_t kSteps = gemm.s.kOrM / c.k;
        if (split) rounds = split->rounds(k, total, blockInPair ? grid / 2 : grid, kSteps);
        std::vector<I32> end = k.whileLoop(
            {draw(k.i32(0)), k.i32(0), k.i32(0)}, [&](const std::vector<I32>& v) { return v[0] < rounds.all; },
            [&](const std::vector<I32>& v) {
              std::optional<Bool> lone;
              std::optional<KSlice> slice;
              I32 unit = v[0];
              if (split) {
                auto [u, sl] = split->share(k, v[0], rounds, kSteps);
                unit = u;
                slice = sl;
              }
              TilePlace p = sched.place(unit, first, &lone);
              I32 g = produceBoxes(p, v[1], v[2], lone, slice);
              return std::vector<I32>{draw(v[1] + 1), v[1] + 1, g};
            });
        handOver(end[1], nullptr);
        if (blockInPair)
          k.ifThen(*blockInPair == 0, [&] { resetTicketsIfLast(k, tickets, grid / 2); });  // block 0s draw
        else
          resetTicketsIfLast(k, tickets, grid);
      });
      if (tmaStores()) k.ifThen(k.threadIdx() == k.i32(c.mmaThreads() + 32), [&] { storeStagedBoxes(); });
      if (sideWork) k.ifThen(!(k.threadIdx() < k.i32(c.mmaThreads() + 32)), [&] { sideWork(); });
    });
    multiply();
    if (blockInPair) k.clusterSync();  // no block leaves while the other may still copy, multicast or arrive into it
  }
};

}  // namespace megamoe::kernels
