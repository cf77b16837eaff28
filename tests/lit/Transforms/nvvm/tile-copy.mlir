// megamoe-lower-to-nvvm: tile_copy for sm_90a (swizzle, gather, transpose, cp.async, MN-major b128_mn).
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

//===----------------------------------------------------------------------===//
// tile_copy
//===----------------------------------------------------------------------===//

// Load into a b128-swizzled tile: 64 x 64 bf16 = 512 chunks of 16 bytes, 4 per thread, 8 per row. Rows at or past
// rows_valid are zero-filled, never read; the generic-proxy writes are fenced for wgmma (fence.proxy.async).
// Kernel functions get nvvm.kernel and their block size as nvvm.reqntid.
// CHECK-LABEL: llvm.func @tile_copy_load
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-SAME: nvvm.kernel, nvvm.reqntid = array<i32: 128, 1, 1>
// CHECK-DAG: %[[ZEROS:.*]] = arith.constant dense<0> : vector<4xi32>
// CHECK-DAG: %[[PER_THREAD:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[ELEM_BYTES:.*]] = arith.constant 2 : i64
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: scf.for %[[IT:.*]] = %{{.*}} to %[[PER_THREAD]] step %{{.*}} : i32 {
// Chunk it * 128 + tid: each pass moves 128 / 8 = 16 rows, so row = tid / 8 + 16 it, chunk = tid % 8, and the
// swizzle phase row % 8 is the thread's own (16 it adds whole groups of 8).
// CHECK-NEXT: %[[ROW_T:.*]] = arith.divui %[[TID]], %[[C8]] : i32
// CHECK-NEXT: %[[STEP:.*]] = arith.muli %[[IT]], %[[C16]] : i32
// CHECK-NEXT: %[[ROW:.*]] = arith.addi %[[ROW_T]], %[[STEP]] : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %[[TID]], %[[C8]] : i32
// CHECK-NEXT: %[[PHASE:.*]] = arith.remui %[[ROW_T]], %[[C8]] : i32
// The global side is not swizzled: byte offset row * ld * 2 + chunk * 16.
// CHECK-NOT: arith.xori
// CHECK: arith.muli %[[CHUNK]], %[[C16]] : i32
// CHECK: arith.muli %{{.*}}, %[[ELEM_BYTES]] : i64
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
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_load(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) attributes {megamoe.kernel, megamoe.block_threads = 128 : i64} {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}

// -----

// Gather: the global row of each chunk is row_index[row], an i32 loaded from shared memory (address space 3)
// before the 64-bit row offset; the shared side keeps the tile's own row and swizzle.
// CHECK-LABEL: llvm.func @tile_copy_gather
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[ROWS:[^:]+]]: !llvm.ptr<3>
// CHECK: scf.for
// CHECK: %[[AT:.*]] = llvm.getelementptr %[[ROWS]][%{{.*}}] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[GROW:.*]] = llvm.load %[[AT]] {alignment = 4 : i64} : !llvm.ptr<3> -> i32
// CHECK: %[[GROW64:.*]] = arith.extui %[[GROW]] : i32 to i64
// CHECK-NEXT: arith.muli %[[GROW64]], %{{.*}} : i64
// CHECK: llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
gpu.module @k {
  llvm.func @tile_copy_gather(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %rows: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) attributes {megamoe.kernel, megamoe.block_threads = 128 : i64} {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid gather %rows : !llvm.ptr<3> {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}

// -----

// Store from an unswizzled f32 tile: 32 x 64 f32 = 512 chunks, 2 per thread of 256, 16 per row. Each side uses its
// own leading dimension; rows past rows_valid are not written; no proxy fence (nothing was written to shared).
// Not a kernel: no NVVM kernel attributes.
// CHECK-LABEL: llvm.func @tile_copy_store(
// CHECK-SAME: %[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr<1>, %[[LDS:[^:]+]]: i32, %[[LDD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-NOT: nvvm.kernel
// CHECK-DAG: %[[PER_THREAD:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[ELEM_BYTES:.*]] = arith.constant 4 : i64
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: scf.for %[[IT:.*]] = %{{.*}} to %[[PER_THREAD]] step %{{.*}} : i32 {
// CHECK-NEXT: %[[ROW_T:.*]] = arith.divui %[[TID]], %[[C16]] : i32
// CHECK-NEXT: %[[STEP:.*]] = arith.muli %[[IT]], %[[C16]] : i32
// CHECK-NEXT: %[[ROW:.*]] = arith.addi %[[ROW_T]], %[[STEP]] : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %[[TID]], %[[C16]] : i32
// CHECK: arith.extui %[[LDS]] : i32 to i64
// CHECK: arith.muli %[[CHUNK]], %[[C16]] : i32
// CHECK: arith.muli %{{.*}}, %[[ELEM_BYTES]] : i64
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

// Transposing load of a K x N = 64 x 128 bf16 tile into the K-major [N][K] layout mma_tile reads (128-byte shared
// rows, b128 swizzle): the 16-byte source chunk c of source row r (columns 8c .. 8c + 7) becomes column r of
// shared rows 8c + j, j = 0..7; shared byte offset (8c + j) * 128 + ((r / 8) ^ ((8c + j) % 8)) * 16 + (r % 8) * 2.
// CHECK-LABEL: llvm.func @tile_copy_load_transposed
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[ZEROS:.*]] = arith.constant dense<0> : vector<4xi32>
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C7:.*]] = arith.constant 7 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK: scf.for %[[IT:.*]] = %{{.*}} to %[[C8]] step %{{.*}} : i32 {
// CHECK: %[[ROW_T:.*]] = arith.divui %{{.*}}, %[[C16]] : i32
// CHECK: %[[ROW:.*]] = arith.addi %[[ROW_T]], %{{.*}} : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %{{.*}}, %[[C16]] : i32
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
// CHECK-DAG: %[[IN_CHUNK7:.*]] = arith.remui %[[ROW]], %[[C8]] : i32
// CHECK-DAG: %[[IN_CHUNK_BYTES7:.*]] = arith.muli %[[IN_CHUNK7]], %[[C2]] : i32
// CHECK-DAG: %[[CHUNK_BYTES7:.*]] = arith.muli %[[SWZ7]], %[[C16]] : i32
// CHECK-DAG: %[[ROW_BYTES7:.*]] = arith.muli %[[DROW7]], %[[C128]] : i32
// CHECK-DAG: %[[B7:.*]] = arith.addi %[[ROW_BYTES7]], %[[CHUNK_BYTES7]] : i32
// CHECK-DAG: %[[OFF7:.*]] = arith.addi %[[B7]], %[[IN_CHUNK_BYTES7]] : i32
// CHECK: %[[E7:.*]] = vector.extract %[[ELEMS]][7] : bf16 from vector<8xbf16>
// CHECK-NEXT: %[[P7:.*]] = llvm.getelementptr %[[DST]][%[[OFF7]]] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
// CHECK-NEXT: llvm.store %[[E7]], %[[P7]] {alignment = 2 : i64} : bf16, !llvm.ptr<3>
// CHECK-NEXT: }
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_load_transposed(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 128, threads = 128, elem = bf16, swizzle = 1 : i32, transpose} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}

