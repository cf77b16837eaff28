"""FP8 e4m3 for megamoe's FP8 inference (issue 48; docs/fp8.md): the format's exact conversions, the checkpoints'
128 x 128 block quantisation of weights and 1 x 128 per-token quantisation of activations, the fp32 reference of the
FP8 grouped GEMM NT that the kernels will compute, a layer's experts quantised (quantize_experts) and the reference of
the FP8 MoE layer (reference_moe_fp8), and a reader of DeepSeek-style FP8 safetensors checkpoints.
Pure torch: runs on torch 1.13 CPU, which has no float8 dtype, so FP8 tensors are torch.uint8 views of the codes;
where torch.float8_e4m3fn exists it is accepted wherever codes are, and returned when asked for (dtype=...)."""
import json
import math
import os

import torch

from .ops import _CODE_DTYPES, FLOAT8, ArgumentError, group_starts  # noqa: F401  (FLOAT8: None on torch < 2.1)

E4M3_MAX = 448.0   # the largest finite e4m3 value, 0x7E (1.75 * 2^8)
BLOCK = 128        # the checkpoints' weight block (rows x columns) and activation group (channels)
SCALE_FORMATS = ("fp32", "ue8m0")
_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MIN_NORMAL = 2.0 ** -6  # e4m3's smallest normal; below it the spacing is the subnormals' 2^-9


class CheckpointError(ValueError):
    """A checkpoint that lacks a tensor or holds one of the wrong dtype or shape: the message names the tensor and
    the file."""


def _fail(op, message):
    raise ArgumentError("megamoe.fp8.%s: %s" % (op, message))


