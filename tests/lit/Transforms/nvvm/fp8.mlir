// megamoe-lower-to-nvvm: acc_row_scales, acc_scale_add (the FP8 promotion), pack_e4m3 for sm_90a.
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

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

// Two factors (a tile of gate | up halves from two B blocks): each row's scale is loaded once and multiplied by
// either factor, factor f's rows at f * 2 + j; acc_scale_add's 128 columns split in two groups of 64, element i in
// group (i / 4) 8 / 64: elements 0 .. 31 take scales 0, 1 (rows 0, 8), 32 .. 63 scales 2, 3.
// CHECK-LABEL: llvm.func @acc_row_scales_two_factors
// CHECK-SAME: (%[[S:[^:]+]]: !llvm.ptr<1>, %[[LD:[^:]+]]: i32, %[[RV:[^:]+]]: i32, %[[F:[^:]+]]: f32, %[[G:[^:]+]]: f32)
// CHECK: %[[S0:.*]] = llvm.load %{{.*}} : !llvm.ptr<1> -> f32
// CHECK-NEXT: arith.mulf %[[S0]], %[[F]] : f32
// CHECK: arith.mulf %[[S0]], %[[G]] : f32
// CHECK: %[[S1:.*]] = llvm.load %{{.*}} : !llvm.ptr<1> -> f32
// CHECK-NEXT: arith.mulf %[[S1]], %[[F]] : f32
// CHECK: arith.mulf %[[S1]], %[[G]] : f32
// CHECK-NOT: llvm.load
// CHECK: llvm.return %{{.*}} : vector<4xf32>
// CHECK-LABEL: llvm.func @acc_scale_add_two_groups
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<64xf32>, %[[P:[^:]+]]: vector<64xf32>, %[[SC:[^:]+]]: vector<4xf32>)
// CHECK: %[[G0R0:.*]] = vector.extract %[[SC]][0] : f32 from vector<4xf32>
// CHECK: %[[G0R8:.*]] = vector.extract %[[SC]][1] : f32 from vector<4xf32>
// CHECK: %[[G1R0:.*]] = vector.extract %[[SC]][2] : f32 from vector<4xf32>
// CHECK: %[[G1R8:.*]] = vector.extract %[[SC]][3] : f32 from vector<4xf32>
// CHECK: %[[P0:.*]] = vector.extract %[[P]][0] : f32 from vector<64xf32>
// CHECK-NEXT: arith.mulf %[[P0]], %[[G0R0]] : f32
// CHECK: %[[P31:.*]] = vector.extract %[[P]][31] : f32 from vector<64xf32>
// CHECK-NEXT: arith.mulf %[[P31]], %[[G0R8]] : f32
// CHECK: %[[P32:.*]] = vector.extract %[[P]][32] : f32 from vector<64xf32>
// CHECK-NEXT: arith.mulf %[[P32]], %[[G1R0]] : f32
// CHECK: %[[P63:.*]] = vector.extract %[[P]][63] : f32 from vector<64xf32>
// CHECK-NEXT: arith.mulf %[[P63]], %[[G1R8]] : f32
gpu.module @k {
  llvm.func @acc_row_scales_two_factors(%s: !llvm.ptr<1>, %ld: i32, %rv: i32, %f: f32, %g: f32) -> vector<4xf32> {
    %r = megamoe.acc_row_scales %s[%ld] rows_valid %rv factor %f, %g {m = 64, n = 128, threads = 128} : !llvm.ptr<1> -> vector<4xf32>
    llvm.return %r : vector<4xf32>
  }
  llvm.func @acc_scale_add_two_groups(%acc: vector<64xf32>, %p: vector<64xf32>, %sc: vector<4xf32>) -> vector<64xf32> {
    %r = megamoe.acc_scale_add %acc, %p, %sc {m = 64, n = 128, threads = 128} : vector<64xf32>, vector<4xf32>
    llvm.return %r : vector<64xf32>
  }
}

// -----

// Column groups narrower than a thread's 8-column spread cannot be told apart by the element index alone.
gpu.module @k {
  llvm.func @acc_scale_add_narrow_groups(%acc: vector<16xf32>, %p: vector<16xf32>, %sc: vector<16xf32>) -> vector<16xf32> {
    // expected-error @below {{8 column groups of 32 columns: each must be a multiple of 8 columns}}
    // expected-error @below {{has no lowering for this target}}
    %r = megamoe.acc_scale_add %acc, %p, %sc {m = 64, n = 32, threads = 128} : vector<16xf32>, vector<16xf32>
    llvm.return %r : vector<16xf32>
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
