// The megamoe dialect: what upstream MLIR lacks for fused multi-GPU MoE kernels. Tile copies between memory
// levels, the MMA tile loop and its accumulator store (lowered through each target's MMA atom descriptor),
// peer addressing on the symmetric heap, release signals, bounded acquire waits, grid and cross-rank barriers.
// Pointers are !llvm.ptr with address spaces: 0 generic, 1 global, 3 shared (LDS on gfx950).
#ifndef MEGAMOE_OPS_TD
#define MEGAMOE_OPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Dialect/LLVMIR/LLVMTypes.td"

def MegaMoe_Dialect : Dialect {
  let name = "megamoe";
  let cppNamespace = "::megamoe";
  let summary = "Tile, MMA and cross-GPU communication ops of the megamoe kernel compiler";
  let dependentDialects = ["::mlir::LLVM::LLVMDialect"];
}

class MegaMoe_Op<string mnemonic, list<Trait> traits = []> : Op<MegaMoe_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def MemScope_CTA : I32EnumAttrCase<"cta", 0>;
def MemScope_GPU : I32EnumAttrCase<"gpu", 1>;
def MemScope_System : I32EnumAttrCase<"system", 2>;
def MemScopeAttr : I32EnumAttr<"MemScope", "memory-model scope of a signal or wait",
    [MemScope_CTA, MemScope_GPU, MemScope_System]> {
  let cppNamespace = "::megamoe";
}

def SignalKind_Store : I32EnumAttrCase<"store", 0>;
def SignalKind_Add : I32EnumAttrCase<"add", 1>;
def SignalKindAttr : I32EnumAttr<"SignalKind", "how a signal updates its flag",
    [SignalKind_Store, SignalKind_Add]> {
  let cppNamespace = "::megamoe";
}

def Swizzle_None : I32EnumAttrCase<"none", 0>;
def Swizzle_B128 : I32EnumAttrCase<"b128", 1>;
def Swizzle_B128MN : I32EnumAttrCase<"b128_mn", 2>;
def SwizzleAttr : I32EnumAttr<"Swizzle",
    "shared-memory tile layout: none (row-major), b128 (K-major 128-byte rows, chunk c of row r at c ^ (r % 8)), "
    "b128_mn (MN-major: the tile's rows are K; 1024-byte atoms of 8 K-rows x 64 MN elements, atom (K/8, MN/64) at "
    "(K/8 * MN atoms + MN/64) * 1024, each 128-byte row swizzled like b128)",
    [Swizzle_None, Swizzle_B128, Swizzle_B128MN]> {
  let cppNamespace = "::megamoe";
}

def AnyLLVMPtr : Type<CPred<"::llvm::isa<::mlir::LLVM::LLVMPointerType>($_self)">, "LLVM pointer">;

//===----------------------------------------------------------------------===//
// Tiles and MMA
//===----------------------------------------------------------------------===//

