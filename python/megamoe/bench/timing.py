"""How the benches time: medians of CUDA-event-timed calls after a steady lead of back-to-back calls
(docs/decisions/bench-steady-state.md), two steps timed in turns, interleaved rounds of several launches (time_rounds,
the gemm bench's), one step's kernel timeline under torch.profiler; div, the ratio of two times."""
import math
import random
import statistics

import torch
import torch.distributed as dist


STEADY_LEAD_MS = 300.0  # back-to-back calls before the layer's and the pipeline's timed ones (steady_lead)


def steady_lead(fn, ms):
    """fn back to back for about `ms`, untimed (the same number of calls on every rank: fn may hold collectives), so
    that what is timed next runs at the clock the board holds under sustained load, as the dense anchor is timed:
    under the 700 W cap a few calls after an idle spell run up to ~8% faster than the same calls in a long run
    (bench/results/2026-12-03-h200-bench-clocks)."""
    for _ in range(calls_for(fn, ms)):
        fn()


def calls_for(fn, ms, warmup=0, before=None):
    """How many back-to-back calls of fn take about `ms`, from one timed call (after `warmup` untimed ones, and
    before() if given): at least one, and the largest count of any rank, so that every rank calls fn as often."""
    once = max(time_ms(fn, 1, warmup=warmup, before=before), 1e-3)
    calls = torch.tensor([max(1, int(ms / once))], device="cuda")
    if dist.is_initialized():
        dist.all_reduce(calls, op=dist.ReduceOp.MAX)
    return int(calls.item())


def time_ms(fn, reps, warmup=3, before=None, lead_ms=0.0):
    """Median ms of `reps` calls, each after before() (if given) and timed alone; first `warmup` untimed calls, and
    with lead_ms a steady_lead before them."""
    if lead_ms:
        steady_lead(fn, lead_ms)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if before:
            before()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def interleaved_ms(a, b, reps, before=None, timer=None):
    """Steps a and b timed in turns (a, b, a, b, ... after one warm-up of each), so that both see the same clocks
    and temperature, which drift over a run: a's and b's median ms and the median of the turns' ratios a / b.
    timer(step) -> ms times one call (default: time_ms of one rep)."""
    timer = timer or (lambda step: time_ms(step, 1, warmup=0, before=before))
    a()
    b()
    ta, tb = [], []
    for _ in range(reps):
        ta.append(timer(a))
        tb.append(timer(b))
    return {"random_ms": statistics.median(ta), "whole_tile_ms": statistics.median(tb),
            "ratio": statistics.median(x / y for x, y in zip(ta, tb))}


def timeline_summary(kernels, top=5):
    """One step's GPU kernels [(name, start_us, end_us)] (any order): the span from the first start to the last end,
    the time some kernel ran (the union of the intervals), the idle rest, the time two or more ran at once, the `top`
    longest gaps with the kernel each ends at, each kernel name's count and summed duration, and every kernel in start
    order (name, start from the first, duration). Milliseconds."""
    kernels = sorted(kernels, key=lambda k: k[1])
    if not kernels:
        return None
    # One sweep over the start (+1) and end (-1) edges, ends first at equal times: busy while one kernel runs or more,
    # overlapped while two or more do.
    edges = sorted([(s, 1) for _, s, _ in kernels] + [(e, -1) for _, _, e in kernels])
    busy, overlap, running, last = 0.0, 0.0, 0, edges[0][0]
    for t, step in edges:
        busy += t - last if running >= 1 else 0.0
        overlap += t - last if running >= 2 else 0.0
        running, last = running + step, t
    gaps, end = [], kernels[0][1]
    per_name = {}
    for name, s, e in kernels:
        if s > end:
            gaps.append((s - end, name))
        end = max(end, e)
        n, d = per_name.get(name, (0, 0.0))
        per_name[name] = (n + 1, d + (e - s))
    span = end - kernels[0][1]
    gaps.sort(key=lambda g: -g[0])
    return {"span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_ms": (span - busy) / 1e3,
            "overlap_ms": overlap / 1e3, "kernels": len(kernels),
            "gaps": [{"ms": g / 1e3, "before": name} for g, name in gaps[:top]],
            "by_kernel": {name: {"count": n, "ms": d / 1e3} for name, (n, d) in
                          sorted(per_name.items(), key=lambda kv: -kv[1][1])},
            "sequence": [{"name": name, "start_ms": (s - kernels[0][1]) / 1e3, "ms": (e - s) / 1e3}
                         for name, s, e in kernels]}


def step_timeline(step, before=None):
    """timeline_summary of one step() (the caller has just timed it: warm), from torch.profiler's CUDA kernel records
    (CUPTI sees the layer's kernels too: they run in this process)."""
    from torch.profiler import ProfilerActivity, profile
    if before:
        before()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    return timeline_summary(kernels)


def time_rounds(fns, rounds, burst_ms=40.0, lead_ms=20.0):
    """Per-call ms of each of `fns` (name -> launch), measured in interleaved rounds: every round runs each function
    back to back for about lead_ms untimed and then burst_ms timed (no gap between them), in a shuffled order, and a
    function's time is the median over rounds. Under the board's power limit a kernel's clock depends on what ran
    just before (a light kernel lets the next start at a higher clock); the untimed lead lets each function reach
    its own steady state first, and the shuffle keeps any one function from always following the same other.
    One warm-up round first."""
    names = list(fns)
    once = {n: time_ms(fns[n], 2, warmup=1) for n in names}
    calls = lambda n, ms: max(1, int(round(ms / max(once[n], 1e-3))))
    order = random.Random(2026)
    times = {n: [] for n in names}
    for r in range(rounds + 1):
        order.shuffle(names)
        for n in names:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            for _ in range(calls(n, lead_ms)):
                fns[n]()
            s.record()
            for _ in range(calls(n, burst_ms)):
                fns[n]()
            e.record()
            e.synchronize()
            if r:
                times[n].append(s.elapsed_time(e) / calls(n, burst_ms))
    return {n: statistics.median(t) for n, t in times.items()}


def div(a, b):
    return a / b if b else math.nan
