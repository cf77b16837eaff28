// The MoE layer's own kernels beyond the grouped GEMMs: the fused operators dispatch_grouped_gemm and
// grouped_gemm_combine, swiglu_bwd and stage_begin (see their specs in Kernels.h, and
// docs/decisions/fused-dispatch.md for the protocol).
#include <algorithm>
#include <initializer_list>
#include <optional>
#include <vector>

#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"
#include "kernels/Activation.h"
#include "kernels/Flags.h"
#include "kernels/Kernels.h"
#include "kernels/gemm/SingleRoleEngine.h"
#include "kernels/gemm/WarpSpecializedEngine.h"

namespace megamoe::kernels {
using namespace dsl;

namespace {

struct Legs {
  Bool comm, gemm;
};
Legs decodeLegs(const I32& legs) {
  return {legs % 2 == 1, (legs / 2) % 2 == 1};
}

// The combine's column chunks (the early reduce) over nTiles n-tiles: the most, up to abi::kCombineChunks, that
// divide them (with pairs into even counts, so that an expert's odd last m-tile still splits into lone tiles). At
// DeepSeek-V3's 28 n-tiles 7 chunks beat 2 in the forward and match them in the dgrad
// (bench/results/2026-12-03-h200-combine-early-reduce).
int64_t combineChunks(int64_t nTiles, bool pairs) {
  for (int64_t q = abi::kCombineChunks; q > 1; --q)
    if (nTiles % q == 0 && (!pairs || nTiles / q % 2 == 0)) return q;
  return 1;
}

// Copies one row of `bytes` bytes (a multiple of 16) with the 32 lanes of a warp, 16 bytes per lane and step: every
// load of the lane's share is issued before its first store (up to 32 in flight), so a warp keeps a whole row on the
// way.
void copyRowByWarp(Kernel& k, const GlobalPtr& fromRow, const GlobalPtr& toRow, int64_t bytes, const I32& lane) {
  const int64_t chunks = bytes / 16;
  GlobalPtr from = fromRow.as(Elem::bf16), to = toRow.as(Elem::bf16);
  int64_t unroll = 1;
  if (chunks % 32 == 0)
    for (int64_t u = std::min<int64_t>(32, chunks / 32); u > 1; --u)
      if ((chunks / 32) % u == 0) {
        unroll = u;
        break;
      }
  k.forRange(lane, k.i32(chunks), k.i32(32 * unroll), [&](I32 c) {
    std::vector<Vec> v;
    for (int64_t j = 0; j < unroll; ++j) v.push_back((from + k.widen(c + 32 * j) * 8).load(8));
    for (int64_t j = 0; j < unroll; ++j) (to + k.widen(c + 32 * j) * 8).store(v[size_t(j)]);
  });
}

// With pairs, clusters of two blocks (blocks 2c and 2c + 1 form cluster c): the block's index in its pair.
std::optional<I32> clusterPairs(Kernel& k, bool pairs) {
  std::optional<I32> blockInPair;
  if (pairs) {
    k.setClusterX(2);
    blockInPair = k.blockIdx() % 2;
  }
  return blockInPair;
}

// A fused kernel's tiles on `arch`; with the warp-specialised engine (ws) as many ring stages as fit beside the
// kernel's shared tables (`tables`: their entries, WarpSpecializedEngine::stagesFor).
GroupedGemmSpec::Tiles fusedTiles(const GroupedGemmSpec& g, Arch arch, bool ws, bool pairs,
                                  std::initializer_list<int64_t> tables) {
  GroupedGemmSpec::Tiles c = g.tiles(arch, ws);
  if (ws) c.stages = WarpSpecializedEngine::stagesFor(c, tables, pairs);
  return c;
}

// Whether the fused NT / NN tiles of `g` run as cluster pairs sharing B (sm_90a): bf16's 128 x 256 tiles (N a
// multiple of 256), and FP8's 128 x 128 ones (N a multiple of 128: B's 128 rows load as two 64-row boxes, one
// from each block of the pair), which halves B's L2 traffic the way the bf16 pairs do (docs/fp8.md).
bool pairTiles(const GroupedGemmSpec& g, Arch arch) {
  return arch == Arch::sm_90a && g.n % (g.fp8 ? 128 : 256) == 0;
}

// An FP8 kernel's f32 scales argument `name` (none in the bf16 kernels).
std::optional<GlobalPtr> scalesArg(Kernel& k, bool fp8, const char* name) {
  return fp8 ? std::optional<GlobalPtr>(k.ptr(name, Elem::f32)) : std::nullopt;
}

// The start check (returnIfErrorAtStart) on a table of its own, allocated here and returned.
SharedTile startCheck(Kernel& k, const Context& ctx, const std::optional<I32>& blockInPair) {
  SharedTile startError = sharedTable(k, "start_error", 2);
  returnIfErrorAtStart(k, ctx, startError, blockInPair);
  return startError;
}

// The dispatch's tensor maps.
TensorMapArgs dispatchMaps(Kernel& k, const DispatchGemmSpec& s) {
  using G = GroupedGemmSpec;
  TensorMapArgs maps = tensorMapArgs(k, s.spec());
  if (s.fp8) return maps;  // the pool and w1 (FP8: no map_c)  // sm_90a TN: dh and the pool; NT: the pool and w1
  // TN stores dW1 as boxes through map_c (WarpSpecializedEngine::tmaStores); NT / NN take it unused.
  std::optional<TensorMap> mapC = k.tensorMap("map_c", s.spec().constants);
  if (s.layout == G::kTN) maps.c = mapC;
  return maps;
}

// dispatch_grouped_gemm's arguments, the shape of its GEMM, its rings and shared tables (DispatchGemm adds the
// phases). The members are initialised in declaration order, which is the order of the DSL calls that make them (it
// fixes the IR and the shared-memory offsets): keep it.
struct DispatchGemmSetup {
  using S = DispatchGemmSpec;
  using G = GroupedGemmSpec;
  DispatchGemmSetup(mlir::MLIRContext& mctx, const DispatchGemmSpec& spec, Arch target)
      : s(spec), arch(target), k(mctx, s.spec().kernel, c.threads, /*tensorMaps=*/ws) {
    // After every member below, before DispatchGemm's own (its parities).
    k.ifThen(tid == 0, [&] { confirmed.storeI32(k.i32(0), k.i32(-1)); });  // read after the tile table's barriers
  }

