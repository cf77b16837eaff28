// Round trip of every megamoe op: custom form parse -> print -> reparse, and through the generic form.
// RUN: megamoe-opt %s | megamoe-opt | FileCheck %s
// RUN: megamoe-opt %s --mlir-print-op-generic | megamoe-opt | FileCheck %s

// CHECK-LABEL: llvm.func @tile_copy_load
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[N:[^:]+]]: i32)
// CHECK: megamoe.tile_copy %[[SRC]][%[[LD]]], %[[DST]][%[[LD]]] rows_valid %[[N]]
// CHECK-SAME: {cols = 64 : i64, elem = bf16, rows = 64 : i64, swizzle = 1 : i32, threads = 128 : i64}
// CHECK-SAME: : !llvm.ptr<1> -> !llvm.ptr<3>
llvm.func @tile_copy_load(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %n: i32) {
  megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %n {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// CHECK-LABEL: llvm.func @tile_copy_gather
// CHECK: megamoe.tile_copy %{{.*}}[%{{.*}}], %{{.*}}[%{{.*}}] rows_valid %{{.*}} gather %[[ROWS:[^ ]+]] : !llvm.ptr<3>
// CHECK-SAME: {async, cols = 64 : i64, elem = bf16, rows = 128 : i64, swizzle = 1 : i32, threads = 256 : i64}
llvm.func @tile_copy_gather(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %rows: !llvm.ptr<3>, %ld: i32, %n: i32) {
  megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %n gather %rows : !llvm.ptr<3> {rows = 128, cols = 64, threads = 256, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// The store direction, a generic destination, distinct leading dimensions, f32, no swizzle.
// CHECK-LABEL: llvm.func @tile_copy_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr, %[[LDS:[^:]+]]: i32, %[[LDD:[^:]+]]: i32, %[[N:[^:]+]]: i32)
// CHECK: megamoe.tile_copy %[[SRC]][%[[LDS]]], %[[DST]][%[[LDD]]] rows_valid %[[N]]
// CHECK-SAME: {cols = 32 : i64, elem = f32, rows = 16 : i64, swizzle = 0 : i32, threads = 128 : i64}
// CHECK-SAME: : !llvm.ptr<3> -> !llvm.ptr
llvm.func @tile_copy_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr, %lds: i32, %ldd: i32, %n: i32) {
  megamoe.tile_copy %src[%lds], %dst[%ldd] rows_valid %n {rows = 16, cols = 32, threads = 128, elem = f32, swizzle = 0 : i32} : !llvm.ptr<3> -> !llvm.ptr
  llvm.return
}

// CHECK-LABEL: llvm.func @tile_copy_load_transposed
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[N:[^:]+]]: i32)
// CHECK: megamoe.tile_copy %[[SRC]][%[[LD]]], %[[DST]][%[[LD]]] rows_valid %[[N]]
// CHECK-SAME: {cols = 128 : i64, elem = bf16, rows = 64 : i64, swizzle = 1 : i32, threads = 128 : i64, transpose}
// CHECK-SAME: : !llvm.ptr<1> -> !llvm.ptr<3>
llvm.func @tile_copy_load_transposed(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %n: i32) {
  megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %n {rows = 64, cols = 128, threads = 128, elem = bf16, swizzle = 1 : i32, transpose} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// An async load (issued only) into a b128 tile, then the group ops: async_commit closes the group, async_wait
// leaves at most `pending` groups in flight.
// CHECK-LABEL: llvm.func @tile_copy_load_async
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[N:[^:]+]]: i32)
// CHECK: megamoe.tile_copy %[[SRC]][%[[LD]]], %[[DST]][%[[LD]]] rows_valid %[[N]]
// CHECK-SAME: {async, cols = 64 : i64, elem = bf16, rows = 64 : i64, swizzle = 1 : i32, threads = 128 : i64}
// CHECK-SAME: : !llvm.ptr<1> -> !llvm.ptr<3>
// CHECK-NEXT: megamoe.async_commit{{$}}
// CHECK-NEXT: megamoe.async_wait {pending = 0 : i64}
// CHECK-NEXT: megamoe.async_wait {pending = 7 : i64}
// CHECK-NEXT: llvm.return
llvm.func @tile_copy_load_async(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %n: i32) {
  megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %n {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
  megamoe.async_commit
  megamoe.async_wait {pending = 0}
  megamoe.async_wait {pending = 7}
  llvm.return
}

// A bulk store of one shared row to global memory, then its group ops.
// CHECK-LABEL: llvm.func @bulk_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr<1>, %[[N:[^:]+]]: i32)
// CHECK: megamoe.bulk_store %[[SRC]], %[[DST]], %[[N]] : !llvm.ptr<3> -> !llvm.ptr<1>
// CHECK-NEXT: megamoe.bulk_commit{{$}}
// CHECK-NEXT: megamoe.bulk_wait {pending = 0 : i64, read}
// CHECK-NEXT: megamoe.bulk_wait {pending = 0 : i64}
// CHECK-NEXT: llvm.return
llvm.func @bulk_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %n: i32) {
  megamoe.bulk_store %src, %dst, %n : !llvm.ptr<3> -> !llvm.ptr<1>
  megamoe.bulk_commit
  megamoe.bulk_wait {pending = 0, read}
  megamoe.bulk_wait {pending = 0}
  llvm.return
}

