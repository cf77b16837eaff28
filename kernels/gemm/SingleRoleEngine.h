// The single-role engine: every thread of the block both copies (cp.async on sm_90a, synchronous copies on gfx950)
// and multiplies, over a ring of K stages that runs on from one tile into the next; static and ticketed tile loops.
#pragma once
#include <functional>
#include <utility>
#include <vector>

#include "dsl/Dsl.h"
#include "kernels/gemm/Operands.h"
#include "kernels/gemm/TileScheduler.h"

namespace megamoe::kernels {

// The main loop of every layout: a `stages`-deep ring of asynchronous copies; the MMA of stage k overlaps the copies
// of stage k + stages - 1, and the MMA of stage k + 1 is issued before stage k's result is waited for. The ring runs
// on from one tile into the next: a tile's stages start at ring slot `base`, the slot after the previous tile's last
// stage, so that once a tile's last MMA is issued the next tile's first stages can be issued into the free slots
// while that MMA still runs (its place computed then too), before the epilogue.
struct SingleRoleEngine {
  GemmOperands gemm;

  // Optional parts of the fused operators.
  // Called by every thread before a tile's first copies (may sync the block), e.g. to wait for the rows to arrive.
  std::function<void(const TilePlace&)> beforeLoads;
  // Replaces the default epilogue (staging -> out); called by every thread once the tile is in the staging tile.
  std::function<void(const TilePlace&, const dsl::I32& firstRow)> epilogue;
  // The epilogue sends rows out of the staging tile with bulk copies (Kernel::bulkStore, committed): the next
  // tile's staging waits until they have read it, and the tile loop ends once they are written.
  bool bulkEpilogue = false;

