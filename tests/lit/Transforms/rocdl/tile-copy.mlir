// megamoe-lower-to-rocdl: tile_copy for gfx950 (swizzle, transpose; async and b128_mn as sync K-major).
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: nvvm.

//===----------------------------------------------------------------------===//
// tile_copy
//===----------------------------------------------------------------------===//

// Load into a b128-swizzled tile: 64 x 64 bf16, 4 chunks per thread, 8 per row; rows past rows_valid zero-filled.
// No proxy fence on gfx950 (LDS has one proxy). Kernels get rocdl.kernel and their fixed work-group size.
// CHECK-LABEL: llvm.func @tile_copy_load
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-SAME: rocdl.flat_work_group_size = "128,128", rocdl.kernel, rocdl.reqd_work_group_size = array<i32: 128, 1, 1>
// CHECK-DAG: %[[ZEROS:.*]] = arith.constant dense<0> : vector<4xi32>
// CHECK-DAG: %[[PER_THREAD:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK: %[[TID:.*]] = rocdl.workitem.id.x : i32
// CHECK-NEXT: scf.for %[[IT:.*]] = %{{.*}} to %[[PER_THREAD]] step %{{.*}} : i32 {
// Row tid / 8 + 16 it, chunk tid % 8 (chunk it * 128 + tid), swizzle phase (tid / 8) % 8.
// CHECK-NEXT: %[[ROW_T:.*]] = arith.divui %[[TID]], %[[C8]] : i32
// CHECK-NEXT: %[[STEP:.*]] = arith.muli %[[IT]], %[[C16]] : i32
// CHECK-NEXT: %[[ROW:.*]] = arith.addi %[[ROW_T]], %[[STEP]] : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %[[TID]], %[[C8]] : i32
// CHECK-NEXT: %[[PHASE:.*]] = arith.remui %[[ROW_T]], %[[C8]] : i32
// CHECK-NOT: arith.xori
// CHECK: %[[SRC_PTR:.*]] = llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// The shared side is swizzled, chunk ^ (row % 8); rows at or past rows_valid are not read.
// CHECK-DAG: %[[INSIDE:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-DAG: %[[SWIZZLED:.*]] = arith.xori %[[CHUNK]], %[[PHASE]] : i32
// CHECK-DAG: arith.muli %[[SWIZZLED]], %[[C16]] : i32
// CHECK-DAG: %[[DST_PTR:.*]] = llvm.getelementptr %[[DST]][%{{.*}}] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i8
// CHECK: %[[CHUNK_VALUE:.*]] = scf.if %[[INSIDE]] -> (vector<4xi32>) {
// CHECK-NEXT: %[[LOADED:.*]] = llvm.load %[[SRC_PTR]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NEXT: scf.yield %[[LOADED]] : vector<4xi32>
// CHECK-NEXT: } else {
// CHECK-NEXT: scf.yield %[[ZEROS]] : vector<4xi32>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.store %[[CHUNK_VALUE]], %[[DST_PTR]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<3>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_load(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) attributes {megamoe.kernel, megamoe.block_threads = 128 : i64} {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}

// -----

// Store from an unswizzled tile into global memory; rows past rows_valid are not written.
// CHECK-LABEL: llvm.func @tile_copy_store(
// CHECK-SAME: %[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr<1>, %[[LDS:[^:]+]]: i32, %[[LDD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-NOT: rocdl.kernel
// CHECK: %[[ROW_T:.*]] = arith.divui
// CHECK: %[[ROW:.*]] = arith.addi %[[ROW_T]], %{{.*}} : i32
// CHECK: arith.extui %[[LDS]] : i32 to i64
// CHECK: %[[SRC_PTR:.*]] = llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i8
// CHECK-DAG: %[[INSIDE:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-DAG: arith.extui %[[LDD]] : i32 to i64
// CHECK-DAG: %[[DST_PTR:.*]] = llvm.getelementptr %[[DST]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK: scf.if %[[INSIDE]] {
// CHECK-NEXT: %[[V:.*]] = llvm.load %[[SRC_PTR]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK-NEXT: llvm.store %[[V]], %[[DST_PTR]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %lds: i32, %ldd: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%lds], %dst[%ldd] rows_valid %rows_valid {rows = 32, cols = 64, threads = 256, elem = f32, swizzle = 0 : i32} : !llvm.ptr<3> -> !llvm.ptr<1>
    llvm.return
  }
  // The same copy: no swizzle anywhere in it.
  // CHECK-LABEL: llvm.func @tile_copy_store_no_swizzle
  // CHECK-NOT: arith.xori
  // CHECK: llvm.return
  llvm.func @tile_copy_store_no_swizzle(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %lds: i32, %ldd: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%lds], %dst[%ldd] rows_valid %rows_valid {rows = 32, cols = 64, threads = 256, elem = f32, swizzle = 0 : i32} : !llvm.ptr<3> -> !llvm.ptr<1>
    llvm.return
  }
}

