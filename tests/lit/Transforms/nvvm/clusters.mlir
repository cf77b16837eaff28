// megamoe-lower-to-nvvm: mbarrier_arrive_peer, shared_copy_peer, shared_store_peer, cluster_sync (pairs) for sm_90a.
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

// A slot given back to the peer CTA's producer: mapa into the cluster window, then an arrival at the default
// (CTA) scope. A cluster-scope release here fenced every K step of the MMA warps (ncu: membar and gmma stalls;
// cluster pairs ran at 0.71-0.81 of torch._grouped_mm, 0.94-1.06 without it).
// CHECK-LABEL: llvm.func @arrive_peer
// CHECK: llvm.inline_asm
// CHECK-SAME: mapa.shared::cluster.u32 peer, $0, $1;
// CHECK-SAME: mbarrier.arrive.shared::cluster.b64 _, [peer];
// CHECK-NOT: release.cluster
gpu.module @k {
  llvm.func @arrive_peer(%bar: !llvm.ptr<3>, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.mbarrier_arrive_peer %bar, %cta : !llvm.ptr<3>
    llvm.return
  }
}

// -----

// With `cluster` the arrival releases at cluster scope (the pairs' ticket mailbox: the slot's read is ordered
// before the other CTA overwrites it).
// CHECK-LABEL: llvm.func @arrive_peer_cluster
// CHECK: llvm.inline_asm
// CHECK-SAME: mbarrier.arrive.release.cluster.shared::cluster.b64 _, [peer];
gpu.module @k {
  llvm.func @arrive_peer_cluster(%bar: !llvm.ptr<3>, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.mbarrier_arrive_peer %bar, %cta {cluster} : !llvm.ptr<3>
    llvm.return
  }
}

// -----

// A pair's ticket: both shared offsets mapped into the peer's window, 16 bytes completing on its barrier; the
// mailbox's wait acquires at cluster scope.
// CHECK-LABEL: llvm.func @shared_copy_peer
// CHECK: llvm.inline_asm
// CHECK-SAME: mapa.shared::cluster.u32 dst, $0, $2;
// CHECK-SAME: mapa.shared::cluster.u32 bar, $1, $2;
// CHECK-SAME: cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [dst], [$0], 16, [bar];
// CHECK: llvm.inline_asm
// CHECK-SAME: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 P1, [$0], $1, 1000000;
gpu.module @k {
  llvm.func @shared_copy_peer(%src: !llvm.ptr<3>, %bar: !llvm.ptr<3>, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.shared_copy_peer %src, %bar, %cta {bytes = 16 : i64} : !llvm.ptr<3>, !llvm.ptr<3>
    megamoe.mbarrier_wait %bar, %cta {cluster} : !llvm.ptr<3>
    llvm.return
  }
}

// -----

// A pair's start check: the value stored at the same shared offset in the peer CTA (mapa, st.shared::cluster), then
// the cluster barrier both pass before either reads it.
// CHECK-LABEL: llvm.func @shared_store_peer
// CHECK: llvm.inline_asm
// CHECK-SAME: mapa.shared::cluster.u32 dst, $0, $2;
// CHECK-SAME: st.shared::cluster.u32 [dst], $1;
// CHECK: barrier.cluster.arrive.release.aligned;
gpu.module @k {
  llvm.func @shared_store_peer(%slot: !llvm.ptr<3>, %v: i32, %cta: i32) attributes {megamoe.kernel, megamoe.block_threads = 256 : i64} {
    megamoe.shared_store_peer %slot, %v, %cta : !llvm.ptr<3>
    megamoe.cluster_sync
    llvm.return
  }
}
