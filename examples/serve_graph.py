"""Serving: an MoE layer's forward captured once in a CUDA graph, replayed for new batches whose tokens and routing
are written into the graph's inputs in place; every replay bitwise equal to an eager call, and its time.
Run: torchrun --nproc_per_node 2 examples/serve_graph.py (ranks may share one GPU), or python3 without torchrun."""
import os
import torch
import torch.distributed as dist
import megamoe

H, I, E, K, T, BATCHES = 512, 256, 16, 4, 128, 20
world, gpus = int(os.environ.get("WORLD_SIZE", 1)), torch.cuda.device_count()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % gpus)
if "RANK" in os.environ:
    dist.init_process_group("gloo" if world > gpus else "nccl")
rank, sms = int(os.environ.get("RANK", 0)), torch.cuda.get_device_properties(0).multi_processor_count
ws = megamoe.Workspace(H, I, E, K, max_tokens=T, training=False,
                       sm_budget=sms * gpus // world // 2 * 2 if world > gpus else 0)
moe = megamoe.MoeExperts(H, I, E, K, ws).requires_grad_(False)
router = torch.nn.Linear(H, E, device="cuda", dtype=torch.bfloat16)
gen = torch.Generator("cuda").manual_seed(rank)
batch = lambda: torch.randn(T, H, device="cuda", generator=gen).bfloat16()
x = batch()
with torch.no_grad():
    w, idx = router(x).float().softmax(-1).topk(K)
    idx = idx.int()  # the graph's static inputs: x, idx, w
    y = moe(x, idx, w)  # eager once (loads, warms), then the capture on the same inputs
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        y = moe(x, idx, w)
    mismatches, start, end, ms = 0, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), 0.0
    for _ in range(BATCHES):
        x.copy_(batch())
        w_new, idx_new = router(x).float().softmax(-1).topk(K)
        w.copy_(w_new), idx.copy_(idx_new)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        ms += start.elapsed_time(end) / BATCHES
        mismatches += not torch.equal(y.view(torch.int16), moe(x, idx, w).view(torch.int16))
ws.check_errors()
print("rank %d: %d replays, %d differ from eager, %.3f ms per replay -> %s" % (
    rank, BATCHES, mismatches, ms, "ok" if mismatches == 0 else "FAIL"))
ws.close()
if "RANK" in os.environ:
    dist.destroy_process_group()
raise SystemExit(1 if mismatches else 0)