def _codes(op, name, t):
    """t's e4m3 codes as a uint8 tensor (a view of a float8_e4m3fn tensor)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _CODE_DTYPES:
        _fail(op, "%s must be e4m3 codes, a torch.uint8%s tensor (got %s)" % (
            name, " or torch.float8_e4m3fn" if FLOAT8 is not None else "",
            t.dtype if isinstance(t, torch.Tensor) else type(t).__name__))
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _out_codes(op, codes, dtype):
    if dtype not in _CODE_DTYPES:
        _fail(op, "dtype must be torch.uint8%s (got %s)" % (
            " or torch.float8_e4m3fn" if FLOAT8 is not None else " (this torch has no float8_e4m3fn)", dtype))
    return codes if dtype == torch.uint8 else codes.view(dtype)


def _floating(op, name, t, dims=None):
    if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS:
        _fail(op, "%s must be a float32, bfloat16, float16 or float64 tensor (got %s)" % (
            name, t.dtype if isinstance(t, torch.Tensor) else type(t).__name__))
    if dims is not None and t.dim() not in dims:
        _fail(op, "%s must have %s dimensions (got shape %s)" % (name, " or ".join(map(str, dims)), list(t.shape)))
    return t


def _positive(op, name, value):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        _fail(op, "%s must be a positive integer (got %r)" % (name, value))
    return value


# --- the format -------------------------------------------------------------------------------------------------

def _decode_table():
    """Each code's value from the bit definition (sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is
    subnormal, m * 2^-9; S.1111.111 is NaN, and there is no infinity)."""
    values = []
    for code in range(256):
        exponent, mantissa = (code >> 3) & 0xF, code & 7
        magnitude = mantissa * 2.0 ** -9 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
        values.append(-magnitude if code & 0x80 else magnitude)
    table = torch.tensor(values, dtype=torch.float32)
    bits = table.view(torch.int32)
    bits[0x7F] = 0x7FC00000
    bits[0xFF] = -0x400000  # 0xFFC00000: a NaN with the sign bit, so that 0xFF comes back as 0xFF
    return table


_DECODE = _decode_table()
_TABLES = {}


def _table(device):
    if device not in _TABLES:
        _TABLES[device] = _DECODE.to(device)
    return _TABLES[device]


def e4m3_to_float(codes):
    """float32 values of e4m3 codes (uint8 or float8_e4m3fn), exact for all 256 codes (0x7F, 0xFF: NaN, the sign
    kept; 0x80: -0.0)."""
    codes = _codes("e4m3_to_float", "codes", codes)
    return _table(codes.device)[codes.long()]


def _pow2(exponent, dtype):
    """2^exponent, exactly, for integer tensors in [-149, 127] (float32) or [-1074, 1023] (float64)."""
    if dtype == torch.float64:
        e = exponent.long()
        normal = ((e.clamp(min=-1022) + 1023) << 52).view(torch.float64)
        sub = (torch.ones_like(e) << (e + 1074).clamp(0, 51)).view(torch.float64)
        return torch.where(e >= -1022, normal, sub)
    e = exponent.int()
    normal = ((e.clamp(min=-126) + 127) << 23).view(torch.float32)
    sub = (torch.ones_like(e) << (e + 149).clamp(0, 22)).view(torch.float32)
    return torch.where(e >= -126, normal, sub)


def random_e4m3(shape, device="cpu", generator=None, exponents=None):
    """Random finite e4m3 codes (uint8, never 0x7F / 0xFF): uniform over the 254 finite codes, or with exponents =
    (lo, hi) uniform over sign and mantissa with the exponent field in [lo, hi) (1 <= lo < hi <= 16; hi = 16 keeps
    S.1111.111, NaN, out: its mantissa becomes 110), i.e. normal values of bounded magnitude."""
    if exponents is None:
        c = torch.randint(0, 254, shape, dtype=torch.int32, device=device, generator=generator)
        return (c + (c >= 0x7F).int()).to(torch.uint8)  # skips 0x7F; 0xFF is never drawn (0..253 -> 0..254)
    lo, hi = exponents
    if not (1 <= lo < hi <= 16):
        raise ValueError("random_e4m3: exponents=(%d, %d) must satisfy 1 <= lo < hi <= 16" % (lo, hi))
    bits = torch.randint(0, 256, shape, dtype=torch.int32, device=device, generator=generator)
    exp = torch.randint(lo, hi, shape, dtype=torch.int32, device=device, generator=generator)
    code = (bits & 0x87) | (exp << 3)
    return torch.where((code & 0x7F) == 0x7F, code ^ 1, code).to(torch.uint8)


def float_to_e4m3(x, dtype=torch.uint8):
    """e4m3 codes of x (float32 / bfloat16 / float16 / float64, any shape), rounded to nearest, ties to even, in
    one rounding from x's own precision (float64 is not rounded to float32 first). Finite values beyond +-448 and
    infinities saturate to +-448 (0x7E / 0xFE), as the checkpoints' quantisers do (they clamp to +-448 before the
    cast; e4m3fn has no infinity, and a plain cast, torch's .to(float8_e4m3fn) included, makes them NaN). NaN stays
    NaN (0x7F, or 0xFF with the sign bit); -0.0 is 0x80. dtype: torch.uint8 (default) or torch.float8_e4m3fn."""
    x = _floating("float_to_e4m3", "x", x)
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    x = x.to(work)
    negative = x.view(torch.int64 if work == torch.float64 else torch.int32) < 0
    nan = torch.isnan(x)
    a = torch.where(nan, torch.zeros_like(x), x.abs().clamp(max=E4M3_MAX))
    # a = m * 2^e with m in [1, 2) and e in [-6, 8] (below 2^-6, e = -6 and m < 1: the subnormals); a * 2^(3 - e)
    # is exact, and rounding it to an integer rounds the mantissa to 3 bits. A carry out of the mantissa (m
    # rounding to 2) lands in the exponent field by the addition, which is the next binade's code.
    _, k = torch.frexp(a)
    e = torch.where(a < _MIN_NORMAL, torch.full_like(k, -6), k - 1)
    steps = torch.round(a * _pow2(3 - e, work))  # torch.round: half to even
    code = steps.long() + 8 * (e.long() + 6)
    code = torch.where(nan, torch.full_like(code, 0x7F), code) | (negative.long() << 7)
    return _out_codes("float_to_e4m3", code.to(torch.uint8), dtype)


def ue8m0_to_float(exponents):
    """float32 scales of UE8M0 exponents (uint8, bias 127: 2^(e - 127); 0xFF is NaN)."""
    if not isinstance(exponents, torch.Tensor) or exponents.dtype != torch.uint8:
        _fail("ue8m0_to_float", "exponents must be a torch.uint8 tensor (got %s)" % getattr(
            exponents, "dtype", type(exponents).__name__))
    e = exponents.int()
    return torch.where(e == 255, torch.full(e.shape, math.nan, device=e.device), _pow2(e - 127, torch.float32))


def float_to_ue8m0(scales):
    """UE8M0 exponents (uint8) of float32 scales that are powers of two in [2^-127, 2^127]; ArgumentError
    otherwise (rounding a scale here would change the quantised values it goes with)."""
    s = _floating("float_to_ue8m0", "scales", scales).float()
    mantissa, k = torch.frexp(s)
    if not bool(((mantissa == 0.5) & (k - 1 >= -127) & (k - 1 <= 127)).all()):
        _fail("float_to_ue8m0", "scales must be powers of two in [2^-127, 2^127] (UE8M0)")
    return (k - 1 + 127).to(torch.uint8)


def _scale_values(op, scales, name):
    """Scales as a float32 or float64 tensor: fp32 / fp64 kept, UE8M0 exponents (uint8) decoded."""
    if isinstance(scales, torch.Tensor) and scales.dtype == torch.uint8:
        return ue8m0_to_float(scales)
    if not isinstance(scales, torch.Tensor) or scales.dtype not in (torch.float32, torch.float64):
        _fail(op, "%s must be float32 scales or UE8M0 exponents (torch.uint8) (got %s)" % (
            name, scales.dtype if isinstance(scales, torch.Tensor) else type(scales).__name__))
    return scales


def _scales_of(op, amax, scale_format):
    """The dequantisation scale of each block / group from its amax (float32). fp32: amax / 448, so the largest
    magnitude quantises to 448; ue8m0: the smallest power of two s with amax / s <= 448, so that nothing saturates.
    amax == 0 (an all-zero block), or an amax so small that amax / 448 underflows to 0, gives scale 1."""
    if scale_format not in SCALE_FORMATS:
        _fail(op, "scale_format must be one of %s (got %r)" % (", ".join(SCALE_FORMATS), scale_format))
    if not bool(torch.isfinite(amax).all()):
        _fail(op, "the input must be finite (a block or group holds inf or NaN)")
    one = torch.ones_like(amax)
    s = amax / E4M3_MAX
    if scale_format == "fp32":
        return torch.where(s == 0, one, s)
    mantissa, k = torch.frexp(s)
    e = torch.where(mantissa == 0.5, k - 1, k)                        # ceil(log2(s)) of the rounded quotient
    e = torch.where(amax > E4M3_MAX * _pow2(e, torch.float32), e + 1, e)  # the quotient rounded down: one more
    return torch.where(amax == 0, one, _pow2(e.clamp(-127, 127), torch.float32))


def _expand(scales, rows, cols, block_rows, block_cols):
    """Each element's scale from a [..., R, C] grid of block scales, cut to [..., rows, cols]."""
    full = scales.repeat_interleave(block_rows, dim=-2).repeat_interleave(block_cols, dim=-1)
    return full[..., :rows, :cols]


