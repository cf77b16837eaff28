// megamoe-lower-to-rocdl: async_commit, async_wait, bulk_store, bulk_commit, bulk_wait for gfx950.
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-rocdl | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: nvvm.

//===----------------------------------------------------------------------===//
// async_commit, async_wait
//===----------------------------------------------------------------------===//

// Copies have completed when they retire: the group ops vanish.
// CHECK-LABEL: llvm.func @async_groups()
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @async_groups() {
    megamoe.async_commit
    megamoe.async_wait {pending = 1}
    megamoe.async_commit
    megamoe.async_wait {pending = 7}
    megamoe.async_wait {pending = 0}
    llvm.return
  }
}

//===----------------------------------------------------------------------===//
// bulk_store, bulk_commit, bulk_wait
//===----------------------------------------------------------------------===//

// -----

// No bulk copy engine: the thread copies bytes / 16 chunks of 16 bytes at once; the group ops vanish.
// CHECK-LABEL: llvm.func @bulk_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr<1>, %[[N:[^:]+]]: i32)
// CHECK: %[[CHUNKS:.*]] = arith.divui %[[N]], %{{.*}} : i32
// CHECK: scf.for %[[I:.*]] = %{{.*}} to %[[CHUNKS]]
// CHECK: llvm.load %{{.*}} {alignment = 16 : i64} : !llvm.ptr<3> -> vector<4xi32>
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 16 : i64} : vector<4xi32>, !llvm.ptr<1>
// CHECK-NOT: megamoe.bulk
// CHECK: llvm.return
gpu.module @k {
  llvm.func @bulk_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %n: i32) {
    megamoe.bulk_store %src, %dst, %n : !llvm.ptr<3> -> !llvm.ptr<1>
    megamoe.bulk_commit
    megamoe.bulk_wait {pending = 0, read}
    megamoe.bulk_wait {pending = 0}
    llvm.return
  }
}
