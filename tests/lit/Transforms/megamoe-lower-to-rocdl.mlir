// megamoe-lower-to-rocdl: every megamoe op -> LLVM + ROCDL for gfx950 (MFMA atom of megamoe/Target/MmaAtoms.h).
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

//===----------------------------------------------------------------------===//
// async_commit, async_wait
//===----------------------------------------------------------------------===//

// -----

// Copies have completed when they retire: the group ops vanish.
// CHECK-LABEL: llvm.func @async_groups()
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @async_groups() {
    megamoe.async_commit
    megamoe.async_wait {pending = 1}
    megamoe.async_commit
    megamoe.async_wait {pending = 7}
    megamoe.async_wait {pending = 0}
    llvm.return
  }
}

//===----------------------------------------------------------------------===//
// bulk_store, bulk_commit, bulk_wait
//===----------------------------------------------------------------------===//

// -----

// No bulk copy engine: the thread copies bytes / 16 chunks of 16 bytes at once; the group ops vanish.
// CHECK-LABEL: llvm.func @bulk_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr<1>, %[[N:[^:]+]]: i32)
// CHECK: %[[CHUNKS:.*]] = arith.divui %[[N]], %{{.*}} : i32
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %[[CHUNKS]]
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-NOT: megamoe.bulk
// CHECK: llvm.return
gpu.module @k {
  llvm.func @bulk_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %n: i32) {
    megamoe.bulk_store %src, %dst, %n : !llvm.ptr<3> -> !llvm.ptr<1>
    megamoe.bulk_commit
    megamoe.bulk_wait {pending = 0, read}
    megamoe.bulk_wait {pending = 0}
    llvm.return
  }
}

//===----------------------------------------------------------------------===//
// mma_tile
//===----------------------------------------------------------------------===//

// -----

