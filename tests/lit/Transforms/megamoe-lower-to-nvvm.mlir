// megamoe-lower-to-nvvm: every megamoe op -> LLVM + NVVM for sm_90a (wgmma atom of megamoe/Target/MmaAtoms.h).
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

//===----------------------------------------------------------------------===//
// async_commit, async_wait
//===----------------------------------------------------------------------===//

// -----

// One cp.async group op each; every wait is followed by the proxy fence (cp.async wrote through the generic proxy,
// wgmma reads through the async proxy).
// CHECK-LABEL: llvm.func @async_groups()
// CHECK-NEXT: nvvm.cp.async.commit.group
// CHECK-NEXT: nvvm.cp.async.wait.group 1
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: nvvm.cp.async.commit.group
// CHECK-NEXT: nvvm.cp.async.wait.group 7
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: nvvm.cp.async.wait.group 0
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
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

// One bulk copy shared::cta -> global; the waits are cp.async.bulk.wait_group, the full one followed by the
// global proxy fence (a release after it covers the bulk-written data).
// CHECK-LABEL: llvm.func @bulk_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr<1>, %[[N:[^:]+]]: i32)
// CHECK-NEXT: nvvm.cp.async.bulk.global.shared.cta %[[DST]], %[[SRC]], %[[N]] : <1>, <3>
// CHECK-NEXT: nvvm.cp.async.bulk.commit.group
// CHECK-NEXT: nvvm.cp.async.bulk.wait_group 0 {read}
// CHECK-NEXT: nvvm.cp.async.bulk.wait_group 0{{$}}
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @bulk_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %n: i32) {
    megamoe.bulk_store %src, %dst, %n : !llvm.ptr<3> -> !llvm.ptr<1>
    megamoe.bulk_commit
    megamoe.bulk_wait {pending = 0, read}
    megamoe.bulk_wait {pending = 0}
    llvm.return
  }
}

// -----

// A tensor store of one box from shared memory, in the thread's bulk group, coordinates innermost first.
// CHECK-LABEL: llvm.func @tma_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[MAP:[^:]+]]: !llvm.ptr, %[[X:[^:]+]]: i32, %[[Y:[^:]+]]: i32)
// CHECK-NEXT: nvvm.cp.async.bulk.tensor.global.shared.cta %[[MAP]], %[[SRC]], box[%[[X]], %[[Y]]]
// CHECK-NEXT: nvvm.cp.async.bulk.commit.group
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tma_store(%src: !llvm.ptr<3>, %map: !llvm.ptr, %x: i32, %y: i32) {
    megamoe.tma_store %src, %map[%x, %y] : !llvm.ptr<3>, !llvm.ptr
    megamoe.bulk_commit
    llvm.return
  }
}

//===----------------------------------------------------------------------===//
// mma_tile
//===----------------------------------------------------------------------===//

// -----