def MegaMoe_TileCopyOp : MegaMoe_Op<"tile_copy"> {
  let summary = "copy a rows x cols tile between global and shared memory, all threads of the block";
  let description = [{
    Every thread of the block (`threads` of them) moves 16-byte chunks. Leading dimensions are in elements.
    Loading (global -> shared): rows at or past `rows_valid` are zero-filled in shared memory, never read.
    Storing (shared -> global): rows at or past `rows_valid` are not written. The shared side may be swizzled.
    With `transpose` (loads only), the global rows x cols tile lands in shared memory as cols x rows, so that a
    K x N (or K x M) operand becomes the K-major [N][K] layout mma_tile reads; rows past `rows_valid` (K) are zeros.
    With `async` (loads only), the copy is only issued (sm_90a: cp.async, zero-filling rows past `rows_valid`);
    `async_commit` closes a group of issued copies and `async_wait` waits until at most `pending` groups are
    in flight (or `async_arrive` hands their completion to an mbarrier). On gfx950 async copies complete at once
    and the two group ops vanish. A warp-specialised kernel runs copies on a group of the block's threads:
    threads [first_thread, first_thread + threads).
    With `gather` (plain loads only: not transposed, not b128_mn), tile row r comes from global row
    `row_index[r]` (a shared i32 table with one entry per tile row; entries of rows past `rows_valid` are not
    read) instead of row r: the rows of a tile may lie anywhere in the source.
    ```mlir
    megamoe.tile_copy %src[%lds], %dst[%ldd] rows_valid %n {rows = 64, cols = 64, threads = 128,
        elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>   // 1 = b128
    megamoe.tile_copy %src[%lds], %dst[%ldd] rows_valid %n gather %rows : !llvm.ptr<3> {...} : ...
    ```
  }];
  let arguments = (ins AnyLLVMPtr:$src, I32:$src_ld, AnyLLVMPtr:$dst, I32:$dst_ld, I32:$rows_valid,
                   I64Attr:$rows, I64Attr:$cols, I64Attr:$threads, TypeAttr:$elem, SwizzleAttr:$swizzle,
                   UnitAttr:$transpose, UnitAttr:$async, DefaultValuedAttr<I64Attr, "0">:$first_thread,
                   Optional<AnyLLVMPtr>:$row_index);
  let assemblyFormat = [{
    $src `[` $src_ld `]` `,` $dst `[` $dst_ld `]` `rows_valid` $rows_valid
    (`gather` $row_index^ `:` type($row_index))? attr-dict `:` type($src) `->` type($dst)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    bool isLoad();  // global -> shared
    int64_t elemBytes();
  }];
}

def MegaMoe_AsyncCommitOp : MegaMoe_Op<"async_commit", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "close the group of async tile copies this thread issued since the last commit";
  let assemblyFormat = "attr-dict";
}

def MegaMoe_AsyncWaitOp : MegaMoe_Op<"async_wait", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "wait until at most `pending` committed async copy groups of this thread are in flight";
  let description = [{
    Afterwards the completed copies are visible to this thread and to the MMA unit (sm_90a adds the proxy fence);
    a block barrier is still needed before other threads read them.
  }];
  let arguments = (ins I64Attr:$pending);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def MegaMoe_BulkStoreOp : MegaMoe_Op<"bulk_store", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "start copying `bytes` from shared to global memory without waiting; the calling thread alone";
  let description = [{
    sm_90a: one bulk copy through the async proxy (cp.async.bulk; `bytes` a multiple of 16, both addresses 16-byte
    aligned). The shared source may be rewritten only after `bulk_wait {read}`; the global destination holds the
    data for other threads and GPUs after `bulk_wait` without `read` (which adds the proxy fence a following
    release needs). Shared data written by other threads must reach it through `acc_store` into shared memory
    (which ends with the proxy fence) and a block barrier. gfx950: the thread copies at once, 16 bytes at a time,
    and the group ops vanish. `bulk_commit` closes the group of bulk stores this thread started.
    ```mlir
    megamoe.bulk_store %row, %dst, %bytes : !llvm.ptr<3> -> !llvm.ptr<1>
    ```
  }];
  let arguments = (ins AnyLLVMPtr:$src, AnyLLVMPtr:$dst, I32:$bytes);
  let assemblyFormat = "$src `,` $dst `,` $bytes attr-dict `:` type($src) `->` type($dst)";
  let hasVerifier = 1;
}

def MegaMoe_BulkCommitOp : MegaMoe_Op<"bulk_commit", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "close the group of bulk stores this thread started since the last commit";
  let assemblyFormat = "attr-dict";
}

def MegaMoe_BulkWaitOp : MegaMoe_Op<"bulk_wait", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "wait until at most `pending` committed bulk-store groups of this thread are in flight";
  let description = [{
    With `read`, only until their shared sources have been read (the source may then be rewritten); without, until
    their writes are done and ordered before this thread's later generic-proxy accesses (e.g. a release signal).
  }];
  let arguments = (ins I64Attr:$pending, UnitAttr:$read);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Warp specialisation: thread groups, their barriers, shared-memory mbarriers
//===----------------------------------------------------------------------===//