// m = 64 over two waves (32 rows each), n = 128 as four 32-column MFMA tiles, k = 64 as four k-steps of 16:
// 16 v_mfma_f32_32x32x16_bf16 per wave. Operand fragments are 8 bf16 (16 bytes) read from the b128-swizzled
// tiles: lane l reads row l % 32, k elements 8 (l / 32) .. + 7 of the step. The A fragment of a k-step is
// loaded once and reused across the four N tiles; each tile's accumulator chains through the k-steps.
// CHECK-LABEL: llvm.func @mma_tile
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<64xf32>)
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : i32
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C6:.*]] = arith.constant 6 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C32:.*]] = arith.constant 32 : i32
// CHECK-DAG: %[[C64:.*]] = arith.constant 64 : i32
// CHECK-DAG: %[[C96:.*]] = arith.constant 96 : i32
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK: %[[TID:.*]] = rocdl.workitem.id.x : i32
// CHECK-NEXT: %[[WAVE:.*]] = arith.divui %[[TID]], %[[C64]] : i32
// CHECK-NEXT: %[[LANE:.*]] = arith.remui %[[TID]], %[[C64]] : i32
// CHECK-DAG: %[[LANE_ROW:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-DAG: %[[WAVE_ROW:.*]] = arith.muli %[[WAVE]], %[[C32]] : i32
// CHECK: %[[ROW_A:.*]] = arith.addi %[[WAVE_ROW]], %[[LANE_ROW]] : i32
// The accumulator is split into the four N tiles' 16 values element by element.
// CHECK-NEXT: %[[X0:.*]] = vector.extract %[[ACC]][0] : f32 from vector<64xf32>
// CHECK: %[[X15:.*]] = vector.extract %[[ACC]][15] : f32 from vector<64xf32>
// CHECK-NEXT: %[[ACC0:.*]] = vector.from_elements %[[X0]], {{.*}}, %[[X15]] : vector<16xf32>
// CHECK-NEXT: %[[X16:.*]] = vector.extract %[[ACC]][16] : f32 from vector<64xf32>
// CHECK: %[[X31:.*]] = vector.extract %[[ACC]][31] : f32 from vector<64xf32>
// CHECK-NEXT: %[[ACC1:.*]] = vector.from_elements %[[X16]], {{.*}}, %[[X31]] : vector<16xf32>
// CHECK-NEXT: %[[X32:.*]] = vector.extract %[[ACC]][32] : f32 from vector<64xf32>
// CHECK: %[[X47:.*]] = vector.extract %[[ACC]][47] : f32 from vector<64xf32>
// CHECK-NEXT: %[[ACC2:.*]] = vector.from_elements %[[X32]], {{.*}}, %[[X47]] : vector<16xf32>
// CHECK-NEXT: %[[X48:.*]] = vector.extract %[[ACC]][48] : f32 from vector<64xf32>
// CHECK: %[[X63:.*]] = vector.extract %[[ACC]][63] : f32 from vector<64xf32>
// CHECK-NEXT: %[[ACC3:.*]] = vector.from_elements %[[X48]], {{.*}}, %[[X63]] : vector<16xf32>
// k-step 0: A fragment = 16-byte chunk 0 + lane / 32 of row wave * 32 + lane % 32, swizzled.
// CHECK-NEXT: %[[HALF0:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[A_PHASE0:.*]] = arith.remui %[[ROW_A]], %[[C8]] : i32
// CHECK-NEXT: %[[A_CHUNK0:.*]] = arith.xori %[[HALF0]], %[[A_PHASE0]] : i32
// CHECK-DAG: %[[A_CHUNK_BYTES0:.*]] = arith.muli %[[A_CHUNK0]], %[[C16]] : i32
// CHECK-DAG: %[[A_ROW_BYTES0:.*]] = arith.muli %[[ROW_A]], %[[C128]] : i32
// CHECK: %[[A_OFF0:.*]] = arith.addi %[[A_ROW_BYTES0]], %[[A_CHUNK_BYTES0]] : i32
// CHECK-NEXT: %[[A_PTR0:.*]] = llvm.getelementptr %[[A]][%[[A_OFF0]]] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[A_K0:.*]] = llvm.load %[[A_PTR0]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// N tile 0: B rows 0 + lane % 32; accumulates onto the input slice.
// CHECK-NEXT: %[[ROW_B00:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B00]], %[[C8]] : i32
// CHECK: %[[B_PTR00:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K00:.*]] = llvm.load %[[B_PTR00]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D00:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K0]], %[[B_K00]], %[[ACC0]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 1: B rows 32 + lane % 32; accumulates onto the input slice.
// CHECK-NEXT: %[[LR01:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B01:.*]] = arith.addi %[[LR01]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B01]], %[[C8]] : i32
// CHECK: %[[B_PTR01:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K01:.*]] = llvm.load %[[B_PTR01]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D01:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K0]], %[[B_K01]], %[[ACC1]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 2: B rows 64 + lane % 32; accumulates onto the input slice.
// CHECK-NEXT: %[[LR02:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B02:.*]] = arith.addi %[[LR02]], %[[C64]] : i32
// CHECK: arith.remui %[[ROW_B02]], %[[C8]] : i32
// CHECK: %[[B_PTR02:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K02:.*]] = llvm.load %[[B_PTR02]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D02:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K0]], %[[B_K02]], %[[ACC2]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 3: B rows 96 + lane % 32; accumulates onto the input slice.
// CHECK-NEXT: %[[LR03:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B03:.*]] = arith.addi %[[LR03]], %[[C96]] : i32
// CHECK: arith.remui %[[ROW_B03]], %[[C8]] : i32
// CHECK: %[[B_PTR03:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K03:.*]] = llvm.load %[[B_PTR03]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D03:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K0]], %[[B_K03]], %[[ACC3]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// k-step 1: A fragment = 16-byte chunk 2 + lane / 32 of row wave * 32 + lane % 32, swizzled.
// CHECK: %[[HALF1:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[LOGICAL1:.*]] = arith.addi %[[HALF1]], %[[C2]] : i32
// CHECK-NEXT: %[[A_PHASE1:.*]] = arith.remui %[[ROW_A]], %[[C8]] : i32
// CHECK-NEXT: arith.xori %[[LOGICAL1]], %[[A_PHASE1]] : i32
// CHECK: %[[A_PTR1:.*]] = llvm.getelementptr %[[A]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[A_K1:.*]] = llvm.load %[[A_PTR1]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// N tile 0: B rows 0 + lane % 32; accumulates onto k-step 0's result.
// CHECK-NEXT: %[[ROW_B10:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B10]], %[[C8]] : i32
// CHECK: %[[B_PTR10:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K10:.*]] = llvm.load %[[B_PTR10]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D10:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K1]], %[[B_K10]], %[[D00]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 1: B rows 32 + lane % 32; accumulates onto k-step 0's result.
// CHECK-NEXT: %[[LR11:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B11:.*]] = arith.addi %[[LR11]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B11]], %[[C8]] : i32
// CHECK: %[[B_PTR11:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K11:.*]] = llvm.load %[[B_PTR11]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D11:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K1]], %[[B_K11]], %[[D01]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 2: B rows 64 + lane % 32; accumulates onto k-step 0's result.
// CHECK-NEXT: %[[LR12:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B12:.*]] = arith.addi %[[LR12]], %[[C64]] : i32
// CHECK: arith.remui %[[ROW_B12]], %[[C8]] : i32
// CHECK: %[[B_PTR12:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K12:.*]] = llvm.load %[[B_PTR12]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D12:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K1]], %[[B_K12]], %[[D02]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 3: B rows 96 + lane % 32; accumulates onto k-step 0's result.
// CHECK-NEXT: %[[LR13:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B13:.*]] = arith.addi %[[LR13]], %[[C96]] : i32
// CHECK: arith.remui %[[ROW_B13]], %[[C8]] : i32
// CHECK: %[[B_PTR13:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K13:.*]] = llvm.load %[[B_PTR13]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D13:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K1]], %[[B_K13]], %[[D03]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// k-step 2: A fragment = 16-byte chunk 4 + lane / 32 of row wave * 32 + lane % 32, swizzled.
// CHECK: %[[HALF2:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[LOGICAL2:.*]] = arith.addi %[[HALF2]], %[[C4]] : i32
// CHECK-NEXT: %[[A_PHASE2:.*]] = arith.remui %[[ROW_A]], %[[C8]] : i32
// CHECK-NEXT: arith.xori %[[LOGICAL2]], %[[A_PHASE2]] : i32
// CHECK: %[[A_PTR2:.*]] = llvm.getelementptr %[[A]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[A_K2:.*]] = llvm.load %[[A_PTR2]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// N tile 0: B rows 0 + lane % 32; accumulates onto k-step 1's result.
// CHECK-NEXT: %[[ROW_B20:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B20]], %[[C8]] : i32
// CHECK: %[[B_PTR20:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K20:.*]] = llvm.load %[[B_PTR20]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D20:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K2]], %[[B_K20]], %[[D10]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 1: B rows 32 + lane % 32; accumulates onto k-step 1's result.
// CHECK-NEXT: %[[LR21:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B21:.*]] = arith.addi %[[LR21]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B21]], %[[C8]] : i32
// CHECK: %[[B_PTR21:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K21:.*]] = llvm.load %[[B_PTR21]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D21:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K2]], %[[B_K21]], %[[D11]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 2: B rows 64 + lane % 32; accumulates onto k-step 1's result.
// CHECK-NEXT: %[[LR22:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B22:.*]] = arith.addi %[[LR22]], %[[C64]] : i32
// CHECK: arith.remui %[[ROW_B22]], %[[C8]] : i32
// CHECK: %[[B_PTR22:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K22:.*]] = llvm.load %[[B_PTR22]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D22:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K2]], %[[B_K22]], %[[D12]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 3: B rows 96 + lane % 32; accumulates onto k-step 1's result.
// CHECK-NEXT: %[[LR23:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B23:.*]] = arith.addi %[[LR23]], %[[C96]] : i32
// CHECK: arith.remui %[[ROW_B23]], %[[C8]] : i32
// CHECK: %[[B_PTR23:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K23:.*]] = llvm.load %[[B_PTR23]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D23:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K2]], %[[B_K23]], %[[D13]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// k-step 3: A fragment = 16-byte chunk 6 + lane / 32 of row wave * 32 + lane % 32, swizzled.
// CHECK: %[[HALF3:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[LOGICAL3:.*]] = arith.addi %[[HALF3]], %[[C6]] : i32
// CHECK-NEXT: %[[A_PHASE3:.*]] = arith.remui %[[ROW_A]], %[[C8]] : i32
// CHECK-NEXT: arith.xori %[[LOGICAL3]], %[[A_PHASE3]] : i32
// CHECK: %[[A_PTR3:.*]] = llvm.getelementptr %[[A]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[A_K3:.*]] = llvm.load %[[A_PTR3]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// N tile 0: B rows 0 + lane % 32; accumulates onto k-step 2's result.
// CHECK-NEXT: %[[ROW_B30:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B30]], %[[C8]] : i32
// CHECK: %[[B_PTR30:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K30:.*]] = llvm.load %[[B_PTR30]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D30:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K3]], %[[B_K30]], %[[D20]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 1: B rows 32 + lane % 32; accumulates onto k-step 2's result.
// CHECK-NEXT: %[[LR31:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B31:.*]] = arith.addi %[[LR31]], %[[C32]] : i32
// CHECK: arith.remui %[[ROW_B31]], %[[C8]] : i32
// CHECK: %[[B_PTR31:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K31:.*]] = llvm.load %[[B_PTR31]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D31:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K3]], %[[B_K31]], %[[D21]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 2: B rows 64 + lane % 32; accumulates onto k-step 2's result.
// CHECK-NEXT: %[[LR32:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B32:.*]] = arith.addi %[[LR32]], %[[C64]] : i32
// CHECK: arith.remui %[[ROW_B32]], %[[C8]] : i32
// CHECK: %[[B_PTR32:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K32:.*]] = llvm.load %[[B_PTR32]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D32:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K3]], %[[B_K32]], %[[D22]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// N tile 3: B rows 96 + lane % 32; accumulates onto k-step 2's result.
// CHECK-NEXT: %[[LR33:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[ROW_B33:.*]] = arith.addi %[[LR33]], %[[C96]] : i32
// CHECK: arith.remui %[[ROW_B33]], %[[C8]] : i32
// CHECK: %[[B_PTR33:.*]] = llvm.getelementptr %[[B]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K33:.*]] = llvm.load %[[B_PTR33]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[D33:.*]] = rocdl.mfma.f32.32x32x16.bf16 %[[A_K3]], %[[B_K33]], %[[D23]], %[[C0]], %[[C0]], %[[C0]] : (vector<8xbf16>, vector<8xbf16>, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// CHECK-NOT: rocdl.mfma
// The four tiles' results are joined back in order.
// CHECK: %[[Y0:.*]] = vector.extract %[[D30]][0] : f32 from vector<16xf32>
// CHECK: %[[Y15:.*]] = vector.extract %[[D30]][15] : f32 from vector<16xf32>
// CHECK-NEXT: %[[Y16:.*]] = vector.extract %[[D31]][0] : f32 from vector<16xf32>
// CHECK: %[[Y31:.*]] = vector.extract %[[D31]][15] : f32 from vector<16xf32>
// CHECK-NEXT: %[[Y32:.*]] = vector.extract %[[D32]][0] : f32 from vector<16xf32>
// CHECK: %[[Y47:.*]] = vector.extract %[[D32]][15] : f32 from vector<16xf32>
// CHECK-NEXT: %[[Y48:.*]] = vector.extract %[[D33]][0] : f32 from vector<16xf32>
// CHECK: %[[Y63:.*]] = vector.extract %[[D33]][15] : f32 from vector<16xf32>
// CHECK-NEXT: %[[OUT:.*]] = vector.from_elements %[[Y0]], {{.*}}, %[[Y15]], %[[Y16]], {{.*}}, %[[Y31]], %[[Y32]], {{.*}}, %[[Y47]], %[[Y48]], {{.*}}, %[[Y63]] : vector<64xf32>
// CHECK-NEXT: llvm.return %[[OUT]] : vector<64xf32>
gpu.module @k {
  llvm.func @mma_tile(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// e4m3: two waves of 32 rows each (m = 64), n = 32 (one N tile), k = 128 e4m3 as eight v_mfma_f32_32x32x16_fp8_fp8 steps; lane l
// reads 8 bytes (one i64) of row l % 32: k-step kk is the row's 16-byte chunk kk, swizzled to kk ^ (row % 8), half
// l / 32, at byte row * 128 + (kk ^ (row % 8)) * 16 + (l / 32) * 8.
// CHECK-LABEL: llvm.func @mma_tile_e4m3
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<16xf32>)
// CHECK-DAG: %[[C1:.*]] = arith.constant 1 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C32:.*]] = arith.constant 32 : i32
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK: %[[LANE:.*]] = arith.remui %{{.*}}, %{{.*}} : i32
// Step 0 (chunk 0 ^ (row % 8), folded), then step 1 with the chunk index xor'ed in:
// CHECK: %[[HALF0:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK: arith.muli %[[HALF0]], %[[C8]] : i32
// CHECK: llvm.load %{{.*}} {alignment = 8 : i64} : !llvm.ptr<3> -> i64
// CHECK: rocdl.mfma.f32.32x32x16.fp8.fp8 %{{.*}}, %{{.*}}, %{{.*}} : (i64, i64, vector<16xf32>, i32, i32, i32) -> vector<16xf32>
// CHECK: %[[ROW8:.*]] = arith.remui %{{.*}}, %[[C8]] : i32
// CHECK-NEXT: %[[PHYS:.*]] = arith.xori %[[ROW8]], %[[C1]] : i32
// CHECK: %[[CHUNKB:.*]] = arith.muli %[[PHYS]], %[[C16]] : i32
// CHECK: %[[INROW:.*]] = arith.addi %[[CHUNKB]], %{{.*}} : i32
// CHECK: %[[ROWB:.*]] = arith.muli %{{.*}}, %[[C128]] : i32
// CHECK-NEXT: %[[AT:.*]] = arith.addi %[[ROWB]], %[[INROW]] : i32
// CHECK-NEXT: %[[P:.*]] = llvm.getelementptr %[[A]][%[[AT]]]
// CHECK-NEXT: llvm.load %[[P]] {alignment = 8 : i64} : !llvm.ptr<3> -> i64
// CHECK-COUNT-7: rocdl.mfma.f32.32x32x16.fp8.fp8
// CHECK-NOT: rocdl.mfma
gpu.module @k {
  llvm.func @mma_tile_e4m3(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<16xf32>) -> vector<16xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 32, k = 128, threads = 128, e4m3} : !llvm.ptr<3>, !llvm.ptr<3>, vector<16xf32> -> vector<16xf32>
    llvm.return %r : vector<16xf32>
  }
}