// One warpgroup: descriptors (addr & 0x3FFFF) >> 4 | 1 << 16 (LBO) | 64 << 32 (SBO 1024 B) | 1 << 62 (128B swizzle)
// = ... | 4611686293305360384; k = 64 is four m64n128k16 steps, each advancing both descriptors by 32 bytes (+2),
// chained through the accumulator; fence before, commit and wait(0) after.
// CHECK-LABEL: llvm.func @mma_tile
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<64xf32>)
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i64
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i64
// CHECK-DAG: %[[C6:.*]] = arith.constant 6 : i64
// CHECK-DAG: %[[DESC_BITS:.*]] = arith.constant 4611686293305360384 : i64
// CHECK-DAG: %[[ADDR_MASK:.*]] = arith.constant 262143 : i64
// CHECK-DAG: %[[A_PER_WARPGROUP:.*]] = arith.constant 8192 : i64
// CHECK-DAG: %[[WARPGROUP:.*]] = arith.constant 128 : i32
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: %[[G32:.*]] = arith.divui %[[TID]], %[[WARPGROUP]] : i32
// CHECK-NEXT: %[[G:.*]] = arith.extui %[[G32]] : i32 to i64
// CHECK-DAG: %[[A_OFF:.*]] = arith.muli %[[G]], %[[A_PER_WARPGROUP]] : i64
// CHECK-DAG: %[[A_ADDR:.*]] = llvm.ptrtoint %[[A]] : !llvm.ptr<3> to i64
// CHECK: %[[A_BASE:.*]] = arith.addi %[[A_ADDR]], %[[A_OFF]] : i64
// CHECK-NEXT: %[[A_MASKED:.*]] = arith.andi %[[A_BASE]], %[[ADDR_MASK]] : i64
// CHECK-NEXT: %[[A_FIELD:.*]] = arith.shrui %[[A_MASKED]], %[[C4]] : i64
// CHECK-NEXT: %[[DESC_A:.*]] = arith.ori %[[A_FIELD]], %[[DESC_BITS]] : i64
// CHECK-NEXT: %[[B_ADDR:.*]] = llvm.ptrtoint %[[B]] : !llvm.ptr<3> to i64
// CHECK-NEXT: %[[B_MASKED:.*]] = arith.andi %[[B_ADDR]], %[[ADDR_MASK]] : i64
// CHECK-NEXT: %[[B_FIELD:.*]] = arith.shrui %[[B_MASKED]], %[[C4]] : i64
// CHECK-NEXT: %[[DESC_B:.*]] = arith.ori %[[B_FIELD]], %[[DESC_BITS]] : i64
// The accumulator is pinned element by element before the fence (an empty volatile asm each: nothing may define
// its registers between the fence and the wgmma), then goes in as wgmma's 64-member register struct.
// CHECK: %[[E0:.*]] = vector.extract %[[ACC]][0] : f32 from vector<64xf32>
// CHECK-NEXT: llvm.inline_asm has_side_effects "", "=f,0" %[[E0]] : (f32) -> f32
// CHECK-COUNT-63: llvm.inline_asm has_side_effects "", "=f,0"
// CHECK: %[[IN:.*]] = llvm.insertvalue %{{.*}}[63] : !llvm.struct<(f32,
// CHECK-NEXT: nvvm.wgmma.fence.aligned
// CHECK-NEXT: %[[W0:.*]] = nvvm.wgmma.mma_async %[[DESC_A]], %[[DESC_B]], %[[IN]], <m = 64, n = 128, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK-DAG: %[[DESC_A1:.*]] = arith.addi %[[DESC_A]], %[[C2]] : i64
// CHECK-DAG: %[[DESC_B1:.*]] = arith.addi %[[DESC_B]], %[[C2]] : i64
// CHECK: %[[W1:.*]] = nvvm.wgmma.mma_async %[[DESC_A1]], %[[DESC_B1]], %[[W0]], <m = 64, n = 128, k = 16>
// CHECK-DAG: %[[DESC_A2:.*]] = arith.addi %[[DESC_A]], %[[C4]] : i64
// CHECK-DAG: %[[DESC_B2:.*]] = arith.addi %[[DESC_B]], %[[C4]] : i64
// CHECK: %[[W2:.*]] = nvvm.wgmma.mma_async %[[DESC_A2]], %[[DESC_B2]], %[[W1]], <m = 64, n = 128, k = 16>
// CHECK-DAG: %[[DESC_A3:.*]] = arith.addi %[[DESC_A]], %[[C6]] : i64
// CHECK-DAG: %[[DESC_B3:.*]] = arith.addi %[[DESC_B]], %[[C6]] : i64
// CHECK: %[[W3:.*]] = nvvm.wgmma.mma_async %[[DESC_A3]], %[[DESC_B3]], %[[W2]], <m = 64, n = 128, k = 16>
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK-NEXT: llvm.extractvalue %[[W3]][0]
// CHECK: llvm.extractvalue %[[W3]][63]
// CHECK-NEXT: %[[OUT:.*]] = vector.insert %{{.*}} [63] : f32 into vector<64xf32>
// CHECK-NEXT: llvm.return %[[OUT]] : vector<64xf32>
gpu.module @k {
  llvm.func @mma_tile(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// k16: one 16-wide K slice at a run-time index, a single wgmma with both descriptors stepped k16 times (K-major:
// +2 each, 32 bytes), committed and waited as the op's pending says.
// CHECK-LABEL: llvm.func @mma_tile_k16
// CHECK-SAME: %[[K16:[^:]+]]: i32)
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i64
// CHECK: %[[DESC_A:.*]] = arith.ori
// CHECK: %[[DESC_B:.*]] = arith.ori
// CHECK: %[[AT:.*]] = arith.extui %[[K16]] : i32 to i64
// CHECK: %[[STEP_A:.*]] = arith.muli %[[AT]], %[[C2]] : i64
// CHECK: arith.addi %[[DESC_A]], %[[STEP_A]] : i64
// CHECK: %[[STEP_B:.*]] = arith.muli %[[AT]], %[[C2]] : i64
// CHECK: arith.addi %[[DESC_B]], %[[STEP_B]] : i64
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-COUNT-1: nvvm.wgmma.mma_async
// CHECK-NOT: nvvm.wgmma.mma_async
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
gpu.module @k {
  llvm.func @mma_tile_k16(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>, %k16: i32) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc k16 %k16 {m = 64, n = 128, k = 64, threads = 128, pending = 1} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// e4m3: a stage of k = 128 e4m3 (one 128-byte row) is four m64n128k32 e4m3 steps over the same descriptors as bf16's
// k16 steps (+2, +4, +6: 32 bytes each), both operands K-major ("row" A, "col" B).
// CHECK-LABEL: llvm.func @mma_tile_e4m3
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i64
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i64
// CHECK-DAG: %[[C6:.*]] = arith.constant 6 : i64
// CHECK-DAG: %[[DESC_BITS:.*]] = arith.constant 4611686293305360384 : i64
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-NEXT: nvvm.wgmma.mma_async %[[A0:.*]], %[[B0:.*]], %{{.*}}, <m = 64, n = 128, k = 32>, D[<f32>, <one>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// CHECK: arith.addi %[[A0]], %[[C2]] : i64
// CHECK: arith.addi %[[B0]], %[[C2]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 32>, D[<f32>, <one>], A[<e4m3>, <one>, <row>], B[<e4m3>, <one>, <col>]
// CHECK: arith.addi %[[A0]], %[[C4]] : i64
// CHECK: nvvm.wgmma.mma_async {{.*}} k = 32>
// CHECK: arith.addi %[[A0]], %[[C6]] : i64
// CHECK: nvvm.wgmma.mma_async {{.*}} k = 32>
// CHECK-NOT: nvvm.wgmma.mma_async
// CHECK: nvvm.wgmma.commit.group.sync.aligned
gpu.module @k {
  llvm.func @mma_tile_e4m3(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 128, threads = 128, e4m3} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// Ring stages (SharedTile::stage: a byte offset from the ring's base, as a GEP): the descriptors come from the
// bases, outside any loop the stage index varies in; each stage adds only offset >> 4 to their low words (i32), and
// k16 step kk adds 2 kk there; the high word is the bases' constant (1024 B stride, 128B swizzle).
// CHECK-LABEL: llvm.func @mma_tile_ring_stage
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<64xf32>, %[[OFF_A:[^:]+]]: i64, %[[OFF_B:[^:]+]]: i32)
// CHECK-DAG: %[[HI:.*]] = arith.constant -4294967296 : i64
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i32
// CHECK: %[[OFF_A32:.*]] = arith.trunci %[[OFF_A]] : i64 to i32
// CHECK: llvm.ptrtoint %[[A]] : !llvm.ptr<3> to i64
// CHECK: %[[DESC_A:.*]] = arith.ori %{{.*}}, %{{.*}} : i64
// CHECK-NEXT: llvm.ptrtoint %[[B]] : !llvm.ptr<3> to i64
// CHECK: %[[DESC_B:.*]] = arith.ori %{{.*}}, %{{.*}} : i64
// CHECK: %[[LO_A:.*]] = arith.trunci %[[DESC_A]] : i64 to i32
// CHECK-NEXT: %[[HI_A:.*]] = arith.andi %[[DESC_A]], %[[HI]] : i64
// CHECK-NEXT: %[[STAGE_A:.*]] = arith.shrui %[[OFF_A32]], %[[C4]] : i32
// CHECK-NEXT: %[[LO_A0:.*]] = arith.addi %[[LO_A]], %[[STAGE_A]] : i32
// CHECK: %[[STAGE_B:.*]] = arith.shrui %[[OFF_B]], %[[C4]] : i32
// CHECK: %[[A0:.*]] = arith.extui %[[LO_A0]] : i32 to i64
// CHECK-NEXT: %[[D_A0:.*]] = arith.ori %[[HI_A]], %[[A0]] : i64
// CHECK: nvvm.wgmma.mma_async %[[D_A0]], %{{.*}}, %{{.*}}, <m = 64, n = 128, k = 16>
// CHECK: %[[LO_A1:.*]] = arith.addi %[[LO_A0]], %[[C2]] : i32
// CHECK-NEXT: %[[A1:.*]] = arith.extui %[[LO_A1]] : i32 to i64
// CHECK-NEXT: %[[D_A1:.*]] = arith.ori %[[HI_A]], %[[A1]] : i64
// CHECK: nvvm.wgmma.mma_async %[[D_A1]], %{{.*}}, %{{.*}}, <m = 64, n = 128, k = 16>
// CHECK-COUNT-2: nvvm.wgmma.mma_async
// CHECK-NOT: nvvm.wgmma.mma_async
gpu.module @k {
  llvm.func @mma_tile_ring_stage(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>, %offa: i64, %offb: i32) -> vector<64xf32> {
    %sa = llvm.getelementptr %a[%offa] : (!llvm.ptr<3>, i64) -> !llvm.ptr<3>, i8
    %sb = llvm.getelementptr %b[%offb] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
    %r = megamoe.mma_tile %sa, %sb, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// Two warpgroups (m = 128): each takes its own 64 rows of A (8 KB further on), all of B; n = 32 is one m64n32k16
// atom with 16 accumulators per thread.
// CHECK-LABEL: llvm.func @mma_tile_two_warpgroups
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<16xf32>)
// CHECK-DAG: %[[A_PER_WARPGROUP:.*]] = arith.constant 8192 : i64
// CHECK-DAG: %[[WARPGROUP:.*]] = arith.constant 128 : i32
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: %[[G32:.*]] = arith.divui %[[TID]], %[[WARPGROUP]] : i32
// CHECK-NEXT: %[[G:.*]] = arith.extui %[[G32]] : i32 to i64
// CHECK: arith.muli %[[G]], %[[A_PER_WARPGROUP]] : i64
// CHECK: llvm.insertvalue %{{.*}}[15] : !llvm.struct<(f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32)>
// CHECK-NEXT: nvvm.wgmma.fence.aligned
// CHECK-COUNT-4: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 32, k = 16>
// CHECK-NOT: nvvm.wgmma.mma_async
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: vector.insert %{{.*}} [15] : f32 into vector<16xf32>
gpu.module @k {
  llvm.func @mma_tile_two_warpgroups(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<16xf32>) -> vector<16xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 128, n = 32, k = 64, threads = 256} : !llvm.ptr<3>, !llvm.ptr<3>, vector<16xf32> -> vector<16xf32>
    llvm.return %r : vector<16xf32>
  }
}

// -----

// MN-major A and B (K x MN tiles in b128_mn atoms) with pending = 1. Descriptors: (addr & 0x3FFFF) >> 4
// | 64 << 16 (leading byte offset 1024: the next 64 MN elements, one atom over) | atoms * 1024 >> 4 << 32 (stride
// byte offset: one 8-row K group across all MN atoms) | 1 << 62 (128B swizzle). A (m = 64) has 1 atom:
// 4611686293309489152; B (n = 128) has 2: 4611686568187396096. Warpgroup g's A starts at atom g (1024 bytes on).
// k16 steps two K groups: +2 * atoms * 1024 bytes = +128 (A), +256 (B) in the descriptor. wgmma reads both
// transposed: A "col", B "row". The group is committed and left with one wgmma group in flight (wait 1).
// CHECK-LABEL: llvm.func @mma_tile_mn_major
// CHECK-SAME: (%[[A:[^:]+]]: !llvm.ptr<3>, %[[B:[^:]+]]: !llvm.ptr<3>, %[[ACC:[^:]+]]: vector<64xf32>)
// CHECK-DAG: %[[A_STEP1:.*]] = arith.constant 128 : i64
// CHECK-DAG: %[[STEP256:.*]] = arith.constant 256 : i64
// CHECK-DAG: %[[A_STEP3:.*]] = arith.constant 384 : i64
// CHECK-DAG: %[[B_STEP2:.*]] = arith.constant 512 : i64
// CHECK-DAG: %[[B_STEP3:.*]] = arith.constant 768 : i64
// CHECK-DAG: %[[DESC_A_BITS:.*]] = arith.constant 4611686293309489152 : i64
// CHECK-DAG: %[[DESC_B_BITS:.*]] = arith.constant 4611686568187396096 : i64
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i64
// CHECK-DAG: %[[ADDR_MASK:.*]] = arith.constant 262143 : i64
// CHECK-DAG: %[[A_PER_WARPGROUP:.*]] = arith.constant 1024 : i64
// CHECK-DAG: %[[WARPGROUP:.*]] = arith.constant 128 : i32
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: %[[G32:.*]] = arith.divui %[[TID]], %[[WARPGROUP]] : i32
// CHECK-NEXT: %[[G:.*]] = arith.extui %[[G32]] : i32 to i64
// CHECK-DAG: %[[A_OFF:.*]] = arith.muli %[[G]], %[[A_PER_WARPGROUP]] : i64
// CHECK-DAG: %[[A_ADDR:.*]] = llvm.ptrtoint %[[A]] : !llvm.ptr<3> to i64
// CHECK: %[[A_BASE:.*]] = arith.addi %[[A_ADDR]], %[[A_OFF]] : i64
// CHECK-NEXT: %[[A_MASKED:.*]] = arith.andi %[[A_BASE]], %[[ADDR_MASK]] : i64
// CHECK-NEXT: %[[A_FIELD:.*]] = arith.shrui %[[A_MASKED]], %[[C4]] : i64
// CHECK-NEXT: %[[DESC_A:.*]] = arith.ori %[[A_FIELD]], %[[DESC_A_BITS]] : i64
// CHECK-NEXT: %[[B_ADDR:.*]] = llvm.ptrtoint %[[B]] : !llvm.ptr<3> to i64
// CHECK-NEXT: %[[B_MASKED:.*]] = arith.andi %[[B_ADDR]], %[[ADDR_MASK]] : i64
// CHECK-NEXT: %[[B_FIELD:.*]] = arith.shrui %[[B_MASKED]], %[[C4]] : i64
// CHECK-NEXT: %[[DESC_B:.*]] = arith.ori %[[B_FIELD]], %[[DESC_B_BITS]] : i64
// CHECK: %[[IN:.*]] = llvm.insertvalue %{{.*}}[63] : !llvm.struct<(f32,
// CHECK-NEXT: nvvm.wgmma.fence.aligned
// CHECK-NEXT: %[[W0:.*]] = nvvm.wgmma.mma_async %[[DESC_A]], %[[DESC_B]], %[[IN]], <m = 64, n = 128, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <row>]
// CHECK-DAG: %[[DESC_A1:.*]] = arith.addi %[[DESC_A]], %[[A_STEP1]] : i64
// CHECK-DAG: %[[DESC_B1:.*]] = arith.addi %[[DESC_B]], %[[STEP256]] : i64
// CHECK: %[[W1:.*]] = nvvm.wgmma.mma_async %[[DESC_A1]], %[[DESC_B1]], %[[W0]], <m = 64, n = 128, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <row>]
// CHECK-DAG: %[[DESC_A2:.*]] = arith.addi %[[DESC_A]], %[[STEP256]] : i64
// CHECK-DAG: %[[DESC_B2:.*]] = arith.addi %[[DESC_B]], %[[B_STEP2]] : i64
// CHECK: %[[W2:.*]] = nvvm.wgmma.mma_async %[[DESC_A2]], %[[DESC_B2]], %[[W1]], <m = 64, n = 128, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <row>]
// CHECK-DAG: %[[DESC_A3:.*]] = arith.addi %[[DESC_A]], %[[A_STEP3]] : i64
// CHECK-DAG: %[[DESC_B3:.*]] = arith.addi %[[DESC_B]], %[[B_STEP3]] : i64
// CHECK: %[[W3:.*]] = nvvm.wgmma.mma_async %[[DESC_A3]], %[[DESC_B3]], %[[W2]], <m = 64, n = 128, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <row>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK-NEXT: llvm.extractvalue %[[W3]][0]
// CHECK: %[[OUT:.*]] = vector.insert %{{.*}} [63] : f32 into vector<64xf32>
// CHECK-NEXT: llvm.return %[[OUT]] : vector<64xf32>
gpu.module @k {
  llvm.func @mma_tile_mn_major(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, pending = 1, a_mn_major, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// Each flag acts on its own operand. Only A MN-major, two warpgroups (m = 128: 2 atoms, A descriptor
// 4611686568187396096, steps of 256 bytes >> 4, warpgroup g one atom = 1024 bytes on); B stays K-major (the b128
// descriptor 4611686293305360384, steps of +2, layout "col").
// CHECK-LABEL: llvm.func @mma_tile_a_mn_major
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i64
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i64
// CHECK-DAG: %[[C6:.*]] = arith.constant 6 : i64
// CHECK-DAG: %[[C256:.*]] = arith.constant 256 : i64
// CHECK-DAG: %[[C512:.*]] = arith.constant 512 : i64
// CHECK-DAG: %[[C768:.*]] = arith.constant 768 : i64
// CHECK-DAG: %[[DESC_A_BITS:.*]] = arith.constant 4611686568187396096 : i64
// CHECK-DAG: %[[DESC_B_BITS:.*]] = arith.constant 4611686293305360384 : i64
// CHECK-DAG: %[[A_PER_WARPGROUP:.*]] = arith.constant 1024 : i64
// CHECK: %[[G:.*]] = arith.extui %{{.*}} : i32 to i64
// CHECK-NEXT: arith.muli %[[G]], %[[A_PER_WARPGROUP]] : i64
// CHECK: %[[DESC_A:.*]] = arith.ori %{{.*}}, %[[DESC_A_BITS]] : i64
// CHECK: %[[DESC_B:.*]] = arith.ori %{{.*}}, %[[DESC_B_BITS]] : i64
// CHECK: nvvm.wgmma.mma_async %[[DESC_A]], %[[DESC_B]], %{{.*}}, <m = 64, n = 64, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <col>]
// CHECK-NEXT: %[[DESC_A1:.*]] = arith.addi %[[DESC_A]], %[[C256]] : i64
// CHECK-NEXT: %[[DESC_B1:.*]] = arith.addi %[[DESC_B]], %[[C2]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async %[[DESC_A1]], %[[DESC_B1]], %{{.*}}, <m = 64, n = 64, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <col>]
// CHECK-NEXT: %[[DESC_A2:.*]] = arith.addi %[[DESC_A]], %[[C512]] : i64
// CHECK-NEXT: %[[DESC_B2:.*]] = arith.addi %[[DESC_B]], %[[C4]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async %[[DESC_A2]], %[[DESC_B2]], %{{.*}}, <m = 64, n = 64, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <col>]
// CHECK-NEXT: %[[DESC_A3:.*]] = arith.addi %[[DESC_A]], %[[C768]] : i64
// CHECK-NEXT: %[[DESC_B3:.*]] = arith.addi %[[DESC_B]], %[[C6]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async %[[DESC_A3]], %[[DESC_B3]], %{{.*}}, <m = 64, n = 64, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <col>], B[<bf16>, <one>, <col>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
//
// Only B MN-major, n = 256 (4 atoms: descriptor 4611687117943209984, steps of 2 * 4 * 1024 bytes = +512); A stays
// K-major (8 KB per warpgroup, +2 steps, layout "row").
// CHECK-LABEL: llvm.func @mma_tile_b_mn_major
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i64
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i64
// CHECK-DAG: %[[C6:.*]] = arith.constant 6 : i64
// CHECK-DAG: %[[C512:.*]] = arith.constant 512 : i64
// CHECK-DAG: %[[C1024:.*]] = arith.constant 1024 : i64
// CHECK-DAG: %[[C1536:.*]] = arith.constant 1536 : i64
// CHECK-DAG: %[[DESC_A_BITS:.*]] = arith.constant 4611686293305360384 : i64
// CHECK-DAG: %[[DESC_B_BITS:.*]] = arith.constant 4611687117943209984 : i64
// CHECK-DAG: %[[A_PER_WARPGROUP:.*]] = arith.constant 8192 : i64
// CHECK: %[[G:.*]] = arith.extui %{{.*}} : i32 to i64
// CHECK-NEXT: arith.muli %[[G]], %[[A_PER_WARPGROUP]] : i64
// CHECK: %[[DESC_A:.*]] = arith.ori %{{.*}}, %[[DESC_A_BITS]] : i64
// CHECK: %[[DESC_B:.*]] = arith.ori %{{.*}}, %[[DESC_B_BITS]] : i64
// CHECK: nvvm.wgmma.mma_async %[[DESC_A]], %[[DESC_B]], %{{.*}}, <m = 64, n = 256, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <row>]
// CHECK-NEXT: %[[DESC_A1:.*]] = arith.addi %[[DESC_A]], %[[C2]] : i64
// CHECK-NEXT: %[[DESC_B1:.*]] = arith.addi %[[DESC_B]], %[[C512]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async %[[DESC_A1]], %[[DESC_B1]], %{{.*}}, <m = 64, n = 256, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <row>]
// CHECK-NEXT: %[[DESC_A2:.*]] = arith.addi %[[DESC_A]], %[[C4]] : i64
// CHECK-NEXT: %[[DESC_B2:.*]] = arith.addi %[[DESC_B]], %[[C1024]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async %[[DESC_A2]], %[[DESC_B2]], %{{.*}}, <m = 64, n = 256, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <row>]
// CHECK-NEXT: %[[DESC_A3:.*]] = arith.addi %[[DESC_A]], %[[C6]] : i64
// CHECK-NEXT: %[[DESC_B3:.*]] = arith.addi %[[DESC_B]], %[[C1536]] : i64
// CHECK-NEXT: nvvm.wgmma.mma_async %[[DESC_A3]], %[[DESC_B3]], %{{.*}}, <m = 64, n = 256, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <row>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
gpu.module @k {
  llvm.func @mma_tile_a_mn_major(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<32xf32>) -> vector<32xf32> attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
    %r = megamoe.mma_tile %a, %b, %acc {m = 128, n = 64, k = 64, threads = 256, a_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<32xf32> -> vector<32xf32>
    llvm.return %r : vector<32xf32>
  }
  llvm.func @mma_tile_b_mn_major(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<128xf32>) -> vector<128xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 256, k = 64, threads = 128, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<128xf32> -> vector<128xf32>
    llvm.return %r : vector<128xf32>
  }
}

// -----

// a_first_rows (a half tile: the warpgroups split its columns): every warpgroup's A descriptor is the tile's own
// address, without the 8 KB per warpgroup (no multiply by the warpgroup index).
// CHECK-LABEL: llvm.func @mma_tile_a_first_rows
// CHECK-NOT: arith.muli
// CHECK: nvvm.wgmma.mma_async %{{.*}}, %{{.*}}, %{{.*}}, <m = 64, n = 128, k = 16>
gpu.module @k {
  llvm.func @mma_tile_a_first_rows(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, a_first_rows} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}

//===----------------------------------------------------------------------===//
// mma_drain
//===----------------------------------------------------------------------===//

// -----

// Wait for every wgmma group, then pin each accumulator register behind an empty volatile asm tied to it ("=f,0"),
// so that no read of the accumulator can move above the wait; the pinned values are what the op returns.
// CHECK-LABEL: llvm.func @mma_drain
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<16xf32>)
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK-NEXT: %[[E0:.*]] = vector.extract %[[ACC]][0] : f32 from vector<16xf32>
// CHECK-NEXT: %[[P0:.*]] = llvm.inline_asm has_side_effects "", "=f,0" %[[E0]] : (f32) -> f32
// CHECK-NEXT: %[[V0:.*]] = vector.insert %[[P0]], %[[ACC]] [0] : f32 into vector<16xf32>
// CHECK-NEXT: %[[E1:.*]] = vector.extract %{{.*}}[1] : f32 from vector<16xf32>
// CHECK-NEXT: %[[P1:.*]] = llvm.inline_asm has_side_effects "", "=f,0" %[[E1]] : (f32) -> f32
// CHECK-NEXT: %[[V1:.*]] = vector.insert %[[P1]], %[[V0]] [1] : f32 into vector<16xf32>
// CHECK-COUNT-13: llvm.inline_asm has_side_effects "", "=f,0"
// CHECK-NEXT: %[[V14:.*]] = vector.insert %{{.*}} [14] : f32 into vector<16xf32>
// CHECK-NEXT: %[[E15:.*]] = vector.extract %{{.*}}[15] : f32 from vector<16xf32>
// CHECK-NEXT: %[[P15:.*]] = llvm.inline_asm has_side_effects "", "=f,0" %[[E15]] : (f32) -> f32
// CHECK-NEXT: %[[V15:.*]] = vector.insert %[[P15]], %[[V14]] [15] : f32 into vector<16xf32>
// CHECK-NEXT: llvm.return %[[V15]] : vector<16xf32>
//
// After mma_tile {pending = 1}: the tile waits for all but one group, the drain for the rest.
// CHECK-LABEL: llvm.func @mma_tile_then_drain
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK-NOT: llvm.inline_asm
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK-COUNT-16: llvm.inline_asm has_side_effects "", "=f,0"
// CHECK-NOT: llvm.inline_asm
// CHECK: llvm.return
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

// The wgmma fragment: thread t = 32 warp + lane, element i sits at row 64 g + 16 warp + lane / 4 + 8 ((i / 2) % 2),
// column (i / 4) 8 + (lane % 4) 2 + i % 2; pairs (i, i + 1) are adjacent columns, stored as one 2 x f16 store.
// All 8 pairs of m64n32 (16 accumulators) are checked.
// CHECK-LABEL: llvm.func @acc_store_f16
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<16xf32>, %[[C:[^:]+]]: !llvm.ptr<1>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32)
// CHECK-DAG: %[[C24:.*]] = arith.constant 24 : i32
// CHECK-DAG: %[[C8:.*]] = arith.constant 8 : i32
// CHECK-DAG: %[[PAIR0:.*]] = arith.constant dense<0.000000e+00> : vector<2xf16>
// CHECK-DAG: %[[C2:.*]] = arith.constant 2 : i32
// CHECK-DAG: %[[C64:.*]] = arith.constant 64 : i32
// CHECK-DAG: %[[C16:.*]] = arith.constant 16 : i32
// CHECK-DAG: %[[C4:.*]] = arith.constant 4 : i32
// CHECK-DAG: %[[C32:.*]] = arith.constant 32 : i32
// CHECK-DAG: %[[C128:.*]] = arith.constant 128 : i32
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-DAG: %[[G:.*]] = arith.divui %[[TID]], %[[C128]] : i32
// CHECK-DAG: %[[T:.*]] = arith.remui %[[TID]], %[[C128]] : i32
// CHECK-DAG: %[[WARP:.*]] = arith.divui %[[T]], %[[C32]] : i32
// CHECK-DAG: %[[LANE:.*]] = arith.remui %[[T]], %[[C32]] : i32
// CHECK-DAG: %[[QUAD:.*]] = arith.divui %[[LANE]], %[[C4]] : i32
// CHECK-DAG: %[[WARP_ROW:.*]] = arith.muli %[[WARP]], %[[C16]] : i32
// CHECK-DAG: %[[IN_G:.*]] = arith.addi %[[WARP_ROW]], %[[QUAD]] : i32
// CHECK-DAG: %[[G_ROW:.*]] = arith.muli %[[G]], %[[C64]] : i32
// CHECK-DAG: %[[ROW:.*]] = arith.addi %[[G_ROW]], %[[IN_G]] : i32
// CHECK-DAG: %[[LQ:.*]] = arith.remui %[[LANE]], %[[C4]] : i32
// CHECK-DAG: %[[COL:.*]] = arith.muli %[[LQ]], %[[C2]] : i32
//
// Pair (0, 1): (row, col).
// CHECK: %[[IN0:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN0]] {
// CHECK-NEXT: %[[E0:.*]] = vector.extract %[[ACC]][0] : f32 from vector<16xf32>
// CHECK-NEXT: %[[H0:.*]] = arith.truncf %[[E0]] : f32 to f16
// CHECK-NEXT: %[[P0:.*]] = vector.insert %[[H0]], %[[PAIR0]] [0] : f16 into vector<2xf16>
// CHECK-NEXT: %[[E1:.*]] = vector.extract %[[ACC]][1] : f32 from vector<16xf32>
// CHECK-NEXT: %[[H1:.*]] = arith.truncf %[[E1]] : f32 to f16
// CHECK-NEXT: %[[P01:.*]] = vector.insert %[[H1]], %[[P0]] [1] : f16 into vector<2xf16>
// CHECK-DAG: %[[COL_W:.*]] = arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: %[[LD_W:.*]] = arith.extui %[[LD]] : i32 to i64
// CHECK-DAG: %[[ROW_W:.*]] = arith.extui %[[ROW]] : i32 to i64
// CHECK: %[[ROW_OFF:.*]] = arith.muli %[[ROW_W]], %[[LD_W]] : i64
// CHECK-NEXT: %[[IDX:.*]] = arith.addi %[[ROW_OFF]], %[[COL_W]] : i64
// CHECK-NEXT: %[[PTR:.*]] = llvm.getelementptr %[[C]][%[[IDX]]] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16
// CHECK-NEXT: llvm.store %[[P01]], %[[PTR]] {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
//
// Pair (2, 3): (row + 8, col).
// CHECK-NEXT: %[[R1:.*]] = arith.addi %[[ROW]], %[[C8]] : i32
// CHECK-NEXT: %[[IN1:.*]] = arith.cmpi ult, %[[R1]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN1]] {
// CHECK-NEXT: vector.extract %[[ACC]][2]
// CHECK: vector.extract %[[ACC]][3]
// CHECK-DAG: arith.extui %[[COL]] : i32 to i64
// CHECK-DAG: arith.extui %[[R1]] : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
//
// Pair (4, 5): (row, col + 8).
// CHECK-NEXT: %[[C2_:.*]] = arith.addi %[[COL]], %[[C8]] : i32
// CHECK-NEXT: %[[IN2:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN2]] {
// CHECK-NEXT: vector.extract %[[ACC]][4]
// CHECK: vector.extract %[[ACC]][5]
// CHECK-DAG: arith.extui %[[C2_]] : i32 to i64
// CHECK-DAG: arith.extui %[[ROW]] : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
//
// Pair (6, 7): (row + 8, col + 8).
// CHECK-NEXT: %[[R3:.*]] = arith.addi %[[ROW]], %[[C8]] : i32
// CHECK-NEXT: %[[C3_:.*]] = arith.addi %[[COL]], %[[C8]] : i32
// CHECK-NEXT: %[[IN3:.*]] = arith.cmpi ult, %[[R3]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN3]] {
// CHECK-NEXT: vector.extract %[[ACC]][6]
// CHECK: vector.extract %[[ACC]][7]
// CHECK-DAG: arith.extui %[[C3_]] : i32 to i64
// CHECK-DAG: arith.extui %[[R3]] : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
//
// Pair (8, 9): (row, col + 16).
// CHECK-NEXT: %[[C4_:.*]] = arith.addi %[[COL]], %[[C16]] : i32
// CHECK-NEXT: %[[IN4:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN4]] {
// CHECK-NEXT: vector.extract %[[ACC]][8]
// CHECK: vector.extract %[[ACC]][9]
// CHECK-DAG: arith.extui %[[C4_]] : i32 to i64
// CHECK-DAG: arith.extui %[[ROW]] : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
//
// Pair (10, 11): (row + 8, col + 16).
// CHECK-NEXT: %[[R5:.*]] = arith.addi %[[ROW]], %[[C8]] : i32
// CHECK-NEXT: %[[C5_:.*]] = arith.addi %[[COL]], %[[C16]] : i32
// CHECK-NEXT: %[[IN5:.*]] = arith.cmpi ult, %[[R5]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN5]] {
// CHECK-NEXT: vector.extract %[[ACC]][10]
// CHECK: vector.extract %[[ACC]][11]
// CHECK-DAG: arith.extui %[[C5_]] : i32 to i64
// CHECK-DAG: arith.extui %[[R5]] : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
//
// Pair (12, 13): (row, col + 24).
// CHECK-NEXT: %[[C6_:.*]] = arith.addi %[[COL]], %[[C24]] : i32
// CHECK-NEXT: %[[IN6:.*]] = arith.cmpi ult, %[[ROW]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN6]] {
// CHECK-NEXT: vector.extract %[[ACC]][12]
// CHECK: vector.extract %[[ACC]][13]
// CHECK-DAG: arith.extui %[[C6_]] : i32 to i64
// CHECK-DAG: arith.extui %[[ROW]] : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
//
// Pair (14, 15): (row + 8, col + 24).
// CHECK-NEXT: %[[R7:.*]] = arith.addi %[[ROW]], %[[C8]] : i32
// CHECK-NEXT: %[[C7_:.*]] = arith.addi %[[COL]], %[[C24]] : i32
// CHECK-NEXT: %[[IN7:.*]] = arith.cmpi ult, %[[R7]], %[[RV]] : i32
// CHECK-NEXT: scf.if %[[IN7]] {
// CHECK-NEXT: vector.extract %[[ACC]][14]
// CHECK: vector.extract %[[ACC]][15]
// CHECK-DAG: arith.extui %[[C7_]] : i32 to i64
// CHECK-DAG: arith.extui %[[R7]] : i32 to i64
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xf16>, !llvm.ptr<1>
// CHECK-NEXT: }
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @acc_store_f16(%acc: vector<16xf32>, %c: !llvm.ptr<1>, %ld: i32, %rows_valid: i32) {
    megamoe.acc_store %acc, %c[%ld] rows_valid %rows_valid {m = 64, n = 32, threads = 128, elem = f16} : vector<16xf32>, !llvm.ptr<1>
    llvm.return
  }
}

// -----

// Into TMA's boxes (box_rows 64): 64 x 128 bf16 is two 64-column boxes of 8 KB; each of the 32 pairs lands at its
// row % 64 times 64 elements, its chunk xor (row % 8) times 8 (chunk 0's xor folds away: 28 of 32), and the
// second box at 4096 elements. The stores end with the proxy fence for the tensor store that reads them.
// CHECK-LABEL: llvm.func @acc_store_boxes
// CHECK: arith.constant 4096 : i32
// CHECK-COUNT-28: arith.xori
// CHECK-NOT: arith.xori
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @acc_store_boxes(%acc: vector<64xf32>, %s: !llvm.ptr<3>, %ld: i32, %rows_valid: i32) {
    megamoe.acc_store %acc, %s[%ld] rows_valid %rows_valid {m = 64, n = 128, threads = 128, elem = bf16, box_rows = 64} : vector<64xf32>, !llvm.ptr<3>
    llvm.return
  }
}

