"""A 2-layer MoE model on megamoe.fused_moe, trained a few steps, against the same model in plain PyTorch (every
expert on every rank). Run: torchrun --nproc_per_node 2 examples/train_moe.py (ranks may share one GPU)."""
import os
import torch
import torch.distributed as dist
import megamoe

H, I, E, K, T, STEPS = 512, 256, 16, 4, 128, 6
world, gpus = int(os.environ["WORLD_SIZE"]), torch.cuda.device_count()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % gpus)
dist.init_process_group("gloo" if world > gpus else "nccl")  # NCCL wants a GPU per rank
rank, sms = dist.get_rank(), torch.cuda.get_device_properties(0).multi_processor_count
ws = megamoe.Workspace(H, I, E, K, max_tokens=T, sm_budget=sms * gpus // world // 2 * 2 if world > gpus else 0)

class PlainExperts(torch.nn.Module):  # the layer as plain PyTorch: all E experts, a loop over them
    def __init__(self):
        super().__init__()
        self.w1 = torch.nn.Parameter(torch.randn(E, 2 * I, H, device="cuda").div(H ** 0.5).bfloat16())
        self.w2 = torch.nn.Parameter(torch.randn(E, H, I, device="cuda").div(I ** 0.5).bfloat16())
    def forward(self, x, idx, w):
        y = torch.zeros_like(x, dtype=torch.float32)
        for e in range(E):
            t, k = (idx == e).nonzero(as_tuple=True)
            g, u = (x[t] @ self.w1[e].t()).chunk(2, dim=-1)
            y = y.index_add(0, t, ((torch.nn.functional.silu(g) * u) @ self.w2[e].t()).float() * w[t, k, None])
        return y.bfloat16()

class Model(torch.nn.Module):
    def __init__(self, experts):
        super().__init__()
        self.routers = torch.nn.ModuleList(torch.nn.Linear(H, E, device="cuda", dtype=torch.bfloat16) for _ in "ab")
        self.experts = torch.nn.ModuleList(experts() for _ in "ab")
    def forward(self, x):
        for router, moe in zip(self.routers, self.experts):
            w, idx = router(x).float().softmax(-1).topk(K)  # int64 topk_idx goes in as is
            x = x + moe(x, idx, w)
        return x

torch.manual_seed(0)  # the same weights on every rank
plain, ours = Model(PlainExperts), Model(lambda: megamoe.MoeExperts(H, I, E, K, ws))
mine = slice(rank * E // world, (rank + 1) * E // world)  # this rank's experts
with torch.no_grad():
    for p, o in zip(plain.experts, ours.experts):
        o.w1.copy_(p.w1[mine]), o.w2.copy_(p.w2[mine])
    ours.routers.load_state_dict(plain.routers.state_dict())
local = {id(p) for p in ours.experts.parameters()}  # their gradients already sum every rank's tokens
losses = {}
for name, model in (("megamoe", ours), ("plain", plain)):
    opt, gen = torch.optim.SGD(model.parameters(), lr=0.5), torch.Generator("cuda").manual_seed(rank)
    for step in range(STEPS):
        x, target = (torch.randn(T, H, device="cuda", generator=gen).bfloat16() for _ in "xt")
        loss = (model(x).float() - target.float()).square().mean()
        opt.zero_grad(), loss.backward()
        for t in [p.grad for p in model.parameters() if id(p) not in local] + [loss.detach()]:
            buf = t.float()  # the mean over ranks, as DDP takes it (a CUDA tensor: NCCL takes no CPU ones)
            dist.all_reduce(buf)
            t.copy_(buf / world)
        for p in model.parameters():
            if id(p) in local:
                p.grad.div_(world)
        losses.setdefault(name, []).append(float(loss))
        opt.step()
diff = max(abs(a - b) for a, b in zip(losses["megamoe"], losses["plain"]))
if rank == 0:
    print("loss megamoe %s\nloss plain   %s\nmax |diff| %.2e -> %s" % (" ".join("%.4f" % l for l in losses["megamoe"]),
          " ".join("%.4f" % l for l in losses["plain"]), diff, "ok" if diff <= 1e-2 else "FAIL"))
ws.close()
dist.destroy_process_group()
raise SystemExit(0 if diff <= 1e-2 else 1)
