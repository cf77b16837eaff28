// The gfx950 pipeline the code generator runs (compiler/lib/Target/Pipeline.cpp
// buildGfx950Pipeline, registered in megamoe-opt as
// --megamoe-gfx950-pipeline): afterwards only LLVM and ROCDL ops are left, and MMA is v_mfma_f32_32x32x16_bf16.
// RUN: megamoe-opt %s --megamoe-gfx950-pipeline | FileCheck %s
// Every line is an llvm./rocdl. op, a block label, a closing brace or the module structure; grep prints any other.
// RUN: megamoe-opt %s --megamoe-gfx950-pipeline | not grep -vE '^ *($|}|\^bb|module( attributes .*)? \{$|gpu\.module @|(%[^ ]+ = )?(llvm|rocdl)\.)'

// A one-stage GEMM tile: both copies, the MMA (2 waves x 4 N tiles x 4 k-steps), the store.
// CHECK-LABEL: llvm.func @gemm
// CHECK-SAME: rocdl.flat_work_group_size = "128,128", rocdl.kernel, rocdl.reqd_work_group_size = array<i32: 128, 1, 1>
// CHECK: rocdl.barrier
// CHECK-COUNT-16: rocdl.mfma.f32.32x32x16.bf16
// CHECK-NOT: rocdl.mfma
// CHECK: llvm.store {{.*}} : bf16, !llvm.ptr<1>
// CHECK: llvm.return
module attributes {gpu.container_module} {
gpu.module @k {
  llvm.mlir.global internal @smem_a() {addr_space = 3 : i32, alignment = 1024 : i64} : !llvm.array<8192 x i8>
  llvm.mlir.global internal @smem_b() {addr_space = 3 : i32, alignment = 1024 : i64} : !llvm.array<16384 x i8>
  llvm.mlir.global internal @ring_a() {addr_space = 3 : i32, alignment = 1024 : i64} : !llvm.array<16384 x i8>
  llvm.mlir.global internal @ring_b() {addr_space = 3 : i32, alignment = 1024 : i64} : !llvm.array<32768 x i8>
  llvm.func @gemm(%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %c: !llvm.ptr<1>, %m: i32) attributes {megamoe.kernel, megamoe.block_threads = 128 : i64} {
    %sa = llvm.mlir.addressof @smem_a : !llvm.ptr<3>
    %sb = llvm.mlir.addressof @smem_b : !llvm.ptr<3>
    %c64 = arith.constant 64 : i32
    %c128 = arith.constant 128 : i32
    %z = arith.constant dense<0.0> : vector<64xf32>
    megamoe.tile_copy %a[%c64], %sa[%c64] rows_valid %m {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
    megamoe.tile_copy %b[%c64], %sb[%c64] rows_valid %c128 {rows = 128, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32} : !llvm.ptr<1> -> !llvm.ptr<3>
    gpu.barrier
    %acc = megamoe.mma_tile %sa, %sb, %z {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    megamoe.acc_store %acc, %c[%c128] rows_valid %m {m = 64, n = 128, threads = 128, elem = bf16} : vector<64xf32>, !llvm.ptr<1>
    llvm.return
  }

  // The accumulator carried through a K loop (not a constant), as every real GEMM has it: the split into and the
  // join from MFMA tiles must lower too (vector strided-slice ops have no LLVM lowering in this pipeline).
  // CHECK-LABEL: llvm.func @gemm_k_loop
  // CHECK-COUNT-16: rocdl.mfma.f32.32x32x16.bf16
  // CHECK-NOT: rocdl.mfma
  // CHECK: llvm.return
  llvm.func @gemm_k_loop(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %c: !llvm.ptr<1>, %ld: i32, %m: i32, %steps: i32) attributes {megamoe.kernel, megamoe.block_threads = 128 : i64} {
    %z = arith.constant dense<0.0> : vector<64xf32>
    %c0 = arith.constant 0 : i32
    %c1 = arith.constant 1 : i32
    %acc = scf.for %s = %c0 to %steps step %c1 iter_args(%x = %z) -> (vector<64xf32>) : i32 {
      %y = megamoe.mma_tile %a, %b, %x {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
      scf.yield %y : vector<64xf32>
    }
    megamoe.acc_store %acc, %c[%ld] rows_valid %m {m = 64, n = 128, threads = 128, elem = bf16} : vector<64xf32>, !llvm.ptr<1>
    llvm.return
  }

  // Signals, bounded waits and both barriers: scoped atomics, s_memrealtime, s_barrier.
  // CHECK-LABEL: llvm.func @communicate
  // CHECK-SAME: rocdl.flat_work_group_size = "256,256", rocdl.kernel, rocdl.reqd_work_group_size = array<i32: 256, 1, 1>
  // CHECK: rocdl.barrier
  // CHECK: llvm.atomicrmw add {{.*}} syncscope("agent") release
  // CHECK: llvm.call_intrinsic "llvm.amdgcn.s.memrealtime"
  // CHECK: llvm.load {{.*}} atomic syncscope("agent") acquire
  // CHECK: llvm.cmpxchg
  // CHECK: rocdl.barrier
  // CHECK: llvm.store {{.*}} atomic release
  // CHECK: llvm.return
  llvm.func @communicate(%counter: !llvm.ptr<1>, %flags: !llvm.ptr<1>, %offsets: !llvm.ptr<1>, %err: !llvm.ptr<1>, %rank: i32, %nranks: i32, %v: i64, %t: i64) attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
    %a = megamoe.grid_barrier %counter at_least %v timeout %t error %err(%rank) : !llvm.ptr<1>, !llvm.ptr<1>
    %b = megamoe.rank_barrier %flags, %offsets(%rank of %nranks) at_least %v timeout %t error %err : !llvm.ptr<1>, !llvm.ptr<1>, !llvm.ptr<1>
    llvm.return
  }

  // A double-buffered K loop on async copies: stage s + 1 is issued into the other slot while stage s's MMA is
  // still in flight (mma_tile {pending = 1}); A is a b128 tile, B a K x N tile in the MN-major b128_mn layout
  // (b_mn_major); mma_drain completes the last MMA before acc_store reads the accumulator.
  // CHECK-LABEL: llvm.func @gemm_async
  // CHECK-SAME: rocdl.flat_work_group_size = "128,128", rocdl.kernel, rocdl.reqd_work_group_size = array<i32: 128, 1, 1>
  // Prologue: the async copies are synchronous; A as 16-byte LDS stores, B transposed into K-major rows.
  // CHECK: llvm.store {{.*}} : vector<4xi32>, !llvm.ptr<3>
  // CHECK-COUNT-8: llvm.store {{.*}} : bf16, !llvm.ptr<3>
  // CHECK: rocdl.barrier
  // CHECK-COUNT-16: rocdl.mfma.f32.32x32x16.bf16
  // CHECK-NOT: rocdl.mfma
  // The next stage, then the accumulator stored as it is (the drain vanished): no asm, no further LDS store.
  // CHECK: llvm.store {{.*}} : vector<4xi32>, !llvm.ptr<3>
  // CHECK-COUNT-8: llvm.store {{.*}} : bf16, !llvm.ptr<3>
  // CHECK-NOT: llvm.inline_asm
  // CHECK-NOT: !llvm.ptr<3>
  // CHECK: llvm.store {{.*}} : bf16, !llvm.ptr<1>
  // CHECK-NOT: llvm.inline_asm
  // CHECK: llvm.return
  llvm.func @gemm_async(%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %c: !llvm.ptr<1>, %lda: i32, %ldb: i32, %ldc: i32, %m: i32, %k: i32, %stages: i32) attributes {megamoe.kernel, megamoe.block_threads = 128 : i64} {
    %ra = llvm.mlir.addressof @ring_a : !llvm.ptr<3>
    %rb = llvm.mlir.addressof @ring_b : !llvm.ptr<3>
    %c0 = arith.constant 0 : i32
    %c1 = arith.constant 1 : i32
    %c2 = arith.constant 2 : i32
    %c64 = arith.constant 64 : i32
    %c128 = arith.constant 128 : i32
    %a_slot = arith.constant 8192 : i32
    %b_slot = arith.constant 16384 : i32
    %z = arith.constant dense<0.0> : vector<64xf32>
    // Prologue: stage 0 into slot 0, one group.
    megamoe.tile_copy %a[%lda], %ra[%c64] rows_valid %m {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
    megamoe.tile_copy %b[%ldb], %rb[%c128] rows_valid %k {rows = 64, cols = 128, threads = 128, elem = bf16, swizzle = 2 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
    megamoe.async_commit
    %acc = scf.for %s = %c0 to %stages step %c1 iter_args(%x = %z) -> (vector<64xf32>) : i32 {
      %slot = arith.remui %s, %c2 : i32
      %oa = arith.muli %slot, %a_slot : i32
      %ob = arith.muli %slot, %b_slot : i32
      %sa = llvm.getelementptr %ra[%oa] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
      %sb = llvm.getelementptr %rb[%ob] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
      megamoe.async_wait {pending = 0}
      gpu.barrier
      %y = megamoe.mma_tile %sa, %sb, %x {m = 64, n = 128, k = 64, threads = 128, pending = 1, b_mn_major} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
      // The other slot was read by stage s - 1's MMA, which the mma_tile above has waited for.
      %next = arith.addi %s, %c1 : i32
      %nslot = arith.subi %c1, %slot : i32
      %noa = arith.muli %nslot, %a_slot : i32
      %nob = arith.muli %nslot, %b_slot : i32
      %na = llvm.getelementptr %ra[%noa] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
      %nb = llvm.getelementptr %rb[%nob] : (!llvm.ptr<3>, i32) -> !llvm.ptr<3>, i8
      %a_bytes = arith.muli %next, %c128 : i32
      %ga = llvm.getelementptr %a[%a_bytes] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, i8
      %k_row = arith.muli %next, %c64 : i32
      %b_elems = arith.muli %k_row, %ldb : i32
      %b_bytes = arith.muli %b_elems, %c2 : i32
      %gb = llvm.getelementptr %b[%b_bytes] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, i8
      %k_left = arith.subi %k, %k_row : i32
      megamoe.tile_copy %ga[%lda], %na[%c64] rows_valid %m {rows = 64, cols = 64, threads = 128, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
      megamoe.tile_copy %gb[%ldb], %nb[%c128] rows_valid %k_left {rows = 64, cols = 128, threads = 128, elem = bf16, swizzle = 2 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
      megamoe.async_commit
      scf.yield %y : vector<64xf32>
    }
    %d = megamoe.mma_drain %acc : vector<64xf32>
    megamoe.acc_store %d, %c[%ldc] rows_valid %m {m = 64, n = 128, threads = 128, elem = bf16} : vector<64xf32>, !llvm.ptr<1>
    llvm.return
  }
}
}
