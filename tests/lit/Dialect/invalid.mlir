// One expected-error per verifier rule of the megamoe ops (compiler/lib/Dialect/MegaMoe.cpp).
// RUN: megamoe-opt %s -split-input-file -verify-diagnostics

//===----------------------------------------------------------------------===//
// tile_copy
//===----------------------------------------------------------------------===//

llvm.func @tile_copy_global_to_global(%src: !llvm.ptr<1>, %dst: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{copies between memory levels: one side must be global (address space 0 or 1) and the other shared (address space 3)}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @tile_copy_shared_to_shared(%src: !llvm.ptr<3>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{copies between memory levels}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<3> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_gather_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %rows: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{a gathering copy (row_index) is a plain load: global -> shared, not transposed, not b128_mn}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i gather %rows : !llvm.ptr<3> {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<3> -> !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @tile_copy_gather_global_table(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %rows: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{row_index is a shared-memory i32 table (address space 3)}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i gather %rows : !llvm.ptr<1> {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

// A group of threads must lie inside the block.
llvm.func @tile_copy_group_outside_block(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
  // expected-error @+1 {{threads [192, 320) must be the kernel's megamoe.block_threads = 256 or a group of whole warps inside it}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, first_thread = 192, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_larger_than_shared_memory(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{a tile of 536870912 x 64 elements exceeds the 232448-byte shared-memory capacity}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 536870912, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @mma_tile_threads_past_block(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
  // expected-error @+1 {{threads [0, 384) must be the kernel's megamoe.block_threads = 256 or a group of whole warps inside it}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 192, n = 128, k = 64, threads = 384} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

// Address space 5 (AMDGPU private) is neither global nor shared.
llvm.func @tile_copy_private(%src: !llvm.ptr<5>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{copies between memory levels}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<5> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_bad_elem(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{element type must be bf16, f16 or f32, got 'i32'}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = i32, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_zero_rows(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{rows, cols and threads must be positive}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 0, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_negative_cols(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{rows, cols and threads must be positive}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = -64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_zero_threads(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{rows, cols and threads must be positive}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 0, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

// 12 bf16 = 24 bytes: not a whole number of 16-byte chunks.
llvm.func @tile_copy_row_not_16_bytes(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{a tile row must be a multiple of 16 bytes, got 24}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 12, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

// 4 rows x 8 chunks = 32 chunks for 128 threads.
llvm.func @tile_copy_chunks_not_divisible(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{the tile's 16-byte chunks (32) must divide evenly among 128 threads}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 4, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<3> -> !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @tile_copy_b128_short_rows(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{b128 swizzle needs 128-byte rows and a multiple of 8 rows, got 64-byte rows x 64}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 32, threads = 128, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

// 128-byte rows (f32), but 4 rows do not fill the 8-row swizzle period.
llvm.func @tile_copy_b128_rows_not_multiple_of_8(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{b128 swizzle needs 128-byte rows and a multiple of 8 rows, got 128-byte rows x 4}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 4, cols = 32, threads = 32, elem = f32, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_transpose_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{transpose is only supported for loads (global -> shared)}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, transpose} : !llvm.ptr<3> -> !llvm.ptr<1>
  llvm.return
}

// -----

// 32 bf16 source rows make 64-byte shared rows.
llvm.func @tile_copy_transpose_short_shared_rows(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{a transposing copy needs 128-byte shared rows (rows * element bytes == 128) and cols a multiple of 8, got 32 x 64}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 32, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, transpose} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

// 32 f32 rows make 128-byte shared rows, but 12 columns (three 16-byte chunks a row) are not a multiple of 8.
llvm.func @tile_copy_transpose_cols_not_multiple_of_8(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{a transposing copy needs 128-byte shared rows (rows * element bytes == 128) and cols a multiple of 8, got 32 x 12}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 32, cols = 12, threads = 32, elem = f32, swizzle = 1 : i32, transpose} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_transpose_without_b128(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{a transposing copy writes K-major b128-swizzled rows: swizzle must be b128}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 2 : i32, transpose} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_async_from_generic_pointer(%src: !llvm.ptr, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{async copies read global memory: the source must be in address space 1}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr -> !llvm.ptr<3>
  llvm.return
}

// -----

// The capacity bound on the tile's bytes, not only on each dimension: 1024 x 128 bf16 = 256 KB.
llvm.func @tile_copy_bytes_larger_than_shared_memory(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{a tile of 1024 x 128 elements exceeds the 232448-byte shared-memory capacity}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 1024, cols = 128, threads = 128, elem = bf16, swizzle = 0 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_async_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{async copies are plain loads (global -> shared, not transposed)}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 0 : i32, async} : !llvm.ptr<3> -> !llvm.ptr<1>
  llvm.return
}

// -----

// A load that would be valid without `async` (see tile_copy_load_transposed in ops.mlir).
llvm.func @tile_copy_async_transposed(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{async copies are plain loads (global -> shared, not transposed)}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 128, threads = 128, elem = bf16, swizzle = 1 : i32, transpose, async} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tile_copy_b128_mn_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{b128_mn tiles are loads of 128 / element-bytes K rows (64 bf16) with row bytes a multiple of 128, got 256-byte rows x 64}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 128, threads = 128, elem = bf16, swizzle = 2 : i32} : !llvm.ptr<3> -> !llvm.ptr<1>
  llvm.return
}

// -----

// 32 bf16 = 64-byte rows: half a 1024-byte atom's MN extent.
llvm.func @tile_copy_b128_mn_short_rows(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{b128_mn tiles are loads of 128 / element-bytes K rows (64 bf16) with row bytes a multiple of 128, got 64-byte rows x 64}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 32, threads = 128, elem = bf16, swizzle = 2 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

// 12 K rows do not fill the atoms' 8-row K groups.
llvm.func @tile_copy_b128_mn_rows_not_multiple_of_8(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{b128_mn tiles are loads of 128 / element-bytes K rows (64 bf16) with row bytes a multiple of 128, got 128-byte rows x 12}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 12, cols = 64, threads = 32, elem = bf16, swizzle = 2 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

// The swizzle enum has three cases.
llvm.func @tile_copy_unknown_swizzle(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{attribute 'swizzle' failed to satisfy constraint: shared-memory tile layout}}
  megamoe.tile_copy %src[%i], %dst[%i] rows_valid %i {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 3 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

//===----------------------------------------------------------------------===//
// async_wait
//===----------------------------------------------------------------------===//

// -----

llvm.func @async_wait_pending_too_large() {
  // expected-error @+1 {{pending must be 0..7, got 8}}
  megamoe.async_wait {pending = 8}
  llvm.return
}

// -----

// Rejected, but the diagnostic prints the value as unsigned (18446744073709551615): only the prefix is matched.
llvm.func @async_wait_pending_negative() {
  // expected-error @+1 {{pending must be 0..7, got}}
  megamoe.async_wait {pending = -1}
  llvm.return
}

//===----------------------------------------------------------------------===//
// bulk_store, bulk_wait
//===----------------------------------------------------------------------===//

// -----

llvm.func @bulk_store_from_global(%src: !llvm.ptr<1>, %dst: !llvm.ptr<1>, %n: i32) {
  // expected-error @+1 {{source must be in shared memory (address space 3)}}
  megamoe.bulk_store %src, %dst, %n : !llvm.ptr<1> -> !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @bulk_store_to_generic(%src: !llvm.ptr<3>, %dst: !llvm.ptr, %n: i32) {
  // expected-error @+1 {{destination must be in global memory (address space 1)}}
  megamoe.bulk_store %src, %dst, %n : !llvm.ptr<3> -> !llvm.ptr
  llvm.return
}

// -----

llvm.func @bulk_wait_pending_too_large() {
  // expected-error @+1 {{pending must be 0..7, got 9}}
  megamoe.bulk_wait {pending = 9}
  llvm.return
}

//===----------------------------------------------------------------------===//
// mma_tile
//===----------------------------------------------------------------------===//

// -----

llvm.func @mma_tile_e4m3_k64(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{e4m3: k must be 128 (one 128-byte swizzled e4m3 row per stage), got 64}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, e4m3} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_e4m3_mn_major(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{e4m3 operands must both be K-major (the FP8 MMAs do not transpose)}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 128, threads = 128, e4m3, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_a_in_global(%a: !llvm.ptr<1>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{operands A and B must be in shared memory (address space 3)}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<1>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

// a_first_rows shares one warpgroup's 64 rows of A: a two-warpgroup tile cannot use it.
llvm.func @mma_tile_a_first_rows_two_warpgroups(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<32xf32>) {
  // expected-error @+1 {{a_first_rows is one warpgroup's tile: m = 64 and threads = 128, got m = 128, threads = 256}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 128, n = 64, k = 64, threads = 256, a_first_rows} : !llvm.ptr<3>, !llvm.ptr<3>, vector<32xf32> -> vector<32xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_b_generic(%a: !llvm.ptr<3>, %b: !llvm.ptr, %acc: vector<64xf32>) {
  // expected-error @+1 {{operands A and B must be in shared memory (address space 3)}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_k_not_64(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{k must be 64 (one 128-byte swizzled bf16 row per stage), got 32}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 32, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_result_type(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{result type must equal the accumulator type}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<32xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_threads_not_warpgroups(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{threads must be a positive multiple of 128 (one warpgroup / two waves), got 64}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 64} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_m_not_64_per_warpgroup(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{m must be 64 per 128 threads (128), got 64}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 256} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_n_not_multiple_of_32(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<24xf32>) {
  // expected-error @+1 {{n must be a multiple of 32 in [32, 256], got 48}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 48, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<24xf32> -> vector<24xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_n_too_large(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<144xf32>) {
  // expected-error @+1 {{n must be a multiple of 32 in [32, 256], got 288}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 288, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<144xf32> -> vector<144xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_acc_length(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<32xf32>) {
  // expected-error @+1 {{accumulator must hold m * n / threads = 64 f32 per thread, got 32}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<32xf32> -> vector<32xf32>
  llvm.return
}

// -----

llvm.func @mma_tile_pending_2(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{pending must be 0 or 1, got 2}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, pending = 2} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

// -----

// Rejected, but the diagnostic prints the value as unsigned (18446744073709551615): only the prefix is matched.
llvm.func @mma_tile_pending_negative(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>) {
  // expected-error @+1 {{pending must be 0 or 1, got}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 128, k = 64, threads = 128, pending = -1, a_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
  llvm.return
}

//===----------------------------------------------------------------------===//
// mma_drain
//===----------------------------------------------------------------------===//

// -----

// The custom form names one type; the generic form can disagree.
llvm.func @mma_drain_result_type(%acc: vector<64xf32>) {
  // expected-error @+1 {{failed to verify that all of {acc, result} have same type}}
  %d = "megamoe.mma_drain"(%acc) : (vector<64xf32>) -> vector<32xf32>
  llvm.return
}

// -----

llvm.func @mma_drain_not_f32(%acc: vector<64xi32>) {
  // expected-error @+1 {{operand #0 must be vector of 32-bit float values of ranks 1, but got 'vector<64xi32>'}}
  %d = megamoe.mma_drain %acc : vector<64xi32>
  llvm.return
}

//===----------------------------------------------------------------------===//
// acc_store
//===----------------------------------------------------------------------===//

// -----

// Address space 5 (AMDGPU private) is neither global nor shared.
llvm.func @acc_store_to_private(%acc: vector<64xf32>, %c: !llvm.ptr<5>, %i: i32) {
  // expected-error @+1 {{destination must be global or shared memory}}
  megamoe.acc_store %acc, %c[%i] rows_valid %i {m = 64, n = 128, threads = 128, elem = bf16} : vector<64xf32>, !llvm.ptr<5>
  llvm.return
}

// -----

llvm.func @acc_store_bad_elem(%acc: vector<64xf32>, %c: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{element type must be bf16, f16 or f32, got 'i8'}}
  megamoe.acc_store %acc, %c[%i] rows_valid %i {m = 64, n = 128, threads = 128, elem = i8} : vector<64xf32>, !llvm.ptr<1>
  llvm.return
}

// -----

// TMA's boxes live in shared memory.
llvm.func @acc_store_boxes_to_global(%acc: vector<64xf32>, %c: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{box_rows: swizzled 64-column boxes of 2-byte elements in shared memory, n a multiple of 64 and box_rows of 8 or more, a multiple of 8; got n = 128, box_rows = 64}}
  megamoe.acc_store %acc, %c[%i] rows_valid %i {m = 64, n = 128, threads = 128, elem = bf16, box_rows = 64} : vector<64xf32>, !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @acc_store_boxes_f32(%acc: vector<64xf32>, %c: !llvm.ptr<3>, %i: i32) {
  // expected-error @+1 {{box_rows: swizzled 64-column boxes of 2-byte elements in shared memory}}
  megamoe.acc_store %acc, %c[%i] rows_valid %i {m = 64, n = 128, threads = 128, elem = f32, box_rows = 64} : vector<64xf32>, !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @tma_store_from_global(%src: !llvm.ptr<1>, %map: !llvm.ptr, %i: i32) {
  // expected-error @+1 {{the box comes from shared memory (address space 3)}}
  megamoe.tma_store %src, %map[%i, %i] : !llvm.ptr<1>, !llvm.ptr
  llvm.return
}

// -----

// The shape rules are shared with mma_tile; one case shows acc_store applies them.
llvm.func @acc_store_acc_length(%acc: vector<64xf32>, %c: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{accumulator must hold m * n / threads = 32 f32 per thread, got 64}}
  megamoe.acc_store %acc, %c[%i] rows_valid %i {m = 64, n = 64, threads = 128, elem = bf16} : vector<64xf32>, !llvm.ptr<1>
  llvm.return
}

// -----

// acc_store is block-scope too.
llvm.func @acc_store_threads_past_block(%acc: vector<64xf32>, %c: !llvm.ptr<1>, %i: i32) attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
  // expected-error @+1 {{threads [0, 512) must be the kernel's megamoe.block_threads = 256 or a group of whole warps inside it}}
  megamoe.acc_store %acc, %c[%i] rows_valid %i {m = 256, n = 128, threads = 512, elem = bf16} : vector<64xf32>, !llvm.ptr<1>
  llvm.return
}

//===----------------------------------------------------------------------===//
// peer_ptr, signal, wait
//===----------------------------------------------------------------------===//

// -----

llvm.func @peer_ptr_shared(%p: !llvm.ptr<3>, %off: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{only global memory lives on the symmetric heap}}
  %q = megamoe.peer_ptr %p, %off[%i] : !llvm.ptr<3>, !llvm.ptr<1> -> !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @peer_ptr_result_type(%p: !llvm.ptr<1>, %off: !llvm.ptr<1>, %i: i32) {
  // expected-error @+1 {{result type must equal the pointer type}}
  %q = megamoe.peer_ptr %p, %off[%i] : !llvm.ptr<1>, !llvm.ptr<1> -> !llvm.ptr
  llvm.return
}

// -----

llvm.func @signal_shared_gpu_scope(%f: !llvm.ptr<3>, %v: i64) {
  // expected-error @+1 {{a flag in shared memory can only be signalled at cta scope}}
  megamoe.signal store %f, %v scope(gpu) : !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @signal_shared_system_scope(%f: !llvm.ptr<3>, %v: i64) {
  // expected-error @+1 {{a flag in shared memory can only be signalled at cta scope}}
  megamoe.signal add %f, %v scope(system) : !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @wait_shared_system_scope(%f: !llvm.ptr<3>, %err: !llvm.ptr<1>, %v: i64, %r: i32) {
  // expected-error @+1 {{a flag in shared memory can only be waited on at cta scope}}
  %ok = megamoe.wait %f at_least %v timeout %v error %err(%r, %v) scope(system) : !llvm.ptr<3>, !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @wait_error_in_shared(%f: !llvm.ptr<1>, %err: !llvm.ptr<3>, %v: i64, %r: i32) {
  // expected-error @+1 {{the error record must be in global memory}}
  %ok = megamoe.wait %f at_least %v timeout %v error %err(%r, %v) scope(gpu) : !llvm.ptr<1>, !llvm.ptr<3>
  llvm.return
}

//===----------------------------------------------------------------------===//
// grid_barrier, rank_barrier
//===----------------------------------------------------------------------===//

// -----

llvm.func @grid_barrier_counter_in_shared(%c: !llvm.ptr<3>, %err: !llvm.ptr<1>, %v: i64, %r: i32) {
  // expected-error @+1 {{the barrier counter must be in global memory}}
  %ok = megamoe.grid_barrier %c at_least %v timeout %v error %err(%r) : !llvm.ptr<3>, !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @grid_barrier_error_in_shared(%c: !llvm.ptr<1>, %err: !llvm.ptr<3>, %v: i64, %r: i32) {
  // expected-error @+1 {{the error record must be in global memory}}
  %ok = megamoe.grid_barrier %c at_least %v timeout %v error %err(%r) : !llvm.ptr<1>, !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @rank_barrier_flags_in_shared(%f: !llvm.ptr<3>, %off: !llvm.ptr<1>, %err: !llvm.ptr<1>, %v: i64, %r: i32) {
  // expected-error @+1 {{the flag array must be on the symmetric heap}}
  %ok = megamoe.rank_barrier %f, %off(%r of %r) at_least %v timeout %v error %err : !llvm.ptr<3>, !llvm.ptr<1>, !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @rank_barrier_error_in_shared(%f: !llvm.ptr<1>, %off: !llvm.ptr<1>, %err: !llvm.ptr<3>, %v: i64, %r: i32) {
  // expected-error @+1 {{the error record must be in global memory}}
  %ok = megamoe.rank_barrier %f, %off(%r of %r) at_least %v timeout %v error %err : !llvm.ptr<1>, !llvm.ptr<1>, !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @mma_tile_mn_major_partial_atom(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<16xf32>) {
  // expected-error @+1 {{an MN-major operand spans whole 64-element atoms: m and n must be multiples of 64}}
  %r = megamoe.mma_tile %a, %b, %acc {m = 64, n = 32, k = 64, threads = 128, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<16xf32> -> vector<16xf32>
  llvm.return
}

// -----

//===----------------------------------------------------------------------===//
// Warp specialisation
//===----------------------------------------------------------------------===//

llvm.func @group_barrier_id_zero() {
  // expected-error @+1 {{id must be 1..15 (0 is the block's own barrier), got 0}}
  megamoe.group_barrier {id = 0 : i64, threads = 128 : i64}
  llvm.return
}

// -----

llvm.func @group_barrier_partial_warp() {
  // expected-error @+1 {{threads must be a positive multiple of 32 (whole warps), got 100}}
  megamoe.group_barrier {id = 1 : i64, threads = 100 : i64}
  llvm.return
}

// -----

llvm.func @mbarrier_in_global_memory(%bar: !llvm.ptr<1>, %n: i32) {
  // expected-error @+1 {{the mbarrier must be in shared memory (address space 3)}}
  megamoe.mbarrier_init %bar, %n : !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @mbarrier_wait_in_global_memory(%bar: !llvm.ptr<1>, %p: i32) {
  // expected-error @+1 {{the mbarrier must be in shared memory (address space 3)}}
  megamoe.mbarrier_wait %bar, %p : !llvm.ptr<1>
  llvm.return
}

// -----

llvm.func @set_max_registers_not_multiple_of_8() {
  // expected-error @+1 {{count must be a multiple of 8 in [24, 256], got 100}}
  megamoe.set_max_registers {count = 100 : i64}
  llvm.return
}

//===----------------------------------------------------------------------===//
// shared_store_peer
//===----------------------------------------------------------------------===//

// -----

llvm.func @shared_store_peer_into_global(%slot: !llvm.ptr<1>, %v: i32, %cta: i32) {
  // expected-error @+1 {{the slot is shared memory (address space 3)}}
  megamoe.shared_store_peer %slot, %v, %cta : !llvm.ptr<1>
  llvm.return
}

// -----

//===----------------------------------------------------------------------===//
// shared_copy_peer
//===----------------------------------------------------------------------===//

// -----

llvm.func @shared_copy_peer_odd_bytes(%src: !llvm.ptr<3>, %bar: !llvm.ptr<3>, %cta: i32) {
  // expected-error @+1 {{bytes must be a positive multiple of 16, got 12}}
  megamoe.shared_copy_peer %src, %bar, %cta {bytes = 12 : i64} : !llvm.ptr<3>, !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @shared_copy_peer_from_global(%src: !llvm.ptr<1>, %bar: !llvm.ptr<3>, %cta: i32) {
  // expected-error @+1 {{the source is shared memory (address space 3)}}
  megamoe.shared_copy_peer %src, %bar, %cta {bytes = 16 : i64} : !llvm.ptr<1>, !llvm.ptr<3>
  llvm.return
}

// -----

llvm.func @pack_e4m3_odd(%v: vector<3xf32>) -> vector<3xi8> {
  // expected-error @+1 {{the value count must be even (the targets convert pairs), got 3}}
  %q = megamoe.pack_e4m3 %v : vector<3xf32> -> vector<3xi8>
  llvm.return %q : vector<3xi8>
}

// -----

llvm.func @pack_e4m3_short(%v: vector<4xf32>) -> vector<2xi8> {
  // expected-error @+1 {{codes must have one byte per value}}
  %q = megamoe.pack_e4m3 %v : vector<4xf32> -> vector<2xi8>
  llvm.return %q : vector<2xi8>
}

// -----

llvm.func @acc_row_scales_no_factor(%s: !llvm.ptr<1>, %ld: i32, %rv: i32) -> vector<2xf32> {
  // expected-error @+1 {{needs at least one factor (B's block scale)}}
  %r = megamoe.acc_row_scales %s[%ld] rows_valid %rv factor {m = 64, n = 128, threads = 128} : !llvm.ptr<1> -> vector<2xf32>
  llvm.return %r : vector<2xf32>
}

// -----

llvm.func @acc_row_scales_ragged(%s: !llvm.ptr<1>, %ld: i32, %rv: i32, %f: f32, %g: f32) -> vector<3xf32> {
  // expected-error @+1 {{its length must be a multiple of the 2 factors}}
  %r = megamoe.acc_row_scales %s[%ld] rows_valid %rv factor %f, %g {m = 64, n = 128, threads = 128} : !llvm.ptr<1> -> vector<3xf32>
  llvm.return %r : vector<3xf32>
}
