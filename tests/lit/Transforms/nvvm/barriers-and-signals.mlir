// megamoe-lower-to-nvvm: peer_ptr, signal, wait, grid_barrier, rank_barrier, kernel attributes for sm_90a.
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

//===----------------------------------------------------------------------===//
// peer_ptr, signal, wait
//===----------------------------------------------------------------------===//

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
