"""MoeExperts: one MoE layer's expert weights on this rank in megamoe's layouts, bf16 parameters applied through
fused_moe or FP8 buffers through fused_moe_fp8; and converters from the common checkpoint layouts."""
import math

import torch

from .fp8 import FLOAT8, load_deepseek_experts, quantize_experts, ue8m0_to_float
from .ops import ArgumentError, fused_moe, fused_moe_fp8
from .workspace import dtype_name

FP8_BLOCK = 128  # the block scales' rows x columns


def _count(t, what):
    """The experts a checkpoint tensor or list of per-expert tensors holds."""
    if isinstance(t, (list, tuple)):
        if not t:
            raise ValueError("convert_experts: %s is an empty list" % what)
        return len(t)
    if not isinstance(t, torch.Tensor):
        raise ValueError("convert_experts: %s must be a tensor or a list of per-expert tensors (got %s)" % (
            what, type(t).__name__))
    return t.shape[0]


def _take(t, lo, hi):
    """Experts [lo, hi) of a tensor (a view) or of a list (only those stacked: a rank never copies every expert)."""
    return torch.stack(list(t[lo:hi])) if isinstance(t, (list, tuple)) else t[lo:hi]


def convert_experts(down, gate=None, up=None, gate_up=None, interleaved=False, transposed=False, rank=0, ranks=1):
    """(w1, w2) in megamoe's layouts, w1 [E/R, 2I, H] (gate rows, then up rows), w2 [E/R, H, I], contiguous, for
    rank `rank` of `ranks` (its experts [rank E/R, (rank+1) E/R)), from a checkpoint's expert weights, each a
    stacked tensor [E, ...] or a list of E per-expert tensors:
      - separate gate and up (Mixtral w1 / w3, Qwen3 and DeepSeek gate_proj / up_proj): gate, up [E, I, H] and
        down [E, H, I] (nn.Linear's [out, in]);
      - fused gate_up [E, 2I, H]: gate rows then up rows, or with interleaved=True rows alternating gate, up
        (gate = rows 0, 2, 4, ...);
      - transposed=True: every tensor stored [in, out] instead (gate / up [E, H, I], gate_up [E, H, 2I], down
        [E, I, H]), as in checkpoints that keep x @ W (e.g. gate_up_proj [E, H, 2I]).
    The dtype is kept; MoeExperts casts to bf16 (or quantises to FP8). e4m3 codes (uint8) convert too, and so do
    their 128 x 128 block scales [E, ceil(rows / 128), ceil(cols / 128)] in the same layout (not interleaved)."""
    if gate_up is not None and (gate is not None or up is not None):
        raise ValueError("convert_experts: give either gate_up or gate and up, not both")
    if gate_up is None and (gate is None or up is None):
        raise ValueError("convert_experts: give gate and up (or gate_up)")
    given = {"down": down, "gate_up": gate_up} if gate_up is not None else {"down": down, "gate": gate, "up": up}
    counts = {name: _count(t, name) for name, t in given.items()}
    E = counts["down"]
    for name, n in counts.items():
        if n != E:
            raise ValueError("convert_experts: %s has %d experts, down %d" % (name, n, E))
    if E % ranks:
        raise ValueError("convert_experts: %d experts do not split over %d ranks" % (E, ranks))
    lo, hi = rank * E // ranks, (rank + 1) * E // ranks
    down = _take(down, lo, hi)
    if gate_up is not None:
        gu = _take(gate_up, lo, hi)
        if transposed:
            gu = gu.transpose(-2, -1)
        if gu.shape[1] % 2:
            raise ValueError("convert_experts: gate_up must have 2 * intermediate rows (got %s)" % list(gu.shape))
        if interleaved:
            gate, up = gu[:, 0::2], gu[:, 1::2]
        else:
            I = gu.shape[1] // 2
            gate, up = gu[:, :I], gu[:, I:]
    else:
        gate, up = _take(gate, lo, hi), _take(up, lo, hi)
        if transposed:
            gate, up = gate.transpose(-2, -1), up.transpose(-2, -1)
    if transposed:
        down = down.transpose(-2, -1)
    _, I, H = gate.shape
    if tuple(up.shape[1:]) != (I, H):
        raise ValueError("convert_experts: up must have gate's shape %s (got %s)" % (
            [E, I, H], [E] + list(up.shape[1:])))
    if tuple(down.shape[1:]) != (H, I):
        raise ValueError("convert_experts: down must be [experts=%d, hidden=%d, intermediate=%d]%s (got %s)" % (
            E, H, I, " after transposing" if transposed else "", [E] + list(down.shape[1:])))
    w1 = torch.cat([gate, up], dim=1).contiguous()
    return w1, down.contiguous()