  const DispatchGemmSpec& s;
  const Arch arch;
  const G g = s.gemm();
  // On sm_90a the weight gradient (TN) runs the warp-specialised engine with TMA loads (DispatchGemmSpec), and so do
  // the forward (NT) and the dgrad (NN) as cluster pairs where their tiles are 256 wide and their rows the pool's own
  // (no dedup gather; docs/decisions/fused-dispatch.md).
  // FP8 runs as cluster pairs too (pairTiles).
  const bool pairs = s.layout != G::kTN && !s.dedup && pairTiles(g, arch);
  const bool ws = ((s.layout == G::kTN || s.fp8) && arch == Arch::sm_90a) || pairs;
  const Elem rowElem = s.fp8 ? Elem::e4m3 : Elem::bf16;  // what src, the pool and the weights hold
  const int64_t E = s.experts, R = s.ranks, local = E / R, H = s.hidden, I = s.intermediate;
  // Tables: the start check's, the tile table, slots, confirmed (the unit table lives in the staging tile).
  G::Tiles c = fusedTiles(g, arch, ws, pairs, {4, local + 1, 1, 1});
  Kernel k;
  Context ctx = k.context();
  GlobalPtr src = k.ptr("src", rowElem);
  GlobalPtr topkWeights = k.ptr("topk_weights", Elem::f32);
  GlobalPtr sendList = k.ptr("send_list", Elem::i32);
  GlobalPtr sendOff = k.ptr("send_off", Elem::i32);
  GlobalPtr sendBase = k.ptr("send_base", Elem::i32);
  GlobalPtr counts = k.ptr("counts", Elem::i32);
  GlobalPtr arrivals = k.ptr("arrivals", Elem::i64);
  GlobalPtr routeEpoch = k.ptr("route_epoch", Elem::i64);
  GlobalPtr pool = k.ptr("pool", rowElem);
  GlobalPtr poolSrc = k.ptr("pool_src", Elem::i32);
  GlobalPtr poolW = k.ptr("pool_w", Elem::f32);
  GlobalPtr poolOffsets = k.ptr("pool_offsets", Elem::i32);
  GlobalPtr weights = k.ptr("weights", rowElem);
  GlobalPtr extra = k.ptr("extra", Elem::bf16);
  GlobalPtr out = k.ptr("out", Elem::bf16);
  GlobalPtr tickets = k.ptr("tickets", Elem::i32);
  I32 pushBlocks = k.i32Arg("push_blocks");
  I32 grid = k.i32Arg("grid");
  Legs legs = decodeLegs(k.i32Arg("legs"));
  GlobalPtr topkIdx = k.ptr("topk_idx", Elem::i32);
  I32 recvStride = k.i32Arg("recv_stride");
  I32 capacity = k.i32Arg("capacity");  // the receive pool's rows: rows past it were dropped by the prologue
  // FP8: x's per-token scales [T, H / 128], the pool's [cap, H / 128] (heap), w1's blocks [E/R, 2I / 128, H / 128].
  std::optional<GlobalPtr> srcScales = scalesArg(k, s.fp8, "src_scales"),
                           poolScales = scalesArg(k, s.fp8, "pool_scales"),
                           weightScales = scalesArg(k, s.fp8, "weight_scales");
  TensorMapArgs maps = dispatchMaps(k, s);  // TN: map_c too (dW1 stored as boxes)
  const bool dedup = s.dedup != 0;

  // Pairs: blocks 2c and 2c + 1 form cluster c (MoeLayer launches whole pairs, pushing blocks included).
  std::optional<I32> blockInPair = clusterPairs(k, pairs);
  Rings rings = allocateRings(k, g, c, mnRingLayout(maps), ws ? 64 : 0, maps.c.has_value());
  // A failed prologue (an expert index out of range) leaves nothing to do here; the peers' waits time out. (Its
  // table after the rings, which are 1024-byte aligned.)
  SharedTile startError = startCheck(k, ctx, blockInPair);
  SharedTile tileFirst = sharedTable(k, "tile_first", local + 1);
  // The push's unit table is dead once the block's GEMM starts: with the warp-specialised engine it lives in the
  // staging tile (first written by an epilogue, after the engine's block-wide start), which leaves room for a
  // fourth ring stage.
  SharedTile unitFirst = ws ? SharedTile(&k, rings.staging.value(), "unit_first", Elem::i32, 1, (E + 1 + 3) / 4 * 4)
                            : sharedTable(k, "unit_first", E + 1);
  SharedTile slots = sharedTable(k, "ticket_slot", 1);
  SharedTile confirmed = sharedTable(k, "confirmed", 1);  // the last local expert whose rows this block saw complete
  // dedup: the receive row of each row of the running tile
  std::optional<SharedTile> gatherRows =
      dedup ? std::optional<SharedTile>(sharedTable(k, "gather_rows", c.m)) : std::nullopt;
  I32 tid = k.threadIdx(), me = ctx.rank();
};

// dispatch_grouped_gemm's phases, which buildDispatchGemm calls in order, over its setup and the epoch parities
// (read after the setup's constructor has stored `confirmed`).
struct DispatchGemm : DispatchGemmSetup {
  DispatchGemm(mlir::MLIRContext& mctx, const DispatchGemmSpec& spec, Arch target)
      : DispatchGemmSetup(mctx, spec, target) {}
  I64 parity = ctx.epoch() % 2;
  I64 routeParity = routeEpoch.loadI64() % 2;