// -----

// 64 x 128 bf16: 32 pair stores, truncated to bf16; f32 keeps the values and stores 8-byte pairs.
// CHECK-LABEL: llvm.func @acc_store_bf16
// CHECK-COUNT-32: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<2xbf16>, !llvm.ptr<1>
// CHECK-NOT: llvm.store
// CHECK: llvm.return
// CHECK-LABEL: llvm.func @acc_store_f32
// CHECK-NOT: arith.truncf
// CHECK-COUNT-8: llvm.store %{{.*}}, %{{.*}} {alignment = 8 : i64} : vector<2xf32>, !llvm.ptr
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

// ptr + offsets[peer] bytes.
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

// Release fence at the scope, then a release store / add at the same scope. NVPTX syncscopes: system is the
// default (none printed), gpu is "device", cta is "block".
// CHECK-LABEL: llvm.func @signal
// CHECK-SAME: (%[[F:[^:]+]]: !llvm.ptr<1>, %[[S:[^:]+]]: !llvm.ptr<3>, %[[V:[^:]+]]: i64)
// CHECK-NEXT: llvm.fence release
// CHECK-NEXT: llvm.store %[[V]], %[[F]] atomic release {alignment = 8 : i64} : i64, !llvm.ptr<1>
// CHECK-NEXT: llvm.fence syncscope("device") release
// CHECK-NEXT: %{{.*}} = llvm.atomicrmw add %[[F]], %[[V]] syncscope("device") release {alignment = 8 : i64} : !llvm.ptr<1>, i64
// CHECK-NEXT: llvm.fence syncscope("block") release
// CHECK-NEXT: llvm.store %[[V]], %[[S]] atomic syncscope("block") release {alignment = 8 : i64} : i64, !llvm.ptr<3>
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