def to_gate_up_down(w1, w2):
    """The inverse: (gate [E, I, H], up [E, I, H], down [E, H, I]) of this rank's experts."""
    I = w1.shape[1] // 2
    return w1[:, :I], w1[:, I:], w2


def _as_codes(t, what):
    """e4m3 codes as uint8 (a float8_e4m3fn tensor viewed), for a tensor or a list of per-expert tensors."""
    if isinstance(t, (list, tuple)):
        return [_as_codes(part, what) for part in t]
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.uint8,) + ((FLOAT8,) if FLOAT8 is not None else ()):
        raise ValueError("MoeExperts.from_checkpoint: %s must be e4m3 codes (torch.uint8%s) with scale_inv (got %s)"
                         % (what, " or torch.float8_e4m3fn" if FLOAT8 is not None else "",
                            getattr(t, "dtype", type(t).__name__)))
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


class MoeExperts(torch.nn.Module):
    """One MoE layer's routed experts on this rank, applied to forward(x, topk_idx, topk_weights) on `workspace`
    (whose ranks are the expert-parallel ranks), in the workspace's dtype:
      bf16: w1 [E/R, 2I, H] and w2 [E/R, H, I] bf16 parameters, through fused_moe;
      FP8 (a workspace made with dtype="fp8"): buffers, not parameters (the FP8 layer is inference only): w1, w2
        e4m3 codes (uint8) in the same layouts with w1_scale [E/R, 2I / 128, H / 128] and w2_scale [E/R, H / 128,
        I / 128] float32 block scales, through fused_moe_fp8 (forward takes x bf16, or its codes with x_scales).
    dtype: None (the workspace's) or the workspace's named ("bf16", "fp8", "fp8_e4m3"); the runtime refuses another.
    Routing (the gate, top-k) is the caller's."""

    def __init__(self, hidden, intermediate, experts, topk, workspace, device=None, init=True, dtype=None):
        super().__init__()
        if experts % workspace.ranks:
            raise ValueError("MoeExperts: experts=%d must be a multiple of the workspace's ranks=%d" % (
                experts, workspace.ranks))
        self.hidden, self.intermediate, self.experts, self.topk = hidden, intermediate, experts, topk
        self.workspace = workspace
        self.dtype = dtype_name(dtype, "MoeExperts") if dtype is not None else workspace.dtype
        self.local_experts = experts // workspace.ranks
        device = device if device is not None else workspace.device
        w1_shape, w2_shape = (self.local_experts, 2 * intermediate, hidden), (self.local_experts, hidden, intermediate)
        if self.dtype == "bf16":
            self.w1 = torch.nn.Parameter(torch.empty(w1_shape, dtype=torch.bfloat16, device=device))
            self.w2 = torch.nn.Parameter(torch.empty(w2_shape, dtype=torch.bfloat16, device=device))
        else:
            for name, shape in (("w1", w1_shape), ("w2", w2_shape)):
                blocks = (shape[0], -(-shape[1] // FP8_BLOCK), -(-shape[2] // FP8_BLOCK))
                self.register_buffer(name, torch.empty(shape, dtype=torch.uint8, device=device))
                self.register_buffer(name + "_scale", torch.empty(blocks, dtype=torch.float32, device=device))
        if init:
            self.reset_parameters()
        # The layers this module calls, made now (a compiled graph only looks them up).
        for training in ((False, True) if workspace.training else (False,)):
            for bits in (32, 64):
                workspace.layer(hidden, intermediate, experts, topk, training, bits, self.dtype)

    def reset_parameters(self):
        """nn.Linear's default: uniform in +-1/sqrt(fan_in); in FP8 those weights quantised (quantize_experts)."""
        bounds = 1 / math.sqrt(self.hidden), 1 / math.sqrt(self.intermediate)
        with torch.no_grad():
            if self.dtype == "bf16":
                self.w1.uniform_(-bounds[0], bounds[0])
                self.w2.uniform_(-bounds[1], bounds[1])
                return
            for e in range(self.local_experts):  # an expert at a time: no float32 copy of them all
                w1, w2 = (torch.empty((1,) + w.shape[1:], dtype=torch.float32, device=w.device).uniform_(-b, b)
                          for w, b in ((self.w1, bounds[0]), (self.w2, bounds[1])))
                self._quantize_expert(e, w1, w2, "fp32")

    def quantize_from(self, w1, w2, scale_format="fp32"):
        """FP8: this rank's experts w1 [E/R, 2I, H], w2 [E/R, H, I] (floating, any device) quantised into the
        buffers by megamoe.fp8.quantize_experts in 128 x 128 blocks (scale_format "fp32": amax / 448, or "ue8m0":
        powers of two), an expert at a time on the buffers' device."""
        if self.dtype == "bf16":
            raise ValueError("MoeExperts.quantize_from: this module is bf16 (its workspace's dtype); FP8 weights need "
                             "a workspace made with dtype='fp8'")
        self._check_shapes("quantize_from", w1=w1, w2=w2)
        for e in range(self.local_experts):
            self._quantize_expert(e, w1[e:e + 1], w2[e:e + 1], scale_format)

    def _quantize_expert(self, e, w1, w2, scale_format):
        with torch.no_grad():
            q = quantize_experts(w1.to(self.w1.device), w2.to(self.w2.device), scale_format=scale_format)
            for name, t in q.items():
                getattr(self, name)[e].copy_(t[0])

    def load_fp8(self, w1, w1_scale, w2, w2_scale):
        """FP8: this rank's experts as e4m3 codes (uint8 or float8_e4m3fn) and block scales (float32, or UE8M0 uint8
        exponents, decoded), in the buffers' shapes: what megamoe.fp8.load_deepseek_experts gives."""
        if self.dtype == "bf16":
            raise ValueError("MoeExperts.load_fp8: this module is bf16 (its workspace's dtype); FP8 weights need a "
                             "workspace made with dtype='fp8'")
        given = dict(w1=w1, w1_scale=w1_scale, w2=w2, w2_scale=w2_scale)
        self._check_shapes("load_fp8", **given)
        with torch.no_grad():
            for name, t in given.items():
                if name.endswith("_scale"):
                    t = ue8m0_to_float(t) if t.dtype == torch.uint8 else t
                else:
                    t = _as_codes(t, name)
                getattr(self, name).copy_(t)

    def _check_shapes(self, what, **tensors):
        for name, t in tensors.items():
            mine = getattr(self, name)
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(mine.shape):
                raise ValueError("MoeExperts.%s: %s must be %s, this rank's experts' (got %s)" % (
                    what, name, list(mine.shape), list(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__))

    @classmethod
    def from_checkpoint(cls, workspace, topk, down, scale_inv=None, scale_format="fp32", **layout):
        """An MoeExperts holding this rank's share of a checkpoint's experts (convert_experts' arguments: down, gate
        and up or gate_up, interleaved, transposed), in the workspace's dtype. bf16: cast. FP8: floating weights are
        quantised (quantize_from; scale_format "fp32" or "ue8m0"), or, given scale_inv, the weights are e4m3 codes
        (uint8 or float8_e4m3fn, as a DeepSeek-V3 / Kimi-K2 FP8 checkpoint's gate_proj / up_proj / down_proj
        weight) and scale_inv their block scales (weight_scale_inv, float32 or UE8M0 uint8) in the same layout: a
        dict with the weights' names, "down" with "gate" and "up" (or "gate_up"), each a stacked tensor or a list
        of per-expert tensors. Only this rank's experts are stacked. from_fp8_checkpoint reads such a checkpoint's
        files."""
        rank, ranks = workspace.rank, workspace.ranks
        if scale_inv is None:
            w1, w2 = convert_experts(down, rank=rank, ranks=ranks, **layout)
            m = cls(w1.shape[2], w2.shape[2], w1.shape[0] * ranks, topk, workspace, init=False)
            if m.dtype == "bf16":
                with torch.no_grad():
                    m.w1.copy_(w1)
                    m.w2.copy_(w2)
            else:
                m.quantize_from(w1, w2, scale_format)
            return m
        if workspace.dtype == "bf16":
            raise ValueError("MoeExperts.from_checkpoint: scale_inv (FP8 weights) needs a workspace made with "
                             "dtype='fp8' (this one is bf16)")
        if layout.get("interleaved"):
            raise ValueError("MoeExperts.from_checkpoint: interleaved gate and up rows would split FP8 weights' 128 x "
                             "128 scale blocks between gate and up; give gate and up, or gate_up as gate rows then up")
        names = ["down"] + [n for n in ("gate", "up", "gate_up") if layout.get(n) is not None]
        if not isinstance(scale_inv, dict) or sorted(scale_inv) != sorted(names):
            raise ValueError("MoeExperts.from_checkpoint: scale_inv must be a dict of the weights' block scales, keys "
                             "%s (got %s)" % (sorted(names), sorted(scale_inv) if isinstance(scale_inv, dict)
                                              else type(scale_inv).__name__))
        weights = {n: _as_codes(down if n == "down" else layout[n], n) for n in names}
        options = dict({k: v for k, v in layout.items() if k not in names}, rank=rank, ranks=ranks)
        w1, w2 = convert_experts(weights.pop("down"), **weights, **options)
        scales = dict(scale_inv)
        w1_scale, w2_scale = convert_experts(scales.pop("down"), **scales, **options)
        m = cls(w1.shape[2], w2.shape[2], w1.shape[0] * ranks, topk, workspace, init=False)
        m.load_fp8(w1, w1_scale, w2, w2_scale)
        return m

    @classmethod
    def from_fp8_checkpoint(cls, workspace, topk, path, layer, experts):
        """An MoeExperts on an FP8 workspace holding this rank's share of layer `layer`'s `experts` routed experts
        of a DeepSeek-V3 / R1 / V3.1 or Kimi-K2 FP8 safetensors checkpoint (a file, or a directory with or without
        its index): megamoe.fp8.load_deepseek_experts, which reads only this rank's tensors."""
        if workspace.dtype == "bf16":
            raise ValueError("MoeExperts.from_fp8_checkpoint: an FP8 checkpoint needs a workspace made with "
                             "dtype='fp8' (this one is bf16)")
        q = load_deepseek_experts(path, layer, experts, rank=workspace.rank, ranks=workspace.ranks)
        m = cls(q["w1"].shape[2], q["w2"].shape[2], experts, topk, workspace, init=False)
        m.load_fp8(**q)
        return m

    def forward(self, x, topk_idx, topk_weights, x_scales=None):
        if self.dtype != "bf16":
            return fused_moe_fp8(x, topk_idx, topk_weights, self.w1, self.w1_scale, self.w2, self.w2_scale,
                                 self.workspace, x_scales)
        if x_scales is not None:
            raise ArgumentError("MoeExperts.forward: x_scales goes with FP8 modules; this one is bf16")
        return fused_moe(x, topk_idx, topk_weights, self.w1, self.w2, self.workspace)

    def extra_repr(self):
        return "hidden=%d, intermediate=%d, experts=%d (%d on this rank), topk=%d%s" % (
            self.hidden, self.intermediate, self.experts, self.local_experts, self.topk,
            ", dtype=%s" % self.dtype if self.dtype != "bf16" else "")


def reference_moe(x, topk_idx, topk_weights, w1, w2):
    """The layer in plain PyTorch on one rank holding every expert (w1 [E, 2I, H], w2 [E, H, I]), in x's dtype
    with fp32 routing weights: what fused_moe computes, for tests and examples. Differentiable."""
    I = w2.shape[2]
    acc = torch.promote_types(x.dtype, torch.float32)  # fp32 sums for bf16 (as the kernels), fp64 for fp64
    y = torch.zeros(x.shape, dtype=acc, device=x.device)
    flat = topk_idx.reshape(-1).long()
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(topk_idx.shape[1])
    for e in range(w1.shape[0]):
        sel = (flat == e).nonzero().squeeze(1)
        rows = x[token[sel]]
        h = rows @ w1[e].t()
        out = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]) @ w2[e].t()
        y = y.index_add(0, token[sel], out.to(acc) * topk_weights.reshape(-1)[sel, None].to(acc))
    return y.to(x.dtype)
