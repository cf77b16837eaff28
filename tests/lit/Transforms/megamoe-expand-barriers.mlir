// megamoe-expand-barriers: grid and rank barriers become block barriers, signals, bounded waits and peer pointers.
// RUN: megamoe-opt %s --split-input-file --megamoe-expand-barriers | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --megamoe-expand-barriers | FileCheck %s --check-prefix=GONE

// Nowhere in the output:
// GONE-NOT: megamoe.grid_barrier
// GONE-NOT: megamoe.rank_barrier

// Thread 0 adds 1 to the counter (gpu scope) and waits for `expected` with the grid-barrier flag id
// (FlagKind::kGridBarrier << 32); every thread then reads the error record after the second block barrier.
// CHECK-LABEL: llvm.func @grid_barrier
// CHECK-SAME: (%[[CTR:[^:]+]]: !llvm.ptr<1>, %[[ERR:[^:]+]]: !llvm.ptr<1>, %[[RANK:[^:]+]]: i32, %[[EXP:[^:]+]]: i64, %[[TMO:[^:]+]]: i64)
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0 : i64
// CHECK-DAG: %[[ONE:.*]] = arith.constant 1 : i64
// CHECK-DAG: %[[GRID_ID:.*]] = arith.constant 8589934592 : i64
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : index
// CHECK: gpu.barrier
// CHECK-NEXT: %[[TID:.*]] = gpu.thread_id x
// CHECK-NEXT: %[[T0:.*]] = arith.cmpi eq, %[[TID]], %[[C0]] : index
// CHECK-NEXT: scf.if %[[T0]] {
// CHECK-NEXT: megamoe.signal add %[[CTR]], %[[ONE]] scope(gpu) : !llvm.ptr<1>
// CHECK-NEXT: megamoe.wait %[[CTR]] at_least %[[EXP]] timeout %[[TMO]] error %[[ERR]](%[[RANK]], %[[GRID_ID]]) scope(gpu)
// CHECK-NEXT: }
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: %[[CODE:.*]] = llvm.load %[[ERR]] atomic acquire {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK-NEXT: %[[CLEAR:.*]] = arith.cmpi eq, %[[CODE]], %[[ZERO]] : i64
// CHECK-NEXT: llvm.return %[[CLEAR]] : i1
gpu.module @k {
  llvm.func @grid_barrier(%counter: !llvm.ptr<1>, %err: !llvm.ptr<1>, %rank: i32, %expected: i64, %timeout: i64) -> i1 {
    %ok = megamoe.grid_barrier %counter at_least %expected timeout %timeout error %err(%rank) : !llvm.ptr<1>, !llvm.ptr<1>
    llvm.return %ok : i1
  }
}

// -----

// Thread 0 stores `value` into slot [rank] of every peer's flag array (system scope), then waits on each local
// slot [peer] with flag id (FlagKind::kRankBarrier << 32) | peer, skipping the rest after a timeout.
// CHECK-LABEL: llvm.func @rank_barrier
// CHECK-SAME: (%[[FLAGS:[^:]+]]: !llvm.ptr<1>, %[[OFF:[^:]+]]: !llvm.ptr<1>, %[[ERR:[^:]+]]: !llvm.ptr<1>, %[[RANK:[^:]+]]: i32, %[[NR:[^:]+]]: i32, %[[VAL:[^:]+]]: i64, %[[TMO:[^:]+]]: i64)
// CHECK-DAG: %[[ZERO:.*]] = arith.constant 0 : i64
// CHECK-DAG: %[[RANK_ID:.*]] = arith.constant 4294967296 : i64
// CHECK-DAG: %[[TRUE:.*]] = arith.constant true
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG: %[[I0:.*]] = arith.constant 0 : i32
// CHECK-DAG: %[[I1:.*]] = arith.constant 1 : i32
// CHECK: gpu.barrier
// CHECK-NEXT: %[[TID:.*]] = gpu.thread_id x
// CHECK-NEXT: %[[T0:.*]] = arith.cmpi eq, %[[TID]], %[[C0]] : index
// CHECK-NEXT: scf.if %[[T0]] {
// Arrive.
// CHECK-NEXT: scf.for %[[PEER:.*]] = %[[I0]] to %[[NR]] step %[[I1]] : i32 {
// CHECK-NEXT: %[[MINE:.*]] = llvm.getelementptr %[[FLAGS]][%[[RANK]]] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, i64
// CHECK-NEXT: %[[REMOTE:.*]] = megamoe.peer_ptr %[[MINE]], %[[OFF]][%[[PEER]]] : !llvm.ptr<1>, !llvm.ptr<1> -> !llvm.ptr<1>
// CHECK-NEXT: megamoe.signal store %[[REMOTE]], %[[VAL]] scope(system) : !llvm.ptr<1>
// CHECK-NEXT: }
// Wait for every peer, carrying "still ok".
// CHECK-NEXT: scf.for %[[P:.*]] = %[[I0]] to %[[NR]] step %[[I1]] iter_args(%[[OK:.*]] = %[[TRUE]]) -> (i1) : i32 {
// CHECK-NEXT: %[[R:.*]] = scf.if %[[OK]] -> (i1) {
// CHECK-NEXT: %[[PW:.*]] = arith.extui %[[P]] : i32 to i64
// CHECK-NEXT: %[[ID:.*]] = arith.ori %[[PW]], %[[RANK_ID]] : i64
// CHECK-NEXT: %[[SLOT:.*]] = llvm.getelementptr %[[FLAGS]][%[[P]]] : (!llvm.ptr<1>, i32) -> !llvm.ptr<1>, i64
// CHECK-NEXT: %[[W:.*]] = megamoe.wait %[[SLOT]] at_least %[[VAL]] timeout %[[TMO]] error %[[ERR]](%[[RANK]], %[[ID]]) scope(system)
// CHECK-NEXT: scf.yield %[[W]] : i1
// CHECK-NEXT: } else {
// CHECK-NEXT: scf.yield %[[OK]] : i1
// CHECK-NEXT: }
// CHECK-NEXT: scf.yield %[[R]] : i1
// CHECK-NEXT: }
// CHECK-NEXT: }
// CHECK-NEXT: gpu.barrier
// CHECK-NEXT: %[[CODE:.*]] = llvm.load %[[ERR]] atomic acquire {alignment = 8 : i64} : !llvm.ptr<1> -> i64
// CHECK-NEXT: %[[CLEAR:.*]] = arith.cmpi eq, %[[CODE]], %[[ZERO]] : i64
// CHECK-NEXT: llvm.return %[[CLEAR]] : i1
gpu.module @k {
  llvm.func @rank_barrier(%flags: !llvm.ptr<1>, %offsets: !llvm.ptr<1>, %err: !llvm.ptr<1>, %rank: i32, %nranks: i32, %value: i64, %timeout: i64) -> i1 {
    %ok = megamoe.rank_barrier %flags, %offsets(%rank of %nranks) at_least %value timeout %timeout error %err : !llvm.ptr<1>, !llvm.ptr<1>, !llvm.ptr<1>
    llvm.return %ok : i1
  }
}

// -----

// Barriers nested in control flow are expanded in place; the primitive ops are left alone.
// CHECK-LABEL: llvm.func @nested_and_primitives
// CHECK: scf.for
// CHECK: gpu.barrier
// CHECK: megamoe.signal add
// CHECK: megamoe.wait
// CHECK: gpu.barrier
// CHECK: gpu.barrier
// CHECK: megamoe.peer_ptr
// CHECK: megamoe.signal store
// CHECK: megamoe.wait
// CHECK: gpu.barrier
// CHECK: }
// The user's own signal and wait pass through unchanged.
// CHECK: megamoe.signal store %{{.*}}, %{{.*}} scope(cta) : !llvm.ptr<3>
// CHECK: megamoe.wait %{{.*}} scope(cta) : !llvm.ptr<3>, !llvm.ptr<1>
gpu.module @k {
  llvm.func @nested_and_primitives(%c: !llvm.ptr<1>, %f: !llvm.ptr<1>, %off: !llvm.ptr<1>, %err: !llvm.ptr<1>, %s: !llvm.ptr<3>, %rank: i32, %n: i32, %v: i64, %t: i64) {
    %c0 = arith.constant 0 : i32
    %c1 = arith.constant 1 : i32
    scf.for %i = %c0 to %n step %c1 : i32 {
      %a = megamoe.grid_barrier %c at_least %v timeout %t error %err(%rank) : !llvm.ptr<1>, !llvm.ptr<1>
      %b = megamoe.rank_barrier %f, %off(%rank of %n) at_least %v timeout %t error %err : !llvm.ptr<1>, !llvm.ptr<1>, !llvm.ptr<1>
    }
    megamoe.signal store %s, %v scope(cta) : !llvm.ptr<3>
    %w = megamoe.wait %s at_least %v timeout %t error %err(%rank, %v) scope(cta) : !llvm.ptr<3>, !llvm.ptr<1>
    llvm.return
  }
}