  dsl::I32 slotOf(const dsl::I32& base, const dsl::I32& kt) const { return (base + kt) % gemm.c.stages; }
  // The first stages - 1 stages of tile p, into the slots from `base`, each its own copy group.
  void prologue(const TilePlace& p, const dsl::I32& base) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    if (beforeLoads) beforeLoads(p);
    I32 steps = gemm.kTiles(p);
    for (int64_t st = 0; st + 1 < gemm.c.stages; ++st) {
      k.ifThen(k.i32(st) < steps, [&] { gemm.issue(k.block(), p, k.i32(st), slotOf(base, k.i32(st))); });
      k.asyncCommit();
    }
  }
  // The tile after the running one.
  struct Next {
    dsl::I32 ticket;   // its index
    dsl::Bool exists;  // ticket < total
  };
  // Runs tile p (its first stages already issued from slot `base`); returns the next tile's place (where it exists)
  // and base. `whatNext` (every thread, may block-sync) runs after the K loop and names the next tile (e.g. once
  // its ticket is published).
  std::pair<TilePlace, dsl::I32> tile(const TileScheduler& sched, const dsl::SharedTile& first, const TilePlace& p,
                                      const dsl::I32& base, const std::function<Next()>& whatNext) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    const auto& c = gemm.c;
    I32 steps = gemm.kTiles(p);
    Acc acc = k.forRange(k.i32(0), steps, k.i32(1), k.block().zeroAcc(c.m, c.n), [&](I32 kt, Acc acc) {
      k.asyncWait(c.stages - 2);  // stage kt has landed (for this thread) ...
      k.block().sync();           // ... and for every thread
      Acc nextAcc = gemm.multiply(k.block(), acc, gemm.rings.a.stage(slotOf(base, kt)),
                                  gemm.rings.b.stage(slotOf(base, kt)), p, kt, /*pending=*/1);
      // The MMA of stage kt - 1 has finished in every warpgroup: its slot can be refilled.
      k.block().sync();
      I32 fill = kt + (c.stages - 1);
      k.ifThen(fill < steps, [&] { gemm.issue(k.block(), p, fill, slotOf(base, fill)); });
      k.asyncCommit();  // an empty group past the end keeps the wait counts uniform
      return nextAcc;
    });
    // Only the last stage's MMA may still run: the other slots are free for the next tile's first stages.
    Next nx = whatNext();
    I32 nextBase = slotOf(base, steps);
    TilePlace next = sched.place(nx.ticket, first);  // clamped where the next tile does not exist
    k.ifThen(nx.exists, [&] { prologue(next, nextBase); });
    acc = k.drain(acc);
    storeTile(p, acc);
    return {next, nextBase};
  }
  // Epilogue through shared memory: fragments into a padded staging tile, then 16-byte coalesced row stores (or the
  // kernel's own epilogue). Every thread of the MMA group.
  void storeTile(const TilePlace& p, const dsl::Acc& acc) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    if (bulkEpilogue) {
      k.bulkWait(/*readOnly=*/true);  // the previous tile's bulk copies have read the staging tile
      k.block().sync();
    }
    I32 first0 = gemm.m0(p);
    k.block().storeAcc(acc, gemm.rings.staging);
    k.block().sync();
    if (epilogue)
      epilogue(p, first0);
    else
      gemm.storeStaged(k.block(), p, first0);
    if (!bulkEpilogue) k.block().sync();  // the next tile's epilogue overwrites the staging tile
  }
  // After the tile loop: every copy this thread started has completed (bulk stores: written, and ordered before a
  // release that follows).
  void finish() const {
    gemm.k.asyncWait(0);
    if (bulkEpilogue) gemm.k.bulkWait(/*readOnly=*/false);
  }

  // Static persistent loop: block b runs tiles b, b + grid, ...
  void runStatic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::I32& grid) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    I32 total = sched.buildTable(first);
    I32 b0 = k.blockIdx();
    TilePlace p0 = sched.place(b0, first);
    k.ifThen(b0 < total, [&] { prologue(p0, k.i32(0)); });
    std::vector<I32> init = p0.pack();
    init.push_back(k.i32(0));  // base
    k.forRange(b0, total, grid, init, [&](I32 t, const std::vector<I32>& v) {
      I32 t2 = t + grid;
      auto [next, base] = tile(sched, first, TilePlace::unpack(v), v[5], [&] { return Next{t2, t2 < total}; });
      std::vector<I32> out = next.pack();
      out.push_back(base);
      return out;
    });
    finish();
  }

  // Dynamic loop: tiles in order of tickets drawn from tickets[0] (global i32, zero at launch); `slots` is a shared
  // i32 [1]. A tile draws the next ticket when it starts and publishes it once its K loop is done, so that the
  // atomic's round trip is never waited for. The last of `grid` blocks to run out of tiles resets tickets[0..1] to
  // zero for the next launch.
  void runDynamic(const TileScheduler& sched, const dsl::SharedTile& first, const dsl::GlobalPtr& tickets,
                  const dsl::SharedTile& slots, const dsl::I32& total, const dsl::I32& grid) const {
    using namespace dsl;
    dsl::Kernel& k = gemm.k;
    // Thread 0 draws; the ticket reaches the block through a shared slot.
    auto draw = [&] { return k.ifElse(k.threadIdx() == 0, [&] { return tickets.atomicAddI32(k.i32(1)); }, k.i32(0)); };
    auto publish = [&](const I32& ticket) {
      k.ifThen(k.threadIdx() == 0, [&] { slots.storeI32(k.i32(0), ticket); });
      k.block().sync();
      return slots.loadI32(k.i32(0));  // the next write is a whole tile (and its barriers) later
    };
    I32 t0 = publish(draw());
    k.ifThen(t0 < total, [&] { prologue(sched.place(t0, first), k.i32(0)); });
    // Carried: the running tile's ticket and base slot. Its place is looked up again when it starts rather than
    // carried like the static loop's: the fused kernels are at the register file's limit (the combine spills
    // otherwise).
    k.whileLoop({t0, k.i32(0)}, [&](const std::vector<I32>& v) { return v[0] < total; },
                [&](const std::vector<I32>& v) {
                  I32 ticket = draw();
                  I32 t2 = k.i32(0);
                  auto next = tile(sched, first, sched.place(v[0], first), v[1], [&] {
                    t2 = publish(ticket);
                    return Next{t2, t2 < total};
                  });
                  return std::vector<I32>{t2, next.second};
                });
    finish();
    k.ifThen(k.threadIdx() == 0, [&] { resetTicketsIfLast(k, tickets, grid); });
  }
};

}  // namespace megamoe::kernels