def MegaMoe_GroupBarrierOp : MegaMoe_Op<"group_barrier", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "barrier `id` among `threads` threads of the block (a warp-specialised kernel's producer or consumers)";
  let description = [{
    Like a block barrier, but only `threads` threads take part (whole warps); id 0 is the block's own barrier and
    is refused. With `arrive` the calling threads only count themselves in and go on (the producer side of a
    hand-over between two groups: the other group's bar.sync on the same id completes it). sm_90a: bar.sync /
    bar.arrive id, threads. gfx950 has no lowering (its kernels do not split).
  }];
  let arguments = (ins I64Attr:$id, I64Attr:$threads, UnitAttr:$arrive);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def MegaMoe_MbarrierInitOp : MegaMoe_Op<"mbarrier_init", [MemoryEffects<[MemWrite]>]> {
  let summary = "initialise the 8-byte shared-memory barrier at `bar` for `count` arrivals per phase; one thread";
  let description = [{
    The phase completes once `count` arrivals (mbarrier_arrive, async_arrive) have been made; the barrier then
    moves to the next phase with the same count. A block barrier must follow before other threads use it.
  }];
  let arguments = (ins AnyLLVMPtr:$bar, I32:$count);
  let assemblyFormat = "$bar `,` $count attr-dict `:` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_MbarrierArriveOp : MegaMoe_Op<"mbarrier_arrive", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "one arrival on the shared barrier, with release semantics at CTA scope; the calling thread alone";
  let arguments = (ins AnyLLVMPtr:$bar);
  let assemblyFormat = "$bar attr-dict `:` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_MbarrierWaitOp : MegaMoe_Op<"mbarrier_wait", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "wait until the barrier's phase with parity `parity` (0 or 1) has completed; acquire";
  let description = [{
    The calling thread alone. Waits on barriers of its own block only, which the block's other threads complete
    (the pipeline's producer and consumers), or with `cluster` also another CTA of the cluster (its arrivals
    released at cluster scope; the acquire is then at cluster scope too); waits on other ranks go through `wait`,
    which is bounded.
  }];
  let arguments = (ins AnyLLVMPtr:$bar, I32:$parity, UnitAttr:$cluster);
  let assemblyFormat = "$bar `,` $parity attr-dict `:` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_AsyncArriveOp : MegaMoe_Op<"async_arrive", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "one arrival on the shared barrier once every async tile copy this thread issued has landed";
  let description = [{
    sm_90a: cp.async.mbarrier.arrive.noinc (the arrival counts toward the barrier's count). A thread that waits
    on the barrier then sees the copied data; it still issues the proxy fence before the MMA reads it.
  }];
  let arguments = (ins AnyLLVMPtr:$bar);
  let assemblyFormat = "$bar attr-dict `:` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_MbarrierExpectTxOp : MegaMoe_Op<"mbarrier_expect_tx", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "one arrival on the shared barrier that also expects `bytes` more from tensor copies (tma_load)";
  let description = [{
    The barrier's phase completes once its arrivals are in and the expected bytes have landed. The calling
    thread alone (the producer that then issues the tma_loads completing on this barrier).
  }];
  let arguments = (ins AnyLLVMPtr:$bar, I32:$bytes);
  let assemblyFormat = "$bar `,` $bytes attr-dict `:` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_TmaLoadOp : MegaMoe_Op<"tma_load", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "one tensor-map box from global to shared memory, completing on an mbarrier (sm_90a TMA)";
  let description = [{
    `map` is a CUtensorMap kernel argument (128 bytes, passed by value: Kernel::argTensorMap); `coords` are the
    box's first element per dimension, innermost first. The box lands at `dst` (1024-byte aligned for the
    128-byte swizzle) in the map's layout; elements outside the tensor are zero-filled. The calling thread alone;
    its bytes count toward the barrier's expected transaction bytes (mbarrier_expect_tx). A non-zero `multicast`
    (a mask of CTAs in the cluster) writes the box into each of those CTAs' shared memory at the same offset and
    completes on each one's barrier at the barrier's offset. gfx950 has no lowering.
  }];
  let arguments = (ins AnyLLVMPtr:$map, AnyLLVMPtr:$dst, AnyLLVMPtr:$bar, Variadic<I32>:$coords,
                   DefaultValuedAttr<I64Attr, "0">:$multicast);
  let assemblyFormat = "$map `[` $coords `]` `,` $dst `,` $bar attr-dict `:` type($map) `,` type($dst) `,` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_TmaStoreOp : MegaMoe_Op<"tma_store", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "one tensor-map box from shared to global memory, in a bulk-store group (sm_90a TMA)";
  let description = [{
    The mirror of `tma_load`: the box at `src` (1024-byte aligned, in the map's layout) goes to the map's tensor at
    `coords` (innermost first); elements outside the tensor are not written. The calling thread alone, without
    waiting: `bulk_commit` closes its group, `bulk_wait {read}` lets `src` be rewritten, `bulk_wait` without it
    makes the writes visible. Data other threads wrote into `src` reaches the copy through their proxy fence
    (`acc_store` into shared memory ends with it) and a barrier. gfx950 has no lowering.
  }];
  let arguments = (ins AnyLLVMPtr:$map, AnyLLVMPtr:$src, Variadic<I32>:$coords);
  let assemblyFormat = "$src `,` $map `[` $coords `]` attr-dict `:` type($src) `,` type($map)";
  let hasVerifier = 1;
}

def MegaMoe_MbarrierArrivePeerOp : MegaMoe_Op<"mbarrier_arrive_peer", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "one arrival on the barrier at the same shared offset in CTA `cta` of the cluster (release)";
  let description = [{
    The calling thread alone. With TMA multicast a producer refills a ring slot in both CTAs of a pair, so each
    CTA's MMA warpgroups release the slot to both producers: CTA scope, as the slot's readers are wgmmas already
    complete. `cluster` releases at cluster scope, for memory accesses of this thread the other CTA must see
    ordered before the arrival (a fence: keep it out of the MMA warps' K loop).
  }];
  let arguments = (ins AnyLLVMPtr:$bar, I32:$cta, UnitAttr:$cluster);
  let assemblyFormat = "$bar `,` $cta attr-dict `:` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_SharedCopyPeerOp : MegaMoe_Op<"shared_copy_peer", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "copy `bytes` of this CTA's shared memory to the same offset in CTA `cta` of the cluster";
  let description = [{
    The calling thread alone (sm_90a: cp.async.bulk.shared::cluster.shared::cta). The copy completes on the
    barrier at `bar`'s offset in CTA `cta` (complete_tx of `bytes`: that CTA expects them with
    mbarrier_expect_tx), which is also when the data is there for its waiters. Shared data this thread wrote
    reaches the copy through a proxy_fence. Source and destination 16-byte aligned, `bytes` a positive multiple
    of 16. The source may be rewritten once the receiver has said so (the copy's completion is only seen there).
    ```mlir
    megamoe.shared_copy_peer %src, %bar, %cta {bytes = 16 : i64} : !llvm.ptr<3>, !llvm.ptr<3>
    ```
  }];
  let arguments = (ins AnyLLVMPtr:$src, AnyLLVMPtr:$bar, I32:$cta, I64Attr:$bytes);
  let assemblyFormat = "$src `,` $bar `,` $cta attr-dict `:` type($src) `,` type($bar)";
  let hasVerifier = 1;
}

def MegaMoe_SharedStorePeerOp : MegaMoe_Op<"shared_store_peer", [MemoryEffects<[MemWrite]>]> {
  let summary = "store an i32 at this shared offset in CTA `cta` of the cluster";
  let description = [{
    The calling thread alone (sm_90a: mapa, then st.shared::cluster.u32). Seen by that CTA's threads after a
    cluster_sync both CTAs pass after the store: how a pair agrees on one value (each CTA stores its own into both,
    then both meet) without a read of the other CTA's memory that could outlive it.
    ```mlir
    megamoe.shared_store_peer %slot, %value, %cta : !llvm.ptr<3>
    ```
  }];
  let arguments = (ins AnyLLVMPtr:$ptr, I32:$value, I32:$cta);
  let assemblyFormat = "$ptr `,` $value `,` $cta attr-dict `:` type($ptr)";
  let hasVerifier = 1;
}

def MegaMoe_ClusterSyncOp : MegaMoe_Op<"cluster_sync", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "every thread of every CTA of the cluster meets (barriers initialised before are visible to all)";
  let description = [{
    Executed by all threads of the block. sm_90a: fence.mbarrier_init.release.cluster, then barrier.cluster
    arrive (release) and wait (acquire). A kernel that multicasts or arrives on its peers' barriers meets its
    cluster after initialising them and again before exiting.
  }];
  let assemblyFormat = "attr-dict";
}

def MegaMoe_ProxyFenceOp : MegaMoe_Op<"proxy_fence", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "order memory written by ordinary stores before this thread's later async-proxy reads (MMA, TMA)";
  let description = [{
    sm_90a: fence.proxy.async.shared::cta (cp.async and st.shared write through the generic proxy, wgmma reads
    through the async proxy); with `global`, fence.proxy.async.global (rows other GPUs or threads stored, seen
    through an acquire, before TMA loads them). The calling thread alone.
  }];
  let arguments = (ins UnitAttr:$global);
  let assemblyFormat = "attr-dict";
}