// -----

// Transposing load (K x N global -> K-major [N][K] shared): each 16-byte chunk becomes 8 two-byte LDS stores down
// one column, with the swizzle applied per destination row. The addressing is shared with sm_90a and checked in
// detail there; here: the shape, and no proxy fence.
// CHECK-LABEL: llvm.func @tile_copy_load_transposed
// CHECK: llvm.bitcast %{{.*}} : vector<4xi32> to vector<8xbf16>
// CHECK-COUNT-8: llvm.store %{{.*}}, %{{.*}} {alignment = 2 : i64} : bf16, !llvm.ptr<3>
// CHECK-NOT: llvm.store
// CHECK: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_load_transposed(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 128, threads = 128, elem = bf16, swizzle = 1 : i32, transpose} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}

// -----

// gfx950 has no asynchronous global -> LDS copy here: an async load is the plain synchronous load (scf.if, 16-byte
// load, zero fill, 16-byte LDS store), with no select and no fence.
// CHECK-LABEL: llvm.func @tile_copy_load_async
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[ZEROS:.*]] = arith.constant dense<0> : vector<4xi32>
// CHECK-DAG: %[[PER_THREAD:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK: %[[TID:.*]] = rocdl.workitem.id.x : i32
// CHECK-NEXT: scf.for %[[IT:.*]] = %{{.*}} to %[[PER_THREAD]] step %{{.*}} : i32 {
// CHECK: %[[ROW_T:.*]] = arith.divui %{{.*}}, %[[C8]] : i32
// CHECK: %[[ROW:.*]] = arith.addi %[[ROW_T]], %{{.*}} : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %{{.*}}, %[[C8]] : i32
// CHECK: %[[SRC_PTR:.*]] = llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NEXT: %[[INSIDE:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK: arith.xori %[[CHUNK]], %{{.*}} : i32
// CHECK: %[[DST_PTR:.*]] = llvm.getelementptr %[[DST]][%{{.*}}] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[CHUNK_VALUE:.*]] = scf.if %[[INSIDE]] -> (vector<4xi32>) {
// CHECK-NEXT: %[[LOADED:.*]] = llvm.load %[[SRC_PTR]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NEXT: scf.yield %[[LOADED]] : vector<4xi32>
// CHECK-NEXT: } else {
// CHECK-NEXT: scf.yield %[[ZEROS]] : vector<4xi32>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.store %[[CHUNK_VALUE]], %[[DST_PTR]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<3>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_load_async(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}

// -----

