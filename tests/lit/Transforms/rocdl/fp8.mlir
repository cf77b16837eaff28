// megamoe-lower-to-rocdl: acc_row_scales, acc_scale_add (the FP8 promotion), pack_e4m3 for gfx950.
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: nvvm.

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

// Two factors over n = 64 (two MFMA tiles side by side, a column group each): 16 loads, each row's scale times
// either factor; tile 0's elements take scales 0 .. 15, tile 1's 16 .. 31.
// CHECK-LABEL: llvm.func @acc_row_scales_two_factors
// CHECK-COUNT-16: llvm.load %{{.*}} {alignment = 4 : i64} : !llvm.ptr<1> -> f32
// CHECK-NOT: llvm.load
// CHECK: llvm.return %{{.*}} : vector<32xf32>
// CHECK-LABEL: llvm.func @acc_scale_add_two_groups
// CHECK-SAME: (%[[ACC:[^:]+]]: vector<32xf32>, %[[P:[^:]+]]: vector<32xf32>, %[[SC:[^:]+]]: vector<32xf32>)
// CHECK: %[[T0:.*]] = vector.extract %[[SC]][0] : f32 from vector<32xf32>
// CHECK: %[[T1:.*]] = vector.extract %[[SC]][16] : f32 from vector<32xf32>
// CHECK: %[[P0:.*]] = vector.extract %[[P]][0] : f32 from vector<32xf32>
// CHECK-NEXT: arith.mulf %[[P0]], %[[T0]] : f32
// CHECK: %[[P16:.*]] = vector.extract %[[P]][16] : f32 from vector<32xf32>
// CHECK-NEXT: arith.mulf %[[P16]], %[[T1]] : f32
gpu.module @k {
  llvm.func @acc_row_scales_two_factors(%s: !llvm.ptr<1>, %ld: i32, %rv: i32, %f: f32, %g: f32) -> vector<32xf32> {
    %r = megamoe.acc_row_scales %s[%ld] rows_valid %rv factor %f, %g {m = 64, n = 64, threads = 128} : !llvm.ptr<1> -> vector<32xf32>
    llvm.return %r : vector<32xf32>
  }
  llvm.func @acc_scale_add_two_groups(%acc: vector<32xf32>, %p: vector<32xf32>, %sc: vector<32xf32>) -> vector<32xf32> {
    %r = megamoe.acc_scale_add %acc, %p, %sc {m = 64, n = 64, threads = 128} : vector<32xf32>, vector<32xf32>
    llvm.return %r : vector<32xf32>
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
