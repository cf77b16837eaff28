// The gfx950 pipeline of compiler/lib/Target/Pipeline.cpp (buildGfx950Pipeline), pass for pass: afterwards only
// LLVM and ROCDL ops are left, and MMA is v_mfma_f32_32x32x16_bf16. Keep the pass list in step with that function.
// RUN: megamoe-opt %s --pass-pipeline='builtin.module(gpu.module(megamoe-lower-to-rocdl,convert-scf-to-cf,convert-gpu-to-rocdl{chipset=gfx950},convert-to-llvm,canonicalize,cse),reconcile-unrealized-casts)' | FileCheck %s
// Every line is an llvm./rocdl. op, a block label, a closing brace or the module structure; grep prints any other.
// RUN: megamoe-opt %s --pass-pipeline='builtin.module(gpu.module(megamoe-lower-to-rocdl,convert-scf-to-cf,convert-gpu-to-rocdl{chipset=gfx950},convert-to-llvm,canonicalize,cse),reconcile-unrealized-casts)' | not grep -vE '^ *($|}|\^bb|module( attributes .*)? \{$|gpu\.module @|(%[^ ]+ = )?(llvm|rocdl)\.)'

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
}
}
