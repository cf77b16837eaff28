// megamoe-lower-to-nvvm: mma_tile, mma_drain -> wgmma for sm_90a (wgmma atom of megamoe/Target/MmaAtoms.h).
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

//===----------------------------------------------------------------------===//
// mma_tile
//===----------------------------------------------------------------------===//

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