// -----

// Four waves (m = 128, 256 threads), n = 32: one N tile, four k-steps.
// CHECK-LABEL: llvm.func @mma_tile_four_waves
// CHECK-COUNT-4: rocdl.mfma.f32.32x32x16.bf16
// CHECK-NOT: rocdl.mfma
// CHECK: llvm.return
gpu.module @k {
  llvm.func @mma_tile_four_waves(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<16xf32>) -> vector<16xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 128, n = 32, k = 64, threads = 256} : !llvm.ptr<3>, !llvm.ptr<3>, vector<16xf32> -> vector<16xf32>
    llvm.return %r : vector<16xf32>
  }
}

// -----

// a_first_rows: the waves of every warpgroup read A's rows [0, 64), as warpgroup 0's do: A's row is
// (wave % 2) * 32 + lane % 32 (the waves of warpgroup 1 are 2 and 3 of the block).
// CHECK-LABEL: llvm.func @mma_tile_a_first_rows
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C32:.*]] = arith.constant 32 : i32
// CHECK: %[[TID:.*]] = rocdl.workitem.id.x
// CHECK: %[[WAVE:.*]] = arith.divui %[[TID]]
// CHECK: %[[WAVE_A:.*]] = arith.remui %[[WAVE]], %[[C2]]
// CHECK: arith.muli %[[WAVE_A]], %[[C32]]
gpu.module @k {
  llvm.func @mma_tile_a_first_rows(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, a_first_rows} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// pending and the MN-major flags change nothing on gfx950: b128_mn tiles were transposed into K-major rows while
// copying, so both operands are read K-major (A row wave * 32 + lane % 32 at byte row * 128 + ((lane / 32) ^
// (row % 8)) * 16 in k-step 0), and MFMA results are final (no wait).
// CHECK-LABEL: llvm.func @mma_tile_mn_major
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<64xf32>)
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C32:.*]] = arith.constant 32 : i32
// CHECK-DAG: %[[C64:.*]] = arith.constant 64 : i32
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK: %[[TID:.*]] = rocdl.workitem.id.x : i32
// CHECK-NEXT: %[[WAVE:.*]] = arith.divui %[[TID]], %[[C64]] : i32
// CHECK-NEXT: %[[LANE:.*]] = arith.remui %[[TID]], %[[C64]] : i32
// CHECK-DAG: %[[LANE_ROW:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-DAG: %[[WAVE_ROW:.*]] = arith.muli %[[WAVE]], %[[C32]] : i32
// CHECK: %[[ROW_A:.*]] = arith.addi %[[WAVE_ROW]], %[[LANE_ROW]] : i32
// CHECK: %[[ACC0:.*]] = vector.from_elements
// CHECK: %[[HALF0:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK-NEXT: %[[A_PHASE0:.*]] = arith.remui %[[ROW_A]], %[[C8]] : i32
// CHECK-NEXT: %[[A_CHUNK0:.*]] = arith.xori %[[HALF0]], %[[A_PHASE0]] : i32
// CHECK-DAG: %[[A_CHUNK_BYTES0:.*]] = arith.muli %[[A_CHUNK0]], %[[C16]] : i32
// CHECK-DAG: %[[A_ROW_BYTES0:.*]] = arith.muli %[[ROW_A]], %[[C128]] : i32
// CHECK: %[[A_OFF0:.*]] = arith.addi %[[A_ROW_BYTES0]], %[[A_CHUNK_BYTES0]] : i32
// CHECK-NEXT: %[[A_PTR0:.*]] = llvm.getelementptr %[[A]][%[[A_OFF0]]] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[A_K0:.*]] = llvm.load %[[A_PTR0]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: %[[ROW_B00:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-DAG: %[[B_PHASE00:.*]] = arith.remui %[[ROW_B00]], %[[C8]] : i32
// CHECK-DAG: %[[B_HALF00:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK: %[[B_CHUNK00:.*]] = arith.xori %[[B_HALF00]], %[[B_PHASE00]] : i32
// CHECK-DAG: %[[B_CHUNK_BYTES00:.*]] = arith.muli %[[B_CHUNK00]], %[[C16]] : i32
// CHECK-DAG: %[[B_ROW_BYTES00:.*]] = arith.muli %[[ROW_B00]], %[[C128]] : i32
// CHECK: %[[B_OFF00:.*]] = arith.addi %[[B_ROW_BYTES00]], %[[B_CHUNK_BYTES00]] : i32
// CHECK-NEXT: %[[B_PTR00:.*]] = llvm.getelementptr %[[B]][%[[B_OFF00]]] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[B_K00:.*]] = llvm.load %[[B_PTR00]] {alignment = 16 : i64} : !llvm.ptr<3> -> vector<8xbf16>
// CHECK-NEXT: rocdl.mfma.f32.32x32x16.bf16 %[[A_K0]], %[[B_K00]], %[[ACC0]], %[[C0]], %[[C0]], %[[C0]]
// CHECK-COUNT-15: rocdl.mfma.f32.32x32x16.bf16
// CHECK-NOT: rocdl.mfma
// CHECK: %[[OUT:.*]] = vector.from_elements {{.*}} : vector<64xf32>
// CHECK-NEXT: llvm.return %[[OUT]] : vector<64xf32>
gpu.module @k {
  llvm.func @mma_tile_mn_major(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, pending = 1, a_mn_major, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

//===----------------------------------------------------------------------===//
// mma_drain
//===----------------------------------------------------------------------===//

// -----

// Nothing is in flight on gfx950: the drain is its operand. After an mma_tile {pending = 1}, the MFMA results are
// returned as they are.
// CHECK-LABEL: llvm.func @mma_drain
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<16xf32>)
// CHECK-NEXT: llvm.return %[[ACC]] : vector<16xf32>
// CHECK-LABEL: llvm.func @mma_tile_then_drain
// CHECK-COUNT-4: rocdl.mfma.f32.32x32x16.bf16
// CHECK-NOT: rocdl.mfma
// CHECK: %[[OUT:.*]] = vector.from_elements {{.*}} : vector<16xf32>
// CHECK-NEXT: llvm.return %[[OUT]] : vector<16xf32>
gpu.module @k {
  llvm.func @mma_drain(%acc: vector<16xf32>) -> vector<16xf32> {
    %d = megamoe.mma_drain %acc : vector<16xf32>
    llvm.return %d : vector<16xf32>
  }
  llvm.func @mma_tile_then_drain(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<16xf32>) -> vector<16xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 32, k = 64, threads = 128, pending = 1} : !llvm.ptr<3>, !llvm.ptr<3>, vector<16xf32> -> vector<16xf32>
    %d = megamoe.mma_drain %r : vector<16xf32>
    llvm.return %d : vector<16xf32>
  }
}

