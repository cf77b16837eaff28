"""One rank's side of `megamoe-bench layer` (LayerBench): this rank's experts, inputs under each routing, and every
case (correctness against the fp32 reference, times against the PyTorch pipeline, the fused operators' legs, the CUDA
graph, the sweep, --clocks, --beside-gemm), with the stage medians and their summary over ranks."""
import math
import statistics
import subprocess
import time

import torch
import torch.distributed as dist

from .cases import whole_tile_picks, zipf_weights
from .clocks import clock_query, clock_summary, gpu_id
from .dense import dense_equivalent, dense_gemm, dense_rate
from .pipeline import (GroupedMM, counts_of, experts_fp32, grouped_mm_for_backward, reference_fwd_bwd,
                       torch_forward, torch_moe)
from .ranks import all_ranks, global_rel_err, on_all_ranks, rank_errors, sync_ranks
from .report import RAGGED_WANTED
from .runtime import BACKWARD_STAGES, FUSED_BACKWARD, LEGS, STAGES
from .timing import STEADY_LEAD_MS, calls_for, div, interleaved_ms, steady_lead, step_timeline, time_ms


GRADS = ("y", "dx", "d_topk_weights", "dw1", "dw2")  # what one forward + backward writes
GUARD_ROWS = 64
GRAPH_POOL = 8  # routings the graph replays cycle through
TOLERANCE = 1e-2


def stage_medians(layer, leg, step, reps, read, stages, warmup=3, lead_ms=STEADY_LEAD_MS):
    """Median ms of each stage (read() after step(), profiling on) with every fused operator running `leg`, timed
    after a steady_lead of that leg, as the layer's headline time is (without it, 5 reps read the fused legs 25-45%
    above 10 reps in bench/results/2026-12-03-h200-bench-clocks run 4)."""
    layer.set_legs(leg, leg)
    steady_lead(step, lead_ms)
    samples = []
    for i in range(warmup + reps):
        sync_ranks()
        step()
        ms = read()
        if i >= warmup:
            samples.append(ms)
    return {op: statistics.median(s[k] for s in samples) for op, k in stages.items()}


def overlap(legs, fused=STAGES):
    """eta = max(comm, gemm) / fused and speedup = (comm + gemm) / fused, per fused operator."""
    f, c, g = legs["fused"], legs["comm"], legs["gemm"]
    return {"eta": {op: div(max(c[op], g[op]), f[op]) for op in fused},
            "speedup": {op: div(c[op] + g[op], f[op]) for op in fused}}


def summarize(per_rank, stages=STAGES, fused=STAGES):
    """Max over ranks of every time; the ratio, eta and speedup of those."""
    s = {k: max(p[k] for p in per_rank) for k in ("T_layer", "T_torch")}
    s["ratio"] = div(s["T_torch"], s["T_layer"])
    if all("prologue_ms" in p for p in per_rank):
        s["prologue_ms"] = max(p["prologue_ms"] for p in per_rank)
    s["legs"] = {leg: {op: max(p["legs"][leg][op] for p in per_rank) for op in stages} for leg in LEGS}
    s.update(overlap(s["legs"], fused))
    if all("dense" in p for p in per_rank):  # the slowest rank's: the largest dense-equivalent times
        d = {"tflops": min(p["dense"]["tflops"] for p in per_rank),
             "ms": max(p["dense"]["ms"] for p in per_rank),
             "stage_ms": {op: max(p["dense"]["stage_ms"][op] for p in per_rank) for op in per_rank[0]["dense"]["stage_ms"]}}
        d["ratio_layer"], d["ratio_torch"] = div(d["ms"], s["T_layer"]), div(d["ms"], s["T_torch"])
        d["stage_ratio"] = {op: div(d["stage_ms"][op], s["legs"]["fused"][op]) for op in d["stage_ms"]}
        s["dense"] = d
    if per_rank[0].get("timeline"):
        s["timeline"] = per_rank[0]["timeline"]  # rank 0's step (--timeline)
    return s


