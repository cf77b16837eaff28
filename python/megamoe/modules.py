"""MoeExperts: one MoE layer's expert weights on this rank as parameters in megamoe's layouts, applied through
fused_moe; and converters from the common checkpoint layouts."""
import math

import torch

from .ops import fused_moe


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
    The dtype is kept; MoeExperts casts to bf16."""
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


class MoeExperts(torch.nn.Module):
    """One MoE layer's routed experts on this rank: w1 [E/R, 2I, H] and w2 [E/R, H, I] bf16 parameters;
    forward(x, topk_idx, topk_weights) -> y through fused_moe on `workspace` (whose ranks are the expert-parallel
    ranks). Routing (the gate, top-k) is the caller's."""

    def __init__(self, hidden, intermediate, experts, topk, workspace, device=None, init=True):
        super().__init__()
        if experts % workspace.ranks:
            raise ValueError("MoeExperts: experts=%d must be a multiple of the workspace's ranks=%d" % (
                experts, workspace.ranks))
        self.hidden, self.intermediate, self.experts, self.topk = hidden, intermediate, experts, topk
        self.workspace = workspace
        self.local_experts = experts // workspace.ranks
        device = device if device is not None else workspace.device
        self.w1 = torch.nn.Parameter(torch.empty(self.local_experts, 2 * intermediate, hidden, dtype=torch.bfloat16,
                                                 device=device))
        self.w2 = torch.nn.Parameter(torch.empty(self.local_experts, hidden, intermediate, dtype=torch.bfloat16,
                                                 device=device))
        if init:
            self.reset_parameters()
        # The layers this module calls, made now (a compiled graph only looks them up).
        for training in ((False, True) if workspace.training else (False,)):
            for bits in (32, 64):
                workspace.layer(hidden, intermediate, experts, topk, training, bits)

    def reset_parameters(self):
        """nn.Linear's default: uniform in +-1/sqrt(fan_in)."""
        with torch.no_grad():
            self.w1.uniform_(-1 / math.sqrt(self.hidden), 1 / math.sqrt(self.hidden))
            self.w2.uniform_(-1 / math.sqrt(self.intermediate), 1 / math.sqrt(self.intermediate))

    @classmethod
    def from_checkpoint(cls, workspace, topk, down, **layout):
        """An MoeExperts holding this rank's share of a checkpoint's experts (convert_experts' arguments)."""
        w1, w2 = convert_experts(down, rank=workspace.rank, ranks=workspace.ranks, **layout)
        experts = w1.shape[0] * workspace.ranks
        m = cls(w1.shape[2], w2.shape[2], experts, topk, workspace, init=False)
        with torch.no_grad():
            m.w1.copy_(w1)
            m.w2.copy_(w2)
        return m

    def forward(self, x, topk_idx, topk_weights):
        return fused_moe(x, topk_idx, topk_weights, self.w1, self.w2, self.workspace)

    def extra_repr(self):
        return "hidden=%d, intermediate=%d, experts=%d (%d on this rank), topk=%d" % (
            self.hidden, self.intermediate, self.experts, self.local_experts, self.topk)


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