//===----------------------------------------------------------------------===//
// acc_store
//===----------------------------------------------------------------------===//

// -----

// The MFMA 32x32 accumulator fragment: element i of lane l sits at row 32 wave + 4 (l / 32) + 8 (i / 4) + i % 4,
// column l % 32 (+ 32 s for N tile s). All 16 elements of one tile are checked.
// CHECK-LABEL: llvm.func @acc_store_f16
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<16xf32>, %[[C:[^:]+]]: !llvm.ptr<1>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[C1:.*]] = arith.constant 1 : i32
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C3:.*]] = arith.constant 3 : i32
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C9:.*]] = arith.constant 9 : i32
// CHECK-DAG: %[[C10:.*]] = arith.constant 10 : i32
// CHECK-DAG: %[[C11:.*]] = arith.constant 11 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C17:.*]] = arith.constant 17 : i32
// CHECK-DAG: %[[C18:.*]] = arith.constant 18 : i32
// CHECK-DAG: %[[C19:.*]] = arith.constant 19 : i32
// CHECK-DAG: %[[C24:.*]] = arith.constant 24 : i32
// CHECK-DAG: %[[C25:.*]] = arith.constant 25 : i32
// CHECK-DAG: %[[C26:.*]] = arith.constant 26 : i32
// CHECK-DAG: %[[C27:.*]] = arith.constant 27 : i32
// CHECK-DAG: %[[C32:.*]] = arith.constant 32 : i32
// CHECK-DAG: %[[C64:.*]] = arith.constant 64 : i32
// CHECK: %[[TID:.*]] = rocdl.workitem.id.x : i32
// CHECK-NEXT: %[[WAVE:.*]] = arith.divui %[[TID]], %[[C64]] : i32
// CHECK-NEXT: %[[LANE:.*]] = arith.remui %[[TID]], %[[C64]] : i32
// CHECK-DAG: %[[HALF:.*]] = arith.divui %[[LANE]], %[[C32]] : i32
// CHECK-DAG: %[[HALF_ROW:.*]] = arith.muli %[[HALF]], %[[C4]] : i32
// CHECK-DAG: %[[WAVE_ROW:.*]] = arith.muli %[[WAVE]], %[[C32]] : i32
// CHECK-DAG: %[[ROW:.*]] = arith.addi %[[WAVE_ROW]], %[[HALF_ROW]] : i32
// CHECK-DAG: %[[COL:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// Element 0: row + 0, column lane % 32.
// CHECK: %[[IN0:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN0]] {
// CHECK-NEXT: %[[E0:.*]] = vector.extract %[[ACC]][0] : f32 from vector<16xf32>
// CHECK-DAG: %[[COL_W:.*]] = arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: %[[LD_W:.*]] = arith.extui %[[LD]] : i32 to i64
// CHECK-DAG: %[[ROW_W:.*]] = arith.extui %[[ROW]] : i32 to i64
// CHECK: %[[ROW_OFF:.*]] = arith.muli %[[ROW_W]], %[[LD_W]] : i64
// CHECK-NEXT: %[[IDX:.*]] = arith.addi %[[ROW_OFF]], %[[COL_W]] : i64
// CHECK-NEXT: %[[PTR:.*]] = llvm.getelementptr %[[C]][%[[IDX]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H0:.*]] = arith.truncf %[[E0]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H0]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 1: row + 1, column lane % 32.
// CHECK-NEXT: %[[R1:.*]] = arith.addi %[[ROW]], %[[C1]] : i32
// CHECK-NEXT: %[[IN1:.*]] = arith.cmpi ult, %[[R1]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN1]] {
// CHECK-NEXT: %[[E1:.*]] = vector.extract %[[ACC]][1] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R1]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H1:.*]] = arith.truncf %[[E1]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H1]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 2: row + 2, column lane % 32.
// CHECK-NEXT: %[[R2:.*]] = arith.addi %[[ROW]], %[[C2]] : i32
// CHECK-NEXT: %[[IN2:.*]] = arith.cmpi ult, %[[R2]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN2]] {
// CHECK-NEXT: %[[E2:.*]] = vector.extract %[[ACC]][2] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R2]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H2:.*]] = arith.truncf %[[E2]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H2]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 3: row + 3, column lane % 32.
// CHECK-NEXT: %[[R3:.*]] = arith.addi %[[ROW]], %[[C3]] : i32
// CHECK-NEXT: %[[IN3:.*]] = arith.cmpi ult, %[[R3]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN3]] {
// CHECK-NEXT: %[[E3:.*]] = vector.extract %[[ACC]][3] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R3]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H3:.*]] = arith.truncf %[[E3]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H3]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 4: row + 8, column lane % 32.
// CHECK-NEXT: %[[R4:.*]] = arith.addi %[[ROW]], %[[C8]] : i32
// CHECK-NEXT: %[[IN4:.*]] = arith.cmpi ult, %[[R4]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN4]] {
// CHECK-NEXT: %[[E4:.*]] = vector.extract %[[ACC]][4] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R4]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H4:.*]] = arith.truncf %[[E4]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H4]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 5: row + 9, column lane % 32.
// CHECK-NEXT: %[[R5:.*]] = arith.addi %[[ROW]], %[[C9]] : i32
// CHECK-NEXT: %[[IN5:.*]] = arith.cmpi ult, %[[R5]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN5]] {
// CHECK-NEXT: %[[E5:.*]] = vector.extract %[[ACC]][5] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R5]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H5:.*]] = arith.truncf %[[E5]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H5]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 6: row + 10, column lane % 32.
// CHECK-NEXT: %[[R6:.*]] = arith.addi %[[ROW]], %[[C10]] : i32
// CHECK-NEXT: %[[IN6:.*]] = arith.cmpi ult, %[[R6]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN6]] {
// CHECK-NEXT: %[[E6:.*]] = vector.extract %[[ACC]][6] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R6]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H6:.*]] = arith.truncf %[[E6]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H6]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 7: row + 11, column lane % 32.
// CHECK-NEXT: %[[R7:.*]] = arith.addi %[[ROW]], %[[C11]] : i32
// CHECK-NEXT: %[[IN7:.*]] = arith.cmpi ult, %[[R7]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN7]] {
// CHECK-NEXT: %[[E7:.*]] = vector.extract %[[ACC]][7] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R7]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H7:.*]] = arith.truncf %[[E7]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H7]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 8: row + 16, column lane % 32.
// CHECK-NEXT: %[[R8:.*]] = arith.addi %[[ROW]], %[[C16]] : i32
// CHECK-NEXT: %[[IN8:.*]] = arith.cmpi ult, %[[R8]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN8]] {
// CHECK-NEXT: %[[E8:.*]] = vector.extract %[[ACC]][8] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R8]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H8:.*]] = arith.truncf %[[E8]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H8]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 9: row + 17, column lane % 32.
// CHECK-NEXT: %[[R9:.*]] = arith.addi %[[ROW]], %[[C17]] : i32
// CHECK-NEXT: %[[IN9:.*]] = arith.cmpi ult, %[[R9]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN9]] {
// CHECK-NEXT: %[[E9:.*]] = vector.extract %[[ACC]][9] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R9]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H9:.*]] = arith.truncf %[[E9]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H9]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 10: row + 18, column lane % 32.
// CHECK-NEXT: %[[R10:.*]] = arith.addi %[[ROW]], %[[C18]] : i32
// CHECK-NEXT: %[[IN10:.*]] = arith.cmpi ult, %[[R10]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN10]] {
// CHECK-NEXT: %[[E10:.*]] = vector.extract %[[ACC]][10] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R10]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H10:.*]] = arith.truncf %[[E10]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H10]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 11: row + 19, column lane % 32.
// CHECK-NEXT: %[[R11:.*]] = arith.addi %[[ROW]], %[[C19]] : i32
// CHECK-NEXT: %[[IN11:.*]] = arith.cmpi ult, %[[R11]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN11]] {
// CHECK-NEXT: %[[E11:.*]] = vector.extract %[[ACC]][11] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R11]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H11:.*]] = arith.truncf %[[E11]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H11]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 12: row + 24, column lane % 32.
// CHECK-NEXT: %[[R12:.*]] = arith.addi %[[ROW]], %[[C24]] : i32
// CHECK-NEXT: %[[IN12:.*]] = arith.cmpi ult, %[[R12]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN12]] {
// CHECK-NEXT: %[[E12:.*]] = vector.extract %[[ACC]][12] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R12]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H12:.*]] = arith.truncf %[[E12]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H12]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 13: row + 25, column lane % 32.
// CHECK-NEXT: %[[R13:.*]] = arith.addi %[[ROW]], %[[C25]] : i32
// CHECK-NEXT: %[[IN13:.*]] = arith.cmpi ult, %[[R13]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN13]] {
// CHECK-NEXT: %[[E13:.*]] = vector.extract %[[ACC]][13] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R13]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H13:.*]] = arith.truncf %[[E13]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H13]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 14: row + 26, column lane % 32.
// CHECK-NEXT: %[[R14:.*]] = arith.addi %[[ROW]], %[[C26]] : i32
// CHECK-NEXT: %[[IN14:.*]] = arith.cmpi ult, %[[R14]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN14]] {
// CHECK-NEXT: %[[E14:.*]] = vector.extract %[[ACC]][14] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R14]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H14:.*]] = arith.truncf %[[E14]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H14]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// Element 15: row + 27, column lane % 32.
// CHECK-NEXT: %[[R15:.*]] = arith.addi %[[ROW]], %[[C27]] : i32
// CHECK-NEXT: %[[IN15:.*]] = arith.cmpi ult, %[[R15]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN15]] {
// CHECK-NEXT: %[[E15:.*]] = vector.extract %[[ACC]][15] : f32 from vector<16xf32>
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R15]] : i32 to i64
// CHECK: llvm.getelementptr %[[C]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: %[[H15:.*]] = arith.truncf %[[E15]] : f32 to f16
// CHECK-NEXT: llvm.store %[[H15]], %{{.*}} {alignment = 2 : i64} : f16, !llvm.ptr<1>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @acc_store_f16(%acc: vector<16xf32>, %c: !llvm.ptr<1>, %ld: i32, %rows_valid: i32) {
    megamoe.acc_store %acc, %c[%ld] rows_valid %rows_valid {m = 64, n = 32, threads = 128, elem = f16} : vector<16xf32>, !llvm.ptr<1>
    llvm.return
  }
}

