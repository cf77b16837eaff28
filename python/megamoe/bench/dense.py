"""The dense cuBLAS anchor of the layer bench: one bf16 GEMM at the layer's L1 shape, its rate in this run, and the
dense-equivalent times of the layer's FLOPs at that rate."""
import torch

from .timing import div, time_rounds


DENSE_ROWS = 8192  # the dense cuBLAS GEMM whose rate prices the layer's FLOPs: [8192, H] x [H, 2I]


def dense_rate(H, I, reps):
    """TFLOP/s of one dense cuBLAS bf16 GEMM [DENSE_ROWS, H] x [H, 2I] in this run (the layer's L1 shape), in the
    steady state the layer's timed calls run in: back to back after a 200 ms lead. A few synchronized calls on an
    idle board run at its top clock and read ~11% faster (bench/results/2026-12-03-h200-dense-anchor)."""
    fn, flops = dense_gemm(H, I)
    ms = time_rounds({"dense": fn}, max(min(reps, 5), 2), burst_ms=100.0, lead_ms=200.0)["dense"]
    return flops / ms / 1e9


def dense_gemm(H, I):
    """The anchor's GEMM on fresh random operands: (a call of it, its FLOPs)."""
    a = torch.randn(DENSE_ROWS, H, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(H, 2 * I, device="cuda", dtype=torch.bfloat16)
    return (lambda: a @ b), 2.0 * DENSE_ROWS * H * 2 * I


def dense_equivalent(flops, tflops, measured, T_layer, T_torch):
    """The dense-cuBLAS-equivalent ms of each stage (its FLOPs at `tflops`) and of the whole, with the ratios
    dense / measured (1.0: as fast as one dense GEMM of the same FLOPs)."""
    stage = {op: f / tflops / 1e9 for op, f in flops.items()}
    total = sum(stage.values())
    return {"tflops": tflops, "stage_ms": stage, "ms": total,
            "stage_ratio": {op: div(stage[op], measured[op]) for op in stage},
            "ratio_layer": div(total, T_layer), "ratio_torch": div(total, T_torch)}
