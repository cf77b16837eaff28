// dispatch_prologue: routing tables on the device (see DispatchPrologueSpec).
#include "compiler/abi/DeviceAbi.h"
#include "dsl/Dsl.h"
#include "kernels/Flags.h"
#include "kernels/Kernels.h"

namespace megamoe::kernels {
using namespace dsl;

namespace {

// The count's groups (Prologue::W): 32, halved until their W x E counts fit in 24 KB of shared memory.
int64_t countGroups(int64_t E) {
  int64_t W = 32;
  while (W > 1 && W * E > 6144) W /= 2;
  return W;
}

// The prologue's arguments, shared tables and the values its phases share, and the phases, which
// buildDispatchPrologue calls in order. The members are initialised in declaration order, which is the order of the
// DSL calls that make them (it fixes the IR and the shared-memory offsets): keep it.
struct Prologue {
  using S = DispatchPrologueSpec;
  Prologue(mlir::MLIRContext& mctx, const DispatchPrologueSpec& spec) : s(spec), k(mctx, S::kName, T) {}

  const DispatchPrologueSpec& s;
  const int64_t E = s.experts, R = s.ranks, local = E / R, T = S::kBlockThreads;
  Kernel k;
  Context ctx = k.context();
  GlobalPtr topkIdx = k.ptr("topk_idx", Elem::i32);
  I32 tokens = k.i32Arg("tokens");
  GlobalPtr counts = k.ptr("counts", Elem::i32);  // heap [2][R][E]
  GlobalPtr flags = k.ptr("flags", Elem::i64);   // heap [R]
  GlobalPtr sendSlot = k.ptr("send_slot", Elem::i32);
  GlobalPtr poolOffsets = k.ptr("pool_offsets", Elem::i32);
  GlobalPtr sendList = k.ptr("send_list", Elem::i32);
  GlobalPtr sendOff = k.ptr("send_off", Elem::i32);
  GlobalPtr sendBase = k.ptr("send_base", Elem::i32);
  GlobalPtr arrivals = k.ptr("arrivals", Elem::i64);  // heap [2][R][E/R]
  GlobalPtr done = k.ptr("done", Elem::i64);      // heap [2][abi::doneSlots(R)]
  GlobalPtr routeEpoch = k.ptr("route_epoch", Elem::i64);
  GlobalPtr scratch = k.ptr("scratch", Elem::i32);   // [kScratchHeader + blocks * E], zero between launches
  I32 blocks = k.i32Arg("blocks");                   // the launch's blocks
  I32 capacity = k.i32Arg("capacity");               // rows any owner's receive pool holds
  // Past the capacity: 0 = an error on every rank; 1 = the picks are dropped (-1 in topk_idx, which is then the
  // layer's own copy) and counted into `dropped`; 2 = dropped, not counted (the backward's rerun of a forward's).
  I32 drop = k.i32Arg("drop");
  GlobalPtr dropped = k.ptr("dropped", Elem::i64);
  // This call's layer and role (abi::callWord), published to every peer in calls (heap i64 [2][R]: each source's
  // word, by epoch parity, as the counts) and compared with every peer's.
  GlobalPtr calls = k.ptr("calls", Elem::i64);
  I64 call = k.widen(k.i32Arg("layer")) * (int64_t(1) << 32) + k.widen(k.i32Arg("role"));
  GlobalPtr arrived = scratch.as(Elem::i64);  // the blocks' meeting counter (i64 [0])
  GlobalPtr left = scratch + k.i64(2);        // blocks past the meeting (i32 [2]); the last resets both
  GlobalPtr partial = scratch + k.i64(S::kScratchHeader);  // [block][expert]: the block's picks of the expert