  GlobalPtr arrivedAt(const I32& from, const I32& el);
  I64 expectedRows(const I32& from, const I32& el);
  void waitArrivals(const I32& from, const I32& el);
  void push();
  void awaitAllRows();
  void gemmTiles();
  void awaitRows(const I32& el);
  void swigluRows(const Threads& by, const TilePlace& p, const I32& firstRow, const I32& t, int64_t rows);
  void runWarpSpecialized(const TileScheduler& sched, GemmOperands& gemm, const I32& total);
  void runSingleRole(const TileScheduler& sched, GemmOperands& gemm, const I32& total);
};

GlobalPtr DispatchGemm::arrivedAt(const I32& from, const I32& el) {
  return arrivals + ((parity * R + k.widen(from)) * local + k.widen(el));
}

// Rows source `from` sends me for my local expert el: its all-gathered count, less what lies past the capacity
// (el's rows start at pool_offsets[el], the sources in order; the prologue dropped the picks of rows past it).
I64 DispatchGemm::expectedRows(const I32& from, const I32& el) {
  auto countOf = [&](const I32& src) {
    return (counts + ((routeParity * R + k.widen(src)) * E + k.widen(me * local + el))).loadI32();
  };
  auto earlier = k.forRange(k.i32(0), from, k.i32(1), {k.i32(0)}, [&](I32 src, const std::vector<I32>& n) {
    return std::vector<I32>{n[0] + countOf(src)};
  });
  return k.widen(rowsBelowCapacity(k, (poolOffsets + k.widen(el)).loadI32() + earlier[0], countOf(from), capacity));
}

void DispatchGemm::waitArrivals(const I32& from, const I32& el) {
  k.ifThen(k.errorClear(ctx), [&] {
    k.waitAtLeast(ctx, arrivedAt(from, el), expectedRows(from, el), arrivalFlagId(k, from, el), Scope::system);
  });
}

void DispatchGemm::push() {
  // 1. Push: units of up to kPushRows rows of one (me -> owner, expert); push order o -> local expert o / R at
  // owner (me + 1 + o) % R, so that every owner's first experts arrive first and the peers are served before myself.
  k.ifThen(legs.comm && k.blockIdx() < pushBlocks, [&] {
    PrefixTable units{k, unitFirst, E};
    auto expertAt = [&](const I32& o) { return ((me + 1 + o % R) % R) * local + o / R; };
    auto sendCount = [&](const I32& e) { return (sendOff + k.widen(e + 1)).loadI32() - (sendOff + k.widen(e)).loadI32(); };
    I32 nUnits = units.build([&](I32 o) { return (sendCount(expertAt(o)) + (S::kPushRows - 1)) / S::kPushRows; });
    I32 warp = tid / 32, lane = tid % 32;
    const int64_t warps = c.threads / 32;
    k.forRange(k.blockIdx(), nUnits, pushBlocks, [&](I32 u) {
      I32 o = units.find(u);
      I32 e = expertAt(o);
      I32 owner = e / local;
      I32 j0 = (u - units.at(o)) * S::kPushRows;
      I32 left = sendCount(e) - j0;
      I32 rows = k.select(left < k.i32(S::kPushRows), left, k.i32(S::kPushRows));
      I32 start = (sendOff + k.widen(e)).loadI32(), base = (sendBase + k.widen(e)).loadI32();
      k.forRange(warp, rows, k.i32(warps), [&](I32 w) {
        I32 j = j0 + w;
        I32 pick = (sendList + k.widen(start + j)).loadI32();
        I32 row = base + j;
        I32 token = pick / s.topk;
        if (dedup) {
          // The carrier: no other pick of the token has a lower expert at this owner (nor the same one earlier;
          // unsigned compares: -1 picks never count).
          I32 lo = owner * local, mine = pick % s.topk;
          std::optional<Bool> covered;
          for (int64_t jj = 0; jj < s.topk; ++jj) {
            I32 other = (topkIdx + (k.widen(token) * s.topk + jj)).loadI32();
            Bool below = other >= lo && (other < e || (other == e && k.i32(jj) < mine));
            covered = covered ? (*covered || below) : below;
          }
          k.ifThen(!*covered, [&] {
            GlobalPtr to = pool + (k.widen(me) * k.widen(recvStride) + k.widen(token)) * H;
            copyRowByWarp(k, src + k.widen(token) * H, k.peer(ctx, to, owner), H * c.elemBytes(), lane);
          });
        } else {
          copyRowByWarp(k, src + k.widen(token) * H, k.peer(ctx, pool + k.widen(row) * H, owner), H * c.elemBytes(),
                        lane);
        }
        if (s.fp8) {  // the row's H / 128 scales, a lane each
          const int64_t groups = H / G::kScaleBlock;
          GlobalPtr from = *srcScales + k.widen(token) * groups;
          GlobalPtr to = k.peer(ctx, *poolScales + k.widen(row) * groups, owner);
          k.forRange(lane, k.i32(groups), k.i32(32),
                     [&](I32 q) { (to + k.widen(q)).store((from + k.widen(q)).load(1)); });
        }
        k.ifThen(lane == 0, [&] {
          k.peer(ctx, poolSrc + k.widen(row), owner).storeI32(me * abi::kPoolSourceShift + pick);
          k.peer(ctx, poolW + k.widen(row), owner).store((topkWeights + k.widen(pick)).load(1));
        });
      });
      k.block().sync();  // the unit's rows are written: count them at the owner (the signal is a system release)
      k.ifThen(tid == 0, [&] {
        k.signal(k.peer(ctx, arrivedAt(me, e % local), owner), k.widen(rows), Scope::system, /*add=*/true);
      });
    });
  });
}

// Comm-only: everything sent to me has arrived when the leg ends.
void DispatchGemm::awaitAllRows() {
  k.ifThen(legs.comm && !legs.gemm && k.blockIdx() == 0 && tid == 0, [&] {
    k.forRange(k.i32(0), ctx.nranks(), k.i32(1), [&](I32 from) {
      k.forRange(k.i32(0), k.i32(local), k.i32(1), [&](I32 el) { waitArrivals(from, el); });
    });
  });
}

void DispatchGemm::gemmTiles() {
  // 2. GEMM tiles (see DispatchGemmSpec for what each layout computes). Pairs: their tiles in bands of m-tiles as the
  // standalone `_tma` kernels' (TileScheduler::ticketed; faster than unbanded pairs: docs/decisions/fused-dispatch.md).
  TileScheduler sched{k, g, poolOffsets, c.m, c.n, blockInPair, /*ticketed=*/pairs || s.fp8};
  I32 tiles = sched.buildTable(tileFirst);
  I32 total = k.select(legs.gemm, tiles, k.i32(0));
  GlobalPtr a = s.layout == G::kTN ? extra : pool;
  GlobalPtr b = s.layout == G::kTN ? pool : weights;
  GemmOperands gemm{k, g, c, a, b, out, rings};
  if (s.layout == G::kNT) gemm.gateUpRows = I;
  if (s.fp8) gemm.scales = GemmOperands::BlockScales{*poolScales, *weightScales, fp8ScaleRows(arch)};
  if (ws)
    runWarpSpecialized(sched, gemm, total);
  else
    runSingleRole(sched, gemm, total);
}

// A tile waits for its expert's rows from every source, once per block and expert: tickets come in expert order,
// so a block's next tiles are mostly the same expert, and each wait is a few system-scope loads, which add up
// over a block's hundreds of tiles (docs/decisions/fused-dispatch.md, arrival counters).
// With dedup a tile also needs the rows its tokens' carriers brought with the units of lower experts: it waits
// for every expert from the last one confirmed up to its own (tickets come in expert order, so each expert is
// waited for once per block), then looks up its rows' receive rows.
// One thread: waits for the rows of expert `el` (with dedup: of every expert after `confirmed` up to it); the
// caller then confirms it.
void DispatchGemm::awaitRows(const I32& el) {
  k.ifThen(legs.comm, [&] {
    k.forRange(k.i32(0), ctx.nranks(), k.i32(1), [&](I32 from) {
      if (dedup)
        k.forRange(confirmed.loadI32(k.i32(0)) + 1, el + 1, k.i32(1), [&](I32 e) { waitArrivals(from, e); });
      else
        waitArrivals(from, el);
    });
  });
}

// The forward's epilogue: SwiGLU of `rows` staged rows (h kept too, for the backward) by the threads `by`, this
// thread being number t of them.
void DispatchGemm::swigluRows(const Threads& by, const TilePlace& p, const I32& firstRow, const I32& t,
                              int64_t rows) {
  const int64_t threads = by.count();
  const int64_t half = c.n / 2, perRow = half / 8;
  I32 rowsValid = k.select(firstRow < p.groupEnd, p.groupEnd - firstRow, k.i32(0));
  if (s.saveH) {  // h kept for the backward: the gate half and the up half of the tile
    GlobalPtr hRow = extra + (k.widen(firstRow) * (2 * I) + k.widen(p.n0 / 2));
    by.copyTile(rings.staging.colSlice(0, half), hRow, k.i32(2 * I), rowsValid);
    by.copyTile(rings.staging.colSlice(half, half), hRow + k.i64(I), k.i32(2 * I), rowsValid);
  }
  k.forRange(t, k.i32(rows * perRow), k.i32(threads), [&](I32 v) {
    I32 r = v / perRow, col = (v % perRow) * 8;
    k.ifThen(r < rowsValid, [&] {
      Vec gate = rings.staging.load(r, col, 8).toF32();
      Vec up = rings.staging.load(r, col + half, 8).toF32();
      GlobalPtr act = out + (k.widen(firstRow + r) * I + k.widen(p.n0 / 2 + col));
      act.store(swiglu(gate, up, s.clampMilli).to(Elem::bf16));
    });
  });
}

void DispatchGemm::runWarpSpecialized(const TileScheduler& sched, GemmOperands& gemm, const I32& total) {
  // The producer leader waits (as beforeLoads below), then orders the rows the pushes stored (generic proxy,
  // seen through the counters' acquire) before its TMA reads of them.
  WarpSpecializedEngine engine = WarpSpecializedEngine::allocate(gemm, maps, blockInPair);
  if (s.layout == G::kNT)
    engine.epilogue = [&](const TilePlace& p, const I32& firstRow, const Threads& wg) {
      swigluRows(wg, p, firstRow, tid - wg.first(), 64);
    };
  engine.leaderBeforeLoads = [&](const TilePlace& p) {
    k.ifThen(!(confirmed.loadI32(k.i32(0)) == p.expert), [&] {
      awaitRows(p.expert);
      k.proxyFence(/*global=*/true);
      confirmed.storeI32(k.i32(0), p.expert);
    });
  };
  engine.runDynamic(sched, tileFirst, tickets, total, grid);
}

void DispatchGemm::runSingleRole(const TileScheduler& sched, GemmOperands& gemm, const I32& total) {
  gemm.gatherA = gatherRows;
  SingleRoleEngine engine{gemm};
  engine.beforeLoads = [&](const TilePlace& p) {
    k.ifThen(!(confirmed.loadI32(k.i32(0)) == p.expert), [&] {
      k.block().sync();  // every thread has read `confirmed` before thread 0 moves it
      k.ifThen(tid == 0, [&] {
        awaitRows(p.expert);
        confirmed.storeI32(k.i32(0), p.expert);
      });
      k.block().sync();
    });
    if (dedup) {
      I32 first = p.groupStart + p.mTile * c.m;
      k.forRange(tid, k.i32(c.m), k.i32(c.threads), [&](I32 r) {
        I32 row = first + r;
        I32 recv = k.ifElse(row < p.groupEnd, [&] {
          I32 from = (poolSrc + k.widen(row)).loadI32();
          return from / abi::kPoolSourceShift * recvStride + from % abi::kPoolSourceShift / s.topk;
        }, k.i32(0));
        gatherRows->storeI32(r, recv);
      });
      k.block().sync();
    }
  };
  if (s.layout == G::kNT)
    engine.epilogue = [&](const TilePlace& p, const I32& firstRow) { swigluRows(k.block(), p, firstRow, tid, c.m); };
  engine.runDynamic(sched, tileFirst, tickets, slots, total, grid);
}

}  // namespace

mlir::OwningOpRef<mlir::ModuleOp> buildDispatchGemm(mlir::MLIRContext& mctx, const DispatchGemmSpec& s, Arch arch) {
  if (s.fp8 && (s.layout != GroupedGemmSpec::kNT || s.saveH || s.dedup))
    throw std::invalid_argument("dispatch_grouped_gemm_fp8: the forward (NT) only, without save_h or dedup");
  DispatchGemm d(mctx, s, arch);
  d.push();
  d.awaitAllRows();
  d.gemmTiles();
  return d.k.finish();
}

namespace {

// grouped_gemm_combine's arguments, the shape of its GEMM, its rings, shared tables and tile schedule, and its
// phases, which buildGemmCombine calls in order. The members are initialised in declaration order, which is the
// order of the DSL calls that make them (it fixes the IR and the shared-memory offsets): keep it.
struct GemmCombine {
  using S = GemmCombineSpec;
  using G = GroupedGemmSpec;
  static constexpr int64_t kReduceGroup = 8;  // picks whose rows the reduce loads at once (reduceColumns)
  GemmCombine(mlir::MLIRContext& mctx, const GemmCombineSpec& spec, Arch target)
      : s(spec), arch(target), k(mctx, s.spec().kernel, c.threads, /*tensorMaps=*/ws) {}

