"""One rank of the GPU tier's two-rank case (test_gpu.py runs it under torch.distributed.run, both ranks on one GPU
when there is one): a Workspace over the process group (gloo when ranks share a GPU: NCCL refuses that), each rank
on its share of the SMs; forward and backward through the op with different token counts per rank, against the fp32
reference of the whole layer (every expert's weights on every rank; the weight gradients summed over the ranks)."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_gpu import E, H, I, K, NAMES, TOL, reference, rel, routing, tokens, weights  # noqa: E402

import megamoe  # noqa: E402

world = int(os.environ["WORLD_SIZE"])
gpus = torch.cuda.device_count()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % gpus)
shared = world > gpus
dist.init_process_group("gloo" if shared else "nccl")
rank = dist.get_rank()
sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
budget = (sms * gpus // world) // 2 * 2 if shared else 0  # each rank's share of a shared GPU's SMs
ws = megamoe.Workspace(H, I, E, K, max_tokens=128, sm_budget=budget)
local = E // world
w1_all, w2_all = weights(7)  # the same on every rank
w1, w2 = w1_all[rank * local:(rank + 1) * local].contiguous(), w2_all[rank * local:(rank + 1) * local].contiguous()
T = 100 + 17 * rank
x, dy = tokens(T, 10 + rank), tokens(T, 20 + rank)
idx, wts = routing(T, 30 + rank, torch.int64)  # as torch.topk gives it
leaves = [t.detach().requires_grad_() for t in (x, wts, w1, w2)]
y = megamoe.fused_moe(leaves[0], idx, leaves[1], leaves[2], leaves[3], ws)
got = (y.detach(),) + torch.autograd.grad(y, leaves, dy)
ref = list(reference(x, idx, wts, w1_all, w2_all, dy))
for i in (3, 4):  # this rank's tokens' share of every expert's gradient, summed over the ranks, then its experts
    total = ref[i].clone()  # on the GPU: NCCL (a GPU per rank) takes no CPU tensors, gloo takes both
    dist.all_reduce(total)
    ref[i] = total[rank * local:(rank + 1) * local]
errors = {n: rel(g, r) for n, g, r in zip(NAMES, got, ref)}
ok = torch.tensor([int(all(e <= TOL for e in errors.values()))], device="cuda")
dist.all_reduce(ok, op=dist.ReduceOp.MIN)
print("rank %d (%d tokens, %s SMs): %s" % (rank, T, budget or "all", ", ".join("%s %.2e" % kv for kv in errors.items())))
ws.close()
if rank == 0:
    print("two ranks: all checks passed" if ok.item() else "two ranks: FAILED")
dist.destroy_process_group()
sys.exit(0 if ok.item() else 1)