  // Counting a chunk of T picks: the block's threads form W groups of G (W x E counts fit in 24 KB of shared memory;
  // a group is at least a warp). A pick's order among the chunk's picks of its expert is its order within its group
  // (G entries scanned) plus that expert's count in the earlier groups (W - 1 entries), instead of a scan over every
  // earlier pick of the chunk (up to T - 1 entries: that scan made this kernel ~1 ms of the EP2 layer).
  const int64_t W = countGroups(E);
  const int64_t G = T / W;
  const int64_t padE = (E + 3) / 4 * 4;
  // Shared tables: this block's counts per expert (then every block's), the picks of the earlier blocks, the first
  // pool row of (me, e) at e's owner, and my picks' start in send_list.
  SharedTile mine = k.sharedTile("mine", Elem::i32, 1, padE);
  SharedTile before = k.sharedTile("before", Elem::i32, 1, padE);
  SharedTile base = k.sharedTile("base", Elem::i32, 1, padE);
  SharedTile off = k.sharedTile("off", Elem::i32, 1, (E + 1 + 3) / 4 * 4);
  SharedTile chunk = k.sharedTile("chunk", Elem::i32, 1, T);  // the experts of the picks being counted
  SharedTile perGroup = k.sharedTile("per_group", Elem::i32, W, padE);  // [group][expert]: its picks of the expert
  SharedTile overflow = k.sharedTile("overflow", Elem::i32, 1, 4);  // [0]: some owner's rows exceed the capacity
  SharedTile differs = k.sharedTile("call_differs", Elem::i32, 1, 4);  // [0]: 1 + the first peer whose call differs
  I32 tid = k.threadIdx(), me = ctx.rank(), block = k.blockIdx();
  I64 epoch = ctx.epoch();
  I64 parity = epoch % 2;

  GlobalPtr countAt(const I64& slab, const I32& src, const I32& e) {
    return counts + ((slab * R + k.widen(src)) * E + k.widen(e));
  }
  GlobalPtr callAt(const I64& slab, const I32& src) { return calls + (slab * R + k.widen(src)); }

