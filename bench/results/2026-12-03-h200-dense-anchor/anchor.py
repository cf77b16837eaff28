# How the layer bench's dense cuBLAS anchor depends on how it is timed: the [R, H] x [H, 2I] bf16 GEMM (DeepSeek-V3:
# H 7168, I 2048) at R = 8192 (the anchor's shape) and R = 65536 (the layer's L1 rows at EP2), each timed
#   short:     as megamoe-bench's dense_rate does (3 warm-up calls, then 10 calls each followed by a synchronize),
#   sustained: back to back for 300 ms untimed, then 500 ms timed (as time_rounds' lead and burst, longer),
#   after:     short again, straight after the sustained run (the board already at its power limit),
# with nvidia-smi sampling the SM clock and board power every 20 ms during each timed part.
# usage: python3 anchor.py [rounds]
import statistics, subprocess, sys, time, torch

H, I = 7168, 2048
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3


def sampled(body):
    smi = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "20"], stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)
    ms = body()
    smi.terminate()
    rows = [list(map(float, l.split(","))) for l in smi.communicate()[0].strip().splitlines() if l.count(",") == 1]
    clock = statistics.median(r[0] for r in rows) if rows else float("nan")
    power = statistics.median(r[1] for r in rows) if rows else float("nan")
    return ms, clock, power


def short(fn):
    for _ in range(3):
        fn()
    times = []
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def burst(fn, ms_wanted, once):
    n = max(1, int(ms_wanted / once))
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record(); e.synchronize()
    return s.elapsed_time(e) / n


for R in (8192, 65536):
    a = torch.randn(R, H, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(H, 2 * I, device="cuda", dtype=torch.bfloat16)
    fn = lambda: a @ b
    flops = 2.0 * R * H * 2 * I
    tf = lambda ms: flops / ms / 1e9
    for r in range(rounds):
        torch.cuda.synchronize(); time.sleep(1.0)  # the board cools between rounds
        s_ms, s_clk, s_w = sampled(lambda: short(fn))
        once = short(fn)
        burst(fn, 300, once)  # lead, untimed
        u_ms, u_clk, u_w = sampled(lambda: burst(fn, 500, once))
        a_ms, a_clk, a_w = sampled(lambda: short(fn))
        print(f"R {R:5d} round {r}: short {tf(s_ms):6.1f} TF/s ({s_ms:.3f} ms, {s_clk:.0f} MHz, {s_w:.0f} W) | "
              f"sustained {tf(u_ms):6.1f} ({u_ms:.3f} ms, {u_clk:.0f} MHz, {u_w:.0f} W) | "
              f"short after it {tf(a_ms):6.1f} ({a_clk:.0f} MHz, {a_w:.0f} W)", flush=True)