def MegaMoe_SetMaxRegistersOp : MegaMoe_Op<"set_max_registers", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "raise or lower the calling warpgroup's register budget (sm_90a setmaxnreg)";
  let description = [{
    Executed by all threads of whole warpgroups together. `count` is a multiple of 8 in [24, 256]; with `increase`
    the warpgroup waits until the registers are free. A producer warpgroup that only issues copies gives registers
    back so that the MMA warpgroups can hold their accumulators.
  }];
  let arguments = (ins I64Attr:$count, UnitAttr:$increase);
  let assemblyFormat = "attr-dict";
  let hasVerifier = 1;
}

def MegaMoe_MmaTileOp : MegaMoe_Op<"mma_tile", [MemoryEffects<[MemRead]>]> {
  let summary = "acc += A * B^T for an m x n x k tile with A [m, k] and B [n, k] K-major in shared memory";
  let description = [{
    The MMA loop over one shared-memory stage, executed by all `threads` of the block. Operands are K-major
    rows of 128 bytes (k = 64 bf16) with the b128 swizzle, or with `a_mn_major` / `b_mn_major` K x MN tiles in the
    b128_mn layout, as `tile_copy` writes them. The accumulator is
    the calling thread's fragment: m * n / threads f32 values whose placement is the target's MMA atom fragment
    layout; only `acc_store` interprets it. With `mn_atoms_outer`, MN-major operands hold their 64-element MN
    atoms one after another, each with all k / 8 of its K groups (the order TMA boxes of 64 MN x k land in)
    instead of b128_mn's K-group-major order. Lowering picks the atom from the target's descriptor table
    (sm_90a: wgmma m64nNk16, one warpgroup per 64 rows; gfx950: v_mfma_f32_32x32x16_bf16, one wave per 32 rows).
    Warpgroup g of the block reads A's rows [64g, 64g + 64); with `a_first_rows` every warpgroup reads rows
    [0, 64) (a 64-row tile whose columns the warpgroups split, each with its own B).
    With `k16` (sm_90a only) the op multiplies only the stage's 16-wide K slice number k16 (0 <= k16 < k / 16, a
    run-time value): one wgmma step instead of k / 16, e.g. for the part of a partial last K step that holds rows.
    With `e4m3` both operands are FP8 e4m3 (OCP E4M3FN), K-major only, k = 128 (still one 128-byte row per
    stage): sm_90a wgmma m64nNk32 e4m3, gfx950 v_mfma_f32_32x32x16_fp8_fp8; block scales are the kernel's (the
    partial sum of a stage is scaled into its accumulator), not the op's. With `fresh` the accumulator's values
    are not read (result = A * B; sm_90a: the first wgmma's scale-d is 0): a chain that starts from zero in
    registers it reuses, without filling them with zeros first.
  }];
  let arguments = (ins VectorOfRankAndType<[1], [F32]>:$acc, AnyLLVMPtr:$a, AnyLLVMPtr:$b, Optional<I32>:$k16,
                   I64Attr:$m, I64Attr:$n, I64Attr:$k, I64Attr:$threads,
                   DefaultValuedAttr<I64Attr, "0">:$pending, UnitAttr:$a_mn_major, UnitAttr:$b_mn_major,
                   UnitAttr:$mn_atoms_outer, UnitAttr:$a_first_rows, UnitAttr:$e4m3, UnitAttr:$fresh);
  let results = (outs VectorOfRankAndType<[1], [F32]>:$result);
  let assemblyFormat = [{
    $a `,` $b `,` $acc (`k16` $k16^)? attr-dict `:` type($a) `,` type($b) `,` type($acc) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MegaMoe_MmaDrainOp : MegaMoe_Op<"mma_drain", [MemoryEffects<[MemRead, MemWrite]>,
                                                 AllTypesMatch<["acc", "result"]>]> {
  let summary = "wait for every MMA tile still in flight (pending > 0) and hand back the final accumulator";
  let description = [{
    `mma_tile {pending = 1}` returns while its own MMA may still run (the one before it has finished), so that the
    next stage's copies overlap it. Only the accumulator `mma_drain` returns may be read. With `pending = 1` it
    waits until at most one MMA tile is in flight: `acc` is then the result of a tile issued before the latest one
    (e.g. FP8's previous stage, promoted while the next stage multiplies).
  }];
  let arguments = (ins VectorOfRankAndType<[1], [F32]>:$acc, DefaultValuedAttr<I64Attr, "0">:$pending);
  let results = (outs VectorOfRankAndType<[1], [F32]>:$result);
  let assemblyFormat = "$acc attr-dict `:` type($acc)";
  let hasVerifier = 1;
}

def MegaMoe_AccStoreOp : MegaMoe_Op<"acc_store"> {
  let summary = "store an mma_tile accumulator fragment to a row-major global tile, converting to `elem`";
  let description = [{
    Rows at or past `rows_valid` are not written. `ld` (elements) and the destination must keep 2-element
    alignment: sm_90a stores adjacent column pairs of the wgmma fragment as one access.
    A non-zero `box_rows` (sm_90a, shared memory, 2-byte elements, n a multiple of 64) writes TMA's 128-byte
    swizzled boxes instead of rows `ld` apart: columns in boxes of 64 (box c / 64 at (c / 64) box_rows 128 bytes),
    fragment row r at row r % box_rows of its box, 16-byte chunk q of that row at q ^ (r % 8) (what a tma_store of
    64 x box_rows boxes reads; `ld` is unused).
  }];
  let arguments = (ins VectorOfRankAndType<[1], [F32]>:$acc, AnyLLVMPtr:$dst, I32:$ld, I32:$rows_valid,
                   I64Attr:$m, I64Attr:$n, I64Attr:$threads, TypeAttr:$elem,
                   DefaultValuedAttr<I64Attr, "0">:$box_rows);
  let assemblyFormat = [{
    $acc `,` $dst `[` $ld `]` `rows_valid` $rows_valid attr-dict `:` type($acc) `,` type($dst)
  }];
  let hasVerifier = 1;
}

def MegaMoe_AccRowScalesOp : MegaMoe_Op<"acc_row_scales", [MemoryEffects<[MemRead]>]> {
  let summary = "the scales of this thread's accumulator rows: row_scales[row * ld] * factor (FP8 promotion)";
  let description = [{
    The loads of the FP8 block-scale promotion (acc_scale_add), apart from it so that a K loop can issue them a
    step ahead of the MMA they scale: an L2 load waited for behind every stage's promotion idled the tensor cores.
    `row_scales` is f32 in global memory (A's scale of each row for one K block), each `factor` a B scale of the
    block. Element f * rows + j is the thread's j-th distinct row (of `rows`, the count of an m x n fragment in the
    target atom's order: wgmma 2, rows lane / 4 and 8 more of its warp's 16; MFMA 32 x 32: 16) times factor f: the
    result's length must be rows times the factors, or the lowering fails. Several factors scale column groups
    apart (acc_scale_add), e.g. a tile of gate | up halves from two weight blocks. Rows at or past `rows_valid`
    read row 0's scale and get 0.
  }];
  let arguments = (ins AnyLLVMPtr:$row_scales, I32:$ld, I32:$rows_valid, Variadic<F32>:$factors,
                   I64Attr:$m, I64Attr:$n, I64Attr:$threads);
  let results = (outs VectorOfRankAndType<[1], [F32]>:$scales);
  let assemblyFormat = [{
    $row_scales `[` $ld `]` `rows_valid` $rows_valid `factor` $factors attr-dict `:` type($row_scales) `->`
    type($scales)
  }];
  let hasVerifier = 1;
}

def MegaMoe_AccScaleAddOp : MegaMoe_Op<"acc_scale_add", [Pure, AllTypesMatch<["acc", "partial", "result"]>]> {
  let summary = "acc + partial * scales[row] over one accumulator fragment (FP8 block-scale promotion)";
  let description = [{
    The promotion of block-scaled FP8 GEMMs: `partial` is one K block's product (an mma_tile chain started from
    zeros, in the same m x n fragment as `acc`), scaled per row by `scales` (acc_row_scales of the same fragment)
    and added to `acc` in f32. The row of each fragment element is the target's MMA atom's, as in `acc_store`; a
    row past rows_valid has scale 0 and adds nothing. With G = scales' length / the target's rows per thread, the
    n columns split into G equal groups, and an element of group g takes scale g * rows + its row's (one B block
    scale per group; n / G a multiple of the columns one thread's atom spans, or the lowering fails).
  }];
  let arguments = (ins VectorOfRankAndType<[1], [F32]>:$acc, VectorOfRankAndType<[1], [F32]>:$partial,
                   VectorOfRankAndType<[1], [F32]>:$scales, I64Attr:$m, I64Attr:$n, I64Attr:$threads);
  let results = (outs VectorOfRankAndType<[1], [F32]>:$result);
  let assemblyFormat = [{
    $acc `,` $partial `,` $scales attr-dict `:` type($acc) `,` type($scales)
  }];
  let hasVerifier = 1;
}

def MegaMoe_PackE4m3Op : MegaMoe_Op<"pack_e4m3", [Pure]> {
  let summary = "f32 values rounded to FP8 e4m3 codes (nearest, ties to even; finite values saturate at +-448)";
  let description = [{
    Each f32 element of `values` becomes the byte of its OCP E4M3FN code, in the same order: rounded to nearest,
    ties to even, magnitudes beyond 448 (the largest finite e4m3) to +-448, NaN to NaN. An even element count:
    sm_90a converts pairs (cvt.rn.satfinite.e4m3x2.f32), gfx950 pairs into words (v_cvt_pk_fp8_f32, after an
    explicit clamp to +-448 that keeps NaN).
  }];
  let arguments = (ins VectorOfRankAndType<[1], [F32]>:$values);
  let results = (outs VectorOfRankAndType<[1], [I8]>:$codes);
  let assemblyFormat = "$values attr-dict `:` type($values) `->` type($codes)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Symmetric heap and signalling
//===----------------------------------------------------------------------===//

def MegaMoe_PeerPtrOp : MegaMoe_Op<"peer_ptr", [MemoryEffects<[MemRead]>]> {
  let summary = "the address of a local symmetric-heap location in peer `peer`'s heap";
  let description = [{
    `offsets` points at the rank's table of i64 peer offsets (peer base minus local base); the result is
    `ptr + offsets[peer]` in bytes. Every rank's heap has the same layout, so this names the same object.
  }];
  let arguments = (ins AnyLLVMPtr:$ptr, AnyLLVMPtr:$offsets, I32:$peer);
  let results = (outs AnyLLVMPtr:$result);
  let assemblyFormat = "$ptr `,` $offsets `[` $peer `]` attr-dict `:` type($ptr) `,` type($offsets) `->` type($result)";
  let hasVerifier = 1;
}

def MegaMoe_SignalOp : MegaMoe_Op<"signal", [MemoryEffects<[MemWrite]>]> {
  let summary = "publish: release fence at `scope`, then store or add `value` to the 64-bit flag";
  let description = [{
    Everything the thread wrote before the signal is visible at `scope` to a thread that acquires the flag
    and sees the new value. Executed by the calling thread alone.
  }];
  let arguments = (ins AnyLLVMPtr:$flag, I64:$value, MemScopeAttr:$scope, SignalKindAttr:$kind);
  let assemblyFormat = "$kind $flag `,` $value `scope` `(` $scope `)` attr-dict `:` type($flag)";
  let hasVerifier = 1;
}

def MegaMoe_WaitOp : MegaMoe_Op<"wait", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "bounded acquire wait until the 64-bit flag >= expected (unsigned); false on timeout";
  let description = [{
    Spins with acquire loads at `scope`. Past `timeout_ns` nanoseconds it claims the error record at `error`
    (abi::DeviceError: CAS code 0 -> kWaitTimeout, then rank, flag_id, seen, expected, block) and returns false;
    the kernel should then exit. It never spins forever. Executed by the calling thread alone.
  }];
  let arguments = (ins AnyLLVMPtr:$flag, I64:$expected, I64:$timeout_ns, AnyLLVMPtr:$error, I32:$rank,
                   I64:$flag_id, MemScopeAttr:$scope);
  let results = (outs I1:$ok);
  let assemblyFormat = [{
    $flag `at_least` $expected `timeout` $timeout_ns `error` $error `(` $rank `,` $flag_id `)` `scope` `(` $scope `)`
    attr-dict `:` type($flag) `,` type($error)
  }];
  let hasVerifier = 1;
}

def MegaMoe_GridBarrierOp : MegaMoe_Op<"grid_barrier", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "all blocks of the grid meet; the counter is monotonic, `expected` = blocks * generation";
  let description = [{
    Executed by every thread of every block. Thread 0 adds 1 (release, gpu scope) and waits (bounded) until the
    counter reaches `expected`; the block then re-converges. Returns true when the rank's error record is still
    clear, so that every thread can exit on any error. Never reset: callers derive `expected` from the epoch.
  }];
  let arguments = (ins AnyLLVMPtr:$counter, I64:$expected, I64:$timeout_ns, AnyLLVMPtr:$error, I32:$rank);
  let results = (outs I1:$ok);
  let assemblyFormat = [{
    $counter `at_least` $expected `timeout` $timeout_ns `error` $error `(` $rank `)` attr-dict `:` type($counter) `,` type($error)
  }];
  let hasVerifier = 1;
}

def MegaMoe_RankBarrierOp : MegaMoe_Op<"rank_barrier", [MemoryEffects<[MemRead, MemWrite]>]> {
  let summary = "all ranks meet: each stores `value` into slot [rank] of every peer's flag array, then waits";
  let description = [{
    `flags` is a local symmetric-heap array of `nranks` u64 slots. Executed by every thread of one block per
    rank; thread 0 signals (system scope) and waits for all slots >= `value`. Returns true when the error record
    is clear afterwards.
  }];
  let arguments = (ins AnyLLVMPtr:$flags, AnyLLVMPtr:$offsets, I32:$rank, I32:$nranks, I64:$value,
                   I64:$timeout_ns, AnyLLVMPtr:$error);
  let results = (outs I1:$ok);
  let assemblyFormat = [{
    $flags `,` $offsets `(` $rank `of` $nranks `)` `at_least` $value `timeout` $timeout_ns `error` $error attr-dict
    `:` type($flags) `,` type($offsets) `,` type($error)
  }];
  let hasVerifier = 1;
}

#endif // MEGAMOE_OPS_TD