// -----

// n = 128: four N tiles, the column of tile s offset by 32 s; 64 scalar bf16 stores. f32 is stored unconverted.
// CHECK-LABEL: llvm.func @acc_store_bf16
// CHECK-DAG: %[[C32:.*]] = arith.constant 32 : i32
// CHECK-DAG: %[[C64:.*]] = arith.constant 64 : i32
// CHECK-DAG: %[[C96:.*]] = arith.constant 96 : i32
// CHECK: %[[LANE:.*]] = arith.remui %{{.*}}, %[[C64]] : i32
// CHECK: %[[COL:.*]] = arith.remui %[[LANE]], %[[C32]] : i32
// CHECK-COUNT-16: llvm.store %{{.*}}, %{{.*}} {alignment = 2 : i64} : bf16, !llvm.ptr<1>
// CHECK: arith.addi %[[COL]], %[[C32]] : i32
// CHECK-COUNT-16: llvm.store %{{.*}}, %{{.*}} {alignment = 2 : i64} : bf16, !llvm.ptr<1>
// CHECK: arith.addi %[[COL]], %[[C64]] : i32
// CHECK-COUNT-16: llvm.store %{{.*}}, %{{.*}} {alignment = 2 : i64} : bf16, !llvm.ptr<1>
// CHECK: arith.addi %[[COL]], %[[C96]] : i32
// CHECK-COUNT-16: llvm.store %{{.*}}, %{{.*}} {alignment = 2 : i64} : bf16, !llvm.ptr<1>
// CHECK-NOT: llvm.store
// CHECK: llvm.return
// CHECK-LABEL: llvm.func @acc_store_f32
// CHECK-NOT: arith.truncf
// CHECK-COUNT-16: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : f32, !llvm.ptr
// CHECK-NOT: llvm.store
// CHECK: llvm.return
gpu.module @k {
  llvm.func @acc_store_bf16(%acc: vector<64xf32>, %c: !llvm.ptr<1>, %ld: i32, %rows_valid: i32) {
    megamoe.acc_store %acc, %c[%ld] rows_valid %rows_valid {m = 64, n = 128, threads = 128, elem = bf16} : vector<64xf32>, !llvm.ptr<1>
    llvm.return
  }
  llvm.func @acc_store_f32(%acc: vector<16xf32>, %c: !llvm.ptr, %ld: i32, %rows_valid: i32) {
    megamoe.acc_store %acc, %c[%ld] rows_valid %rows_valid {m = 64, n = 32, threads = 128, elem = f32} : vector<16xf32>, !llvm.ptr
    llvm.return
  }
}

