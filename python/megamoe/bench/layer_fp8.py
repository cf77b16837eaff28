"""`megamoe-bench layer-fp8`: the FP8 layer's forward (MEGAMOE_DTYPE_FP8_E4M3: e4m3 weights with 128 x 128 block
scales, x quantised by the layer) against the bf16 layer's on the same experts, dequantised to bf16, in one process
on one GPU (one rank: --experts 128 is DeepSeek-V3 EP2's per-GPU work), interleaved in the same run (time_rounds).
Prints each token count's times, the FP8 / bf16 ratio, the forward's TF/s (2 x 3 H I per pick), how far the two
layers' y are apart (relative Frobenius), each layer's time over the time to read the weights of the experts its
tokens pick once (their bytes at the copy bandwidth of the same run: issue 50's decode anchor), and each layer's
stages from its profiling events (MoeLayer::Stage: the prologue with FP8's x quantiser; dispatch_grouped_gemm with
FP8's act quantiser; grouped_gemm_combine)."""
import statistics
import sys

import torch

from .. import _lib
from ..kernels import with_kernels
from .runtime import LEGS, Megamoe
from .timing import STEADY_LEAD_MS, steady_lead, time_ms, time_rounds

STAGE_NAMES = ("prologue", "dispatch", "combine")  # MoeLayer::Stage order


def stage_times(layer, step, reps, leg="fused"):
    """Median ms of each stage (STAGE_NAMES) over `reps` profiled calls of step(), after a steady lead, with the
    fused kernels running `leg` (LEGS: "gemm" skips the pushes and the arrival waits)."""
    layer.set_legs(LEGS[leg], LEGS[leg])
    layer.set_profiling(True)
    steady_lead(step, STEADY_LEAD_MS)
    samples = []
    for _ in range(reps):
        step()
        torch.cuda.synchronize()
        samples.append(layer.stage_ms())
    layer.set_profiling(False)
    layer.set_legs(LEGS["fused"], LEGS["fused"])
    return {n: statistics.median(s[i] for s in samples) for i, n in enumerate(STAGE_NAMES)}


def copy_bandwidth(src, reps):
    """Bytes per ms HBM moves copying `src` (read plus write), measured now."""
    dst = torch.empty_like(src)
    return 2.0 * src.numel() * src.element_size() / time_ms(lambda: dst.copy_(src), reps, lead_ms=STEADY_LEAD_MS)


def layer_handle(mm, cfg, dtype):
    config = _lib.LayerConfig(**dict(cfg, dtype=dtype))
    command = "megamoe-cache generate --hidden %d --intermediate %d --experts %d --topk %d --ep 1%s" % (
        cfg["hidden"], cfg["intermediate"], cfg["experts"], cfg["topk"], " --dtype fp8" if dtype else "")
    return with_kernels(lambda: _lib.LayerHandle.create(mm.runtime, config, 0, 1, None), command,
                        "megamoe-bench layer-fp8")


