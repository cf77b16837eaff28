# Experiment (2026-12-01 copy of 2026-11-30-h200-clocks/clocks.py for the ticketed TMA kernels and their pairs): SM
# clock and board power while each GEMM of one case runs back to back (ours cp.async, TMA single blocks, TMA pairs,
# torch._grouped_mm, dense cuBLAS), sampled by nvidia-smi every 20 ms; TF/s from CUDA events over the same loop.
# usage: python3 clocks.py LIB CASE[,CASE...] [seconds]     (NCU=1: two launches each, for ncu to profile)
import importlib.machinery, importlib.util, ctypes, os, subprocess, sys, time, statistics, torch
spec = importlib.util.spec_from_loader("mb", importlib.machinery.SourceFileLoader(
    "mb", os.path.join(os.path.dirname(__file__), "../../../tools/megamoe-bench/megamoe-bench")))
mb = importlib.util.module_from_spec(spec); spec.loader.exec_module(mb)
mm = mb.Megamoe(sys.argv[1]); secs = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
ncu = os.environ.get("NCU") == "1"
sm = torch.cuda.get_device_properties(0).multi_processor_count
for name in sys.argv[2].split(","):
    layout, E, N, K, total, dist = mb.CASES[name]
    gen = torch.Generator().manual_seed(1)
    sizes = (torch.bincount(torch.randint(0, E, (total,), generator=gen), minlength=E) if dist == "random"
             else torch.full((E,), total // E, dtype=torch.long))
    ends = torch.cumsum(sizes, 0).to(torch.int32).cuda()
    offs = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), ends])
    a = torch.randn(total, K, device="cuda").bfloat16(); b = torch.randn(E, N, K, device="cuda").bfloat16()
    c = torch.empty(total + 64, N, device="cuda", dtype=torch.bfloat16)
    g3 = int(os.environ.get("OGRID", sm * 3))  # the cp.async kernel's grid (default as megamoe-bench gemm)
    k1 = mm.kernel("grouped_gemm_nt", [("E", E), ("N", N), ("K", K)])
    k2 = mm.kernel("grouped_gemm_nt_tma", [("E", E), ("N", N), ("K", K), ("pairs", 0)])
    k3 = mm.kernel("grouped_gemm_nt_tma", [("E", E), ("N", N), ("K", K), ("pairs", 1)])
    tickets = torch.zeros(2, dtype=torch.int32, device="cuda")
    ma = mm.tensor_map(a, [K, total], [K * 2], [64, 128]); mbm = mm.tensor_map(b, [K, E * N], [K * 2], [64, 128])
    bt = b.transpose(-2, -1); dn = torch.randn(N, K, device="cuda").bfloat16().t()
    tg = int(os.environ.get("TGRID", sm))  # the TMA variant's grid (1 block per SM resident; more wait their turn)
    runs = {"ours": lambda: mm.launch(k1, (g3, 1, 1), [a.data_ptr(), b.data_ptr(), c.data_ptr(), offs.data_ptr(),
                                                       ctypes.c_int32(g3)]),
            "tma": lambda: mm.launch(k2, (tg, 1, 1), [a.data_ptr(), b.data_ptr(), c.data_ptr(), offs.data_ptr(),
                                                     tickets.data_ptr(), ctypes.c_int32(tg), ma, mbm]),
            "pairs": lambda: mm.launch(k3, (tg // 2 * 2, 1, 1), [a.data_ptr(), b.data_ptr(), c.data_ptr(), offs.data_ptr(),
                                                               tickets.data_ptr(), ctypes.c_int32(tg // 2 * 2), ma, mbm]),
            "grouped_mm": lambda: torch._grouped_mm(a, bt, offs=ends),
            "dense": lambda: a @ dn}
    flops = 2.0 * total * N * K
    for what, fn in [(w, f) for w, f in runs.items() if w in os.environ.get("WHAT", "ours,tma,pairs,grouped_mm,dense")]:
        if ncu:
            fn(); fn(); torch.cuda.synchronize(); continue
        for _ in range(5): fn()
        torch.cuda.synchronize(); time.sleep(1.0)  # cool down between phases
        smi = subprocess.Popen(["nvidia-smi", "-i", str(torch.cuda.current_device()), "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                                "--format=csv,noheader,nounits", "-lms", "20"], stdout=subprocess.PIPE, text=True)
        time.sleep(0.3)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = 0; t0 = time.time(); s.record()
        while time.time() - t0 < secs:
            for _ in range(20): fn()
            n += 20; torch.cuda.synchronize()
        e.record(); e.synchronize(); smi.terminate(); out = smi.communicate()[0]
        rows = [list(map(float, l.split(","))) for l in out.strip().splitlines() if l.count(",") == 2]
        rows = rows[len(rows) // 3:]  # steady state: the last two thirds of the samples
        ms = s.elapsed_time(e) / n
        print("%-20s %-10s grid %3d %7.1f TF/s  %.3f ms  SM clock %5.0f MHz (min %4.0f)  power %5.0f W  temp %2.0f C  n=%d" % (
            name, what, tg if what in ("tma", "pairs") else g3, flops / ms / 1e9, ms, statistics.median(r[0] for r in rows), min(r[0] for r in rows),
            statistics.median(r[1] for r in rows), statistics.median(r[2] for r in rows), len(rows)), flush=True)