//===----------------------------------------------------------------------===//
// peer_ptr, signal, wait
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: llvm.func @peer_ptr
// CHECK-SAME: (%[[P:[^:]+]]: !llvm.ptr<1>, %[[OFF:[^:]+]]: !llvm.ptr<1>, %[[PEER:[^:]+]]: i32)
// CHECK-NEXT: %[[SLOT:.*]] = llvm.getelementptr %[[OFF]][%[[PEER]]] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, i64
// CHECK-NEXT: %[[DELTA:.*]] = llvm.load %[[SLOT]] {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK-NEXT: %[[Q:.*]] = llvm.getelementptr %[[P]][%[[DELTA]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NEXT: llvm.return %[[Q]] : !llvm.ptr<1>
gpu.module @k {
  llvm.func @peer_ptr(%p: !llvm.ptr<1>, %offsets: !llvm.ptr<1>, %peer: i32) -> !llvm.ptr<1> {
    %q = megamoe.peer_ptr %p, %offsets[%peer] : !llvm.ptr<1>, !llvm.ptr<1> -> !llvm.ptr<1>
    llvm.return %q : !llvm.ptr<1>
  }
}

// -----

// AMDGPU syncscopes: system is the default (none printed), gpu is "agent", cta is "workgroup".
// CHECK-LABEL: llvm.func @signal
// CHECK-SAME: (%[[F:[^:]+]]: !llvm.ptr<1>, %[[S:[^:]+]]: !llvm.ptr<3>, %[[V:[^:]+]]: i64)
// CHECK-NEXT: llvm.fence release
// CHECK-NEXT: llvm.store %[[V]], %[[F]] atomic release {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: llvm.fence syncscope("agent") release
// CHECK-NEXT: %{{.*}} = llvm.atomicrmw add %[[F]], %[[V]] syncscope("agent") release {alignment = 8 : i64} : !llvm.ptr<1>, i64
// CHECK-NEXT: llvm.fence syncscope("workgroup") release
// CHECK-NEXT: llvm.store %[[V]], %[[S]] atomic syncscope("workgroup") release {alignment = 8 : i64} : i64, !llvm.ptr<3>
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @signal(%f: !llvm.ptr<1>, %s: !llvm.ptr<3>, %v: i64) {
    megamoe.signal store %f, %v scope(system) : !llvm.ptr<1>
    megamoe.signal add %f, %v scope(gpu) : !llvm.ptr<1>
    megamoe.signal store %s, %v scope(cta) : !llvm.ptr<3>
    llvm.return
  }
}

