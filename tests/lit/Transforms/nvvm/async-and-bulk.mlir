// megamoe-lower-to-nvvm: async_commit, async_wait, bulk_store, bulk_commit, bulk_wait, tma_store for sm_90a.
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

//===----------------------------------------------------------------------===//
// async_commit, async_wait
//===----------------------------------------------------------------------===//

// One cp.async group op each; every wait is followed by the proxy fence (cp.async wrote through the generic proxy,
// wgmma reads through the async proxy).
// CHECK-LABEL: llvm.func @async_groups()
// CHECK-NEXT: nvvm.cp.async.commit.group
// CHECK-NEXT: nvvm.cp.async.wait.group 1
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: nvvm.cp.async.commit.group
// CHECK-NEXT: nvvm.cp.async.wait.group 7
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: nvvm.cp.async.wait.group 0
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
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

// One bulk copy shared::cta -> global; the waits are cp.async.bulk.wait_group, the full one followed by the
// global proxy fence (a release after it covers the bulk-written data).
// CHECK-LABEL: llvm.func @bulk_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[DST:[^:]+]]: !llvm.ptr<1>, %[[N:[^:]+]]: i32)
// CHECK-NEXT: nvvm.cp.async.bulk.global.shared.cta %[[DST]], %[[SRC]], %[[N]] : <1>, <3>
// CHECK-NEXT: nvvm.cp.async.bulk.commit.group
// CHECK-NEXT: nvvm.cp.async.bulk.wait_group 0 {read}
// CHECK-NEXT: nvvm.cp.async.bulk.wait_group 0{{$}}
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @bulk_store(%src: !llvm.ptr<3>, %dst: !llvm.ptr<1>, %n: i32) {
    megamoe.bulk_store %src, %dst, %n : !llvm.ptr<3> -> !llvm.ptr<1>
    megamoe.bulk_commit
    megamoe.bulk_wait {pending = 0, read}
    megamoe.bulk_wait {pending = 0}
    llvm.return
  }
}

// -----

// A tensor store of one box from shared memory, in the thread's bulk group, coordinates innermost first.
// CHECK-LABEL: llvm.func @tma_store
// CHECK-SAME: (%[[SRC:[^:]+]]: !llvm.ptr<3>, %[[MAP:[^:]+]]: !llvm.ptr, %[[X:[^:]+]]: i32, %[[Y:[^:]+]]: i32)
// CHECK-NEXT: nvvm.cp.async.bulk.tensor.global.shared.cta %[[MAP]], %[[SRC]], box[%[[X]], %[[Y]]]
// CHECK-NEXT: nvvm.cp.async.bulk.commit.group
// CHECK-NEXT: llvm.return
gpu.module @k {
  llvm.func @tma_store(%src: !llvm.ptr<3>, %map: !llvm.ptr, %x: i32, %y: i32) {
    megamoe.tma_store %src, %map[%x, %y] : !llvm.ptr<3>, !llvm.ptr
    megamoe.bulk_commit
    llvm.return
  }
}
