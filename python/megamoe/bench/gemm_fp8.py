"""`megamoe-bench gemm --dtype fp8`: the FP8 grouped GEMM (grouped_gemm_nt_fp8) on FP8_CASES against the float32
product of its dequantised operands, our bf16 TMA grouped GEMM, torch._grouped_mm and torch's FP8 GEMMs."""
import sys

import torch

from .cases import CASES, FP8_CASES, group_sizes
from .timing import time_rounds


def run_gemm_fp8_case(mm, name, reps, gen):
    """grouped_gemm_nt_fp8 (e4m3 with 128 x 128 block scales on B, 1 x 128 on A) on CASES[name]'s NT shape and group
    sizes, against: the float32 product of the dequantised operands (correctness, as run_gemm_case checks), our bf16
    TMA grouped GEMM and torch._grouped_mm on the same values in bf16, torch._scaled_grouped_mm (FP8 with row-wise
    scales, where this torch has it) and a dense torch._scaled_mm of the same total size (cuBLAS FP8, row-wise)."""
    from megamoe import fp8 as mfp8
    layout, E, N, K, total, dist = CASES[name]
    assert layout == "nt" and N % 128 == 0 and K % 128 == 0 and K >= 256, name
    dev = "cuda"
    sizes = group_sizes(dist, total, E, gen)
    total = int(sizes.sum())
    offs_end = torch.cumsum(sizes, 0).to(torch.int32).to(dev)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int32, device=dev), offs_end])
    kb = K // 128
    a, b = mfp8.random_e4m3((total, K), dev), mfp8.random_e4m3((E, N, K), dev)
    sa = torch.rand(total, kb, device=dev) * 0.02 + 0.005
    sb = torch.rand(E, N // 128, kb, device=dev) * 0.02 + 0.005
    flops = 2.0 * total * N * K
    r = {"case": name, "dtype": "fp8", "layout": layout, "experts": E, "N": N, "K": K, "rows": total,
         "groups_min": int(sizes.min()), "groups_max": int(sizes.max())}
    pad = 64
    c_full = torch.full((total + pad, N), float("nan"), device=dev, dtype=torch.bfloat16)
    c = c_full[:total]
    kernel = mm.kernel("grouped_gemm_nt_fp8", [("E", E), ("N", N), ("K", K)])
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    tickets = torch.zeros(2, dtype=torch.int32, device=dev)
    map_a, map_b = mm.tensor_map(kernel, "map_a", a, total, K), mm.tensor_map(kernel, "map_b", b, E * N, K)
    fp8_launch = lambda: mm.launch(kernel, (sm, 1, 1), a=a.data_ptr(), a_scales=sa.data_ptr(), b=b.data_ptr(),
                                   b_scales=sb.data_ptr(), c=c.data_ptr(), offsets=offsets.data_ptr(),
                                   tickets=tickets.data_ptr(), grid=sm, map_a=map_a, map_b=map_b)
    # The dequantised values, rounded once to bf16 for the bf16 anchors, and the float32 reference from them, one
    # group at a time.
    a32 = mfp8.dequantize_tokens(a, sa)
    a_bf = a32.to(torch.bfloat16)
    b_bf = torch.empty(E, N, K, dtype=torch.bfloat16, device=dev)
    ref = torch.empty(total, N, dtype=torch.float32, device=dev)
    torch.backends.cuda.matmul.allow_tf32 = False
    starts = [0] + torch.cumsum(sizes, 0).tolist()
    for e in range(E):
        w = mfp8.dequantize_blocks(b[e], sb[e])
        b_bf[e] = w.to(torch.bfloat16)
        lo, hi = starts[e], starts[e + 1]
        if hi > lo:
            ref[lo:hi] = a32[lo:hi] @ w.t()
    del a32
    c_full.fill_(float("nan"))
    fp8_launch()
    torch.cuda.synchronize()
    got = c.clone()
    c_full.fill_(float("nan"))
    fp8_launch()
    torch.cuda.synchronize()
    r.update({"rel_err_vs_fp32": float((got.float() - ref).norm() / ref.norm()),
              "all_written": bool(torch.isfinite(got.float()).all()),
              "sentinel_untouched": bool(torch.isnan(c_full[total:].float()).all()),
              "rerun_identical": bool(torch.equal(got.view(torch.int16), c.view(torch.int16))),
              "tickets_zero": not bool(tickets.any())})
    r["correct"] = (r["all_written"] and r["sentinel_untouched"] and r["rerun_identical"] and r["tickets_zero"]
                    and r["rel_err_vs_fp32"] <= 1e-2)
    del got, ref
    fns = {"fp8": fp8_launch}
    # bf16: our TMA grouped GEMM (pairs where N allows, as grouped_mm_nt runs it) and torch._grouped_mm.
    pairs = int(N % 256 == 0)
    bf_kernel = mm.kernel("grouped_gemm_nt_tma", [("E", E), ("N", N), ("K", K), ("pairs", pairs)])
    bgrid = max(2, sm // 2 * 2) if pairs else sm
    split_bytes, _ = mm.split_scratch_bytes(bgrid)
    split_scratch = torch.zeros(split_bytes, dtype=torch.uint8, device=dev)
    c_bf = torch.empty(total, N, dtype=torch.bfloat16, device=dev)
    bmap_a, bmap_b = mm.tensor_map(bf_kernel, "map_a", a_bf, total, K), mm.tensor_map(bf_kernel, "map_b", b_bf, E * N, K)
    fns["bf16"] = lambda: mm.launch(bf_kernel, (bgrid, 1, 1), a=a_bf.data_ptr(), b=b_bf.data_ptr(), c=c_bf.data_ptr(),
                                    offsets=offsets.data_ptr(), tickets=tickets.data_ptr(),
                                    split=split_scratch.data_ptr(), max_split=8, grid=bgrid, map_a=bmap_a,
                                    map_b=bmap_b)
    bt = b_bf.transpose(-2, -1)
    fns["torch_bf16"] = lambda: torch._grouped_mm(a_bf, bt, offs=offs_end)
    f8 = getattr(torch, "float8_e4m3fn", None)
    a8, b8 = a.view(f8), b.view(f8)
    ones_m, ones_n = torch.ones(total, 1, device=dev), torch.ones(1, N, device=dev)
    dense_b = b8[0].t()  # [K, N] column-major, as cuBLAS FP8 wants
    fns["dense_fp8"] = lambda: torch._scaled_mm(a8, dense_b, scale_a=ones_m, scale_b=ones_n, out_dtype=torch.bfloat16)
    if hasattr(torch, "_scaled_grouped_mm"):
        gs_a, gs_b = torch.ones(total, device=dev), torch.ones(E, N, device=dev)
        fns["torch_fp8_rowwise"] = lambda: torch._scaled_grouped_mm(a8, b8.transpose(-2, -1), gs_a, gs_b,
                                                                   offs=offs_end, out_dtype=torch.bfloat16)
    for n in list(fns):
        if n == "fp8":
            continue
        try:
            fns[n]()
            torch.cuda.synchronize()
        except Exception as e:  # an anchor's own constraints (e.g. offsets alignment): reported, not timed
            r["%s_error" % n] = str(e).splitlines()[0][:200]
            del fns[n]
    t = time_rounds(fns, reps)
    r["ms"] = {n: t[n] for n in fns}
    r["tflops"] = {n: flops / t[n] / 1e9 for n in fns}
    r["speedup_vs"] = {n: t[n] / t["fp8"] for n in fns if n != "fp8"}
    return r


def gemm_fp8_main(args, mm, gen):
    names = args.cases.split(",") if args.cases else list(FP8_CASES)
    rows = []
    for name in names:
        try:
            r = run_gemm_fp8_case(mm, name, args.reps, gen)
        except Exception as e:
            r = {"case": name, "error": str(e)}
        rows.append(r)
        if "error" in r:
            print("%-20s ERROR %s" % (name, r["error"]))
        else:
            print("%-20s fp8 %7.1f TF/s | %s | err %.2e written=%s sentinel=%s rerun=%s tickets=%s%s" % (
                name, r["tflops"]["fp8"], " | ".join("%s %.1f (fp8 %.2fx)" % (n, r["tflops"][n], r["speedup_vs"][n])
                                                    for n in r["speedup_vs"]),
                r["rel_err_vs_fp32"], r["all_written"], r["sentinel_untouched"], r["rerun_identical"],
                r["tickets_zero"], "".join(" [%s]" % r[k] for k in r if k.endswith("_error"))))
        sys.stdout.flush()
        torch.cuda.empty_cache()
    return rows