def bitwise_equal(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


class LayerBench:
    """One rank's side of `megamoe-bench layer`: the layer, this rank's experts, the cases."""

    def __init__(self, layer, cfg, reps, backward=False, timeline=False):
        self.layer, self.cfg, self.reps, self.backward, self.timeline = layer, cfg, reps, backward, timeline
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.own = cfg["experts"] // self.world
        H, I = cfg["hidden"], cfg["intermediate"]
        self.w1 = torch.randn(self.own, 2 * I, H, device="cuda", dtype=torch.bfloat16).div_(math.sqrt(H))
        self.w2 = torch.randn(self.own, H, I, device="cuda", dtype=torch.bfloat16).div_(math.sqrt(I))
        self.gen = torch.Generator().manual_seed(1234)  # same on every rank: the Zipf popularity, the hot expert
        self.gmm = GroupedMM()
        self.dense_tflops = dense_rate(H, I, reps)
        if backward:  # the pipeline's forward + backward
            self.gmm_bwd, self.gmm_bwd_why = grouped_mm_for_backward()

    def picks(self, kind, n, skip=0.0):
        """topk_idx int32 [n, topk] (distinct experts per token, a fraction `skip` then set to -1) and
        topk_weights fp32 [n, topk] (softmax of randn)."""
        E, K = self.cfg["experts"], self.cfg["topk"]
        if kind in ("balanced", "shuffled"):
            idx = whole_tile_picks(kind, self.rank, self.world, n, E, K, self.gen)
            return idx.int().cuda(), torch.softmax(torch.randn(n, K, device="cuda"), dim=1)
        if kind == "zipf":  # popularity 1 / rank^1.2, the same on every rank; drawn without replacement
            p = zipf_weights(E, 1.2, self.gen).to("cuda")
            idx = torch.multinomial(p.expand(n, E).contiguous(), K).int()
        else:
            scores = torch.rand(n, E, device="cuda")
            if kind == "remote":  # only experts that other ranks own
                scores[:, self.rank * self.own:(self.rank + 1) * self.own] = -1
            elif kind == "hot":  # one expert, the same on every rank, among every token's picks
                scores[:, int(torch.randint(E, (1,), generator=self.gen))] = 2
            idx = scores.topk(K, dim=1).indices.int()
        if skip:
            idx[torch.rand(n, K, device="cuda") < skip] = -1
        return idx, torch.softmax(torch.randn(n, K, device="cuda"), dim=1)

    def inputs(self, kind, T, skip=0.0):
        """x, topk_idx, topk_weights of T tokens: views of buffers of at least one row (valid pointers at T = 0)."""
        n = max(T, 1)
        x = torch.randn(n, self.cfg["hidden"], device="cuda", dtype=torch.bfloat16)
        idx, wts = self.picks(kind, n, skip)
        return x[:T], idx[:T], wts[:T]

    def check(self, x, idx, wts):
        """One forward against the fp32 reference, over all ranks (the same verdict on every rank)."""
        T, H = x.shape
        ref = torch_moe(x, idx, wts, self.w1, self.w2, experts_fp32)
        y_full = torch.full((T + GUARD_ROWS, H), float("nan"), device="cuda", dtype=torch.bfloat16)
        y = y_full[:T]
        on_all_ranks(lambda: self.layer.forward(x, idx, wts, self.w1, self.w2, y, check=True))
        first = y.clone()
        y.fill_(float("nan"))  # the rerun from NaN too: a rerun that writes nothing must not pass
        on_all_ranks(lambda: self.layer.forward(x, idx, wts, self.w1, self.w2, y, check=True))
        r = {"rel_err": global_rel_err(first, ref),
             "all_written": all_ranks(torch.isfinite(first.float()).all()),
             "guard_untouched": all_ranks(torch.isnan(y_full[T:].float()).all()),
             "rerun_identical": all_ranks(torch.equal(first.view(torch.int16), y.view(torch.int16)))}
        r["correct"] = (r["rel_err"] <= TOLERANCE and r["all_written"] and r["guard_untouched"]
                        and r["rerun_identical"])
        return r

    def traffic(self, idx):
        """This rank's valid picks as rows: received (from every rank), leaving it in dispatch and in combine."""
        flat = idx.reshape(-1).long()
        mine = counts_of(flat[flat >= 0] // self.own, self.world)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        m = torch.stack(every).tolist()  # [source rank][owner rank]
        r = self.rank
        received = sum(row[r] for row in m)
        out_dispatch = sum(m[r]) - m[r][r]
        if self.cfg.get("dedup_tokens"):  # one row per (token, remote owner) with at least one pick there
            owner = torch.where(idx >= 0, idx.long() // self.own, torch.full_like(idx, -1, dtype=torch.long))
            hit = torch.stack([(owner == o).any(dim=1) for o in range(self.world) if o != r]) if self.world > 1 \
                else torch.zeros(0, device=idx.device, dtype=torch.bool)
            out_dispatch = int(hit.sum())
        return {"rows_received": received, "rows_out_dispatch": out_dispatch, "rows_out_combine": received - m[r][r]}

    def rates(self, legs, traffic):
        """TFLOP/s of each fused operator (fused leg) and link GB/s of the rows leaving this rank (comm leg)."""
        H, I, rows = self.cfg["hidden"], self.cfg["intermediate"], traffic["rows_received"]
        flops = {"dispatch": 2.0 * rows * 2 * I * H, "combine": 2.0 * rows * H * I}
        out = {op: traffic["rows_out_" + op] * H * 2 for op in STAGES}
        return {"tflops": {op: div(flops[op], legs["fused"][op]) / 1e9 for op in STAGES},
                "link_gbps": {op: div(out[op], legs["comm"][op]) / 1e6 for op in STAGES}}

    def measure(self, x, idx, wts):
        """This rank's times (ms): the layer, the PyTorch pipeline, the legs of each fused operator."""
        layer, reps = self.layer, self.reps
        m = self.traffic(idx)
        y = torch.empty_like(x)
        forward = lambda: layer.forward(x, idx, wts, self.w1, self.w2, y)
        pipeline = lambda: torch_forward(x, idx, wts, self.w1, self.w2, self.gmm.experts)
        layer.set_plain()
        m["T_layer"] = time_ms(forward, reps, before=sync_ranks, lead_ms=STEADY_LEAD_MS)
        if self.timeline:
            m["timeline"] = step_timeline(forward, before=sync_ranks)
        m["T_torch"] = time_ms(pipeline, reps, before=sync_ranks, lead_ms=STEADY_LEAD_MS)
        m["ratio"] = div(m["T_torch"], m["T_layer"])
        layer.set_profiling(True)
        try:
            forward()  # the receive pool filled for the GEMM_ONLY leg
            m["legs"] = {leg: stage_medians(layer, code, forward, reps, layer.stage_ms, STAGES)
                         for leg, code in LEGS.items()}
            # dispatch_prologue (routing tables, counts exchanged with the peers) as the layer runs it
            m["prologue_ms"] = stage_medians(layer, LEGS["fused"], forward, reps, layer.stage_ms,
                                             {"prologue": 0})["prologue"]
        finally:
            layer.set_plain()
        layer.check_errors()
        m.update(overlap(m["legs"]))
        m.update(self.rates(m["legs"], m))
        m["dense"] = dense_equivalent(self.forward_flops(m), self.dense_tflops, m["legs"]["fused"], m["T_layer"],
                                      m["T_torch"])
        return m

    def forward_flops(self, traffic):
        H, I, rows = self.cfg["hidden"], self.cfg["intermediate"], traffic["rows_received"]
        return {"dispatch": 2.0 * rows * 2 * I * H, "combine": 2.0 * rows * H * I}

    def sweep_case(self, T):
        """Times only (uniform routing, T tokens per rank): the layer and the PyTorch pipeline, forward, and with
        --backward forward + backward (autograd for the pipeline)."""
        x, idx, wts = self.inputs("uniform", T)
        y = torch.empty_like(x)
        m = {"tokens": T}
        m["T_layer"] = time_ms(lambda: self.layer.forward(x, idx, wts, self.w1, self.w2, y), self.reps,
                               before=sync_ranks, lead_ms=STEADY_LEAD_MS)
        m["T_torch"] = time_ms(lambda: torch_forward(x, idx, wts, self.w1, self.w2, self.gmm.experts), self.reps,
                               before=sync_ranks, lead_ms=STEADY_LEAD_MS)
        if self.backward:
            dy = torch.randn_like(x)
            out = {"y": y, "dx": torch.empty_like(x), "dw1": torch.empty_like(self.w1),
                   "dw2": torch.empty_like(self.w2),
                   "d_topk_weights": torch.empty(wts.shape, device="cuda", dtype=torch.float32)}
            leaves = [t.detach().requires_grad_() for t in (x, wts, self.w1, self.w2)]

            def pipeline():
                with torch.enable_grad():
                    yt = torch_forward(leaves[0], idx, leaves[1], leaves[2], leaves[3], self.gmm_bwd.experts,
                                       differentiable=True)
                    torch.autograd.grad(yt, leaves, dy, allow_unused=True)

            m["T_layer_fwd_bwd"] = time_ms(lambda: self.fwd_bwd(x, idx, wts, dy, out), self.reps, before=sync_ranks,
                                           lead_ms=STEADY_LEAD_MS)
            m["T_torch_fwd_bwd"] = time_ms(pipeline, self.reps, before=sync_ranks, lead_ms=STEADY_LEAD_MS)
        self.layer.check_errors()
        per_rank = [None] * self.world
        dist.all_gather_object(per_rank, m)
        r = {k: max(p[k] for p in per_rank) for k in m}
        r["ratio"] = div(r["T_torch"], r["T_layer"])
        if self.backward:
            r["ratio_fwd_bwd"] = div(r["T_torch_fwd_bwd"], r["T_layer_fwd_bwd"])
        r["correct"] = True  # timing only: the correctness cases are the other sections
        return r

    def outputs(self, T):
        """NaN-filled outputs of one forward + backward, each followed by guard rows (dW1, dW2: a guard expert):
        ({name: full buffer}, {name: the part the layer writes})."""
        H, I, K, own = self.cfg["hidden"], self.cfg["intermediate"], self.cfg["topk"], self.own
        nan = lambda shape, dtype: torch.full(shape, float("nan"), device="cuda", dtype=dtype)
        full = {"y": nan((T + GUARD_ROWS, H), torch.bfloat16), "dx": nan((T + GUARD_ROWS, H), torch.bfloat16),
                "d_topk_weights": nan((T + GUARD_ROWS, K), torch.float32),
                "dw1": nan((own + 1, 2 * I, H), torch.bfloat16), "dw2": nan((own + 1, H, I), torch.bfloat16)}
        part = {k: v[:own] if k in ("dw1", "dw2") else v[:T] for k, v in full.items()}
        return full, part

    def grads_out(self, x, wts):
        """Fresh output buffers of a forward + backward (GRADS; dW1 and dW2 are as large as the weights)."""
        return {"y": torch.empty_like(x), "dx": torch.empty_like(x),
                "d_topk_weights": torch.empty(wts.shape, device="cuda", dtype=torch.float32),
                "dw1": torch.empty_like(self.w1), "dw2": torch.empty_like(self.w2)}

    def fwd_bwd_step(self, x, idx, wts, out=None):
        """A random dy and a step() running forward + backward on these inputs into `out` (grads_out unless given)."""
        dy = torch.randn_like(x)
        out = out or self.grads_out(x, wts)
        return dy, lambda: self.fwd_bwd(x, idx, wts, dy, out)

    def interleaved_case(self, anchor, T):
        """Random (uniform) routing against `anchor`'s whole-tile groups with the same rows, their steps timed in
        turns (interleaved_ms): the forward, and with --backward the forward + backward; this rank's."""
        u, a = self.inputs("uniform", T), self.inputs(anchor, T)
        out = self.grads_out(u[0], u[2]) if self.backward else {"y": torch.empty_like(u[0])}
        forward = lambda inp: (lambda: self.layer.forward(*inp, self.w1, self.w2, out["y"]))
        self.layer.set_plain()
        steady_lead(forward(u), STEADY_LEAD_MS)
        m = {"anchor": anchor, "wanted_at_most": RAGGED_WANTED,
             "forward": interleaved_ms(forward(u), forward(a), self.reps, before=sync_ranks)}
        if self.backward:
            step_u, step_a = self.fwd_bwd_step(*u, out)[1], self.fwd_bwd_step(*a, out)[1]
            steady_lead(step_u, STEADY_LEAD_MS)
            m["forward_backward"] = interleaved_ms(step_u, step_a, self.reps, before=sync_ranks)
        return m

    def fwd_bwd(self, x, idx, wts, dy, out, check=False):
        """One forward and its backward into out (GRADS)."""
        self.layer.forward(x, idx, wts, self.w1, self.w2, out["y"], check)
        self.layer.backward(dy, x, idx, wts, self.w1, self.w2, out["dx"], out["d_topk_weights"], out["dw1"],
                            out["dw2"], check)

    def clocks_case(self, T, seconds):
        """--clocks: each phase (the dense anchor, the layer's forward, its forward with only the GEMM legs (no push,
        no rows sent home), its forward under balanced (whole-tile) routing, with --backward its forward + backward,
        the PyTorch pipeline's forward; uniform routing unless said) back to back for `seconds` while nvidia-smi
        samples this rank's GPU (clock_summary). Every rank runs the same number of calls (the slowest rank's)."""
        query = clock_query()
        if query is None:
            return {"skipped": "nvidia-smi not found"}
        H, I = self.cfg["hidden"], self.cfg["intermediate"]
        x, idx, wts = self.inputs("uniform", T)
        out = self.grads_out(x, wts) if self.backward else {"y": torch.empty_like(x)}
        forward = lambda: self.layer.forward(x, idx, wts, self.w1, self.w2, out["y"])
        xb, ib, wb = self.inputs("balanced", T)

        def gemm_only():  # the legs without their comm: the receive pool as the fused forward just left it
            self.layer.set_legs(LEGS["gemm"], LEGS["gemm"])
            forward()
            self.layer.set_plain()

        phases = {"dense cuBLAS": dense_gemm(H, I), "layer forward": (forward, None),
                  "forward, GEMM legs": (gemm_only, None),
                  "forward, balanced": (lambda: self.layer.forward(xb, ib, wb, self.w1, self.w2, out["y"]), None)}
        if self.backward:
            dy = torch.randn_like(x)
            phases["layer fwd+bwd"] = (lambda: self.fwd_bwd(x, idx, wts, dy, out), None)
        phases["torch forward"] = (lambda: torch_forward(x, idx, wts, self.w1, self.w2, self.gmm.experts), None)
        self.layer.set_plain()
        gpu, r = gpu_id(), {}
        for name, (fn, flops) in phases.items():
            calls = calls_for(fn, seconds * 1000.0, warmup=2, before=sync_ranks)
            sync_ranks()
            time.sleep(1.0)  # the board's clock recovers a little between phases, as between the bench's cases
            smi = subprocess.Popen(["nvidia-smi", "-i", gpu, "--query-gpu=" + ",".join(query),
                                    "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(calls):
                fn()
            e.record()
            e.synchronize()
            smi.terminate()
            ms = s.elapsed_time(e) / calls
            r[name] = dict(ms=ms, calls=calls, **(clock_summary(query, smi.communicate()[0].splitlines()) or {}))
            if flops:
                r[name]["tflops"] = flops / ms / 1e9
        every = [None] * self.world
        dist.all_gather_object(every, r)
        return {"phases": r, "per_rank": every, "seconds": seconds}

    def beside_gemm_case(self, T, reps):
        """The layer at its SM budget while a dense GEMM loops on another stream: per-call ms alone and side by side."""
        x, idx, wts = self.inputs("uniform", T)
        y, plain = torch.empty_like(x), torch.empty_like(x)
        a = torch.randn(8192, 7168, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(7168, 4096, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(8192, 4096, device="cuda", dtype=torch.bfloat16)
        main, side = torch.cuda.current_stream(), torch.cuda.Stream()
        forward = lambda out: self.layer.forward(x, idx, wts, self.w1, self.w2, out)
        gemm = lambda: torch.matmul(a, b, out=c)
        forward(plain)
        layer_ms = time_ms(lambda: forward(y), reps, before=sync_ranks)
        gemm_ms = time_ms(gemm, reps)
        n_layer = max(5, int(round(200.0 / max(layer_ms, 1e-3))))  # ~200 ms of each loop
        n_gemm = max(5, int(round(n_layer * layer_ms / max(gemm_ms, 1e-3))))
        runs = []
        y.fill_(float("nan"))  # what the side-by-side calls write is compared below, not the solo calls' output
        for _ in range(max(3, reps // 3)):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            sync_ranks()
            side.wait_stream(main)
            ev[0].record(main)
            ev[2].record(side)
            with torch.cuda.stream(side):
                for _ in range(n_gemm):
                    gemm()
            for _ in range(n_layer):
                forward(y)
            ev[1].record(main)
            ev[3].record(side)
            torch.cuda.synchronize()
            runs.append((ev[0].elapsed_time(ev[1]), ev[2].elapsed_time(ev[3]),
                         max(ev[1].elapsed_time(ev[3]), 0) + ev[0].elapsed_time(ev[1])))
        self.layer.check_errors()
        layer_beside = statistics.median(r[0] for r in runs) / n_layer
        gemm_beside = statistics.median(r[1] for r in runs) / n_gemm
        wall = statistics.median(r[2] for r in runs)
        serial = n_layer * layer_ms + n_gemm * gemm_ms
        identical = all_ranks(torch.equal(y.view(torch.int16), plain.view(torch.int16)))
        return {"tokens": T, "sm_budget": self.layer.sm_budget, "layer_alone_ms": layer_ms,
                "layer_beside_ms": layer_beside, "gemm_alone_ms": gemm_ms, "gemm_beside_ms": gemm_beside,
                "gemm_tflops_alone": 2 * 8192 * 4096 * 7168 / gemm_ms / 1e9,
                "gemm_tflops_beside": 2 * 8192 * 4096 * 7168 / gemm_beside / 1e9,
                "wall_ms": wall, "serial_ms": serial, "wall_over_serial": div(wall, serial),
                "rerun_identical": identical, "correct": identical}

    def check_backward(self, x, idx, wts):
        """Forward + backward twice (fresh NaN-filled outputs each time) against the fp32 reference, over all ranks
        (the same verdict on every rank)."""
        T, H = x.shape
        dy = torch.randn(max(T, 1), H, device="cuda", dtype=torch.bfloat16)[:T]
        full_a, a = self.outputs(T)
        on_all_ranks(lambda: self.fwd_bwd(x, idx, wts, dy, a, check=True))
        full_b, b = self.outputs(T)
        on_all_ranks(lambda: self.fwd_bwd(x, idx, wts, dy, b, check=True))
        # isnan / isfinite on bf16 directly: no fp32 copy of dW1 / dW2
        guard = lambda full: all(bool(torch.isnan(v[(self.own if k in ("dw1", "dw2") else T):]).all())
                                 for k, v in full.items())
        written = all(bool(torch.isfinite(v).all()) for o in (a, b) for v in o.values())
        r = {"all_written": all_ranks(written),
             "guard_untouched": all_ranks(guard(full_a) and guard(full_b)),
             "rerun_identical": all_ranks(all(bitwise_equal(a[k], b[k]) for k in GRADS)),
             "skipped_zero": all_ranks(bool((a["d_topk_weights"][idx < 0] == 0).all()))}
        full_b = b = None  # freed before the reference
        sums = torch.zeros(4, dtype=torch.float64, device="cuda")  # dW1: |diff|^2, |ref|^2; dW2: the same
        empty = []

        def per_expert(e, n, g1, g2):
            sums.add_(torch.stack([(a["dw1"][e].float() - g1).pow(2).sum(), g1.pow(2).sum(),
                                   (a["dw2"][e].float() - g2).pow(2).sum(), g2.pow(2).sum()]).double())
            if n == 0:
                empty.append(e)

        ref_y, ref_dx, ref_dw = reference_fwd_bwd(x, idx, wts, dy, self.w1, self.w2, per_expert)
        r["empty_experts"] = len(empty)
        r["empty_experts_zero"] = all_ranks(all(bool((a["dw1"][e] == 0).all() and (a["dw2"][e] == 0).all())
                                                for e in empty))
        dist.all_reduce(sums)
        d1, r1, d2, r2 = sums.tolist()
        rel = lambda d, ref: math.sqrt(d / ref) if ref > 0 else (0.0 if d == 0 else math.inf)
        r["rel_err"] = {"y": global_rel_err(a["y"], ref_y), "dx": global_rel_err(a["dx"], ref_dx),
                        "d_topk_weights": global_rel_err(a["d_topk_weights"], ref_dw), "dw1": rel(d1, r1),
                        "dw2": rel(d2, r2)}
        r["correct"] = (all(e <= TOLERANCE for e in r["rel_err"].values()) and r["all_written"]
                        and r["guard_untouched"] and r["rerun_identical"] and r["skipped_zero"]
                        and r["empty_experts_zero"])
        return r

    def backward_rates(self, legs, traffic):
        """TFLOP/s of each GEMM stage of the backward (fused leg); link GB/s of the rows leaving this rank in each
        fused one (comm leg)."""
        H, I, rows = self.cfg["hidden"], self.cfg["intermediate"], traffic["rows_received"]
        flops = {"dgrad_dispatch": 2.0 * rows * H * I, "wgrad_w2": 2.0 * rows * H * I,
                 "wgrad_w1_dispatch": 2.0 * rows * 2 * I * H, "dgrad_combine": 2.0 * rows * 2 * I * H}
        out = {"dgrad_dispatch": traffic["rows_out_dispatch"] * H * 2,
               "wgrad_w1_dispatch": traffic["rows_out_dispatch"] * H * 2,
               "dgrad_combine": traffic["rows_out_combine"] * H * 2}
        return {"tflops": {op: div(f, legs["fused"][op]) / 1e9 for op, f in flops.items()},
                "link_gbps": {op: div(b, legs["comm"][op]) / 1e6 for op, b in out.items()}}

    def measure_backward(self, x, idx, wts):
        """This rank's times (ms) of forward + backward: the layer, the PyTorch pipeline with autograd; the legs of
        every backward stage."""
        layer, reps = self.layer, self.reps
        m = self.traffic(idx)
        dy, step = self.fwd_bwd_step(x, idx, wts)
        leaves = [t.detach().requires_grad_() for t in (x, wts, self.w1, self.w2)]
        xg, wg, w1g, w2g = leaves

        def pipeline():
            with torch.enable_grad():
                y = torch_forward(xg, idx, wg, w1g, w2g, self.gmm_bwd.experts, differentiable=True)
                torch.autograd.grad(y, leaves, dy, allow_unused=True)

        layer.set_plain()
        m["T_layer"] = time_ms(step, reps, before=sync_ranks, lead_ms=STEADY_LEAD_MS)
        if self.timeline:
            m["timeline"] = step_timeline(step, before=sync_ranks)
        m["T_torch"] = time_ms(pipeline, reps, before=sync_ranks, lead_ms=STEADY_LEAD_MS)
        m["ratio"] = div(m["T_torch"], m["T_layer"])
        layer.set_profiling(True)
        try:
            step()  # the receive pools filled for the GEMM_ONLY leg
            m["legs"] = {leg: stage_medians(layer, code, step, reps, layer.backward_stage_ms, BACKWARD_STAGES)
                         for leg, code in LEGS.items()}
        finally:
            layer.set_plain()
        layer.check_errors()
        m.update(overlap(m["legs"], FUSED_BACKWARD))
        m.update(self.backward_rates(m["legs"], m))
        H, I, rows = self.cfg["hidden"], self.cfg["intermediate"], m["rows_received"]
        bwd = {"dgrad_dispatch": 2.0 * rows * H * I, "wgrad_w2": 2.0 * rows * H * I,
               "wgrad_w1_dispatch": 2.0 * rows * 2 * I * H, "dgrad_combine": 2.0 * rows * 2 * I * H}
        m["dense"] = dense_equivalent(bwd, self.dense_tflops, m["legs"]["fused"], m["T_layer"], m["T_torch"])
        # the whole forward + backward: every FLOP of both at the dense rate
        whole = (sum(self.forward_flops(m).values()) + sum(bwd.values())) / self.dense_tflops / 1e9
        m["dense"].update(ms=whole, ratio_layer=div(whole, m["T_layer"]), ratio_torch=div(whole, m["T_torch"]))
        return m

    def with_backward(self, r, x, idx, wts, timed=False):
        """r (a forward case) with the backward's checks (and times) under r["backward"]; correct only if both are."""
        if not self.backward:
            return r
        b = self.check_backward(x, idx, wts)
        if timed:
            per_rank = [None] * self.world
            dist.all_gather_object(per_rank, on_all_ranks(lambda: self.measure_backward(x, idx, wts)))
            b.update(summarize(per_rank, BACKWARD_STAGES, FUSED_BACKWARD), per_rank=per_rank)
        r["backward"] = b
        r["forward_correct"] = r["correct"]
        r["correct"] = r["correct"] and b["correct"]
        return r

    def routing_case(self, kind, T):
        x, idx, wts = self.inputs(kind, T)
        r = {"routing": kind, "tokens": [T] * self.world}
        r.update(self.check(x, idx, wts))
        per_rank = [None] * self.world
        dist.all_gather_object(per_rank, on_all_ranks(lambda: self.measure(x, idx, wts)))
        r.update(summarize(per_rank), per_rank=per_rank)
        return self.with_backward(r, x, idx, wts, timed=True)

    def check_case(self, tokens, skip=0.0):
        """Correctness only: uniform routing, tokens[r] on rank r, a fraction `skip` of the picks -1."""
        x, idx, wts = self.inputs("uniform", tokens[self.rank], skip)
        r = dict(routing="uniform", tokens=tokens, skip=skip, **self.check(x, idx, wts))
        return self.with_backward(r, x, idx, wts)

    def graph_case(self, T, replays, kinds):
        """One forward captured in a CUDA graph, replayed with routing from a pool written into topk_idx /
        topk_weights in place; every replay bitwise equal to a plain forward on that routing."""
        x, idx, wts = self.inputs("uniform", T)
        routings = [kinds[i % len(kinds)] for i in range(GRAPH_POOL)]
        pool = [self.picks(kind, T) for kind in routings]
        y = torch.empty_like(x)
        forward = lambda check=False: self.layer.forward(x, idx, wts, self.w1, self.w2, y, check)
        expected, ref_errs = [], []
        for pool_idx, pool_wts in pool:
            idx.copy_(pool_idx)
            wts.copy_(pool_wts)
            on_all_ranks(lambda: forward(check=True))
            expected.append(y.clone())
            ref_errs.append(global_rel_err(y, torch_moe(x, idx, wts, self.w1, self.w2, experts_fp32)))
        sync_ranks()
        graph = on_all_ranks(lambda: capture(forward))
        sync_ranks()
        mismatches = 0
        for i in range(replays):
            pool_idx, pool_wts = pool[i % GRAPH_POOL]
            idx.copy_(pool_idx)
            wts.copy_(pool_wts)
            graph.replay()
            mismatches += not torch.equal(y.view(torch.int16), expected[i % GRAPH_POOL].view(torch.int16))
        _, errors = rank_errors(self.layer.check_errors)
        per_rank = [None] * self.world
        dist.all_gather_object(per_rank, mismatches)
        r = {"tokens": [T] * self.world, "replays": replays, "routings": routings, "mismatches": per_rank,
             "ref_rel_err": ref_errs, "check_errors": ["rank %d: %s" % (i, e[0]) for i, e in enumerate(errors) if e]}
        r["correct"] = sum(per_rank) == 0 and max(ref_errs) <= TOLERANCE and not r["check_errors"]
        return r


def capture(forward):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # the ctypes launch on the capture stream
        forward()
    return graph