// Spin with acquire loads until flag >= expected (unsigned) or %globaltimer passes start + timeout; on timeout CAS
// the error code 0 -> 1 (kWaitTimeout) and, if claimed, fill words 1..5 (rank, flag id, seen, expected, block).
// CHECK-LABEL: llvm.func @wait
// CHECK-SAME: (%[[F:[^:]+]]: !llvm.ptr<1>, %[[ERR:[^:]+]]: !llvm.ptr<1>, %[[EXP:[^:]+]]: i64, %[[TMO:[^:]+]]: i64, %[[RANK:[^:]+]]: i32, %[[ID:[^:]+]]: i64)
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-DAG: %[[TRUE:.*]] = arith.constant true
// CHECK-DAG: %[[FALSE:.*]] = arith.constant false
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0 : i64
// CHECK: %[[START:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
// CHECK-NEXT: %[[LOOP:.*]]:2 = scf.while (%{{.*}} = %[[ZERO]], %{{.*}} = %[[FALSE]]) : (i64, i1) -> (i64, i1) {
// CHECK-NEXT: %[[SEEN:.*]] = llvm.load %[[F]] atomic acquire {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK-NEXT: %[[REACHED:.*]] = arith.cmpi uge, %[[SEEN]], %[[EXP]] : i64
// CHECK-NEXT: %[[NOW:.*]] = nvvm.read.ptx.sreg.globaltimer : i64
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
// CHECK-NEXT: %[[BLOCK:.*]] = nvvm.read.ptx.sreg.ctaid.x : i32
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