  const GemmCombineSpec& s;
  const Arch arch;
  const G g = s.gemm();
  const bool forward = s.layout == G::kNT;
  // The dx combine (NN) runs the warp-specialised engine with TMA loads on sm_90a, the forward combine too, as
  // cluster pairs (pairTiles): both faster than on the single-role engine
  // (docs/decisions/fused-dispatch.md).
  // FP8: the warp-specialised engine with TMA, as cluster pairs (pairTiles).
  const bool pairs = forward && pairTiles(g, arch);
  const bool ws = ((!forward || s.fp8) && arch == Arch::sm_90a) || pairs;
  const Elem rowElem = s.fp8 ? Elem::e4m3 : Elem::bf16;  // what a and b hold
  const int64_t E = s.experts, R = s.ranks, local = E / R, H = s.hidden;
  // Tables: the start check's, the tile table, slots.
  G::Tiles c = fusedTiles(g, arch, ws, pairs, {4, local + 1, 1});
  Kernel k;
  Context ctx = k.context();
  GlobalPtr a = k.ptr("a", rowElem);
  GlobalPtr b = k.ptr("b", rowElem);
  GlobalPtr poolOffsets = k.ptr("pool_offsets", Elem::i32);
  GlobalPtr poolSrc = k.ptr("pool_src", Elem::i32);
  GlobalPtr comb = k.ptr("comb", Elem::bf16);
  GlobalPtr done = k.ptr("done", Elem::i64);
  GlobalPtr topkIdx = k.ptr("topk_idx", Elem::i32);
  GlobalPtr topkWeights = k.ptr("topk_weights", Elem::f32);
  I32 tokens = k.i32Arg("tokens");
  GlobalPtr y = k.ptr("y", Elem::bf16);
  GlobalPtr dw = k.ptr("dw", Elem::f32);
  GlobalPtr dTopkWeights = k.ptr("d_topk_weights", Elem::f32);
  GlobalPtr tickets = k.ptr("tickets", Elem::i32);
  I32 grid = k.i32Arg("grid");
  Legs legs = decodeLegs(k.i32Arg("legs"));
  // FP8: act's per-token scales [cap, I / 128] and w2's blocks [E/R, H / 128, I / 128].
  std::optional<GlobalPtr> aScales = scalesArg(k, s.fp8, "a_scales"),
                           bScales = scalesArg(k, s.fp8, "b_scales");
  const TensorMapArgs maps = tensorMapArgs(k, s.spec());  // sm_90a NN: dh's rows and w1; NT: act's rows and w2

