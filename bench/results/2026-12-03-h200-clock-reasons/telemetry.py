# What the board does while each of these runs back to back for a few seconds (one rank, DeepSeek-V3 EP2's per-GPU
# work: H 7168, I 2048, 128 local experts, top-8, 8192 tokens, uniform routing): the dense cuBLAS anchor
# ([8192, 7168] x [7168, 4096]), the layer's forward, its forward + backward, and the PyTorch pipeline's forward.
# nvidia-smi samples SM clock, power, temperatures and the active clock event reasons every 50 ms.
# usage (GPU machine, repository root, MEGAMOE_CACHE_DIR set): python3 telemetry.py LIB [seconds]
import collections, importlib.machinery, importlib.util, os, statistics, subprocess, sys, time, torch
import torch.distributed as dist

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_loader("mb", importlib.machinery.SourceFileLoader(
    "mb", os.path.join(here, "../../../tools/megamoe-bench/megamoe-bench")))
mb = importlib.util.module_from_spec(spec); spec.loader.exec_module(mb)
lib, secs = sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
torch.cuda.set_device(0); dist.init_process_group("nccl")
subprocess.run(["nvidia-smi", "-q", "-d", "POWER,CLOCK,PERFORMANCE,TEMPERATURE"])

FIELDS = ["clocks.sm", "clocks.mem", "power.draw", "power.limit", "enforced.power.limit", "temperature.gpu",
          "temperature.memory"]
REASONS = None
for name in ("clocks_event_reasons", "clocks_throttle_reasons"):
    probe = subprocess.run(["nvidia-smi", "--query-gpu=%s.active" % name, "--format=csv,noheader"],
                           capture_output=True, text=True)
    if probe.returncode == 0 and "not a valid" not in probe.stdout.lower():
        REASONS = name
        break
KINDS = ["gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
         "hw_power_brake_slowdown", "sw_thermal_slowdown", "sync_boost"]
query = FIELDS + (["%s.%s" % (REASONS, k) for k in KINDS] if REASONS else [])


def sampled(fn, secs):
    for _ in range(3):
        fn()
    torch.cuda.synchronize(); time.sleep(1.5)  # the board cools a little between phases
    smi = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=" + ",".join(query), "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.3)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    n, t0 = 0, time.time()
    s.record()
    while time.time() - t0 < secs:
        for _ in range(4):
            fn()
        n += 4
        torch.cuda.synchronize()
    e.record(); e.synchronize()
    smi.terminate()
    rows = [[c.strip() for c in l.split(",")] for l in smi.communicate()[0].strip().splitlines()]
    rows = [r for r in rows if len(r) == len(query)][4:]  # past the first 0.2 s
    return s.elapsed_time(e) / n, rows


def num(v):
    try:
        return float(v)
    except ValueError:
        return float("nan")


cfg = dict(hidden=7168, intermediate=2048, experts=128, topk=8, max_tokens=8192, swiglu_clamp_milli=0, training=1,
           dtype=0, dedup_tokens=0, sm_budget=0)
mm = mb.Megamoe(lib)
layer = mb.Layer(mm, cfg, 0, 1, "/tmp/megamoe-telemetry-%d.sock" % os.getpid())
bench = mb.LayerBench(layer, cfg, 10, backward=True)
x, idx, wts = bench.inputs("uniform", 8192)
out, dy = bench.grads_out(x, wts), torch.randn_like(x)
a = torch.randn(8192, 7168, device="cuda", dtype=torch.bfloat16)
b = torch.randn(7168, 4096, device="cuda", dtype=torch.bfloat16)
phases = [("dense cuBLAS 8192x7168x4096", lambda: a @ b, 2.0 * 8192 * 7168 * 4096),
          ("layer forward", lambda: layer.forward(x, idx, wts, bench.w1, bench.w2, out["y"]), None),
          ("layer fwd+bwd", lambda: bench.fwd_bwd(x, idx, wts, dy, out), None),
          ("torch pipeline forward", lambda: mb.torch_moe(x, idx, wts, bench.w1, bench.w2, bench.gmm.experts), None),
          ("dense cuBLAS again", lambda: a @ b, 2.0 * 8192 * 7168 * 4096)]
for name, fn, flops in phases:
    ms, rows = sampled(fn, secs)
    col = lambda f: [num(r[query.index(f)]) for r in rows]
    med = lambda f: statistics.median(col(f)) if rows else float("nan")
    reasons = collections.Counter()
    if REASONS:
        for r in rows:
            active = tuple(k for k in KINDS if r[query.index("%s.%s" % (REASONS, k))].lower() == "active")
            reasons[active or ("none",)] += 1
    rate = " %.1f TF/s" % (flops / ms / 1e9) if flops else ""
    print("%-28s %.3f ms%s | SM clock median %.0f MHz (min %.0f, max %.0f) | mem clock %.0f | power %.0f W "
          "(limit %.0f, enforced %.0f) | GPU %.0f C, HBM %.0f C | %d samples | reasons: %s" % (
              name, ms, rate, med("clocks.sm"), min(col("clocks.sm") or [0]), max(col("clocks.sm") or [0]),
              med("clocks.mem"), med("power.draw"), med("power.limit"), med("enforced.power.limit"),
              med("temperature.gpu"), med("temperature.memory"), len(rows),
              ", ".join("%s %d" % ("+".join(k), v) for k, v in reasons.most_common(4)) or "n/a"), flush=True)
dist.destroy_process_group()