// A wait on a shared-memory flag loads at CTA scope; on a global flag at gpu scope, "device".
// CHECK-LABEL: llvm.func @wait_scopes
// CHECK: llvm.load %{{.*}} atomic syncscope("block") acquire {alignment = 8 : i64} : !llvm.ptr<3> -> i64
// CHECK: llvm.load %{{.*}} atomic syncscope("device") acquire {alignment = 8 : i64} : !llvm.ptr<1> -> i64
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

// The lowering expands barriers itself; the block barriers stay gpu.barrier (convert-gpu-to-nvvm lowers them).
// CHECK-LABEL: llvm.func @barriers
// CHECK-SAME: nvvm.kernel, nvvm.reqntid = array<i32: 256, 1, 1>
// CHECK: gpu.barrier
// CHECK: llvm.atomicrmw add %{{.*}} syncscope("device") release
// CHECK: llvm.load %{{.*}} atomic syncscope("device") acquire
// CHECK: nvvm.read.ptx.sreg.globaltimer
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

//===----------------------------------------------------------------------===//
// Warp specialisation: group_barrier, mbarriers, async_arrive, proxy_fence, set_max_registers
//===----------------------------------------------------------------------===//

// -----

// A producer group's copies start at its own first thread (tid - 256); the ring hand-over ops map one to one.
// CHECK-LABEL: llvm.func @warp_specialised
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: %[[LOCAL:.*]] = arith.subi %[[TID]], %{{.*}} : i32
// CHECK: arith.divui %[[LOCAL]]
// CHECK: nvvm.cp.async.shared.global
// CHECK: nvvm.cp.async.mbarrier.arrive %{{.*}} {noinc = true}
// CHECK: nvvm.mbarrier.init %{{.*}}, %{{.*}}
// CHECK: nvvm.mbarrier.arrive %{{.*}}
// CHECK: nvvm.mbarrier.try_wait.parity %{{.*}}, %{{.*}}, %{{.*}}
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %{{.*}}
// CHECK: nvvm.setmaxregister decrease 56
// CHECK: nvvm.setmaxregister increase 216
gpu.module @k {
  llvm.func @warp_specialised(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %bar: !llvm.ptr<3>, %ld: i32, %n: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %n {rows = 64, cols = 64, threads = 128, first_thread = 256, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
    megamoe.async_arrive %bar : !llvm.ptr<3>
    megamoe.mbarrier_init %bar, %n : !llvm.ptr<3>
    megamoe.mbarrier_arrive %bar : !llvm.ptr<3>
    megamoe.mbarrier_wait %bar, %n : !llvm.ptr<3>
    megamoe.proxy_fence
    megamoe.proxy_fence {global}
    megamoe.group_barrier {id = 1 : i64, threads = 256 : i64}
    megamoe.set_max_registers {count = 56 : i64}
    megamoe.set_max_registers {count = 216 : i64, increase}
    llvm.return
  }
}

// -----

// A slot given back to the peer CTA's producer: mapa into the cluster window, then an arrival at the default
// (CTA) scope. A cluster-scope release here fenced every K step of the MMA warps (ncu: membar and gmma stalls;
// cluster pairs ran at 0.71-0.81 of torch._grouped_mm, 0.94-1.06 without it).
// CHECK-LABEL: llvm.func @arrive_peer
// CHECK: llvm.inline_asm
// CHECK-SAME: mapa.shared::cluster.u32 peer, $0, $1;
// CHECK-SAME: mbarrier.arrive.shared::cluster.b64 _, [peer];
// CHECK-NOT: release.cluster
gpu.module @k {
  llvm.func @arrive_peer(%bar: !llvm.ptr<3>, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.mbarrier_arrive_peer %bar, %cta : !llvm.ptr<3>
    llvm.return
  }
}

// -----

// With `cluster` the arrival releases at cluster scope (the pairs' ticket mailbox: the slot's read is ordered
// before the other CTA overwrites it).
// CHECK-LABEL: llvm.func @arrive_peer_cluster
// CHECK: llvm.inline_asm
// CHECK-SAME: mbarrier.arrive.release.cluster.shared::cluster.b64 _, [peer];
gpu.module @k {
  llvm.func @arrive_peer_cluster(%bar: !llvm.ptr<3>, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.mbarrier_arrive_peer %bar, %cta {cluster} : !llvm.ptr<3>
    llvm.return
  }
}

// -----

// A pair's ticket: both shared offsets mapped into the peer's window, 16 bytes completing on its barrier; the
// mailbox's wait acquires at cluster scope.
// CHECK-LABEL: llvm.func @shared_copy_peer
// CHECK: llvm.inline_asm
// CHECK-SAME: mapa.shared::cluster.u32 dst, $0, $2;
// CHECK-SAME: mapa.shared::cluster.u32 bar, $1, $2;
// CHECK-SAME: cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [$0], 16, [bar];
// CHECK: llvm.inline_asm
// CHECK-SAME: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [$0], $1, 1000000;
gpu.module @k {
  llvm.func @shared_copy_peer(%src: !llvm.ptr<3>, %bar: !llvm.ptr<3>, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.shared_copy_peer %src, %bar, %cta {bytes = 16 : i64} : !llvm.ptr<3>, !llvm.ptr<3>
    megamoe.mbarrier_wait %bar, %cta {cluster} : !llvm.ptr<3>
    llvm.return
  }
}

// -----

// A pair's start check: the value stored at the same shared offset in the peer CTA (mapa, st.shared::cluster), then
// the cluster barrier both pass before either reads it.
// CHECK-LABEL: llvm.func @shared_store_peer
// CHECK: llvm.inline_asm
// CHECK-SAME: mapa.shared::cluster.u32 dst, $0, $2;
// CHECK-SAME: st.shared::cluster.u32 [dst], $1;
// CHECK: barrier.cluster.arrive.release.aligned;
gpu.module @k {
  llvm.func @shared_store_peer(%slot: !llvm.ptr<3>, %v: i32, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
    megamoe.shared_store_peer %slot, %v, %cta : !llvm.ptr<3>
    megamoe.cluster_sync
    llvm.return
  }
}

// -----

// The FP8 promotion over the wgmma fragment: a thread's 64 elements lie in two rows (lane / 4 and 8 more), so
// acc_row_scales loads two scales, each multiplied by the factor and zeroed past rows_valid (a select, the load
// clamped to row 0); acc_scale_add loads nothing and makes every element acc + partial * its row's scale (elements
// 0, 1 row 0; 2, 3 row 8).
// CHECK-LABEL: llvm.func @acc_row_scales
// CHECK-SAME: (%[[S:[^:]+]]: !llvm.ptr<1>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32, %[[F:[^:]+]]: f32)
// CHECK: %[[IN0:.*]] = arith.cmpi ult, %[[ROW0:.*]], %[[RV]] : i32
// CHECK-NEXT: arith.select %[[IN0]], %[[ROW0]], %{{.*}} : i32
// CHECK: %[[S0:.*]] = llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NEXT: %[[SF0:.*]] = arith.mulf %[[S0]], %[[F]] : f32
// CHECK-NEXT: arith.select %[[IN0]], %[[SF0]], %{{.*}} : f32
// CHECK-COUNT-1: llvm.load
// CHECK-NOT: llvm.load
// CHECK: llvm.return %{{.*}} : vector<2xf32>
gpu.module @k {
  llvm.func @acc_row_scales(%s: !llvm.ptr<1>, %ld: i32, %rv: i32, %f: f32) -> vector<2xf32> {
    %r = megamoe.acc_row_scales %s[%ld] rows_valid %rv factor %f {m = 64, n = 128, threads = 128} : !llvm.ptr<1> -> vector<2xf32>
    llvm.return %r : vector<2xf32>
  }
}

// -----

// CHECK-LABEL: llvm.func @acc_scale_add
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<64xf32>, %[[P:[^:]+]]: vector<64xf32>, %[[SC:[^:]+]]: vector<2xf32>)
// CHECK-NOT: llvm.load
// CHECK: %[[R0:.*]] = vector.extract %[[SC]][0] : f32 from vector<2xf32>
// CHECK: %[[R8:.*]] = vector.extract %[[SC]][1] : f32 from vector<2xf32>
// CHECK: %[[P0:.*]] = vector.extract %[[P]][0] : f32 from vector<64xf32>
// CHECK-NEXT: arith.mulf %[[P0]], %[[R0]] : f32
// CHECK: %[[P2:.*]] = vector.extract %[[P]][2] : f32 from vector<64xf32>
// CHECK-NEXT: arith.mulf %[[P2]], %[[R8]] : f32
// CHECK-NOT: llvm.load
// CHECK: llvm.return
gpu.module @k {
  llvm.func @acc_scale_add(%acc: vector<64xf32>, %p: vector<64xf32>, %sc: vector<2xf32>) -> vector<64xf32> {
    %r = megamoe.acc_scale_add %acc, %p, %sc {m = 64, n = 128, threads = 128} : vector<64xf32>, vector<2xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// mma_tile {fresh}: the chain's first wgmma ignores the accumulator (scale-d false), the later ones add to it; an
// mma_drain {pending = 1} waits for all but the latest group.
// CHECK-LABEL: llvm.func @mma_fresh
// CHECK: nvvm.wgmma.fence.aligned
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <zero>]
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK: nvvm.wgmma.mma_async {{.*}} D[<f32>, <one>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
gpu.module @k {
  llvm.func @mma_fresh(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) -> vector<64xf32> attributes {megamoe.kernel, megamoe.block_threads = 128 : i64} {
    %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 128, threads = 128, pending = 1, e4m3, fresh} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    %d = megamoe.mma_drain %r {pending = 1} : vector<64xf32>
    llvm.return %d : vector<64xf32>
  }
}

// -----

// pack_e4m3: one cvt.rn.satfinite.e4m3x2.f32 per pair, the odd element first (the instruction's high byte), so the
// pair's bytes read (even, odd) in memory order.
// CHECK-LABEL: llvm.func @pack_e4m3
// CHECK: %[[X0:.*]] = vector.extract %{{.*}}[0] : f32 from vector<4xf32>
// CHECK-NEXT: %[[X1:.*]] = vector.extract %{{.*}}[1] : f32 from vector<4xf32>
// CHECK-NEXT: nvvm.convert.f32x2.to.f8x2 %[[X1]], %[[X0]] {rnd = #nvvm.fp_rnd_mode<rn>, sat = #nvvm.sat_mode<satfinite>} : vector<2xi8>(f8E4M3FN)
// CHECK-COUNT-1: nvvm.convert.f32x2.to.f8x2
// CHECK-NOT: nvvm.convert.f32x2.to.f8x2
// CHECK: llvm.return
gpu.module @k {
  llvm.func @pack_e4m3(%v: vector<4xf32>) -> vector<4xi8> {
    %q = megamoe.pack_e4m3 %v : vector<4xf32> -> vector<4xi8>
    llvm.return %q : vector<4xi8>
  }
}
