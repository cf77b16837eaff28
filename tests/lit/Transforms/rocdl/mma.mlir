// megamoe-lower-to-rocdl: mma_tile, mma_drain -> MFMA for gfx950 (MFMA atom of megamoe/Target/MmaAtoms.h).
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: nvvm.

//===----------------------------------------------------------------------===//
// mma_tile
//===----------------------------------------------------------------------===//

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

// -----

// k16 (one K slice at run time) is an sm_90a form: gfx950 has no lowering for it.
gpu.module @k {
  llvm.func @mma_tile_k16(%a: !llvm.ptr<3>, %b: !llvm.ptr<3>, %acc: vector<64xf32>, %k16: i32) -> vector<64xf32> {
    // expected-error @+1 {{'megamoe.mma_tile' op has no lowering for this target}}
    %r = megamoe.mma_tile %a, %b, %acc k16 %k16 {m = 64, n = 128, k = 64, threads = 128} : !llvm.ptr<3>, !llvm.ptr<3>, vector<64xf32> -> vector<64xf32>
    llvm.return %r : vector<64xf32>
  }
}
