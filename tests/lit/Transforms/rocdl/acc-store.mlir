// megamoe-lower-to-rocdl: acc_store of the MFMA fragment for gfx950 (f16, bf16, f32).
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: nvvm.

//===----------------------------------------------------------------------===//
// acc_store
//===----------------------------------------------------------------------===//

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