// A K x N = 64 x 128 bf16 b128_mn tile is not kept MN-major here: MFMA wants 8 consecutive K per lane, so the copy
// transposes it into the K-major b128 layout mma_tile reads (N rows of 64 K = 128 bytes), like `transpose`: source
// K row r, chunk c (N elements 8c .. 8c + 7) becomes column r of shared rows 8c + j, byte offset
// (8c + j) * 128 + ((r / 8) ^ ((8c + j) % 8)) * 16 + (r % 8) * 2; eight 2-byte LDS stores, no 1024-byte atoms.
// CHECK-LABEL: llvm.func @tile_copy_load_b128_mn
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[ZEROS:.*]] = arith.constant dense<0> : vector<4xi32>
// CHECK-DAG: %[[PER_THREAD:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C7:.*]] = arith.constant 7 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK: scf.for %[[IT:.*]] = %{{.*}} to %[[PER_THREAD]] step %{{.*}} : i32 {
// CHECK: %[[ROW_T:.*]] = arith.divui %{{.*}}, %[[C16]] : i32
// CHECK: %[[ROW:.*]] = arith.addi %[[ROW_T]], %{{.*}} : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %{{.*}}, %[[C16]] : i32
// CHECK-NOT: arith.xori
// CHECK: %[[SRC_PTR:.*]] = llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NEXT: %[[INSIDE:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-NEXT: %[[CHUNK_VALUE:.*]] = scf.if %[[INSIDE]] -> (vector<4xi32>) {
// CHECK-NEXT: llvm.load %[[SRC_PTR]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK: scf.yield %[[ZEROS]] : vector<4xi32>
// CHECK-NEXT: }
// CHECK-NEXT: %[[ELEMS:.*]] = llvm.bitcast %[[CHUNK_VALUE]] : vector<4xi32> to vector<8xbf16>
// Element 0: shared row 8c.
// CHECK-NEXT: %[[DROW0:.*]] = arith.muli %[[CHUNK]], %[[C8]] : i32
// CHECK-NEXT: %[[KCHUNK0:.*]] = arith.divui %[[ROW]], %[[C8]] : i32
// CHECK-NEXT: %[[PHASE0:.*]] = arith.remui %[[DROW0]], %[[C8]] : i32
// CHECK-NEXT: %[[SWZ0:.*]] = arith.xori %[[KCHUNK0]], %[[PHASE0]] : i32
// CHECK-DAG: %[[IN_CHUNK0:.*]] = arith.remui %[[ROW]], %[[C8]] : i32
// CHECK-DAG: %[[IN_CHUNK_BYTES0:.*]] = arith.muli %[[IN_CHUNK0]], %[[C2]] : i32
// CHECK-DAG: %[[CHUNK_BYTES0:.*]] = arith.muli %[[SWZ0]], %[[C16]] : i32
// CHECK-DAG: %[[ROW_BYTES0:.*]] = arith.muli %[[DROW0]], %[[C128]] : i32
// CHECK-DAG: %[[B0:.*]] = arith.addi %[[ROW_BYTES0]], %[[CHUNK_BYTES0]] : i32
// CHECK-DAG: %[[OFF0:.*]] = arith.addi %[[B0]], %[[IN_CHUNK_BYTES0]] : i32
// CHECK: %[[E0:.*]] = vector.extract %[[ELEMS]][0] : bf16 from vector<8xbf16>
// CHECK-NEXT: %[[P0:.*]] = llvm.getelementptr %[[DST]][%[[OFF0]]] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: llvm.store %[[E0]], %[[P0]] {alignment = 2 : i64} : bf16, !llvm.ptr<3>
// Elements 1..6.
// CHECK-COUNT-6: llvm.store %{{.*}}, %{{.*}} {alignment = 2 : i64} : bf16, !llvm.ptr<3>
// Element 7: shared row 8c + 7.
// CHECK: %[[FIRST7:.*]] = arith.muli %[[CHUNK]], %[[C8]] : i32
// CHECK-NEXT: %[[DROW7:.*]] = arith.addi %[[FIRST7]], %[[C7]] : i32
// CHECK-NEXT: %[[KCHUNK7:.*]] = arith.divui %[[ROW]], %[[C8]] : i32
// CHECK-NEXT: %[[PHASE7:.*]] = arith.remui %[[DROW7]], %[[C8]] : i32
// CHECK-NEXT: %[[SWZ7:.*]] = arith.xori %[[KCHUNK7]], %[[PHASE7]] : i32
// CHECK: %[[E7:.*]] = vector.extract %[[ELEMS]][7] : bf16 from vector<8xbf16>
// CHECK-NEXT: %[[P7:.*]] = llvm.getelementptr %[[DST]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: llvm.store %[[E7]], %[[P7]] {alignment = 2 : i64} : bf16, !llvm.ptr<3>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
//
// Async changes nothing on gfx950: the same transposing copy.
// CHECK-LABEL: llvm.func @tile_copy_load_b128_mn_async
// CHECK-NOT: arith.select
// CHECK: llvm.bitcast %{{.*}} : vector<4xi32> to vector<8xbf16>
// CHECK-COUNT-8: llvm.store %{{.*}}, %{{.*}} {alignment = 2 : i64} : bf16, !llvm.ptr<3>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_load_b128_mn(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 128, threads = 256, elem = bf16, swizzle = 2 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
  llvm.func @tile_copy_load_b128_mn_async(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 128, threads = 256, elem = bf16, swizzle = 2 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}
