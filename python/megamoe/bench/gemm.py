"""`megamoe-bench gemm`: our grouped GEMMs (NT / NN / TN, each with its TMA variants) on CASES against
torch._grouped_mm and a dense cuBLAS GEMM of the same size: correctness per case, TFLOP/s and ratios; the printed
table and the JSON."""
import json
import os
import sys

import torch

from .cases import CASES, group_sizes
from .gemm_fp8 import gemm_fp8_main
from .runtime import Megamoe
from .timing import time_rounds


def run_gemm_case(mm, name, reps, gen):
    layout, E, N, KM, total, dist = CASES[name]
    dev = "cuda"
    sizes = group_sizes(dist, total, E, gen)
    total = int(sizes.sum())
    offs_end = torch.cumsum(sizes, 0).to(torch.int32).to(dev)             # torch: group ends
    offsets = torch.cat([torch.zeros(1, dtype=torch.int32, device=dev), offs_end])  # ours: starts + total
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sm * int(os.environ.get("GEMM_GRID_PER_SM", "3"))  # persistent grid; see docs/decisions/gemm-tiles.md
    r = {"case": name, "layout": layout, "experts": E, "N": N, "groups_min": int(sizes.min()),
         "groups_max": int(sizes.max())}
    randn = lambda *shape: torch.randn(*shape, device=dev, dtype=torch.float32, generator=None).to(torch.bfloat16)
    if layout in ("nt", "nn"):
        K = KM
        flops = 2.0 * total * N * K
        a = randn(total, K)
        b = randn(E, N, K) if layout == "nt" else randn(E, K, N)
        bt = b.transpose(-2, -1) if layout == "nt" else b  # torch wants [E, K, N] (any strides)
        pad = 64
        c_full = torch.full((total + pad, N), float("nan"), device=dev, dtype=torch.bfloat16)
        c = c_full[:total]
        kernel = mm.kernel("grouped_gemm_" + layout, [("E", E), ("N", N), ("K", K)])
        ours = lambda: mm.launch(kernel, (grid, 1, 1), a=a.data_ptr(), b=b.data_ptr(), c=c.data_ptr(),
                                 offsets=offsets.data_ptr(), grid=grid)
        # The TMA variant (kernels/Kernels.h buildGroupedGemm): maps over A and B as the kernel's boxes expect.
        tma_kernel = mm.kernel("grouped_gemm_%s_tma" % layout, [("E", E), ("N", N), ("K", K), ("pairs", 0)])
        # Cluster pairs multicasting B (N % 256 == 0), run beside it as "pairs".
        pairs_kernel = (mm.kernel("grouped_gemm_%s_tma" % layout, [("E", E), ("N", N), ("K", K), ("pairs", 1)])
                        if N % 256 == 0 else None)
        # The maps over A [total, K] and B (NT: [E * N, K]; NN: [E * K, N]), in each kernel's declared boxes.
        maps = lambda kern: (mm.tensor_map(kern, "map_a", a, total, K),
                             mm.tensor_map(kern, "map_b", b, E * N, K) if layout == "nt"
                             else mm.tensor_map(kern, "map_b", b, E * K, N))
        anchor = lambda: torch._grouped_mm(a, bt, offs=offs_end)
        dense_a, dense_b = a, randn(N, K).t()
    else:
        M = KM
        flops = 2.0 * total * N * M
        a = randn(total, M)
        b = randn(total, N)
        c_full = torch.full((E + 1, M, N), float("nan"), device=dev, dtype=torch.bfloat16)
        c = c_full[:E]
        kernel = mm.kernel("grouped_gemm_tn", [("E", E), ("N", N), ("M", M)])
        ours = lambda: mm.launch(kernel, (grid, 1, 1), a=a.data_ptr(), b=b.data_ptr(), c=c.data_ptr(),
                                 offsets=offsets.data_ptr(), grid=grid)
        # TMA: maps over the tokens' rows of A [total, M] and B [total, N] (MN-major slabs); the kernel zeroes rows
        # past a group itself.
        tma_kernel = mm.kernel("grouped_gemm_tn_tma", [("E", E), ("N", N), ("M", M), ("pairs", 0)])
        pairs_kernel = None  # TN has no pairs (each block reads its own group's rows)
        maps = lambda kern: (mm.tensor_map(kern, "map_a", a, total, M), mm.tensor_map(kern, "map_b", b, total, N),
                             mm.tensor_map(kern, "map_c", c, E * M, N))
        if bool((sizes % 16 != 0).any()):
            # torch._grouped_mm wants TN's group ends at multiples of 16 (a device-side assert otherwise): the anchor
            # runs on copies whose groups are padded with zero rows to that (the copies are not timed).
            psizes = (sizes + 15) // 16 * 16
            dst = (torch.arange(total) - torch.repeat_interleave(torch.cumsum(sizes, 0) - sizes, sizes)
                   + torch.repeat_interleave(torch.cumsum(psizes, 0) - psizes, sizes)).to(dev)
            a_t, b_t = (torch.zeros(int(psizes.sum()), x.shape[1], device=dev, dtype=x.dtype).index_copy_(0, dst, x)
                        for x in (a, b))
            offs_t = torch.cumsum(psizes, 0).to(torch.int32).to(dev)
            r["anchor_padded_to"] = 16
        else:
            a_t, b_t, offs_t = a, b, offs_end
        at = a_t.t().contiguous()  # torch's 2d x 2d form wants A^T row-major [M, total]
        anchor = lambda: torch._grouped_mm(at, b_t, offs=offs_t)
        dense_a, dense_b = randn(M, total), randn(total, N)
    # One 384-thread block fits an SM; clusters of two need an even grid (GEMM_TMA_GRID overrides).
    tgrid = int(os.environ.get("GEMM_TMA_GRID", sm))
    tickets = torch.zeros(2, dtype=torch.int32, device=dev)  # the TMA variants' tile tickets (each launch resets them)
    # Their split scratch (compiler/abi/DeviceAbi.h, through megamoe_split_scratch_bytes), zero: its leading
    # counters must be, and each launch leaves them so.
    split_bytes, zeroed_bytes = mm.split_scratch_bytes(tgrid)
    split_scratch = torch.zeros(split_bytes, dtype=torch.uint8, device=dev)
    max_split = int(os.environ.get("GEMM_MAX_SPLIT", "8"))
    def launcher(kern, g, ms):
        m = maps(kern)
        extra = {"map_c": m[2]} if len(m) > 2 else {}
        return lambda: mm.launch(kern, (g, 1, 1), a=a.data_ptr(), b=b.data_ptr(), c=c.data_ptr(),
                                 offsets=offsets.data_ptr(), tickets=tickets.data_ptr(),
                                 split=split_scratch.data_ptr(), max_split=ms, grid=g, map_a=m[0], map_b=m[1],
                                 **extra)
    # "-split": the last round's tiles split over K (layouts NT / NN; kernels/Kernels.h); the others with max_split 0.
    variants = {"tma": launcher(tma_kernel, tgrid, 0)}
    if layout != "tn":
        variants["tma-split"] = launcher(tma_kernel, tgrid, max_split)
    if pairs_kernel is not None:
        pgrid = max(2, tgrid // 2 * 2)  # whole clusters of two
        variants["pairs"] = launcher(pairs_kernel, pgrid, 0)
        variants["pairs-split"] = launcher(pairs_kernel, pgrid, max_split)
    # Correctness: sentinel rows untouched, everything in the contract written, fp32 reference, rerun identical.
    with torch.no_grad():
        try:
            ref_t = anchor().float()
        except Exception as e:  # the anchor's own constraints (e.g. offsets alignment): correctness only
            r["anchor_error"] = str(e).splitlines()[0]
            anchor, ref_t = None, None
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = torch.empty_like(c, dtype=torch.float32)
        starts = [0] + torch.cumsum(sizes, 0).tolist()
        for e in range(E):
            lo, hi = starts[e], starts[e + 1]
            if layout == "nt":
                ref[lo:hi] = a[lo:hi].float() @ b[e].float().t()
            elif layout == "nn":
                ref[lo:hi] = a[lo:hi].float() @ b[e].float()
            else:
                ref[e] = a[lo:hi].float().t() @ b[lo:hi].float()
    empty = [e for e in range(E) if int(sizes[e]) == 0]
    sentinel = c_full[E:] if layout == "tn" else c_full[total:]

    def checked(launch):
        """From a NaN-filled output, two launches: the first's result against the fp32 reference, everything in
        the contract written, the sentinel rows untouched, experts without tokens zero (TN), the second bitwise equal."""
        c_full.fill_(float("nan"))
        launch()
        torch.cuda.synchronize()
        got = c.clone()
        c_full.fill_(float("nan"))  # the rerun from NaN too: a rerun that writes nothing must not pass
        launch()
        torch.cuda.synchronize()
        v = {"rel_err_vs_fp32": float((got.float() - ref).norm() / ref.norm()),
             "all_written": bool(torch.isfinite(got.float()).all()),
             "sentinel_untouched": bool(torch.isnan(sentinel.float()).all()),
             "rerun_identical": bool(torch.equal(got.view(torch.int16), c.view(torch.int16))),
             "empty_groups_zero": layout != "tn" or all(bool((got[e] == 0).all()) for e in empty)}
        # The TMA variants leave their tile tickets and split counters zero.
        v["tickets_zero"] = not bool(tickets.any()) and not bool(split_scratch[:zeroed_bytes].any())
        v["correct"] = (v["tickets_zero"] and v["all_written"] and v["sentinel_untouched"] and v["rerun_identical"]
                        and v["empty_groups_zero"] and v["rel_err_vs_fp32"] <= 1e-2)
        return v

    r.update(checked(ours), empty_groups=len(empty))
    for v, launch in variants.items():  # the same checks for the TMA variants
        r[v] = checked(launch)
        r["correct"] = r["correct"] and r[v]["correct"]
    r["rel_err_torch_vs_fp32"] = float((ref_t - ref).norm() / ref.norm()) if ref_t is not None else float("nan")
    del ref, ref_t
    # Speed.
    fns = dict(ours=ours, **variants)
    if anchor is not None:
        fns.update(anchor=anchor, dense=lambda: dense_a @ dense_b)
    t = time_rounds(fns, reps)
    t_ours = t["ours"]
    if anchor is None:
        r.update({"ms_ours": t_ours, "tflops_ours": flops / t_ours / 1e9})
        return r
    t_anchor, t_dense = t["anchor"], t["dense"]
    for v in variants:
        t_v = t[v]
        r[v].update({"ms": t_v, "tflops": flops / t_v / 1e9, "ratio_vs_torch_grouped_mm": t_anchor / t_v})
    r.update({"ms_ours": t_ours, "ms_torch_grouped_mm": t_anchor, "ms_dense_cublas": t_dense,
              "tflops_ours": flops / t_ours / 1e9, "tflops_torch_grouped_mm": flops / t_anchor / 1e9,
              "tflops_dense_cublas": flops / t_dense / 1e9})
    r["ratio_vs_torch_grouped_mm"] = t_anchor / t_ours
    r["ratio_vs_dense_cublas"] = t_dense / t_ours
    return r


def gemm_main(args):
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    gen = torch.Generator().manual_seed(1234)
    mm = Megamoe(args.lib)
    print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
    rows = gemm_fp8_main(args, mm, gen) if args.dtype == "fp8" else []
    for name in ([] if args.dtype == "fp8" else (args.cases or ",".join(CASES)).split(",")):
        try:
            r = run_gemm_case(mm, name, args.reps, gen)
        except Exception as e:  # report and go on: one case must not hide the others
            r = {"case": name, "error": str(e)}
        rows.append(r)
        if "error" in r:
            print("%-20s ERROR %s" % (name, r["error"]))
        elif "anchor_error" in r:
            print("%-20s %-3s ours %7.1f TF/s | anchor refused: %s | err %.2e written=%s sentinel=%s rerun=%s"
                  " empty=%d zeroed=%s" % (name, r["layout"], r["tflops_ours"], r["anchor_error"][:60],
                                          r["rel_err_vs_fp32"], r["all_written"], r["sentinel_untouched"],
                                          r["rerun_identical"], r["empty_groups"], r["empty_groups_zero"]))
        else:
            print("%-20s %-3s ours %7.1f TF/s | grouped_mm %7.1f | dense %7.1f | ours/grouped_mm %.3f ours/dense %.3f"
                  " | err %.2e (torch %.2e) written=%s sentinel=%s rerun=%s" % (
                      name, r["layout"], r["tflops_ours"], r["tflops_torch_grouped_mm"], r["tflops_dense_cublas"],
                      r["ratio_vs_torch_grouped_mm"], r["ratio_vs_dense_cublas"], r["rel_err_vs_fp32"],
                      r["rel_err_torch_vs_fp32"], r["all_written"], r["sentinel_untouched"], r["rerun_identical"]))
            if "anchor_padded_to" in r:
                print("%-20s     (grouped_mm on groups padded with zero rows to multiples of %d: it refuses others)"
                      % ("", r["anchor_padded_to"]))
            for v in ("tma", "tma-split", "pairs", "pairs-split"):
                if v in r and "tflops" in r[v]:
                    t = r[v]
                    print("%-20s     %-11s%7.1f TF/s | ours/grouped_mm %.3f | err %.2e written=%s sentinel=%s rerun=%s" % (
                        "", v, t["tflops"], t["ratio_vs_torch_grouped_mm"], t["rel_err_vs_fp32"], t["all_written"],
                        t["sentinel_untouched"], t["rerun_identical"]))
        sys.stdout.flush()
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                       "timing": "median over %d shuffled rounds of a ~20 ms untimed lead + ~40 ms timed burst "
                                 "per kernel (time_rounds)" % args.reps,
                       "cases": rows}, f, indent=1)
    return 0 if all(r.get("correct") for r in rows) else 1
