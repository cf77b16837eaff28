"""One rank of the CPU tier's two-process case (test_package.py runs two): a Workspace over a gloo process group on
the fake HIP backend, the ranks' handles exchanged over the group; one forward and backward; close()."""
import ctypes
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "python"))
import megamoe  # noqa: E402

dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("MEGAMOE_TEST_FAIL_JOIN_RANK") == str(rank):
    # This rank's join fails: its gathered handles come back one byte short.
    gather = megamoe.Workspace._all_gather
    megamoe.Workspace._all_gather = lambda self, mine: gather(self, mine)[:-1]
if os.environ.get("MEGAMOE_TEST_FAIL_JOIN_RANK"):
    try:
        megamoe.Workspace(512, 256, 16, 4, 64, device=rank, backend="hip", _host_tensors=True)
    except megamoe.MegamoeError as e:
        print("rank %d: MegamoeError: %s" % (rank, e))
        sys.exit(3)
    sys.exit("rank %d: the workspace was made" % rank)
ws = megamoe.Workspace(512, 256, 16, 4, 64, device=rank, backend="hip", _host_tensors=True)
assert ws.handle.group_digest() is not None  # the library has megamoe_workspace_group_digest
assert ws.ranks == 2 and ws.rank == rank
fake = ctypes.CDLL(os.environ["MEGAMOE_HIP_LIBRARY"])
before = fake.fakehip_launch_count()
m = megamoe.MoeExperts(512, 256, 16, 4, ws)
assert m.w1.shape == (8, 512, 512)  # half the experts on each rank
x = torch.randn(5 + rank, 512).bfloat16().requires_grad_()
idx = torch.randint(0, 16, (5 + rank, 4), dtype=torch.int32)
y = m(x, idx, torch.rand(5 + rank, 4))
y.float().sum().backward()
assert x.grad.shape == x.shape and fake.fakehip_launch_count() > before
print("rank %d: exchanged through the group (%s), %d launches" % (
    rank, "handles" if megamoe._lib.WorkspaceHandle.exchange_supported(ws.lib) else "socket",
    fake.fakehip_launch_count() - before))
ws.close()
dist.destroy_process_group()