  // Pairs: clusters of two blocks (an even grid).
  std::optional<I32> blockInPair = clusterPairs(k, pairs);
  Rings rings = allocateRings(k, g, c, mnRingLayout(maps), ws ? 64 : 0);
  SharedTile startError = startCheck(k, ctx, blockInPair);
  SharedTile tileFirst = sharedTable(k, "tile_first", local + 1);
  SharedTile slots = sharedTable(k, "ticket_slot", 1);
  I32 tid = k.threadIdx(), me = ctx.rank();
  I64 parity = ctx.epoch() % 2;
  // The early reduce (the warp-specialised combines): the tiles come chunk by chunk over H's columns, and the
  // producer warpgroup's side warps sum a chunk's picks while the next chunk multiplies; only the last chunk's sum
  // waits for the done barrier below (docs/decisions/combine-early-reduce.md).
  const int64_t chunks = ws ? combineChunks(H / c.n, pairs) : 1, counters = abi::doneSlots(R);
  TileScheduler sched{k, g, poolOffsets, c.m, c.n, blockInPair, /*ticketed=*/pairs, chunks};
  const int64_t chunkCols = sched.chunkColumns();

  GlobalPtr homeOf(const TilePlace& p, const I32& firstRow, const I32& r, const I32& col);
  void reduceColumns(int64_t col0, int64_t cols, const I32& first, const I32& stride);
  GlobalPtr doneSlot(const I64& slot);
  void pass(const Threads& wg, const I32& from, const I32& to);
  void gemmTiles();
  void runWarpSpecialized(GemmOperands& gemm, const I32& total);
  void runSingleRole(GemmOperands& gemm, const I32& total);
  void awaitDone();
  void reduceLastChunk();
};

// Row r of tile p from firstRow, column col: its destination at its home rank (gemm-only: here).
GlobalPtr GemmCombine::homeOf(const TilePlace& p, const I32& firstRow, const I32& r, const I32& col) {
  I32 from = (poolSrc + k.widen(firstRow + r)).loadI32();
  I32 home = k.select(legs.comm, from / abi::kPoolSourceShift, me);
  return k.peer(ctx, comb + (k.widen(from % abi::kPoolSourceShift) * H + k.widen(p.n0 + col)), home);
}

// Per token, the valid picks' rows of columns [col0, col0 + cols) in pick order, in fp32 (deterministic): weighted
// by the routing weights in the forward; plain in the backward, which also hands out d_topk_weights (with the
// columns from 0). One flat loop over (token, 16-byte vector) pairs, from `first` by `stride`, keeps every thread
// equally busy.
// The picks go in groups of up to kReduceGroup, each group's loads in flight together: the producer warpgroup runs
// this with its 72 registers, where ten 16-byte rows in flight (Qwen3-Next's top-10) spilled.
void GemmCombine::reduceColumns(int64_t col0, int64_t cols, const I32& first, const I32& stride) {
  const int64_t vectors = cols / 8;
  int64_t group = std::min<int64_t>(s.topk, kReduceGroup);
  while (s.topk % group != 0) --group;  // the largest divisor of topk up to kReduceGroup
  k.forRange(first, tokens * vectors, stride, [&](I32 i) {
    I32 t = i / vectors, v = i % vectors;
    I64 col = k.widen(v) * 8 + col0;
    auto addPicks = [&](const I64& firstPick, Vec sum) {
      for (int64_t j = 0; j < group; ++j) {
        I64 pick = firstPick + j;
        Bool valid = (topkIdx + pick).loadI32() < k.i32(E);  // unsigned: -1 is skipped
        Vec row = (comb + (pick * H + col)).load(8).toF32();
        Vec term = forward ? row * (topkWeights + pick).loadSplat(8) : row;
        sum = k.select(valid, sum + term, sum);
        if (!forward && col0 == 0)
          k.ifThen(v == 0, [&] {
            (dTopkWeights + pick).store(k.select(valid, (dw + pick).load(1), k.zeros(1, Elem::f32)));
          });
      }
      return sum;
    };
    I64 picks = k.widen(t) * s.topk;
    Vec sum = group == s.topk ? addPicks(picks, k.zeros(8, Elem::f32))
                              : k.forRange(k.i32(0), k.i32(s.topk), k.i32(group), k.zeros(8, Elem::f32),
                                           [&](I32 j, Vec acc) { return addPicks(picks + k.widen(j), acc); });
    (y + (k.widen(t) * H + col)).store(sum.to(Elem::bf16));
  });
}

// The counters of this epoch: blocks done per owner (slot o), MMA warpgroups past chunk q (slot R + q).
GlobalPtr GemmCombine::doneSlot(const I64& slot) { return done + (parity * counters + slot); }

// A warpgroup past chunks [from, to) (its rows of them written: bulkWait) counts itself at every home rank.
void GemmCombine::pass(const Threads& wg, const I32& from, const I32& to) {
  k.bulkWait(/*readOnly=*/false);
  wg.sync();
  k.ifThen(tid == k.i32(wg.first()), [&] {
    k.forRange(from, to, k.i32(1), [&](I32 q) {
      k.forRange(k.i32(0), ctx.nranks(), k.i32(1), [&](I32 home) {
        k.signal(k.peer(ctx, doneSlot(k.widen(q) + R), home), k.i64(1), Scope::system, /*add=*/true);
      });
    });
  });
}

void GemmCombine::gemmTiles() {
  // 1. GEMM tiles; the epilogue stores each row at its home rank (gemm-only: in my own buffer). Pairs: tiles in
  // bands as the dispatch's.
  I32 total = sched.buildTable(tileFirst);
  GemmOperands gemm{k, g, c, a, b, comb, rings};
  if (s.fp8) gemm.scales = GemmOperands::BlockScales{*aScales, *bScales, fp8ScaleRows(arch)};
  // One bulk copy per row, over NVLink where the home is a peer, draining while the next tile runs (faster than the
  // block's row stores here: docs/decisions/gemm-tiles.md, epilogue stores).
  // The comm-only leg leaves the accumulators zero. The NT combine runs a copy of the tile loop without K loop for
  // it: one loop with a run-time trip count (zero for that leg) took ptxas to 255 registers and spills there with
  // the bulk epilogue. The NN combine keeps the one loop: with two, its GEMM was slower
  // (docs/decisions/fused-dispatch.md, comm-only leg).
  if (ws)
    runWarpSpecialized(gemm, total);
  else
    runSingleRole(gemm, total);
  k.returnIf(!legs.comm);
}

void GemmCombine::runWarpSpecialized(GemmOperands& gemm, const I32& total) {
  // Each MMA warpgroup sends its 64 staged rows home, one bulk copy per row; the comm-only leg skips the K loops
  // (not in FP8, whose K loop has no skip: GemmCombineSpec).
  if (!s.fp8) gemm.mmaOn = [&] { return k.select(legs.gemm, k.i32(1), k.i32(0)); };
  WarpSpecializedEngine engine = WarpSpecializedEngine::allocate(gemm, maps, blockInPair);
  engine.bulkEpilogue = true;
  if (chunks > 1) {
    // The state: chunks passed (tiles come in chunk order, so a tile of chunk q passes every chunk before it).
    engine.beforeTile = [&](const Threads& wg, const TilePlace& p, const I32& passed) {
      I32 chunk = p.n0 / k.i32(chunkCols);
      Bool ahead = passed < chunk;
      k.ifThen(ahead && legs.comm, [&] { pass(wg, passed, chunk); });
      return k.select(ahead, chunk, passed);
    };
    engine.afterTiles = [&](const Threads& wg, const I32& passed) {
      k.ifThen(passed < k.i32(chunks - 1) && legs.comm, [&] { pass(wg, passed, k.i32(chunks - 1)); });
    };
    // Side warps: chunk q's sums once every warpgroup of every rank is past it (all but the last chunk).
    engine.sideWork = [&] {
      const int64_t side = WarpSpecializedEngine::kSideThreads;
      I32 st = tid - k.i32(c.mmaThreads() + 32);
      I64 everyWarpgroup = k.widen(grid) * (R * engine.warpgroups());
      k.ifThen(legs.comm, [&] {
        for (int64_t q = 0; q + 1 < chunks; ++q) {
          k.ifThen(st == 0 && k.errorClear(ctx), [&] {
            k.waitAtLeast(ctx, doneSlot(k.i64(R + q)), everyWarpgroup,
                          k.i64(int64_t(abi::flagId(abi::FlagKind::kUser, uint32_t(q)))), Scope::system);
          });
          k.namedBarrier(WarpSpecializedEngine::kSideBarrier, side, /*arriveOnly=*/false);
          k.ifThen(k.errorClear(ctx),
                   [&] { reduceColumns(q * chunkCols, chunkCols, k.blockIdx() * side + st, grid * side); });
        }
      });
    };
  }
  engine.epilogue = [&](const TilePlace& p, const I32& firstRow, const Threads& wg) {
    I32 rowsValid = k.select(firstRow < p.groupEnd, p.groupEnd - firstRow, k.i32(0));
    I32 lt = tid - wg.first();
    k.ifThen(lt < k.i32(64) && lt < rowsValid, [&] {
      k.bulkStore(rings.staging, lt, homeOf(p, firstRow, lt, k.i32(0)), c.n * 2);
      k.bulkCommit();
    });
  };
  engine.runDynamic(sched, tileFirst, tickets, total, grid);
}

void GemmCombine::runSingleRole(GemmOperands& gemm, const I32& total) {
  SingleRoleEngine engine{gemm};
  engine.bulkEpilogue = c.bulkStores;
  engine.epilogue = [&](const TilePlace& p, const I32& firstRow) {
    const int64_t perRow = c.n / 8;
    I32 rowsValid = p.groupEnd - firstRow;
    if (c.bulkStores) {
      k.ifThen(tid < k.i32(c.m) && tid < rowsValid, [&] {
        k.bulkStore(rings.staging, tid, homeOf(p, firstRow, tid, k.i32(0)), c.n * 2);
        k.bulkCommit();
      });
      return;
    }
    k.forRange(tid, k.i32(c.m * perRow), k.i32(c.threads), [&](I32 v) {
      I32 r = v / perRow, col = (v % perRow) * 8;
      k.ifThen(r < rowsValid, [&] { homeOf(p, firstRow, r, col).store(rings.staging.load(r, col, 8)); });
    });
  };
  if (forward) {
    k.ifThen(legs.gemm, [&] { engine.runDynamic(sched, tileFirst, tickets, slots, total, grid); });
    k.ifThen(!legs.gemm, [&] {
      SingleRoleEngine commOnly = engine;
      commOnly.gemm.mmaOn = [&] { return k.i32(0); };
      commOnly.runDynamic(sched, tileFirst, tickets, slots, total, grid);
    });
  } else {
    engine.gemm.mmaOn = [&] { return k.select(legs.gemm, k.i32(1), k.i32(0)); };
    engine.runDynamic(sched, tileFirst, tickets, slots, total, grid);
  }
}

void GemmCombine::awaitDone() {
  // 2. This block is done at every home rank; wait until every block of every rank is done with my rows.
  k.block().sync();
  k.ifThen(tid == 0, [&] {
    k.forRange(k.i32(0), ctx.nranks(), k.i32(1), [&](I32 home) {
      k.signal(k.peer(ctx, doneSlot(k.widen(me)), home), k.i64(1), Scope::system, /*add=*/true);
    });
    k.forRange(k.i32(0), ctx.nranks(), k.i32(1), [&](I32 owner) {
      k.ifThen(k.errorClear(ctx), [&] {
        k.waitAtLeast(ctx, doneSlot(k.widen(owner)), k.widen(grid), peerFlagId(k, owner), Scope::system);
      });
    });
  });
  k.block().sync();
  k.returnIf(!k.errorClear(ctx));
}

void GemmCombine::reduceLastChunk() {
  // 3. The last chunk's sums (without chunks: every column), over every thread of every block.
  reduceColumns((chunks - 1) * chunkCols, chunkCols, k.blockIdx() * c.threads + tid, grid * c.threads);
}

}  // namespace

mlir::OwningOpRef<mlir::ModuleOp> buildGemmCombine(mlir::MLIRContext& mctx, const GemmCombineSpec& s, Arch arch) {
  if (s.fp8 && s.layout != GroupedGemmSpec::kNT)
    throw std::invalid_argument("grouped_gemm_combine_fp8: the forward (NT) only");
  GemmCombine d(mctx, s, arch);
  d.gemmTiles();
  d.awaitDone();
  d.reduceLastChunk();
  return d.k.finish();
}

mlir::OwningOpRef<mlir::ModuleOp> buildSwigluBwd(mlir::MLIRContext& mctx, const SwigluBwdSpec& s) {
  using S = SwigluBwdSpec;
  const int64_t I = s.intermediate, T = S::kBlockThreads;
  Kernel k(mctx, S::kName, T);
  Context ctx = k.context();
  GlobalPtr gIn = k.ptr("g", Elem::bf16);   // g, overwritten by w * act
  GlobalPtr h = k.ptr("h", Elem::bf16);     // h, read only (the caller's saved state)
  GlobalPtr dh = k.ptr("dh", Elem::bf16);   // dh out, [rows, 2I] like h (may be h itself)
  GlobalPtr poolW = k.ptr("pool_w", Elem::f32);
  GlobalPtr poolSrc = k.ptr("pool_src", Elem::i32);
  GlobalPtr rowsAt = k.ptr("rows_at", Elem::i32);
  GlobalPtr dw = k.ptr("dw", Elem::f32);
  I32 grid = k.i32Arg("grid");
  returnIfErrorAtStart(k, ctx, k.sharedTile("start_error", Elem::i32, 1, 4), std::nullopt);
  SharedTile partial = k.sharedTile("partial", Elem::f32, 1, T);
  I32 tid = k.threadIdx();
  const float limit = float(s.clampMilli) / 1000.f;
  k.forRange(k.blockIdx(), rowsAt.loadI32(), grid, [&](I32 r) {
    Vec w = (poolW + k.widen(r)).loadSplat(8);
    // Each thread keeps its running <g, act> in its own fp32 slot of `partial`, updated per vector.
    partial.store(k.i32(0), tid, k.zeros(1, Elem::f32));
    k.forRange(tid, k.i32(I / 8), k.i32(T), [&](I32 v) {
      I64 col = k.widen(v) * 8;
      GlobalPtr gAt = gIn + (k.widen(r) * I + col);
      GlobalPtr gateAt = h + (k.widen(r) * (2 * I) + col);
      GlobalPtr upAt = gateAt + k.i64(I);
      GlobalPtr dGateAt = dh + (k.widen(r) * (2 * I) + col);
      GlobalPtr dUpAt = dGateAt + k.i64(I);
      Vec gv = gAt.load(8).toF32();
      Vec gate = gateAt.load(8).toF32();
      Vec up = upAt.load(8).toF32();
      // A clamped component passes no gradient.
      Vec gateMask = s.clampMilli > 0 ? gate.stepLE(limit) : gate.splat(1.f);
      Vec upMask = s.clampMilli > 0 ? up.stepLE(limit) * (-up).stepLE(limit) : up.splat(1.f);
      clampSwiglu(gate, up, s.clampMilli);
      Vec sig = sigmoid(gate);
      Vec silu = gate * sig;
      Vec act = silu * up;
      Vec dact = w * gv;
      Vec dsilu = sig * (sig.splat(1.f) + gate * (sig.splat(1.f) + -sig));  // silu' = s (1 + z (1 - s))
      dGateAt.store((dact * up * dsilu * gateMask).to(Elem::bf16));
      dUpAt.store((dact * silu * upMask).to(Elem::bf16));
      gAt.store((w * act).to(Elem::bf16));
      partial.store(k.i32(0), tid, partial.load(k.i32(0), tid, 1) + (gv * act).sum());
    });
    k.block().sync();
    // Fixed-order tree over the block's partial sums.
    for (int64_t half = T / 2; half > 0; half /= 2) {
      k.ifThen(tid < k.i32(half), [&] {
        partial.store(k.i32(0), tid, partial.load(k.i32(0), tid, 1) + partial.load(k.i32(0), tid + half, 1));
      });
      k.block().sync();
    }
    k.ifThen(tid == 0, [&] {
      I32 from = (poolSrc + k.widen(r)).loadI32();
      k.peer(ctx, dw + k.widen(from % abi::kPoolSourceShift), from / abi::kPoolSourceShift)
          .store(partial.load(k.i32(0), k.i32(0), 1));
    });
    k.block().sync();  // the slots are reset for the next row
  });
  return k.finish();
}

mlir::OwningOpRef<mlir::ModuleOp> buildStageBegin(mlir::MLIRContext& mctx, const StageBeginSpec& s) {
  const int64_t R = s.ranks, local = s.experts / s.ranks, T = 256;
  Kernel k(mctx, StageBeginSpec::kName, T);
  Context ctx = k.context();
  GlobalPtr arrivals = k.ptr("arrivals", Elem::i64);
  GlobalPtr done = k.ptr("done", Elem::i64);
  GlobalPtr barrier = k.ptr("barrier", Elem::i64);
  returnIfErrorAtStart(k, ctx, k.sharedTile("start_error", Elem::i32, 1, 4), std::nullopt);
  I32 tid = k.threadIdx();
  I64 epoch = ctx.epoch();
  I64 stale = k.i64(1) - epoch % 2;
  zeroStaleCounters(k, arrivals, done, stale, R, local, tid, T);
  k.block().sync();
  k.rankBarrier(ctx, barrier, epoch + 1);
  return k.finish();
}

}  // namespace megamoe::kernels