// A K x N = 64 x 128 bf16 tile in the MN-major b128_mn layout (swizzle = 2), synchronous and async, distinct
// leading dimensions.
// CHECK-LABEL: llvm.func @tile_copy_load_b128_mn
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LDS:[^:]+]]: i32, %[[LDD:[^:]+]]: i32, %[[N:[^:]+]]: i32)
// CHECK: megamoe.tile_copy %[[SRC]][%[[LDS]]], %[[DST]][%[[LDD]]] rows_valid %[[N]]
// CHECK-SAME: {cols = 128 : i64, elem = bf16, rows = 64 : i64, swizzle = 2 : i32, threads = 256 : i64}
// CHECK-SAME: : !llvm.ptr<1> -> !llvm.ptr<3>
// CHECK-NEXT: megamoe.tile_copy %[[SRC]][%[[LDS]]], %[[DST]][%[[LDD]]] rows_valid %[[N]]
// CHECK-SAME: {async, cols = 128 : i64, elem = bf16, rows = 64 : i64, swizzle = 2 : i32, threads = 256 : i64}
// CHECK-SAME: : !llvm.ptr<1> -> !llvm.ptr<3>
llvm.func @tile_copy_load_b128_mn(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %lds: i32, %ldd: i32, %n: i32) {
  megamoe.tile_copy %src[%lds], %dst[%ldd] rows_valid %n {rows = 64, cols = 128, threads = 256, elem = bf16, swizzle = 2 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  megamoe.tile_copy %src[%lds], %dst[%ldd] rows_valid %n {rows = 64, cols = 128, threads = 256, elem = bf16, swizzle = 2 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// CHECK-LABEL: llvm.func @mma_tile
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<64xf32>)
// CHECK: %[[R:.*]] = megamoe.mma_tile %[[A]], %[[B]], %[[ACC]] {k = 64 : i64, m = 64 : i64, n = 128 : i64, threads = 128 : i64}
// CHECK-SAME: : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
// CHECK: llvm.return %[[R]]
llvm.func @mma_tile(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return %r : vector<64xf32>
}

// pending = 1 and both MN-major flags survive; an explicit pending = 0 is the default and is not printed. Each
// flag also appears alone (it is a separate attribute, not a pair).
// CHECK-LABEL: llvm.func @mma_tile_pending_mn_major
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<64xf32>)
// CHECK: %[[R1:.*]] = megamoe.mma_tile %[[A]], %[[B]], %[[ACC]] {a_mn_major, b_mn_major, k = 64 : i64, m = 64 : i64, n = 128 : i64, pending = 1 : i64, threads = 128 : i64}
// CHECK-SAME: : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
// CHECK-NEXT: %[[R0:.*]] = megamoe.mma_tile %[[A]], %[[B]], %[[R1]] {k = 64 : i64, m = 64 : i64, n = 128 : i64, threads = 128 : i64}
// CHECK-SAME: : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
// CHECK-NEXT: %[[RA:.*]] = megamoe.mma_tile %[[A]], %[[B]], %[[R0]] {a_mn_major, k = 64 : i64, m = 64 : i64, n = 128 : i64, threads = 128 : i64}
// CHECK-NEXT: %[[RB:.*]] = megamoe.mma_tile %[[A]], %[[B]], %[[RA]] {b_mn_major, k = 64 : i64, m = 64 : i64, n = 128 : i64, pending = 1 : i64, threads = 128 : i64}
// CHECK-NEXT: llvm.return %[[RB]]
llvm.func @mma_tile_pending_mn_major(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
  %r1 = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, pending = 1, a_mn_major, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  %r0 = megamoe.mma_tile %a, %b, %r1 {m = 64, n = 128, k = 64, threads = 128, pending = 0} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  %ra = megamoe.mma_tile %a, %b, %r0 {m = 64, n = 128, k = 64, threads = 128, a_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  %rb = megamoe.mma_tile %a, %b, %ra {m = 64, n = 128, k = 64, threads = 128, pending = 1, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return %rb : vector<64xf32>
}

// CHECK-LABEL: llvm.func @mma_drain
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<16xf32>)
// CHECK: %[[D:.*]] = megamoe.mma_drain %[[ACC]] : vector<16xf32>
// CHECK-NEXT: llvm.return %[[D]] : vector<16xf32>
llvm.func @mma_drain(%acc: vector<16xf32>) -> vector<16xf32> {
  %d = megamoe.mma_drain %acc : vector<16xf32>
  llvm.return %d : vector<16xf32>
}

// CHECK-LABEL: llvm.func @acc_store
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<16xf32>, %[[C:[^:]+]]: !llvm.ptr<1>, %[[LD:[^:]+]]: i32, %[[N:[^:]+]]: i32)
// CHECK: megamoe.acc_store %[[ACC]], %[[C]][%[[LD]]] rows_valid %[[N]] {elem = f16, m = 128 : i64, n = 32 : i64, threads = 256 : i64}
// CHECK-SAME: : vector<16xf32>, !llvm.ptr<1>
llvm.func @acc_store(%acc: vector<16xf32>, %c: !llvm.ptr<1>, %ld: i32, %n: i32) {
  megamoe.acc_store %acc, %c[%ld] rows_valid %n {m = 128, n = 32, threads = 256, elem = f16} : vector<16xf32>, !llvm.ptr<1>
  llvm.return
}

// CHECK-LABEL: llvm.func @peer_ptr
// CHECK-SAME: (%[[P:[^:]+]]: !llvm.ptr<1>, %[[OFF:[^:]+]]: !llvm.ptr<1>, %[[PEER:[^:]+]]: i32)
// CHECK: %[[Q:.*]] = megamoe.peer_ptr %[[P]], %[[OFF]][%[[PEER]]] : !llvm.ptr<1>, !llvm.ptr<1> -> !llvm.ptr<1>
// CHECK: llvm.return %[[Q]]
llvm.func @peer_ptr(%p: !llvm.ptr<1>, %off: !llvm.ptr<1>, %peer: i32) -> !llvm.ptr<1> {
  %q = megamoe.peer_ptr %p, %off[%peer] : !llvm.ptr<1>, !llvm.ptr<1> -> !llvm.ptr<1>
  llvm.return %q : !llvm.ptr<1>
}

// Every kind and every scope; a shared flag at cta scope.
// CHECK-LABEL: llvm.func @signal
// CHECK-SAME: (%[[F:[^:]+]]: !llvm.ptr<1>, %[[S:[^:]+]]: !llvm.ptr<3>, %[[V:[^:]+]]: i64)
// CHECK: megamoe.signal store %[[F]], %[[V]] scope(system) : !llvm.ptr<1>
// CHECK: megamoe.signal add %[[F]], %[[V]] scope(gpu) : !llvm.ptr<1>
// CHECK: megamoe.signal store %[[S]], %[[V]] scope(cta) : !llvm.ptr<3>
llvm.func @signal(%f: !llvm.ptr<1>, %s: !llvm.ptr<3>, %v: i64) {
  megamoe.signal store %f, %v scope(system) : !llvm.ptr<1>
  megamoe.signal add %f, %v scope(gpu) : !llvm.ptr<1>
  megamoe.signal store %s, %v scope(cta) : !llvm.ptr<3>
  llvm.return
}

// CHECK-LABEL: llvm.func @wait
// CHECK-SAME: (%[[F:[^:]+]]: !llvm.ptr<1>, %[[S:[^:]+]]: !llvm.ptr<3>, %[[ERR:[^:]+]]: !llvm.ptr<1>, %[[V:[^:]+]]: i64, %[[T:[^:]+]]: i64, %[[R:[^:]+]]: i32, %[[ID:[^:]+]]: i64)
// CHECK: %[[OK:.*]] = megamoe.wait %[[F]] at_least %[[V]] timeout %[[T]] error %[[ERR]](%[[R]], %[[ID]]) scope(system) : !llvm.ptr<1>, !llvm.ptr<1>
// CHECK: megamoe.wait %[[S]] at_least %[[V]] timeout %[[T]] error %[[ERR]](%[[R]], %[[ID]]) scope(cta) : !llvm.ptr<3>, !llvm.ptr<1>
// CHECK: llvm.return %[[OK]] : i1
llvm.func @wait(%f: !llvm.ptr<1>, %s: !llvm.ptr<3>, %err: !llvm.ptr<1>, %v: i64, %t: i64, %r: i32, %id: i64) -> i1 {
  %ok = megamoe.wait %f at_least %v timeout %t error %err(%r, %id) scope(system) : !llvm.ptr<1>, !llvm.ptr<1>
  %ok2 = megamoe.wait %s at_least %v timeout %t error %err(%r, %id) scope(cta) : !llvm.ptr<3>, !llvm.ptr<1>
  llvm.return %ok : i1
}

// CHECK-LABEL: llvm.func @grid_barrier
// CHECK-SAME: (%[[C:[^:]+]]: !llvm.ptr<1>, %[[ERR:[^:]+]]: !llvm.ptr<1>, %[[R:[^:]+]]: i32, %[[E:[^:]+]]: i64, %[[T:[^:]+]]: i64)
// CHECK: %[[OK:.*]] = megamoe.grid_barrier %[[C]] at_least %[[E]] timeout %[[T]] error %[[ERR]](%[[R]]) : !llvm.ptr<1>, !llvm.ptr<1>
// CHECK: llvm.return %[[OK]] : i1
llvm.func @grid_barrier(%c: !llvm.ptr<1>, %err: !llvm.ptr<1>, %r: i32, %e: i64, %t: i64) -> i1 {
  %ok = megamoe.grid_barrier %c at_least %e timeout %t error %err(%r) : !llvm.ptr<1>, !llvm.ptr<1>
  llvm.return %ok : i1
}

// CHECK-LABEL: llvm.func @rank_barrier
// CHECK-SAME: (%[[F:[^:]+]]: !llvm.ptr<1>, %[[OFF:[^:]+]]: !llvm.ptr<1>, %[[ERR:[^:]+]]: !llvm.ptr<1>, %[[R:[^:]+]]: i32, %[[NR:[^:]+]]: i32, %[[V:[^:]+]]: i64, %[[T:[^:]+]]: i64)
// CHECK: %[[OK:.*]] = megamoe.rank_barrier %[[F]], %[[OFF]](%[[R]] of %[[NR]]) at_least %[[V]] timeout %[[T]] error %[[ERR]] : !llvm.ptr<1>, !llvm.ptr<1>, !llvm.ptr<1>
// CHECK: llvm.return %[[OK]] : i1
llvm.func @rank_barrier(%f: !llvm.ptr<1>, %off: !llvm.ptr<1>, %err: !llvm.ptr<1>, %r: i32, %nr: i32, %v: i64, %t: i64) -> i1 {
  %ok = megamoe.rank_barrier %f, %off(%r of %nr) at_least %v timeout %t error %err : !llvm.ptr<1>, !llvm.ptr<1>, !llvm.ptr<1>
  llvm.return %ok : i1
}
