// megamoe-lower-to-nvvm: warp specialisation for sm_90a (group_barrier, mbarriers, set_max_registers, ...).
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s
// RUN: megamoe-opt %s --split-input-file --verify-diagnostics --megamoe-lower-to-nvvm | FileCheck %s --check-prefix=GONE

// No megamoe op survives, and nothing of the other target appears.
// GONE-NOT: {{^ *(%[^ ]+ = )?megamoe\.}}
// GONE-NOT: rocdl.

//===----------------------------------------------------------------------===//
// Warp specialisation: group_barrier, mbarriers, async_arrive, proxy_fence, set_max_registers
//===----------------------------------------------------------------------===//

// A producer group's copies start at its own first thread (tid - 256); the ring hand-over ops map one to one.
// CHECK-LABEL: llvm.func @warp_specialised
// CHECK: %[[TID:.*]] = nvvm.read.ptx.sreg.tid.x : i32
// CHECK-NEXT: %[[LOCAL:.*]] = arith.subi %[[TID]], %{{.*}} : i32
// CHECK: arith.divui %[[LOCAL]]
// CHECK: nvvm.cp.async.shared.global
// CHECK: nvvm.cp.async.mbarrier.arrive %{{.*}} {noinc = true}
// CHECK: nvvm.mbarrier.init %{{.*}}, %{{.*}}
// CHECK: nvvm.mbarrier.arrive %{{.*}}
// CHECK: nvvm.mbarrier.try_wait.parity %{{.*}}, %{{.*}}, %{{.*}}
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.global>}
// CHECK: nvvm.barrier id = %{{.*}} number_of_threads = %{{.*}}
// CHECK: nvvm.setmaxregister decrease 56
// CHECK: nvvm.setmaxregister increase 216
gpu.module @k {
  llvm.func @warp_specialised(%src: !llvm.ptr<1>, %dst: !llvm.ptr<3>, %bar: !llvm.ptr<3>, %ld: i32, %n: i32) attributes {megamoe.kernel, megamoe.block_threads = 384 : i64} {
    megamoe.tile_copy %src[%ld], %dst[%ld] rows_valid %n {rows = 64, cols = 64, threads = 128, first_thread = 256, elem = bf16, swizzle = 1 : i32, async} : !llvm.ptr<1> -> !llvm.ptr<3>
    megamoe.async_arrive %bar : !llvm.ptr<3>
    megamoe.mbarrier_init %bar, %n : !llvm.ptr<3>
    megamoe.mbarrier_arrive %bar : !llvm.ptr<3>
    megamoe.mbarrier_wait %bar, %n : !llvm.ptr<3>
    megamoe.proxy_fence
    megamoe.proxy_fence {global}
    megamoe.group_barrier {id = 1 : i64, threads = 256 : i64}
    megamoe.set_max_registers {count = 56 : i64}
    megamoe.set_max_registers {count = 216 : i64, increase}
    llvm.return
  }
}