// -----

// Async load into a b128 tile: same chunk walk and addresses as a synchronous load, but each chunk is one
// cp.async.cg of 16 bytes (no register round trip, no scf.if). Rows at or past rows_valid copy 0 source bytes
// (cp.async zero-fills the 16-byte destination) and read from the tile's first chunk, never past rows_valid. No
// proxy fence here: async_wait fences after the copies have landed.
// CHECK-LABEL: llvm.func @tile_copy_load_async
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : i32
// CHECK-DAG: %[[PER_THREAD:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: scf.for %[[IT:.*]] = %[[C0]] to %[[PER_THREAD]] step %{{.*}} : i32 {
// CHECK: %[[ROW_T:.*]] = arith.divui %{{.*}}, %[[C8]] : i32
// CHECK: %[[ROW:.*]] = arith.addi %[[ROW_T]], %{{.*}} : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %{{.*}}, %[[C8]] : i32
// CHECK-NOT: arith.xori
// CHECK: %[[SRC_PTR:.*]] = llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-NEXT: %[[INSIDE:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-NOT: llvm.load
// CHECK: %[[SWIZZLED:.*]] = arith.xori %[[CHUNK]], %{{.*}} : i32
// CHECK: %[[DST_PTR:.*]] = llvm.getelementptr %[[DST]][%{{.*}}] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[SAFE_SRC:.*]] = arith.select %[[INSIDE]], %[[SRC_PTR]], %[[SRC]] : !llvm.ptr<1>
// CHECK-NEXT: %[[SRC_BYTES:.*]] = arith.select %[[INSIDE]], %[[C16]], %[[C0]] : i32
// CHECK-NEXT: nvvm.cp.async.shared.global %[[DST_PTR]], %[[SAFE_SRC]], 16, cache = cg, %[[SRC_BYTES]] : !llvm.ptr<3>, !llvm.ptr<1>, i32
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tile_copy_load_async(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %rows_valid {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
    llvm.return
  }
}

