// megamoe-lower-to-nvvm: acc_store of the wgmma fragment for sm_90a (f16, bf16, f32; TMA boxes).
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

//===----------------------------------------------------------------------===//
// acc_store
//===----------------------------------------------------------------------===//

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
