"""Does an MMA on zero rows cost less time at the board's power limit? Times (boost clock, the H200's 700 W limit)
dense cuBLAS and megamoe.ops.grouped_mm_nt on the same shapes with A's rows random, and with a fraction of A's
rows zero in 64-row blocks (as a half tile's padding rows would be, were they zeroed), alternating, two rounds;
samples nvidia-smi (SM clock, board power) while each runs. Prints JSON."""
import json, statistics, subprocess, sys, time, torch

torch.manual_seed(1)
dev = "cuda"


def zeroed(a, frac, period):
    """a with, in every `period` rows, the last frac * period rows zero."""
    z = a.clone()
    if frac > 0:
        v = z.view(-1, period, a.shape[1])
        v[:, period - int(frac * period):] = 0
    return z


def timed(fn):
    t0 = time.time()
    n = 0
    while time.time() - t0 < 0.6:  # warm: reach the power limit's steady clock
        fn(); n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    iters = max(20, int(n * 1.2))  # ~0.7 s timed
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize()
        times.append(s.elapsed_time(e))
    smi.terminate()
    out = smi.communicate()[0]
    samples = [tuple(float(x) for x in l.split(",")) for l in out.splitlines() if l.count(",") == 1]
    hot = [x for x in samples if x[1] > 300] or samples
    return {"ms": statistics.median(times), "mhz": statistics.median(x[0] for x in hot) if hot else None,
            "watts": statistics.median(x[1] for x in hot) if hot else None}


cases = {}
A = torch.randn(8192, 8192, device=dev).to(torch.bfloat16)
B = torch.randn(8192, 8192, device=dev).to(torch.bfloat16)
for f in (0.0, 0.125, 0.5):
    cases["dense-zero%.3f" % f] = lambda Af=zeroed(A, f, 512): torch.mm(Af, B)
try:  # the op needs the carried runtime and cache; checked on two groups against fp32 before its cases are timed
    from megamoe import ops
    E, N, K, rows = 128, 4096, 7168, 512
    a = torch.randn(E * rows, K, device=dev).to(torch.bfloat16)
    b = torch.randn(E, N, K, device=dev).to(torch.bfloat16)
    offs = torch.arange(1, E + 1, device=dev, dtype=torch.int32) * rows
    out = ops.grouped_mm_nt(a, b, offs)
    for e in (0, E - 1):
        want = a[e * rows:(e + 1) * rows].float() @ b[e].float().t()
        err = float((out[e * rows:(e + 1) * rows].float() - want).abs().max() / want.abs().max())
        print("grouped op check, group %d: max rel err %.2e" % (e, err), flush=True)
    for f in (0.0, 0.125, 0.5):
        cases["grouped-nt-zero%.3f" % f] = lambda af=zeroed(a, f, 512): ops.grouped_mm_nt(af, b, offs)
except Exception as e:
    print("grouped op not run: %s" % e, flush=True)

res = {}
for r in (1, 2):
    for name, fn in cases.items():
        t = timed(fn)
        res.setdefault(name, []).append(t)
        print("round %d %-22s %.3f ms  %s MHz  %s W" % (r, name, t["ms"], t["mhz"], t["watts"]), flush=True)
summary = {}
for name in res:
    base = name.rsplit("zero", 1)[0] + "zero0.000"
    ms = statistics.median(x["ms"] for x in res[name])
    summary[name] = {"ms": ms, "time_vs_random": ms / statistics.median(x["ms"] for x in res[base]),
                     "runs": res[name]}
for name, s in summary.items():
    print("%-22s median %.3f ms  time / all-random %.3f" % (name, s["ms"], s["time_vs_random"]))
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": summary},
          open(sys.argv[1] if len(sys.argv) > 1 else "zero_rows.json", "w"), indent=1)