// -----

// Load of a K x N = 64 x 128 bf16 tile into the MN-major b128_mn layout, kept as wgmma's MN-major atoms: 16 chunks a
// row, 4 per thread of 256. K row r, chunk c (MN elements 8c .. 8c + 7) goes to atom (r / 8, c / 8), i.e. byte
// ((r / 8) * 2 + c / 8) * 1024 (2 atoms along N), line r % 8 of the atom (128 bytes), chunk (c % 8) ^ (r % 8).
// The global side is row-major and unswizzled; then the generic-proxy writes are fenced for wgmma.
// CHECK-LABEL: llvm.func @tile_copy_load_b128_mn
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[ZEROS:.*]] = arith.constant dense<0> : vector<4xi32>
// CHECK-DAG: %[[PER_THREAD:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[ATOMS_MN:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK-DAG: %[[ATOM_BYTES:.*]] = arith.constant 1024 : i32
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: scf.for %[[IT:.*]] = %{{.*}} to %[[PER_THREAD]] step %{{.*}} : i32 {
// 16 rows a pass (256 threads / 16 chunks): row = tid / 16 + 16 it = rowT + 16 it; the atom line row % 8 is
// rowT % 8 and the K group row / 8 is rowT / 8 + 2 it.
// CHECK-NEXT: %[[ROW_T:.*]] = arith.divui %[[TID]], %[[C16]] : i32
// CHECK-NEXT: %[[STEP:.*]] = arith.muli %[[IT]], %[[C16]] : i32
// CHECK-NEXT: %[[ROW:.*]] = arith.addi %[[ROW_T]], %[[STEP]] : i32
// CHECK-NEXT: %[[CHUNK:.*]] = arith.remui %[[TID]], %[[C16]] : i32
// CHECK-NEXT: %[[LINE:.*]] = arith.remui %[[ROW_T]], %[[C8]] : i32
// CHECK-NEXT: %[[KG_T:.*]] = arith.divui %[[ROW_T]], %[[C8]] : i32
// CHECK-NEXT: %[[KG_IT:.*]] = arith.muli %[[IT]], %[[ATOMS_MN]] : i32
// CHECK-NEXT: %[[K_GROUP:.*]] = arith.addi %[[KG_T]], %[[KG_IT]] : i32
// CHECK-NOT: arith.xori
// CHECK: %[[SRC_PTR:.*]] = llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-DAG: %[[INSIDE:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-DAG: %[[K_GROUP_ATOMS:.*]] = arith.muli %[[K_GROUP]], %[[ATOMS_MN]] : i32
// CHECK-DAG: %[[MN_ATOM:.*]] = arith.divui %[[CHUNK]], %[[C8]] : i32
// CHECK-DAG: %[[ATOM:.*]] = arith.addi %[[K_GROUP_ATOMS]], %[[MN_ATOM]] : i32
// CHECK-DAG: %[[ATOM_CHUNK:.*]] = arith.remui %[[CHUNK]], %[[C8]] : i32
// CHECK-DAG: %[[SWIZZLED:.*]] = arith.xori %[[ATOM_CHUNK]], %[[LINE]] : i32
// CHECK-DAG: %[[CHUNK_OFF:.*]] = arith.muli %[[SWIZZLED]], %[[C16]] : i32
// CHECK-DAG: %[[LINE_OFF:.*]] = arith.muli %[[LINE]], %[[C128]] : i32
// CHECK-DAG: %[[IN_ATOM:.*]] = arith.addi %[[LINE_OFF]], %[[CHUNK_OFF]] : i32
// CHECK-DAG: %[[ATOM_OFF:.*]] = arith.muli %[[ATOM]], %[[ATOM_BYTES]] : i32
// CHECK-DAG: %[[OFF:.*]] = arith.addi %[[ATOM_OFF]], %[[IN_ATOM]] : i32
// CHECK-DAG: %[[OFF_W:.*]] = arith.extui %[[OFF]] : i32 to i64
// CHECK: %[[DST_PTR:.*]] = llvm.getelementptr %[[DST]][%[[OFF_W]]] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[CHUNK_VALUE:.*]] = scf.if %[[INSIDE]] -> (vector<4xi32>) {
// CHECK-NEXT: %[[LOADED:.*]] = llvm.load %[[SRC_PTR]] {alignment = 16 : i64} : !llvm.ptr<1> -> vector<4xi32>
// CHECK-NEXT: scf.yield %[[LOADED]] : vector<4xi32>
// CHECK-NEXT: } else {
// CHECK-NEXT: scf.yield %[[ZEROS]] : vector<4xi32>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.store %[[CHUNK_VALUE]], %[[DST_PTR]] {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<3>
// CHECK-NEXT: }
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: llvm.return
//
// The same tile loaded asynchronously: the atom address feeds cp.async; no fence.
// CHECK-LABEL: llvm.func @tile_copy_load_b128_mn_async
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<1>, %[[DST:[^:]+]]: !llvm.ptr<3>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[ATOM_BYTES:.*]] = arith.constant 1024 : i32
// CHECK: %[[ROW_T:.*]] = arith.divui %{{.*}}, %{{.*}} : i32
// CHECK: %[[ROW:.*]] = arith.addi %[[ROW_T]], %{{.*}} : i32
// CHECK: %[[SRC_PTR:.*]] = llvm.getelementptr %[[SRC]][%{{.*}}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8
// CHECK-DAG: %[[INSIDE:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-DAG: %[[ATOM_OFF:.*]] = arith.muli %{{.*}}, %[[ATOM_BYTES]] : i32
// CHECK-DAG: %[[OFF:.*]] = arith.addi %[[ATOM_OFF]], %{{.*}} : i32
// CHECK-DAG: %[[OFF_W:.*]] = arith.extui %[[OFF]] : i32 to i64
// CHECK: %[[DST_PTR:.*]] = llvm.getelementptr %[[DST]][%[[OFF_W]]] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i8
// CHECK-NEXT: %[[SAFE_SRC:.*]] = arith.select %[[INSIDE]], %[[SRC_PTR]], %[[SRC]] : !llvm.ptr<1>
// CHECK-NEXT: %[[SRC_BYTES:.*]] = arith.select %[[INSIDE]], %{{.*}}, %{{.*}} : i32
// CHECK-NEXT: nvvm.cp.async.shared.global %[[DST_PTR]], %[[SAFE_SRC]], 16, cache = cg, %[[SRC_BYTES]] : !llvm.ptr<3>, !llvm.ptr<1>, i32
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