# --- weights: 128 x 128 blocks ----------------------------------------------------------------------------------

def quantize_blocks(w, block=BLOCK, scale_format="fp32", dtype=torch.uint8):
    """(q, scale_inv) of weights w [N, K] or expert-stacked [E, N, K] (float32 / bfloat16 / float16 / float64),
    quantised in block x block tiles as the FP8 checkpoints are: q = e4m3(w / s) per tile, q [..., N, K] codes
    (uint8, or float8_e4m3fn with dtype=), scale_inv float32 [..., ceil(N / block), ceil(K / block)], the
    dequantised weight being q * scale_inv. N and K need not be multiples of block: the last row / column of tiles
    is partial and its scale covers only the elements it has. w is taken as float32 (w / s is rounded to float32,
    then to e4m3). scale_format "fp32": s = amax / 448 of the tile; "ue8m0": s = the smallest power of two with
    amax / s <= 448, so no value saturates (DeepSeek-V3.1's UE8M0 scales; float_to_ue8m0 gives the uint8 form).
    An all-zero tile gets scale 1."""
    op = "quantize_blocks"
    _floating(op, "w", w, (2, 3))
    block = _positive(op, "block", block)
    w = w.float()
    N, K = w.shape[-2:]
    nb, kb = -(-N // block), -(-K // block)
    padded = w.new_zeros(w.shape[:-2] + (nb * block, kb * block))
    padded[..., :N, :K] = w
    tiles = padded.view(w.shape[:-2] + (nb, block, kb, block))
    amax = tiles.abs().amax(dim=-1).amax(dim=-2)
    scale = _scales_of(op, amax, scale_format)
    q = float_to_e4m3(w / _expand(scale, N, K, block, block), dtype)
    return q, scale


def dequantize_blocks(q, scale_inv, block=BLOCK, dtype=torch.float32):
    """q * scale_inv per block x block tile: q [..., N, K] e4m3 codes, scale_inv [..., ceil(N / block),
    ceil(K / block)] float32 (or UE8M0 uint8 exponents). dtype float32 rounds each product (an e4m3 value times
    an fp32 scale has up to 28 significant bits); float64 is exact."""
    op = "dequantize_blocks"
    q = _codes(op, "q", q)
    s = _scale_values(op, scale_inv, "scale_inv")
    block = _positive(op, "block", block)
    if q.dim() not in (2, 3):
        _fail(op, "q must be [N, K] or [E, N, K] (got shape %s)" % list(q.shape))
    N, K = q.shape[-2:]
    want = list(q.shape[:-2]) + [-(-N // block), -(-K // block)]
    if list(s.shape) != want:
        _fail(op, "scale_inv must be [..., ceil(N / %d), ceil(K / %d)] = %s for q of shape %s (got %s)" % (
            block, block, want, list(q.shape), list(s.shape)))
    return e4m3_to_float(q).to(dtype) * _expand(s.to(dtype), N, K, block, block)


# --- activations: per token, 128 channels -----------------------------------------------------------------------

def _check_groups(op, H, group):
    if H % group:
        _fail(op, "H=%d must be a multiple of the group size %d (each token's scales cover whole groups of %d "
                  "channels)" % (H, group, group))


def quantize_tokens(x, group=BLOCK, scale_format="fp32", dtype=torch.uint8):
    """(q, scales) of activations x [T, H], quantised per token over groups of `group` channels: q [T, H] e4m3
    codes (uint8, or float8_e4m3fn with dtype=), scales float32 [T, H / group], x ~= q * scale of its group;
    the scale as quantize_blocks' (fp32: amax / 448; ue8m0: a power of two, nothing saturates; an all-zero group
    gets 1). H must be a multiple of group."""
    op = "quantize_tokens"
    _floating(op, "x", x)
    if x.dim() != 2:
        _fail(op, "x must be [T, H] (got shape %s)" % list(x.shape))
    group = _positive(op, "group", group)
    T, H = x.shape
    _check_groups(op, H, group)
    x = x.float()
    amax = x.view(T, H // group, group).abs().amax(dim=-1)
    scales = _scales_of(op, amax, scale_format)
    q = float_to_e4m3(x / scales.repeat_interleave(group, dim=-1), dtype)
    return q, scales


def dequantize_tokens(q, scales, group=BLOCK, dtype=torch.float32):
    """q * scale of each token's group: q [T, H] e4m3 codes, scales [T, H / group] float32 (or UE8M0 uint8)."""
    op = "dequantize_tokens"
    q = _codes(op, "q", q)
    s = _scale_values(op, scales, "scales")
    group = _positive(op, "group", group)
    if q.dim() != 2:
        _fail(op, "q must be [T, H] (got shape %s)" % list(q.shape))
    T, H = q.shape
    _check_groups(op, H, group)
    if list(s.shape) != [T, H // group]:
        _fail(op, "scales must be [T, H / %d] = %s (got %s)" % (group, [T, H // group], list(s.shape)))
    return e4m3_to_float(q).to(dtype) * s.to(dtype).repeat_interleave(group, dim=-1)


# --- the grouped GEMM's reference -------------------------------------------------------------------------------

def reference_grouped_mm_fp8(xq, xs, wq, ws, group_offsets):
    """The FP8 grouped GEMM NT in fp32: y [M, N] float32, y[rows of group g] = dequant(x) @ dequant(w[g]).T, with
    xq [M, K] e4m3 codes and xs [M, K / 128] their per-token scales (quantize_tokens), wq [G, N, K] codes and ws
    [G, ceil(N / 128), ceil(K / 128)] their block scales (quantize_blocks; scales float32 or UE8M0 uint8).
    group_offsets int32 / int64 [G]: each group's end row, as grouped_mm_nt's offs (clamped to [0, M] and made
    non-decreasing). Computed in float64 from the exactly dequantised operands and rounded once to float32, so
    it is the exact product to fp32 rounding, whatever order the kernels sum in; rows past the last end are 0
    here (the kernels do not write them: compare rows below it)."""
    op = "reference_grouped_mm_fp8"
    xq, wq = _codes(op, "xq", xq), _codes(op, "wq", wq)
    if xq.dim() != 2 or wq.dim() != 3:
        _fail(op, "xq must be [M, K] and wq [G, N, K] (got %s and %s)" % (list(xq.shape), list(wq.shape)))
    M, K = xq.shape
    G, N = wq.shape[:2]
    if wq.shape[2] != K:
        _fail(op, "wq's K (%d) must be xq's K (%d)" % (wq.shape[2], K))
    if not isinstance(group_offsets, torch.Tensor) or group_offsets.dtype not in (torch.int32, torch.int64) \
            or group_offsets.dim() != 1 or group_offsets.shape[0] != G:
        _fail(op, "group_offsets must be an int32 or int64 tensor [G] = [%d], each group's end row (got %s)" % (
            G, list(group_offsets.shape) if isinstance(group_offsets, torch.Tensor) else type(group_offsets)))
    x = dequantize_tokens(xq, xs, dtype=torch.float64)
    w = dequantize_blocks(wq, ws, dtype=torch.float64)
    starts = group_starts(group_offsets.to(xq.device).long(), M).tolist()
    y = torch.zeros(M, N, dtype=torch.float64, device=xq.device)
    for g in range(G):
        lo, hi = starts[g], starts[g + 1]
        if hi > lo:
            y[lo:hi] = x[lo:hi] @ w[g].T
    return y.float()


# --- the MoE layer's experts and its reference -------------------------------------------------------------------

def _check_layer_dims(op, H, I):
    """H and I of an FP8 layer: multiples of 128, each named with its rule."""
    if H % BLOCK:
        _fail(op, "H=%d must be a multiple of %d (x is quantised per token in groups of %d channels, w1 and w2 in "
                  "%d x %d blocks)" % (H, BLOCK, BLOCK, BLOCK, BLOCK))
    if I % BLOCK:
        _fail(op, "I=%d must be a multiple of %d (h is quantised per token in groups of %d channels, and no block of "
                  "w1 may span gate and up rows)" % (I, BLOCK, BLOCK))


def _expert_dims(op, w1, w2):
    """I of w1 [E, 2I, H] (gate rows, then up rows) and w2 [E, H, I]; H and I multiples of 128."""
    E, I2, H = w1.shape
    if I2 % 2:
        _fail(op, "w1 must be [E, 2I, H], gate rows then up rows: an even number of rows (got shape %s)" % (
            list(w1.shape),))
    I = I2 // 2
    if list(w2.shape) != [E, H, I]:
        _fail(op, "w2 must be [E, H, I] = %s for w1 [E, 2I, H] = %s (got %s)" % (
            [E, H, I], list(w1.shape), list(w2.shape)))
    _check_layer_dims(op, H, I)
    return I


def quantize_experts(w1, w2, scale_format="fp32", dtype=torch.uint8):
    """One layer's experts in FP8, in load_deepseek_experts' layout: w1 [E, 2I, H] (gate rows, then up rows: the
    order of fused_moe, convert_experts and reference_moe) and w2 [E, H, I], float32 / bfloat16 / float16 /
    float64, quantised by quantize_blocks in 128 x 128 blocks -> dict(w1 codes [E, 2I, H], w1_scale float32
    [E, 2I / 128, H / 128], w2 codes [E, H, I], w2_scale float32 [E, H / 128, I / 128]). H and I must be
    multiples of 128 (the FP8 layer's rules: x and h are quantised per token in groups of 128 channels); as I is,
    no block spans gate and up rows, so w1's codes and scales are gate's and up's, each quantised on its own,
    stacked. scale_format "fp32" (amax / 448) or "ue8m0" (powers of two, returned as float32, as
    load_deepseek_experts decodes them); dtype torch.uint8 (default) or torch.float8_e4m3fn for the codes."""
    op = "quantize_experts"
    _floating(op, "w1", w1, (3,))
    _floating(op, "w2", w2, (3,))
    _expert_dims(op, w1, w2)
    q1, s1 = quantize_blocks(w1, scale_format=scale_format, dtype=dtype)
    q2, s2 = quantize_blocks(w2, scale_format=scale_format, dtype=dtype)
    return dict(w1=q1, w1_scale=s1, w2=q2, w2_scale=s2)


def _check_scales(op, name, scales, want):
    s = _scale_values(op, scales, name)
    if list(s.shape) != want:
        _fail(op, "%s must be %s (got %s)" % (name, want, list(s.shape)))
    return scales


SWIGLU_ROUNDINGS = ("bf16", "fp32")


def reference_moe_fp8(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, x_scales=None, swiglu="bf16"):
    """The FP8 MoE layer on one rank holding every expert, as the FP8 kernels are to compute it: y [T, H] bfloat16.
      x: [T, H] float32 / bfloat16 / float16 / float64, quantised here per token by quantize_tokens (fp32 scales);
         or e4m3 codes (uint8 / float8_e4m3fn) with x_scales [T, H / 128] (float32, or UE8M0 uint8), required
         then and refused otherwise.
      topk_idx [T, k] int32 / int64, topk_weights [T, k] float (taken as float32); a pick outside [0, E) (-1) is
         skipped.
      w1 [E, 2I, H] / w1_scale [E, 2I / 128, H / 128], w2 [E, H, I] / w2_scale [E, H / 128, I / 128]: e4m3 codes
         and block scales (float32 or UE8M0 uint8), as quantize_experts and load_deepseek_experts give them.
    H and I must be multiples of 128. Per valid pick (token t, expert e), with dq the exact dequantisation:
      l1  = bf16(fp32(dq(xq[t]) @ dq(w1[e])^T))   float64 product of the exact operands, rounded once to float32
                                                  (reference_grouped_mm_fp8), then to bf16: the L1 output;
      h   = silu(l1[:I]) * l1[I:]                 swiglu="bf16" (the default): reference_moe's formula in bf16
                                                  ops, silu rounded to bf16, the product rounded to bf16;
                                                  swiglu="fp32": the FP8 layer kernel's epilogue, silu and the
                                                  product in float32 from l1, rounded once to bf16;
      hq, hs = quantize_tokens(h)                 per token, 128 channels, fp32 scales (amax / 448);
      out = bf16(fp32(dq(hq) @ dq(w2[e])^T))      as l1: the L2 row, bf16 as reference_moe's (the combine's rows);
    y[t] = bf16(sum over the token's valid picks j, in pick order, from +0, of fp32(out_j) * w[t, j]), each
    product and each sum rounded to float32 (the combine's fp32 pick-order sum). reference_moe sums in expert
    order instead (the same float32 sum where a token has at most two valid picks). Not differentiable."""
    op = "reference_moe_fp8"
    if swiglu not in SWIGLU_ROUNDINGS:
        _fail(op, "swiglu must be one of %s (got %r)" % (", ".join(SWIGLU_ROUNDINGS), swiglu))
    # x, as codes and scales
    if not isinstance(x, torch.Tensor):
        _fail(op, "x must be a tensor [T, H] (got %s)" % type(x).__name__)
    if x.dim() != 2:
        _fail(op, "x must be [T, H] (got shape %s)" % list(x.shape))
    T, H = x.shape
    codes_in = x.dtype in _CODE_DTYPES
    if codes_in and x_scales is None:
        _fail(op, "x is e4m3 codes (%s), so x_scales, its per-token scales [T, H / 128], is required" % x.dtype)
    if not codes_in:
        if x.dtype not in _FLOATS:
            _fail(op, "x must be float32 / bfloat16 / float16 / float64 activations or e4m3 codes (torch.uint8%s) "
                      "(got %s)" % (" or torch.float8_e4m3fn" if FLOAT8 is not None else "", x.dtype))
        if x_scales is not None:
            _fail(op, "x_scales goes only with e4m3 codes x; x is %s and is quantised here (pass its codes from "
                      "quantize_tokens with their scales, or x alone)" % x.dtype)
    # the experts
    w1, w2 = _codes(op, "w1", w1), _codes(op, "w2", w2)
    if w1.dim() != 3 or w2.dim() != 3:
        _fail(op, "w1 must be [E, 2I, H] and w2 [E, H, I] (got shapes %s and %s)" % (list(w1.shape), list(w2.shape)))
    E, I2, Hw = w1.shape
    if Hw != H:
        _fail(op, "w1's H (%d, its last dimension) must be x's H (%d)" % (Hw, H))
    I = _expert_dims(op, w1, w2)
    _check_scales(op, "w1_scale", w1_scale, [E, I2 // BLOCK, H // BLOCK])
    _check_scales(op, "w2_scale", w2_scale, [E, H // BLOCK, I // BLOCK])
    # the routing
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype not in (torch.int32, torch.int64) \
            or topk_idx.dim() != 2 or topk_idx.shape[0] != T:
        _fail(op, "topk_idx must be an int32 or int64 tensor [T, k] with T = %d, x's tokens (got %s)" % (
            T, "%s %s" % (topk_idx.dtype, list(topk_idx.shape)) if isinstance(topk_idx, torch.Tensor)
            else type(topk_idx).__name__))
    k = topk_idx.shape[1]
    _floating(op, "topk_weights", topk_weights)
    if list(topk_weights.shape) != [T, k]:
        _fail(op, "topk_weights must be [T, k] = %s, topk_idx's shape (got %s)" % ([T, k], list(topk_weights.shape)))

    if codes_in:
        xq = _codes(op, "x", x)
        xs = _check_scales(op, "x_scales", x_scales, [T, H // BLOCK])
    else:
        xq, xs = quantize_tokens(x)
    # The picks grouped by expert (pick order within an expert), as the kernels' pools hold them.
    flat = topk_idx.reshape(-1).long()
    valid = (flat >= 0) & (flat < E)
    picks = valid.nonzero().squeeze(1)
    order = picks[torch.argsort(flat[picks] * max(T * k, 1) + picks)]
    ends = torch.bincount(flat[order], minlength=E).cumsum(0)
    tokens = order // max(k, 1)
    l1 = reference_grouped_mm_fp8(xq[tokens], xs[tokens], w1, w1_scale, ends).to(torch.bfloat16)
    if swiglu == "fp32":
        gate, up = l1[:, :I].float(), l1[:, I:].float()
        h = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    else:
        h = torch.nn.functional.silu(l1[:, :I]) * l1[:, I:]
    hq, hs = quantize_tokens(h)
    out = reference_grouped_mm_fp8(hq, hs, w2, w2_scale, ends).to(torch.bfloat16)
    rows = torch.zeros(T * k, H, dtype=torch.float32, device=x.device)
    rows[order] = out.float() * topk_weights.reshape(-1)[order, None].float()
    rows, valid = rows.view(T, k, H), valid.view(T, k)
    y = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    for j in range(k):
        y = torch.where(valid[:, j, None], y + rows[:, j], y)
    return y.to(torch.bfloat16)


# --- safetensors ------------------------------------------------------------------------------------------------

_ST_DTYPES = {"F8_E4M3": torch.uint8, "U8": torch.uint8, "F32": torch.float32, "BF16": torch.bfloat16,
              "F16": torch.float16}
_ST_NAMES = {torch.uint8: "U8", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
if FLOAT8 is not None:
    _ST_NAMES[FLOAT8] = "F8_E4M3"
_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header


class SafetensorsFile:
    """One .safetensors file, read lazily: an 8-byte little-endian header length n, n bytes of JSON (name ->
    {dtype, shape, data_offsets [begin, end)} relative to the data after the header; "__metadata__" aside), then
    the tensors' bytes. read(name) reads only that tensor. F8_E4M3 tensors come back as uint8 codes."""

    def __init__(self, path):
        self.path = path
        self._file = open(path, "rb")
        try:
            self._size = os.fstat(self._file.fileno()).st_size
            head = self._file.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or n > _MAX_HEADER or 8 + n > self._size:
                raise CheckpointError("%s is not a safetensors file (header length %d, file size %d)" % (
                    path, n, self._size))
            try:
                header = json.loads(self._file.read(n).decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise CheckpointError("%s: the safetensors header is not JSON (%s)" % (path, e)) from None
            if not isinstance(header, dict):
                raise CheckpointError("%s: the safetensors header is not a JSON object" % path)
        except BaseException:
            self._file.close()
            raise
        self.metadata = header.pop("__metadata__", None)
        self.entries = header
        self._data = 8 + n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._file.close()

    def __contains__(self, name):
        return name in self.entries

    def keys(self):
        return list(self.entries)

    def dtype(self, name):
        return self._entry(name)["dtype"]

    def _entry(self, name):
        if name not in self.entries:
            raise CheckpointError("tensor %s is not in %s" % (name, self.path))
        return self.entries[name]

    def read(self, name):
        entry = self._entry(name)
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in _ST_DTYPES:
            raise CheckpointError("tensor %s in %s has dtype %s; this reader knows %s" % (
                name, self.path, dtype, ", ".join(sorted(_ST_DTYPES))))
        torch_dtype = _ST_DTYPES[dtype]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
                and isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise CheckpointError("tensor %s in %s has a malformed entry %s" % (name, self.path, entry))
        begin, end = offsets
        nbytes = math.prod(shape) * torch.tensor([], dtype=torch_dtype).element_size()
        if not 0 <= begin <= end or end - begin != nbytes or self._data + end > self._size:
            raise CheckpointError("tensor %s in %s: data_offsets %s do not hold %s %s (%d bytes) inside the file" % (
                name, self.path, offsets, dtype, shape, nbytes))
        if nbytes == 0:
            return torch.empty(shape, dtype=torch_dtype)
        self._file.seek(self._data + begin)
        data = bytearray(self._file.read(nbytes))
        return torch.frombuffer(data, dtype=torch_dtype).view(shape)


def write_safetensors(path, tensors, dtypes=None, metadata=None):
    """Writes tensors (name -> tensor: uint8, float32, bfloat16, float16, float8_e4m3fn) as a .safetensors file.
    dtypes (name -> "F8_E4M3") marks uint8 tensors that hold e4m3 codes; metadata: str -> str for
    "__metadata__"."""
    dtypes = dtypes or {}
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dtype not in _ST_NAMES:
            raise ArgumentError("megamoe.fp8.write_safetensors: tensor %s must be one of %s (got %s)" % (
                name, ", ".join(str(d) for d in _ST_NAMES), getattr(t, "dtype", type(t).__name__)))
        kind = dtypes.get(name, _ST_NAMES[t.dtype])
        if kind == "F8_E4M3" and t.dtype not in _CODE_DTYPES or kind not in _ST_DTYPES:
            raise ArgumentError("megamoe.fp8.write_safetensors: tensor %s cannot be written as %s from %s" % (
                name, kind, t.dtype))
        blob = t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": kind, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the reference writer keeps it
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


# --- DeepSeek-style FP8 checkpoints -----------------------------------------------------------------------------

INDEX = "model.safetensors.index.json"
EXPERT_TENSOR = "model.layers.{layer}.mlp.experts.{expert}.{proj}.{what}"


class _Locator:
    """Where each tensor of a checkpoint lives: a file, a directory with an index json (its weight_map), or a
    directory without one (every .safetensors file's header). Opens each file once."""

    def __init__(self, path):
        self.index, self.files = None, {}
        if os.path.isdir(path):
            index = os.path.join(path, INDEX)
            if os.path.exists(index):
                with open(index) as f:
                    try:
                        weight_map = json.load(f)["weight_map"]
                    except (ValueError, KeyError, TypeError) as e:
                        raise CheckpointError("%s has no readable weight_map (%s)" % (index, e)) from None
                self.index = index
                self.map = {name: os.path.join(path, file) for name, file in weight_map.items()}
            else:
                shards = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".safetensors"))
                if not shards:
                    raise FileNotFoundError("%s has neither %s nor .safetensors files" % (path, INDEX))
                self.map = {}
                for shard in shards:
                    for name in self._open(shard).keys():
                        self.map.setdefault(name, shard)
        elif os.path.isfile(path):
            self.map = {name: path for name in self._open(path).keys()}
        else:
            raise FileNotFoundError("no checkpoint at %s (a .safetensors file or a directory)" % path)

    def _open(self, file):
        if file not in self.files:
            self.files[file] = SafetensorsFile(file)
        return self.files[file]

    def file_of(self, name):
        if name not in self.map:
            where = self.index + "'s weight_map" if self.index else "the checkpoint's files (%s)" % ", ".join(
                sorted(set(self.map.values())))
            raise CheckpointError("tensor %s is not in %s" % (name, where))
        file = self.map[name]
        if not os.path.isfile(file):
            raise FileNotFoundError("%s, which %s names for tensor %s, does not exist" % (file, self.index, name))
        return self._open(file)

    def close(self):
        for f in self.files.values():
            f.close()


def _read_weight(loc, name, shape):
    f = loc.file_of(name)
    if f.dtype(name) != "F8_E4M3":
        raise CheckpointError("tensor %s in %s is %s, not F8_E4M3" % (name, f.path, f.dtype(name)))
    t = f.read(name)
    if list(t.shape) != shape:
        raise CheckpointError("tensor %s in %s has shape %s, expected %s" % (name, f.path, list(t.shape), shape))
    return t


def _read_scale(loc, name, shape):
    f = loc.file_of(name)
    kind = f.dtype(name)
    if kind not in ("F32", "U8"):
        raise CheckpointError("tensor %s in %s is %s; block scales are F32 or U8 (UE8M0)" % (name, f.path, kind))
    t = f.read(name)
    if list(t.shape) != shape:
        raise CheckpointError("tensor %s in %s has shape %s, expected %s (ceil(rows / 128), ceil(cols / 128))" % (
            name, f.path, list(t.shape), shape))
    return ue8m0_to_float(t) if kind == "U8" else t


def load_deepseek_experts(path_or_dir, layer, experts, rank=0, ranks=1):
    """One MoE layer's routed experts of a DeepSeek-V3 / R1 / V3.1 or Kimi-K2 style FP8 checkpoint, this rank's
    share [rank * E / R, (rank + 1) * E / R) of `experts` = E, in megamoe's layouts:
      w1 uint8 [E/R, 2I, H] e4m3 codes, the layer's [gate; up] order (gate_proj's I rows, then up_proj's: w1 of
         fused_moe and convert_experts), w1_scale float32 [E/R, 2I / 128, H / 128] (gate's scale rows, then up's);
      w2 uint8 [E/R, H, I] (down_proj), w2_scale float32 [E/R, H / 128, I / 128] (ceil where H is partial).
    Tensors model.layers.{layer}.mlp.experts.{e}.{gate,up,down}_proj.weight (F8_E4M3, [I, H], [I, H], [H, I]) and
    .weight_scale_inv (F32, or U8 UE8M0 exponents, returned decoded to float32), from a .safetensors file or a
    directory (its model.safetensors.index.json's weight_map, else every .safetensors file there). I must be a
    multiple of 128, so no scale block of w1 spans gate and up rows. Errors name the tensor and the file."""
    op = "load_deepseek_experts"
    for name, value, lo in (("layer", layer, 0), ("experts", experts, 1), ("ranks", ranks, 1), ("rank", rank, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < lo:
            _fail(op, "%s must be an integer >= %d (got %r)" % (name, lo, value))
    if rank >= ranks:
        _fail(op, "rank %d must be below ranks %d" % (rank, ranks))
    if experts % ranks:
        _fail(op, "%d experts do not split over %d ranks" % (experts, ranks))
    local = experts // ranks
    first = rank * local

    def name(e, proj, what):
        return EXPERT_TENSOR.format(layer=layer, expert=e, proj=proj, what=what)

    loc = _Locator(path_or_dir)
    try:
        gate0 = name(first, "gate_proj", "weight")
        f = loc.file_of(gate0)
        shape = f.entries[gate0].get("shape")
        if not (isinstance(shape, list) and len(shape) == 2):
            raise CheckpointError("tensor %s in %s has shape %s, expected [I, H]" % (gate0, f.path, shape))
        I, H = shape
        if I % BLOCK:
            raise CheckpointError("tensor %s in %s: I=%d must be a multiple of %d (w1's scale blocks must not span "
                                  "gate and up rows)" % (gate0, f.path, I, BLOCK))
        ib, hb = I // BLOCK, -(-H // BLOCK)
        out = dict(w1=torch.empty(local, 2 * I, H, dtype=torch.uint8),
                   w1_scale=torch.empty(local, 2 * ib, hb, dtype=torch.float32),
                   w2=torch.empty(local, H, I, dtype=torch.uint8),
                   w2_scale=torch.empty(local, hb, ib, dtype=torch.float32))
        for j in range(local):
            e = first + j
            for half, proj in enumerate(("gate_proj", "up_proj")):
                out["w1"][j, half * I:(half + 1) * I] = _read_weight(loc, name(e, proj, "weight"), [I, H])
                out["w1_scale"][j, half * ib:(half + 1) * ib] = _read_scale(
                    loc, name(e, proj, "weight_scale_inv"), [ib, hb])
            out["w2"][j] = _read_weight(loc, name(e, "down_proj", "weight"), [H, I])
            out["w2_scale"][j] = _read_scale(loc, name(e, "down_proj", "weight_scale_inv"), [hb, ib])
        return out
    finally:
        loc.close()