// -----

// The clock is s_memrealtime (100 MHz): ticks * 10 ns. Timeout claims and fills the error record as on sm_90a.
// CHECK-LABEL: llvm.func @wait
// CHECK-SAME: (%[[F:[^:]+]]: !llvm.ptr<1>, %[[ERR:[^:]+]]: !llvm.ptr<1>, %[[EXP:[^:]+]]: i64, %[[TMO:[^:]+]]: i64, %[[RANK:[^:]+]]: i32, %[[ID:[^:]+]]: i64)
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-DAG: %[[TRUE:.*]] = arith.constant true
// CHECK-DAG: %[[FALSE:.*]] = arith.constant false
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0 : i64
// CHECK-DAG: %[[NS_PER_TICK:.*]] = arith.constant 10 : i64
// CHECK: %[[T0:.*]] = llvm.call_intrinsic "llvm.amdgcn.s.memrealtime"() : () -> i64
// CHECK-NEXT: %[[START:.*]] = arith.muli %[[T0]], %[[NS_PER_TICK]] : i64
// CHECK-NEXT: %[[LOOP:.*]]:2 = scf.while (%{{.*}} = %[[ZERO]], %{{.*}} = %[[FALSE]]) : (i64, i1) -> (i64, i1) {
// CHECK-NEXT: %[[SEEN:.*]] = llvm.load %[[F]] atomic acquire {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK-NEXT: %[[REACHED:.*]] = arith.cmpi uge, %[[SEEN]], %[[EXP]] : i64
// CHECK-NEXT: %[[T1:.*]] = llvm.call_intrinsic "llvm.amdgcn.s.memrealtime"() : () -> i64
// CHECK-NEXT: %[[NOW:.*]] = arith.muli %[[T1]], %[[NS_PER_TICK]] : i64
// CHECK-NEXT: %[[ELAPSED:.*]] = arith.subi %[[NOW]], %[[START]] : i64
// CHECK-NEXT: %[[LATE:.*]] = arith.cmpi ugt, %[[ELAPSED]], %[[TMO]] : i64
// CHECK-NEXT: %[[STOP:.*]] = arith.ori %[[REACHED]], %[[LATE]] : i1
// CHECK-NEXT: %[[AGAIN:.*]] = arith.xori %[[STOP]], %[[TRUE]] : i1
// CHECK-NEXT: scf.condition(%[[AGAIN]]) %[[SEEN]], %[[REACHED]] : i64, i1
// CHECK: %[[TIMED_OUT:.*]] = arith.xori %[[LOOP]]#1, %[[TRUE]] : i1
// CHECK-NEXT: scf.if %[[TIMED_OUT]] {
// CHECK-NEXT: %[[CAS:.*]] = llvm.cmpxchg %[[ERR]], %[[ZERO]], %[[ONE]] acq_rel monotonic : !llvm.ptr<1>, i64
// CHECK-NEXT: %[[CLAIMED:.*]] = llvm.extractvalue %[[CAS]][1] : !llvm.struct<(i64, i1)>
// CHECK-NEXT: scf.if %[[CLAIMED]] {
// CHECK-NEXT: %[[RANK_W:.*]] = arith.extui %[[RANK]] : i32 to i64
// CHECK-NEXT: %[[W1:.*]] = llvm.getelementptr %[[ERR]][1] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i64
// CHECK-NEXT: llvm.store volatile %[[RANK_W]], %[[W1]] {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: %[[W2:.*]] = llvm.getelementptr %[[ERR]][2] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i64
// CHECK-NEXT: llvm.store volatile %[[ID]], %[[W2]] {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: %[[W3:.*]] = llvm.getelementptr %[[ERR]][3] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i64
// CHECK-NEXT: llvm.store volatile %[[LOOP]]#0, %[[W3]] {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: %[[W4:.*]] = llvm.getelementptr %[[ERR]][4] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i64
// CHECK-NEXT: llvm.store volatile %[[EXP]], %[[W4]] {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: %[[BLOCK:.*]] = rocdl.workgroup.id.x : i32
// CHECK-NEXT: %[[BLOCK_W:.*]] = arith.extui %[[BLOCK]] : i32 to i64
// CHECK-NEXT: %[[W5:.*]] = llvm.getelementptr %[[ERR]][5] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i64
// CHECK-NEXT: llvm.store volatile %[[BLOCK_W]], %[[W5]] {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: llvm.fence release
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return %[[LOOP]]#1 : i1
gpu.module @k {
  llvm.func @wait(%flag: !llvm.ptr<1>, %err: !llvm.ptr<1>, %expected: i64, %timeout: i64, %rank: i32, %id: i64) -> i1 {
    %ok = megamoe.wait %flag at_least %expected timeout %timeout error %err(%rank, %id) scope(system) : !llvm.ptr<1>, !llvm.ptr<1>
    llvm.return %ok : i1
  }
}