  // The picks this block counts and places: [first, last).
  struct Range {
    I32 first, last;
  };
  void begin();
  Range count();
  void meet();
  void exchange();
  void layOutPools();
  void writeTables();
  void placePicks(const Range& range);
};

// The rank check, the block's tables cleared, and (block 0) the previous call's counters.
void Prologue::begin() {
  // The kernel was specialised for R ranks: a heap of another size is a launch bug, reported, not run.
  Bool wrongRanks = !(ctx.nranks() == k.i32(R));
  k.ifThen(wrongRanks && tid == 0 && block == 0, [&] {
    k.reportError(ctx, uint64_t(abi::ErrorCode::kBadIndex), k.i64(-1), k.widen(ctx.nranks()), k.i64(R));
  });
  k.returnIf(wrongRanks || !(block < blocks));
  k.forRange(tid, k.i32(E), k.i32(T), [&](I32 e) { mine.storeI32(e, k.i32(0)); });
  k.ifThen(tid == 0, [&] {
    overflow.storeI32(k.i32(0), k.i32(0));
    overflow.storeI32(k.i32(1), k.i32(0));
  });
  k.forRange(tid, k.i32(W * padE), k.i32(T), [&](I32 i) { perGroup.storeI32(i, k.i32(0)); });
  // The counters the previous call used (the other parity) start again from zero.
  k.ifThen(block == 0, [&] {
    zeroStaleCounters(k, arrivals, done, k.i64(1) - parity, R, local, tid, T);
    k.ifThen(tid == 0, [&] { routeEpoch.storeI64(epoch); });
  });
  k.block().sync();
}

Prologue::Range Prologue::count() {
  // 1. Block b counts the picks of chunks [b * per, (b + 1) * per) and gives each its order among the block's
  // picks of its expert, in pick order (temporarily in send_slot): within a chunk a pick's order is the number of
  // earlier picks of the chunk with the same expert, so pool rows (and every sum over them, e.g. a weight gradient)
  // are the same in every run.
  I32 picks = tokens * s.topk;
  I32 per = (picks + (blocks * T - 1)) / (blocks * T) * T;  // picks per block, whole chunks
  I32 first = block * per;
  I32 last = k.select(first + per < picks, first + per, picks);
  k.forRange(first, last, k.i32(T), [&](I32 c0) {
    I32 i = c0 + tid;
    Bool inRange = i < last;
    I32 e = k.select(inRange, (topkIdx + k.widen(k.select(inRange, i, k.i32(0)))).loadI32(), k.i32(-1));
    chunk.storeI32(tid, e);
    k.block().sync();
    Bool valid = e < k.i32(E);  // unsigned: -1 and every negative value are out of range here
    I32 group = tid / G, g0 = group * G;
    // Within my group: the picks of my expert before mine, and all of them.
    std::vector<I32> inGroup = k.forRange(g0, g0 + G, k.i32(1), {k.i32(0), k.i32(0)},
                                          [&](I32 j, const std::vector<I32>& n) {
                                            I32 same = k.select(chunk.loadI32(j) == e, k.i32(1), k.i32(0));
                                            return std::vector<I32>{n[0] + k.select(j < tid, same, k.i32(0)), n[1] + same};
                                          });
    Bool lastOfGroup = valid && (inGroup[0] + 1 == inGroup[1]);  // the one pick that publishes the group's count
    k.ifThen(lastOfGroup, [&] { perGroup.storeI32(group * padE + e, inGroup[1]); });
    k.block().sync();
    k.ifThen(valid, [&] {
      auto earlier = k.forRange(k.i32(0), group, k.i32(1), {inGroup[0]}, [&](I32 g, const std::vector<I32>& n) {
        return std::vector<I32>{n[0] + perGroup.loadI32(g * padE + e)};
      });
      (sendSlot + k.widen(i)).storeI32(mine.loadI32(e) + earlier[0]);
    });
    k.ifThen(inRange && !valid, [&] {
      (sendSlot + k.widen(i)).storeI32(k.i32(-1));
      // -1 means "no expert"; anything else outside [0, E) is a routing bug the host is told about.
      k.ifThen(!(e == -1), [&] {
        k.reportError(ctx, uint64_t(abi::ErrorCode::kBadIndex), k.widen(i), k.widenSigned(e), k.i64(E));
      });
    });
    k.block().sync();  // every pick of the chunk has read its expert's counts
    k.ifThen(lastOfGroup, [&] {
      mine.atomicAddI32(e, inGroup[1]);
      perGroup.storeI32(group * padE + e, k.i32(0));  // clean for the next chunk
    });
    k.block().sync();
  });
  return {first, last};
}

void Prologue::meet() {
  // 2. The blocks meet: then every block knows every block's counts, the earlier blocks' ones (its picks' offset
  // within each expert) and the sums (my picks per expert). The last block past the meeting zeroes the counters
  // for the next launch (a kernel boundary separates it from the next one).
  k.forRange(tid, k.i32(E), k.i32(T), [&](I32 e) { (partial + k.widen(block * E + e)).storeI32(mine.loadI32(e)); });
  k.block().sync();
  // A bad index claimed the error record already: the counts (bad picks skipped) still go to the peers below, so
  // that their tables are right; this rank stops after the exchange.
  k.gridBarrier(ctx, arrived, k.widen(blocks));
  k.forRange(tid, k.i32(E), k.i32(T), [&](I32 e) {
    auto sums = k.forRange(k.i32(0), blocks, k.i32(1), {k.i32(0), k.i32(0)}, [&](I32 b, const std::vector<I32>& v) {
      I32 c = (partial + k.widen(b * E + e)).loadI32();
      return std::vector<I32>{v[0] + c, v[1] + k.select(b < block, c, k.i32(0))};
    });
    mine.storeI32(e, sums[0]);
    before.storeI32(e, sums[1]);
  });
  k.block().sync();
  k.ifThen(tid == 0, [&] {
    resetIfLastBlock(k, left, blocks, [&] {
      arrived.storeI64(k.i64(0));
      left.storeI32(k.i32(0));
    });
  });
}

void Prologue::exchange() {
  // 3. All-gather the count matrix (block 0): my row into every rank's slab [parity], then my call's word, then one
  // flag per source rank; every block waits for the flags.
  I64 expected = epoch + 1;
  k.ifThen(block == 0, [&] {
    k.forRange(tid, k.i32(E), k.i32(T), [&](I32 e) {
      k.forRange(k.i32(0), ctx.nranks(), k.i32(1),
                 [&](I32 p) { k.peer(ctx, countAt(parity, me, e), p).storeI32(mine.loadI32(e)); });
    });
    k.block().sync();
    k.ifThen(tid == 0, [&] {
      k.forRange(k.i32(0), ctx.nranks(), k.i32(1), [&](I32 p) {
        k.peer(ctx, callAt(parity, me), p).storeI64(call);  // ordered before the flag by the signal's release
        k.signal(k.peer(ctx, flags + k.widen(me), p), expected, Scope::system);
      });
    });
  });
  // Every peer's call word came before its flag: when every wait ended in time, each must equal mine, or this call
  // is another layer or role than a peer's (its rows would be another layer's). Each block decides from its own
  // reads, which are the same in every block (so that all its threads, and all blocks, leave together); block 0
  // claims the record, naming the first such peer. Every rank compares, so every rank's call stops here.
  k.ifThen(tid == 0, [&] {
    differs.storeI32(k.i32(0), k.i32(0));
    k.forRange(k.i32(0), ctx.nranks(), k.i32(1), [&](I32 p) {
      k.ifThen(k.errorClear(ctx), [&] {
        k.waitAtLeast(ctx, flags + k.widen(p), expected, peerFlagId(k, p), Scope::system);
      });
    });
    k.ifThen(k.errorClear(ctx), [&] {
      auto first = k.forRange(k.i32(0), ctx.nranks(), k.i32(1), {k.i32(0)}, [&](I32 p, const std::vector<I32>& f) {
        Bool other = !(callAt(parity, p).loadI64() == call);
        return std::vector<I32>{k.select(other && f[0] == 0, p + 1, f[0])};
      });
      differs.storeI32(k.i32(0), first[0]);
    });
  });
  k.block().sync();
  I32 firstDiffering = differs.loadI32(k.i32(0));
  Bool mismatch = !(firstDiffering == 0);
  k.ifThen(mismatch && block == 0 && tid == 0, [&] {
    I32 peer = firstDiffering - 1;
    k.reportError(ctx, uint64_t(abi::ErrorCode::kCallMismatch), peerFlagId(k, peer), callAt(parity, peer).loadI64(),
                  call);
  });
  k.returnIf(mismatch || !k.errorClear(ctx));
}

void Prologue::layOutPools() {
  // 4. Pool layout of every owner (expert e's rows start after the owner's earlier experts; within e, source ranks
  // in order), so base[e] = first row of (me, e) at e's owner: the per-expert sums over source ranks in parallel
  // (one thread per expert, into two rows of the group counts, free now), then one thread walks the experts in
  // shared memory. Every block computes them; block 0 writes them out.
  I32 nranks = ctx.nranks();  // == R, checked above
  SharedTile totals = perGroup.rowSlice(0, 1), below = perGroup.rowSlice(1, 1);  // W >= 4: E <= 1024
  k.forRange(tid, k.i32(E), k.i32(T), [&](I32 e) {
    auto sums = k.forRange(k.i32(0), nranks, k.i32(1), {k.i32(0), k.i32(0)}, [&](I32 src, const std::vector<I32>& v) {
      I32 c = countAt(parity, src, e).loadI32();
      return std::vector<I32>{v[0] + c, v[1] + k.select(src < me, c, k.i32(0))};
    });
    totals.storeI32(e, sums[0]);
    below.storeI32(e, sums[1]);
  });
  k.block().sync();
  k.ifThen(tid == 0, [&] {
    k.forRange(k.i32(0), nranks, k.i32(1), [&](I32 owner) {
      k.forRange(k.i32(0), k.i32(local), k.i32(1), {k.i32(0)}, [&](I32 el, const std::vector<I32>& run) {
        I32 e = owner * local + el;
        base.storeI32(e, run[0] + below.loadI32(e));
        // The pool holds at most `capacity` rows: with dropping, the rows past it are the dropped picks'.
        auto held = [&](const I32& row) { return k.select(row < capacity, row, capacity); };
        k.ifThen(owner == me && block == 0, [&] { (poolOffsets + k.widen(el)).storeI32(held(run[0])); });
        I32 next = run[0] + totals.loadI32(e);
        k.ifThen(owner == me && el == k.i32(local - 1) && block == 0,
                 [&] { (poolOffsets + k.i64(local)).storeI32(held(next)); });
        // Every rank sees every owner's rows: one that would receive more than its pool holds stops every rank
        // here, before a row moves (the dispatch starts only with a clear error record). Each block decides from
        // its own walk (`overflow`, in shared memory), so that all its threads leave together.
        k.ifThen(el == k.i32(local - 1) && capacity < next && drop == k.i32(0), [&] {
          overflow.storeI32(k.i32(0), k.i32(1));
          k.ifThen(block == 0, [&] {
            k.reportError(ctx, uint64_t(abi::ErrorCode::kCapacity), k.widen(owner), k.widen(next), k.widen(capacity));
          });
        });
        return std::vector<I32>{next};
      });
    });
  });
  k.block().sync();
  k.returnIf(overflow.loadI32(k.i32(0)) == k.i32(1));
}

// The picks this rank keeps and drops, and its send tables.
void Prologue::writeTables() {
  // My picks of e that fit at e's owner: the first ones, rows base[e] .. capacity - 1 (all of them unless dropping);
  // the rest are dropped, counted once per call (block 0).
  SharedTile droppedHere = overflow;  // [1]: the picks this rank drops (the overflow flag is clear past here)
  k.forRange(tid, k.i32(E), k.i32(T), [&](I32 e) {
    I32 all = mine.loadI32(e), kept = rowsBelowCapacity(k, base.loadI32(e), all, capacity);
    mine.storeI32(e, kept);
    k.ifThen(kept < all, [&] { droppedHere.atomicAddI32(k.i32(1), all - kept); });
  });
  k.block().sync();
  k.ifThen(block == 0 && tid == 0 && drop == k.i32(1), [&] {
    I32 n = droppedHere.loadI32(k.i32(1));
    k.ifThen(k.i32(0) < n, [&] { k.signal(dropped, k.widen(n), Scope::gpu, /*add=*/true); });
  });
  // My picks grouped by expert: expert e's start in send_list (send_off[E] = my valid picks).
  k.ifThen(tid == 1, [&] {
    auto total = k.forRange(k.i32(0), k.i32(E), k.i32(1), {k.i32(0)}, [&](I32 e, const std::vector<I32>& run) {
      off.storeI32(e, run[0]);
      return std::vector<I32>{run[0] + mine.loadI32(e)};
    });
    off.storeI32(k.i32(E), total[0]);
  });
  k.block().sync();
  k.ifThen(block == 0, [&] {
    k.forRange(tid, k.i32(E + 1), k.i32(T), [&](I32 e) {
      (sendOff + k.widen(e)).storeI32(off.loadI32(e));
      k.ifThen(e < k.i32(E), [&] { (sendBase + k.widen(e)).storeI32(base.loadI32(e)); });
    });
  });
}

void Prologue::placePicks(const Range& range) {
  // 5. Every pick of the block's range: its row at its owner, and the pick in send_list (its order among my picks of
  // its expert: the earlier blocks' picks of it, then its order in this block).
  k.forRange(range.first + tid, range.last, k.i32(T), [&](I32 i) {
    GlobalPtr slot = sendSlot + k.widen(i);
    I32 e = (topkIdx + k.widen(i)).loadI32();
    k.ifThen(e < k.i32(E), [&] {
      I32 j = slot.loadI32() + before.loadI32(e);
      Bool kept = j < mine.loadI32(e);
      k.ifThen(kept, [&] {
        slot.storeI32(base.loadI32(e) + j);
        (sendList + k.widen(off.loadI32(e) + j)).storeI32(i);
      });
      k.ifThen(!kept, [&] {  // dropped: from here on the pick is a -1 for every kernel of the call
        slot.storeI32(k.i32(-1));
        (topkIdx + k.widen(i)).storeI32(k.i32(-1));
      });
    });
  });
}

}  // namespace

mlir::OwningOpRef<mlir::ModuleOp> buildDispatchPrologue(mlir::MLIRContext& mctx, const DispatchPrologueSpec& s) {
  Prologue p(mctx, s);
  p.begin();
  Prologue::Range range = p.count();
  p.meet();
  p.exchange();
  p.layOutPools();
  p.writeTables();
  p.placePicks(range);
  return p.k.finish();
}

}  // namespace megamoe::kernels