def layer_fp8_main(args):
    from .. import fp8 as mfp8
    dev, gen = "cuda", torch.Generator(device="cuda").manual_seed(2026)
    H, I, E, k = args.hidden, args.intermediate, args.experts, args.topk
    tokens = [int(t) for t in args.tokens.split(",")]
    T = max(tokens)
    mm = Megamoe(args.lib)
    cfg = {"hidden": H, "intermediate": I, "experts": E, "topk": k, "max_tokens": T}
    fp8_layer, bf16_layer = layer_handle(mm, cfg, 1), layer_handle(mm, cfg, 0)
    # The experts: codes with scales that make a weight about 1 / sqrt(K), and their bf16 dequantisation.
    # Codes of moderate magnitude (exponent fields 5..14, either sign, every mantissa): no NaN, no subnormal.
    w1 = mfp8.random_e4m3((E, 2 * I, H), dev, gen, exponents=(5, 15))
    w2 = mfp8.random_e4m3((E, H, I), dev, gen, exponents=(5, 15))
    s1 = (torch.rand(E, 2 * I // 128, H // 128, device=dev, generator=gen) * 0.5 + 0.5) / (140 * H ** 0.5)
    s2 = (torch.rand(E, H // 128, I // 128, device=dev, generator=gen) * 0.5 + 0.5) / (140 * I ** 0.5)
    w1_bf = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=dev)
    w2_bf = torch.empty(E, H, I, dtype=torch.bfloat16, device=dev)
    for e in range(E):
        w1_bf[e] = mfp8.dequantize_blocks(w1[e], s1[e]).to(torch.bfloat16)
        w2_bf[e] = mfp8.dequantize_blocks(w2[e], s2[e]).to(torch.bfloat16)
    stream = lambda: torch.cuda.current_stream().cuda_stream
    bandwidth = copy_bandwidth(w2_bf, args.reps)  # bytes / ms
    expert_bytes = {"fp8": 3 * H * I + 4 * (s1[0].numel() + s2[0].numel()), "bf16": 6 * H * I}
    print("copy bandwidth %.0f GB/s (read + write, the weight-read anchor)" % (bandwidth / 1e6))
    rows = []
    for t in tokens:
        x = torch.randn(t, H, device=dev, generator=gen).to(torch.bfloat16)
        idx = torch.rand(t, E, device=dev, generator=gen).topk(k, dim=1).indices.to(torch.int32).contiguous()
        wts = torch.rand(t, k, device=dev, generator=gen) * 0.95 + 0.05
        y8 = torch.empty(t, H, dtype=torch.bfloat16, device=dev)
        y16 = torch.empty(t, H, dtype=torch.bfloat16, device=dev)
        fns = {
            "fp8": lambda: fp8_layer.forward_fp8(x.data_ptr(), 0, t, idx.data_ptr(), wts.data_ptr(), w1.data_ptr(),
                                                 s1.data_ptr(), w2.data_ptr(), s2.data_ptr(), y8.data_ptr(), stream()),
            "bf16": lambda: bf16_layer.forward(x.data_ptr(), t, idx.data_ptr(), wts.data_ptr(), w1_bf.data_ptr(),
                                               w2_bf.data_ptr(), y16.data_ptr(), stream()),
        }
        for f in fns.values():
            f()
        fp8_layer.check_errors(stream())
        bf16_layer.check_errors(stream())
        first = y8.clone()
        fns["fp8"]()
        fp8_layer.check_errors(stream())
        ms = time_rounds(fns, args.reps)
        stages = {n: stage_times(layer, fns[n], args.reps) for n, layer in (("fp8", fp8_layer), ("bf16", bf16_layer))}
        for n, layer in (("fp8", fp8_layer), ("bf16", bf16_layer)):
            stages[n + " gemm-only"] = stage_times(layer, fns[n], args.reps, leg="gemm")
        flops = 2.0 * 3 * H * I * t * k
        picked = int(torch.unique(idx).numel())
        weights_ms = {n: picked * expert_bytes[n] / bandwidth for n in ms}
        r = {"tokens": t, "ms": ms, "tflops": {n: flops / ms[n] / 1e9 for n in ms}, "stage_ms": stages,
             "experts_picked": picked, "weights_once_ms": weights_ms,
             "over_weights_once": {n: ms[n] / weights_ms[n] for n in ms},
             "fp8_speedup_vs_bf16": ms["bf16"] / ms["fp8"],
             "rel_diff_fp8_vs_bf16": float((y8.float() - y16.float()).norm() / y16.float().norm()),
             "fp8_finite": bool(torch.isfinite(y8.float()).all()), "fp8_rerun_identical": bool(torch.equal(first, y8))}
        rows.append(r)
        print("tokens %6d: fp8 %.3f ms (%.0f TF/s) | bf16 %.3f ms (%.0f TF/s) | fp8 %.2fx bf16 | y rel diff %.3e "
              "finite=%s rerun=%s" % (t, ms["fp8"], r["tflops"]["fp8"], ms["bf16"], r["tflops"]["bf16"],
                                      r["fp8_speedup_vs_bf16"], r["rel_diff_fp8_vs_bf16"], r["fp8_finite"],
                                      r["fp8_rerun_identical"]))
        over = r["over_weights_once"]
        print("  %d experts picked; weights read once: fp8 %.3f ms (layer %.2fx that), bf16 %.3f ms (%.2fx)" % (
            picked, weights_ms["fp8"], over["fp8"], weights_ms["bf16"], over["bf16"]))
        for n in stages:
            print("  stages %-14s ms: %s" % (n, " | ".join("%s %.3f" % (st, stages[n][st]) for st in STAGE_NAMES)))
        sys.stdout.flush()
    fp8_layer.destroy()
    bf16_layer.destroy()
    return {"shape": cfg, "device": torch.cuda.get_device_name(), "copy_bandwidth_gbps": bandwidth / 1e6, "rows": rows}