// -----

// CHECK-LABEL: llvm.func @wait_scopes
// CHECK: llvm.load %{{.*}} atomic syncscope("workgroup") acquire {alignment = 8 : i64} : !llvm.ptr<3> -> i64
// CHECK: llvm.load %{{.*}} atomic syncscope("agent") acquire {alignment = 8 : i64} : !llvm.ptr<1> -> i64
gpu.module @k {
  llvm.func @wait_scopes(%s: !llvm.ptr<3>, %g: !llvm.ptr<1>, %err: !llvm.ptr<1>, %v: i64, %rank: i32) {
    %a = megamoe.wait %s at_least %v timeout %v error %err(%rank, %v) scope(cta) : !llvm.ptr<3>, !llvm.ptr<1>
    %b = megamoe.wait %g at_least %v timeout %v error %err(%rank, %v) scope(gpu) : !llvm.ptr<1>, !llvm.ptr<1>
    llvm.return
  }
}

//===----------------------------------------------------------------------===//
// Barriers (expanded by the same pass), kernel attributes
//===----------------------------------------------------------------------===//

// -----

// CHECK-LABEL: llvm.func @barriers
// CHECK-SAME: rocdl.flat_work_group_size = "256,256", rocdl.kernel, rocdl.reqd_work_group_size = array<i32: 256, 1, 1>
// CHECK: gpu.barrier
// CHECK: llvm.atomicrmw add %{{.*}} syncscope("agent") release
// CHECK: llvm.load %{{.*}} atomic syncscope("agent") acquire
// CHECK: llvm.call_intrinsic "llvm.amdgcn.s.memrealtime"
// CHECK: gpu.barrier
// CHECK: gpu.barrier
// CHECK: llvm.store %{{.*}} atomic release
// CHECK: llvm.load %{{.*}} atomic acquire
// CHECK: gpu.barrier
gpu.module @k {
  llvm.func @barriers(%c: !llvm.ptr<1>, %f: !llvm.ptr<1>, %off: !llvm.ptr<1>, %err: !llvm.ptr<1>, %rank: i32, %n: i32, %v: i64, %t: i64) attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
    %a = megamoe.grid_barrier %c at_least %v timeout %t error %err(%rank) : !llvm.ptr<1>, !llvm.ptr<1>
    %b = megamoe.rank_barrier %f, %off(%rank of %n) at_least %v timeout %t error %err : !llvm.ptr<1>, !llvm.ptr<1>, !llvm.ptr<1>
    llvm.return
  }
}

// -----

gpu.module @k {
  // expected-error @+1 {{kernel function needs megamoe.block_threads (the fixed block size)}}
  llvm.func @kernel_without_block_size() attributes {megamoe.kernel} {
    llvm.return
  }
}

// -----

// k16 (one K slice at run time) is an sm_90a form: gfx950 has no lowering for it.
gpu.module @k {
  llvm.func @mma_tile_k16(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>, %k16: i32) -> vector<64xf32> {
    // expected-error @+1 {{'megamoe.mma_tile' op has no lowering for this target}}
    %r = megamoe.mma_tile %a, %b, %acc k16 %k16 {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// The FP8 promotion over the MFMA fragment: a lane's 16 elements of an N tile lie in 16 rows (8 (i / 4) + i % 4 +
// 4 (lane / 32)), the same in every tile: acc_row_scales loads 16 scales for n = 32, acc_scale_add none.
// CHECK-LABEL: llvm.func @acc_row_scales
// CHECK-COUNT-16: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NOT: llvm.load
// CHECK: llvm.return
// CHECK-LABEL: llvm.func @acc_scale_add
// CHECK-NOT: llvm.load
// CHECK: llvm.return
gpu.module @k {
  llvm.func @acc_row_scales(%s: !llvm.ptr<1>, %ld: i32, %rv: i32, %f: f32) -> vector<16xf32> {
    %r = megamoe.acc_row_scales %s[%ld] rows_valid %rv factor %f {m = 64, n = 32, threads = 128} : !llvm.ptr<1> -> vector<16xf32>
    llvm.return %r : vector<16xf32>
  }
  llvm.func @acc_scale_add(%acc: vector<16xf32>, %p: vector<16xf32>, %sc: vector<16xf32>) -> vector<16xf32> {
    %r = megamoe.acc_scale_add %acc, %p, %sc {m = 64, n = 32, threads = 128} : vector<16xf32>, vector<16xf32>
    llvm.return %r : vector<16xf32>
  }
}

// -----

// pack_e4m3: values clamped to +-448 by compare + select (NaN kept), then two v_cvt_pk_fp8_f32 into the halves of
// one word (word_sel false, then true), its four bytes the codes in order.
// CHECK-LABEL: llvm.func @pack_e4m3
// CHECK: arith.cmpf ogt
// CHECK: arith.cmpf olt
// CHECK: %[[LO:.*]] = rocdl.cvt.pk.fp8.f32 %{{.*}}, %{{.*}} -> %{{.*}}[false] : i32
// CHECK: %[[HI:.*]] = rocdl.cvt.pk.fp8.f32 %{{.*}}, %{{.*}} -> %[[LO]][true] : i32
// CHECK: llvm.bitcast %[[HI]] : i32 to vector<4xi8>
// CHECK-NOT: rocdl.cvt.pk.fp8.f32
// CHECK: llvm.return
gpu.module @k {
  llvm.func @pack_e4m3(%v: vector<4xf32>) -> vector<4xi8> {
    %q = megamoe.pack_e4m3 %v : vector<4xf32> -> vector<4xi8>
    llvm.return %q : vector<4xi8>
  }
}
