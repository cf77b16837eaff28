"""The PyTorch ops: fused_moe (the expert-parallel MoE layer: dispatch, L1, SwiGLU, L2, combine; forward and
backward), fused_moe_fp8 (the layer in FP8 e4m3, inference), the grouped GEMMs (NT / NN / TN over group offsets; NT
in FP8 too) and the per-token FP8 quantiser. On torch >= 2.4 they are torch.library custom ops (megamoe::fused_moe,
megamoe::fused_moe_backward, megamoe::grouped_mm_nt / _nn / _tn; megamoe::fused_moe_fp8, megamoe::grouped_mm_fp8 and
megamoe::quantize_fp8 without autograd) with fake implementations and registered autograd, so
torch.compile(fullgraph=True) traces through them and CUDA graphs capture them; on an older torch (Debian's 1.13)
the same implementations run through torch.autograd.Function (the FP8 ones as plain functions). Every call runs on
torch's current stream; arguments are checked here, at the boundary, with errors that name the argument and the
rule."""
import logging
from typing import Optional, Tuple

import torch

from . import _lib
from .kernels import with_kernels
from .workspace import Workspace, layer_of

log = logging.getLogger("megamoe")
HAS_CUSTOM_OP = all(hasattr(torch.library, n) for n in ("custom_op", "register_fake", "register_autograd"))


class ArgumentError(ValueError):
    """A bad argument of a megamoe op: the message names the op, the argument and the rule."""


def _fail(op, message):
    raise ArgumentError("%s: %s" % (op, message))


def _dtype_name(d):
    return str(d).replace("torch.", "")


def _tensor(op, name, t, dtypes, dims, layout):
    if not isinstance(t, torch.Tensor):
        _fail(op, "%s must be a torch.Tensor (got %s)" % (name, type(t).__name__))
    if t.dtype not in dtypes:
        _fail(op, "%s must be %s (got %s)" % (name, " or ".join(_dtype_name(d) for d in dtypes), _dtype_name(t.dtype)))
    if t.dim() != dims:
        _fail(op, "%s must have %d dimensions %s (got shape %s)" % (name, dims, layout, list(t.shape)))


def _contiguous(op, **tensors):
    for name, t in tensors.items():
        if not t.is_contiguous():
            _fail(op, "%s must be contiguous (got strides %s for shape %s; call .contiguous())" % (
                name, list(t.stride()), list(t.shape)))


def _on_device(op, device, **tensors):
    for name, t in tensors.items():
        if t.device != device:
            _fail(op, "%s must be on %s, the workspace's device (got %s)" % (name, device, t.device))


def _aligned(op, **tensors):
    """name=(tensor, bytes): the address of each tensor's first element is a multiple of `bytes` (the kernels'
    vector loads). Real tensors only: run inside the ops, not on the fake tensors of a trace."""
    for name, (t, alignment) in tensors.items():
        if t.numel() and t.data_ptr() % alignment:
            _fail(op, "%s must be %d-byte aligned (address 0x%x; a view at an offset of %d elements)" % (
                name, alignment, t.data_ptr(), t.storage_offset()))


def _address(t, keep):
    """t's address, or for an empty tensor a one-element buffer's (the layer refuses null pointers; an empty call
    still takes part in the ranks' exchange). keep collects the buffers so they live through the call."""
    if t.numel():
        return t.data_ptr()
    buf = torch.empty(16, dtype=torch.uint8, device=t.device)
    keep.append(buf)
    return buf.data_ptr()


# ---- fused_moe ----

def _check_layer_key(op, layer, shape, topk_idx, dtype):
    """The arguments' (hidden, intermediate, experts, topk) and topk_idx bits, and the op's dtype, are the layer's."""
    given = tuple(shape) + (64 if topk_idx.dtype == torch.int64 else 32,)
    H, I, E, K, _, bits, layer_dtype = layer.key
    if layer_dtype != dtype:
        _fail(op, "layer %d is a %s layer; %s runs %s layers" % (layer.id, layer_dtype, op.split()[0], dtype))
    if given != (H, I, E, K, bits):
        _fail(op, "the arguments' (hidden, intermediate, experts, topk, topk_idx bits) %s differ from layer %d's %s" % (
            given, layer.id, (H, I, E, K, bits)))


def _check_layer_call(op, layer, x, topk_idx, topk_weights, w1, w2):
    """The ops check their tensors against the layer they run (whoever calls them: fused_moe, a direct
    torch.ops.megamoe call, a compiled or exported graph): the kernels trust every shape."""
    shape = check_fused_moe_args(x, topk_idx, topk_weights, w1, w2, layer.workspace, op)
    _check_layer_key(op, layer, shape, topk_idx, "bf16")
    _aligned(op, x=(x, 16), w1=(w1, 16), w2=(w2, 16), topk_weights=(topk_weights, 4),
             topk_idx=(topk_idx, topk_idx.element_size()))


def _fused_moe_forward(x, topk_idx, topk_weights, w1, w2, layer_id, training):
    layer = layer_of(layer_id)
    _check_layer_call("fused_moe", layer, x, topk_idx, topk_weights, w1, w2)
    if bool(training) != layer.key[4]:
        _fail("fused_moe", "training=%s but layer %d was made with training=%s" % (training, layer.id, layer.key[4]))
    ws = layer.workspace
    y = torch.empty_like(x)
    saved = torch.empty(layer.saved_bytes if training else 0, dtype=torch.uint8, device=x.device)
    keep = []
    with ws._call():
        layer.handle.forward(_address(x, keep), x.shape[0], _address(topk_idx, keep), _address(topk_weights, keep),
                             w1.data_ptr(), w2.data_ptr(), _address(y, keep), ws.stream(),
                             saved=saved.data_ptr() if training else None)
    return y, saved


def _keep_for_backward(ctx, layer_id):
    """The layer's id for the backward, and its workspace (which holds the layer) alive until then: a layer refers
    to its workspace weakly (workspace.py)."""
    ctx.layer_id, ctx.workspace = layer_id, layer_of(layer_id).workspace


def _fused_moe_backward(dy, x, topk_idx, topk_weights, w1, w2, saved, layer_id):
    layer = layer_of(layer_id)
    if saved.numel() != layer.saved_bytes:
        _fail("fused_moe backward", "saved must be the %d bytes its forward wrote (got %d)" % (
            layer.saved_bytes, saved.numel()))
    op = "fused_moe backward"
    _check_layer_call(op, layer, x, topk_idx, topk_weights, w1, w2)
    _tensor(op, "dy", dy, (torch.bfloat16,), 2, "[tokens, hidden]")
    if dy.shape != x.shape:
        _fail(op, "dy must have x's shape %s (got %s)" % (list(x.shape), list(dy.shape)))
    _contiguous(op, dy=dy)
    _on_device(op, layer.workspace.device, dy=dy, saved=saved)
    _aligned(op, dy=(dy, 16), saved=(saved, 16))
    ws = layer.workspace
    dx = torch.empty_like(x)
    d_topk_weights = torch.empty(topk_weights.shape, dtype=torch.float32, device=x.device)
    dw1, dw2 = torch.empty_like(w1), torch.empty_like(w2)
    keep = []
    with ws._call():
        layer.handle.backward(_address(dy, keep), _address(x, keep), x.shape[0], _address(topk_idx, keep),
                              _address(topk_weights, keep), w1.data_ptr(), w2.data_ptr(), _address(dx, keep),
                              _address(d_topk_weights, keep), dw1.data_ptr(), dw2.data_ptr(), ws.stream(),
                              saved=saved.data_ptr())
    return dx, d_topk_weights, dw1, dw2


if HAS_CUSTOM_OP:
    @torch.library.custom_op("megamoe::fused_moe", mutates_args=())
    def _fused_moe_op(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, w1: torch.Tensor,
                      w2: torch.Tensor, layer_id: int, training: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        return _fused_moe_forward(x, topk_idx, topk_weights, w1, w2, layer_id, training)

    @_fused_moe_op.register_fake
    def _(x, topk_idx, topk_weights, w1, w2, layer_id, training):
        n = layer_of(layer_id).saved_bytes if training else 0
        return torch.empty_like(x), x.new_empty((n,), dtype=torch.uint8)

    @torch.library.custom_op("megamoe::fused_moe_backward", mutates_args=())
    def _fused_moe_backward_op(dy: torch.Tensor, x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                               w1: torch.Tensor, w2: torch.Tensor, saved: torch.Tensor, layer_id: int
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return _fused_moe_backward(dy, x, topk_idx, topk_weights, w1, w2, saved, layer_id)

    @_fused_moe_backward_op.register_fake
    def _(dy, x, topk_idx, topk_weights, w1, w2, saved, layer_id):
        return (torch.empty_like(x), topk_weights.new_empty(topk_weights.shape, dtype=torch.float32),
                torch.empty_like(w1), torch.empty_like(w2))

    def _setup_context(ctx, inputs, output):
        x, topk_idx, topk_weights, w1, w2, layer_id, training = inputs
        ctx.save_for_backward(x, topk_idx, topk_weights, w1, w2, output[1])
        _keep_for_backward(ctx, layer_id)

    def _backward(ctx, dy, d_saved):
        x, topk_idx, topk_weights, w1, w2, saved = ctx.saved_tensors
        dx, dtw, dw1, dw2 = _fused_moe_backward_op(dy.contiguous(), x, topk_idx, topk_weights, w1, w2, saved,
                                                   ctx.layer_id)
        return dx, None, dtw, dw1, dw2, None, None

    _fused_moe_op.register_autograd(_backward, setup_context=_setup_context)

    def _fused_moe_call(*args):
        return _fused_moe_op(*args)
else:
    class _FusedMoeFunction(torch.autograd.Function):
        """torch < 2.4: the same forward and backward through autograd.Function (no torch.compile op)."""

        @staticmethod
        def forward(ctx, x, topk_idx, topk_weights, w1, w2, layer_id, training):
            y, saved = _fused_moe_forward(x, topk_idx, topk_weights, w1, w2, layer_id, training)
            ctx.save_for_backward(x, topk_idx, topk_weights, w1, w2, saved)
            _keep_for_backward(ctx, layer_id)
            ctx.mark_non_differentiable(saved)
            return y, saved

        @staticmethod
        def backward(ctx, dy, d_saved):
            x, topk_idx, topk_weights, w1, w2, saved = ctx.saved_tensors
            dx, dtw, dw1, dw2 = _fused_moe_backward(dy.contiguous(), x, topk_idx, topk_weights, w1, w2, saved,
                                                    ctx.layer_id)
            return dx, None, dtw, dw1, dw2, None, None

    def _fused_moe_call(*args):
        return _FusedMoeFunction.apply(*args)


def _check_workspace(op, workspace):
    if not isinstance(workspace, Workspace):
        _fail(op, "workspace must be a megamoe.Workspace (got %s)" % type(workspace).__name__)


def _check_routing(op, T, topk_idx, topk_weights):
    """topk_idx and topk_weights [T, topk]; returns topk."""
    _tensor(op, "topk_idx", topk_idx, (torch.int32, torch.int64), 2, "[tokens, topk]")
    _tensor(op, "topk_weights", topk_weights, (torch.float32,), 2, "[tokens, topk]")
    if topk_idx.shape[0] != T:
        _fail(op, "topk_idx must have one row per token of x: shape [%d, topk] (got %s)" % (T, list(topk_idx.shape)))
    if tuple(topk_weights.shape) != tuple(topk_idx.shape):
        _fail(op, "topk_weights must have topk_idx's shape %s (got %s)" % (list(topk_idx.shape),
                                                                         list(topk_weights.shape)))
    return topk_idx.shape[1]


def _check_expert_shapes(op, H, w1, w2):
    """w1 [E/R, 2I, H] (gate rows, then up rows) and w2 [E/R, H, I]; returns (E/R, I)."""
    if w1.shape[2] != H:
        _fail(op, "w1 must be [local experts, 2 * intermediate, hidden=%d] (got %s)" % (H, list(w1.shape)))
    if w1.shape[1] % 2:
        _fail(op, "w1's second dimension must be even: gate rows then up rows, 2 * intermediate (got %d)" % w1.shape[1])
    E_local, I = w1.shape[0], w1.shape[1] // 2
    if tuple(w2.shape) != (E_local, H, I):
        _fail(op, "w2 must be [local experts=%d, hidden=%d, intermediate=%d] to match w1 %s (got %s)" % (
            E_local, H, I, list(w1.shape), list(w2.shape)))
    return E_local, I


def _check_fits(op, workspace, T, H, I, E_local, K):
    """The call's tokens and layer against the workspace's sizes; returns the experts, E_local x ranks."""
    if T > workspace.max_tokens:
        _fail(op, "x has %d tokens, above the workspace's max_tokens=%d" % (T, workspace.max_tokens))
    E = E_local * workspace.ranks
    for name, value in (("hidden", H), ("intermediate", I), ("experts", E), ("topk", K)):
        if value > workspace.shape[name]:
            _fail(op, "%s=%d (from the arguments' shapes) exceeds the workspace's %s=%d" % (
                name, value, name, workspace.shape[name]))
    if E != workspace.shape["experts"]:
        _fail(op, "experts=%d (w1's %d local experts x %d ranks) must equal the workspace's experts=%d" % (
            E, E_local, workspace.ranks, workspace.shape["experts"]))
    return E


def check_fused_moe_args(x, topk_idx, topk_weights, w1, w2, workspace, op="fused_moe"):
    """The boundary checks of fused_moe (no device access); returns (hidden, intermediate, experts, topk)."""
    _check_workspace(op, workspace)
    if workspace.dtype != "bf16":
        _fail(op, "the workspace's dtype is %s: its layers run through fused_moe_fp8" % workspace.dtype)
    _tensor(op, "x", x, (torch.bfloat16,), 2, "[tokens, hidden]")
    T, H = x.shape
    K = _check_routing(op, T, topk_idx, topk_weights)
    _tensor(op, "w1", w1, (torch.bfloat16,), 3, "[local experts, 2 * intermediate, hidden]")
    _tensor(op, "w2", w2, (torch.bfloat16,), 3, "[local experts, hidden, intermediate]")
    E_local, I = _check_expert_shapes(op, H, w1, w2)
    E = _check_fits(op, workspace, T, H, I, E_local, K)
    _contiguous(op, x=x, topk_idx=topk_idx, topk_weights=topk_weights, w1=w1, w2=w2)
    _on_device(op, workspace.device, x=x, topk_idx=topk_idx, topk_weights=topk_weights, w1=w1, w2=w2)
    return H, I, E, K


def fused_moe(x, topk_idx, topk_weights, w1, w2, workspace):
    """The expert-parallel MoE layer on this rank: y [tokens, hidden] bf16 = sum over k of topk_weights[t, k] *
    expert_{topk_idx[t, k]}(x[t]), expert_e(x) = (silu(x w1[e][:I]^T) * (x w1[e][I:]^T)) w2[e]^T.

    x: bf16 [tokens, hidden]; topk_idx: int32 or int64 [tokens, topk], global expert ids (-1: no expert; rank r owns
    experts [r E/R, (r+1) E/R)); topk_weights: fp32 [tokens, topk]; w1: bf16 [E/R, 2 * intermediate, hidden] (gate
    rows, then up rows); w2: bf16 [E/R, hidden, intermediate]; all contiguous, on the workspace's device; tokens at
    most the workspace's max_tokens (token counts may differ between ranks). Every rank of the workspace calls its
    layers in the same order. Differentiable in x, topk_weights, w1 and w2 when the workspace serves training: the
    forward then keeps its saved state in a tensor saved for backward, so any number of forwards may be in flight
    and their backwards run in any order."""
    H, I, E, K = check_fused_moe_args(x, topk_idx, topk_weights, w1, w2, workspace)
    training = torch.is_grad_enabled() and (x.requires_grad or topk_weights.requires_grad or w1.requires_grad
                                            or w2.requires_grad)
    if training and not workspace.training:
        _fail("fused_moe", "gradients are wanted (an input requires grad) but the workspace was made with "
                           "training=False; make it with training=True or call under torch.no_grad()")
    bits = 64 if topk_idx.dtype == torch.int64 else 32
    layer = workspace.layer_for(H, I, E, K, training, bits, "bf16")
    y, _ = _fused_moe_call(x, topk_idx, topk_weights, w1, w2, layer.id, training)
    return y


# ---- grouped GEMMs ----

_runtimes = {}


def _runtime(device):
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    if ordinal not in _runtimes:
        _runtimes[ordinal] = _lib.Runtime("hip" if getattr(torch.version, "hip", None) else "cuda", ordinal)
        _runtimes[ordinal].sms = torch.cuda.get_device_properties(ordinal).multi_processor_count
    return _runtimes[ordinal]


GEMM_MAX_SPLIT = 8  # the split-K tail's parts (NT / NN; bench/results 2026-12-01-h200-session10-final)
_SCRATCH_HEAD = 256  # tickets (i32 [2]) in the first bytes, the split scratch from here


def grouped_kernel_spec(layout, E, N, KM):
    """(kernel name, spec) that grouped_mm_<layout> launches: the TMA build, as cluster pairs where N allows."""
    if layout == "tn":
        return "grouped_gemm_tn_tma", [("E", E), ("N", N), ("M", KM), ("pairs", 0)]
    return "grouped_gemm_%s_tma" % layout, [("E", E), ("N", N), ("K", KM), ("pairs", int(N % 256 == 0))]


def _grouped_rules(op, layout, N, KM):
    if N < 128 or N % 128:
        _fail(op, "N=%d must be a positive multiple of 128 (the kernels' BLOCK_N)" % N)
    if layout == "tn":
        if KM < 128 or KM % 128:
            _fail(op, "M=%d must be a positive multiple of 128 (BLOCK_M of TN)" % KM)
    elif KM % 64 or KM < 128:
        _fail(op, "K=%d must be a multiple of 64 and at least 128 (BLOCK_K, the 3-stage ring)" % KM)


def _check_offs(op, offs, E, device):
    _tensor(op, "offs", offs, (torch.int32,), 1, "[groups]: each group's end row")
    if offs.shape[0] != E:
        _fail(op, "offs must have one end per group, %d (got %d)" % (E, offs.shape[0]))
    if E < 1 or E > 1024:
        _fail(op, "the group count %d must be 1..1024" % E)
    _on_device(op, device, offs=offs)


def group_starts(offs, rows):
    """The kernels' offsets: E + 1 group starts, the last the end, from torch._grouped_mm's group ends. The kernels
    trust them (an NT / NN epilogue stores each row of its group), so they are made safe on the device, without a
    host sync: ends clamped to [0, rows] and non-decreasing (a group ending before the previous one is empty)."""
    ends = torch.cummax(offs.clamp(0, rows), 0).values
    return torch.cat([offs.new_zeros(1), ends.to(offs.dtype)])


# The layouts, N and K (or M) of the gradients' kernels (see _grouped_grads): [da, db] of each layout with its N, KM.
_GRAD_SHAPES = {"nt": lambda N, KM: [("nn", KM, N), ("tn", KM, N)],
                "nn": lambda N, KM: [("nt", KM, N), ("tn", N, KM)],
                "tn": lambda N, KM: [("nt", KM, N), ("nn", N, KM)]}


def check_grad_rules(layout, N, KM, needs):
    """The rules of the kernels the wanted gradients run (needs: (a's, b's)), checked before the forward: a shape
    the forward serves but a gradient does not (e.g. NT with K = 64 mod 128) fails here, not inside backward."""
    for name, need, (grad_layout, gN, gKM) in zip(("a", "b"), needs, _GRAD_SHAPES[layout](N, KM)):
        if need:
            _grouped_rules("grouped_mm_%s's gradient of %s (grouped_mm_%s)" % (layout, name, grad_layout), grad_layout,
                           gN, gKM)


def _check_grads_wanted(layout, a, b, offs):
    needs = (a.requires_grad, b.requires_grad) if torch.is_grad_enabled() else (False, False)
    if any(needs):
        _, N, KM = check_grouped_args(layout, a, b, offs)
        check_grad_rules(layout, N, KM, needs)


def check_grouped_args(layout, a, b, offs):
    """Boundary checks of grouped_mm_<layout>; returns (E, N, K or M)."""
    op = "grouped_mm_" + layout
    if layout == "tn":
        _tensor(op, "a", a, (torch.bfloat16,), 2, "[rows, M]")
        _tensor(op, "b", b, (torch.bfloat16,), 2, "[rows, N]")
        if b.shape[0] != a.shape[0]:
            _fail(op, "b must have a's %d rows (got %s)" % (a.shape[0], list(b.shape)))
        E, N, KM = offs.shape[0] if isinstance(offs, torch.Tensor) and offs.dim() == 1 else 0, b.shape[1], a.shape[1]
    else:
        _tensor(op, "a", a, (torch.bfloat16,), 2, "[rows, K]")
        _tensor(op, "b", b, (torch.bfloat16,), 3, "[groups, N, K]" if layout == "nt" else "[groups, K, N]")
        E = b.shape[0]
        K = a.shape[1]
        bK = b.shape[2] if layout == "nt" else b.shape[1]
        if bK != K:
            _fail(op, "b's K dimension must be a's K=%d (got b %s)" % (K, list(b.shape)))
        N, KM = (b.shape[1] if layout == "nt" else b.shape[2]), K
    _check_offs(op, offs, E, a.device)
    _grouped_rules(op, layout, N, KM)
    _contiguous(op, a=a, b=b, offs=offs)
    _on_device(op, a.device, b=b)
    if a.device.type != "cuda":
        _fail(op, "a must be on a CUDA device (got %s)" % a.device)
    return E, N, KM


def _grouped_mm(layout, a, b, offs):
    op = "grouped_mm_" + layout
    E, N, KM = check_grouped_args(layout, a, b, offs)
    _aligned(op, a=(a, 16), b=(b, 16))
    rows = a.shape[0]
    out = (torch.empty(E, KM, N, dtype=a.dtype, device=a.device) if layout == "tn"
           else torch.empty(rows, N, dtype=a.dtype, device=a.device))
    if rows == 0:
        return out.zero_()
    rt = _runtime(a.device)
    name, spec = grouped_kernel_spec(layout, E, N, KM)
    kernel = with_kernels(lambda: rt.kernel(name, spec), _lib.generate_command(name, spec, rt.target), op)
    pairs = layout != "tn" and spec[-1][1] == 1
    grid = max(2, rt.sms // 2 * 2) if pairs else rt.sms
    split_bytes, zeroed = rt.lib.split_scratch_bytes(grid)
    scratch = torch.empty(_SCRATCH_HEAD + split_bytes, dtype=torch.uint8, device=a.device)
    scratch[:_SCRATCH_HEAD + zeroed].zero_()  # the tickets and the split counters start at zero
    starts = group_starts(offs, rows)
    # A [rows, KM]; B [rows, N] (TN), [E * N, KM] (NT) or [E * KM, N] (NN); boxes as the kernel declares them.
    map_a = rt.tensor_map(kernel, "map_a", a.data_ptr(), rows, KM)
    map_b = (rt.tensor_map(kernel, "map_b", b.data_ptr(), rows, N) if layout == "tn"
             else rt.tensor_map(kernel, "map_b", b.data_ptr(), E * N, KM) if layout == "nt"
             else rt.tensor_map(kernel, "map_b", b.data_ptr(), E * KM, N))
    # TN stores dW [E * M, N] through a map too.
    extra = {"map_c": rt.tensor_map(kernel, "map_c", out.data_ptr(), E * KM, N)} if layout == "tn" else {}
    rt.launch(kernel, (grid, 1, 1), torch.cuda.current_stream(a.device).cuda_stream, a=a.data_ptr(),
              b=b.data_ptr(), c=out.data_ptr(), offsets=starts.data_ptr(), tickets=scratch.data_ptr(),
              split=scratch.data_ptr() + _SCRATCH_HEAD, max_split=0 if layout == "tn" else GEMM_MAX_SPLIT,
              grid=grid, map_a=map_a, map_b=map_b, **extra)
    return out


def _grouped_fake(layout, a, b, offs):
    if layout == "tn":
        return a.new_empty((offs.shape[0], a.shape[1], b.shape[1]))
    return a.new_empty((a.shape[0], b.shape[1] if layout == "nt" else b.shape[2]))


# Gradients, in the same kernels (c = a b[e]^T, c = a b[e], c[e] = a_e^T b_e):
#   NT: da = NN(dc, b)          db = TN(dc, a)
#   NN: da = NT(dc, b)          db = TN(a, dc)
#   TN: da = NT(b, dc)          db = NN(a, dc)
def _grouped_grads(layout, a, b, offs, dc, needs):
    ops = {"nt": grouped_mm_nt, "nn": grouped_mm_nn, "tn": grouped_mm_tn}
    dc = dc.contiguous()
    da = db = None
    if layout == "nt":
        da = ops["nn"](dc, b, offs) if needs[0] else None
        db = ops["tn"](dc, a, offs) if needs[1] else None
    elif layout == "nn":
        da = ops["nt"](dc, b, offs) if needs[0] else None
        db = ops["tn"](a, dc, offs) if needs[1] else None
    else:
        da = ops["nt"](b, dc, offs) if needs[0] else None
        db = ops["nn"](a, dc, offs) if needs[1] else None
    return da, db


def _make_grouped(layout):
    if HAS_CUSTOM_OP:
        @torch.library.custom_op("megamoe::grouped_mm_" + layout, mutates_args=())
        def op(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
            return _grouped_mm(layout, a, b, offs)

        op.register_fake(lambda a, b, offs: _grouped_fake(layout, a, b, offs))

        def setup(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        def backward(ctx, dc):
            a, b, offs = ctx.saved_tensors
            da, db = _grouped_grads(layout, a, b, offs, dc, ctx.needs_input_grad[:2])
            return da, db, None

        op.register_autograd(backward, setup_context=setup)
        return op

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, offs):
            ctx.save_for_backward(a, b, offs)
            return _grouped_mm(layout, a, b, offs)

        @staticmethod
        def backward(ctx, dc):
            a, b, offs = ctx.saved_tensors
            da, db = _grouped_grads(layout, a, b, offs, dc, ctx.needs_input_grad[:2])
            return da, db, None

    return Function.apply


_grouped_nt, _grouped_nn, _grouped_tn = (_make_grouped(l) for l in ("nt", "nn", "tn"))


def grouped_mm_nt(a, b, offs):
    """c [rows, N] = a [rows, K] b[e]^T for the rows of group e, b [groups, N, K] (an expert's weights as stored);
    offs int32 [groups]: each group's end row (torch._grouped_mm's offs; clamped to [0, rows] and made
    non-decreasing on the device). Rows past offs[-1] are not written, in c and in a's gradient alike.
    N a multiple of 128; K a multiple of 64, at least 128."""
    _check_grads_wanted("nt", a, b, offs)
    return _grouped_nt(a, b, offs)


def grouped_mm_nn(a, b, offs):
    """c [rows, N] = a [rows, K] b[e] for the rows of group e, b [groups, K, N]; offs as grouped_mm_nt's."""
    _check_grads_wanted("nn", a, b, offs)
    return _grouped_nn(a, b, offs)


def grouped_mm_tn(a, b, offs):
    """c [groups, M, N], c[e] = a_e^T b_e over the rows of group e (a [rows, M], b [rows, N]): weight gradients. A
    group without rows gets zeros. M and N multiples of 128."""
    _check_grads_wanted("tn", a, b, offs)
    return _grouped_tn(a, b, offs)


def grouped_mm(a, b, offs, fallback=True):
    """A drop-in for torch._grouped_mm(a, b, offs=offs) in bf16: a [rows, K] with b [groups, K, N] (any of its two
    layouts: b.transpose(-2, -1) contiguous runs NT, b contiguous runs NN), or a [M, rows] with b [rows, N] (the
    2d x 2d form: a per-group [M, N] result, TN). Shapes these kernels do not serve go to torch._grouped_mm when
    fallback is set and this torch has it (said once in the log at info), else raise naming the rule."""
    try:
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 3:
            bt = b.transpose(-2, -1)
            if bt.is_contiguous():
                check_grouped_args("nt", a.contiguous(), bt, offs)
                return grouped_mm_nt(a.contiguous(), bt, offs)
            check_grouped_args("nn", a.contiguous(), b.contiguous(), offs)
            return grouped_mm_nn(a.contiguous(), b.contiguous(), offs)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2:
            at = a.t().contiguous()
            check_grouped_args("tn", at, b.contiguous(), offs)
            return grouped_mm_tn(at, b.contiguous(), offs)
        _fail("grouped_mm", "a and b must be 2d x 3d ([rows, K] x [groups, K, N]) or 2d x 2d ([M, rows] x "
                            "[rows, N]) (got %s x %s)" % (
                                list(getattr(a, "shape", [])), list(getattr(b, "shape", []))))
    except ArgumentError as e:
        if not (fallback and hasattr(torch, "_grouped_mm")):
            raise
        if not getattr(grouped_mm, "_said", False):
            log.info("megamoe: grouped_mm falls back to torch._grouped_mm: %s", e)
            grouped_mm._said = True
        return torch._grouped_mm(a, b, offs=offs)


# ---- the FP8 grouped GEMM ----

FP8_BLOCK = 128  # the block scales' rows x columns of b, and a's channels per scale (kernels/Kernels.h kScaleBlock)
FLOAT8 = getattr(torch, "float8_e4m3fn", None)  # None on torch < 2.1
_CODE_DTYPES = (torch.uint8,) + ((FLOAT8,) if FLOAT8 is not None else ())  # e4m3 codes' dtypes (megamoe.fp8 too)


def _fp8_codes(op, name, t, dims, layout):
    _tensor(op, name, t, _CODE_DTYPES, dims, layout)
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _check_fp8_scales(op, name, s, shape, layout):
    """Scales of `shape`: float32, or UE8M0 exponents (uint8)."""
    _tensor(op, name, s, (torch.float32, torch.uint8), len(shape), layout)
    if list(s.shape) != list(shape):
        _fail(op, "%s must be %s = %s (got %s)" % (name, layout, list(shape), list(s.shape)))


def _float_scales(s):
    """float32 scales, contiguous; UE8M0 exponents (uint8) are decoded to float32 here (one small kernel)."""
    if s.dtype == torch.uint8:
        from .fp8 import ue8m0_to_float
        s = ue8m0_to_float(s)
    return s.contiguous()


def _fp8_scales(op, name, s, shape, layout):
    _check_fp8_scales(op, name, s, shape, layout)
    return _float_scales(s)


def check_grouped_fp8_args(a, a_scales, b, b_scales, offs):
    """Boundary checks of grouped_mm_fp8; returns (a codes, a's float32 scales, b codes, b's float32 scales, E, N,
    K)."""
    op = "grouped_mm_fp8"
    a = _fp8_codes(op, "a", a, 2, "[rows, K] (e4m3)")
    b = _fp8_codes(op, "b", b, 3, "[groups, N, K] (e4m3)")
    (rows, K), (E, N) = a.shape, b.shape[:2]
    if b.shape[2] != K:
        _fail(op, "b's K dimension must be a's K=%d (got b %s)" % (K, list(b.shape)))
    if N < FP8_BLOCK or N % FP8_BLOCK:
        _fail(op, "N=%d must be a positive multiple of 128 (the weights' scale block and BLOCK_N)" % N)
    if K < 2 * FP8_BLOCK or K % FP8_BLOCK:
        _fail(op, "K=%d must be a multiple of 128 and at least 256 (the scale block, two ring stages)" % K)
    a_scales = _fp8_scales(op, "a_scales", a_scales, (rows, K // FP8_BLOCK), "[rows, K / 128]")
    b_scales = _fp8_scales(op, "b_scales", b_scales, (E, N // FP8_BLOCK, K // FP8_BLOCK),
                           "[groups, N / 128, K / 128]")
    _check_offs(op, offs, E, a.device)
    _contiguous(op, a=a, b=b, offs=offs)
    _on_device(op, a.device, a_scales=a_scales, b=b, b_scales=b_scales)
    if a.device.type != "cuda":
        _fail(op, "a must be on a CUDA device (got %s)" % a.device)
    return a, a_scales, b, b_scales, E, N, K


def _grouped_mm_fp8(a, a_scales, b, b_scales, offs):
    op = "grouped_mm_fp8"
    a, a_scales, b, b_scales, E, N, K = check_grouped_fp8_args(a, a_scales, b, b_scales, offs)
    _aligned(op, a=(a, 16), b=(b, 16), a_scales=(a_scales, 4), b_scales=(b_scales, 4))
    rows = a.shape[0]
    out = torch.empty(rows, N, dtype=torch.bfloat16, device=a.device)
    if rows == 0:
        return out
    rt = _runtime(a.device)
    name, spec = "grouped_gemm_nt_fp8", [("E", E), ("N", N), ("K", K)]
    kernel = with_kernels(lambda: rt.kernel(name, spec), _lib.generate_command(name, spec, rt.target), op)
    tickets = torch.zeros(2, dtype=torch.int32, device=a.device)  # each launch leaves them zero; a fresh pair here
    starts = group_starts(offs, rows)
    rt.launch(kernel, (rt.sms, 1, 1), torch.cuda.current_stream(a.device).cuda_stream, a=a.data_ptr(),
              a_scales=a_scales.data_ptr(), b=b.data_ptr(), b_scales=b_scales.data_ptr(), c=out.data_ptr(),
              offsets=starts.data_ptr(), tickets=tickets.data_ptr(), grid=rt.sms,
              map_a=rt.tensor_map(kernel, "map_a", a.data_ptr(), rows, K),
              map_b=rt.tensor_map(kernel, "map_b", b.data_ptr(), E * N, K))
    return out


if HAS_CUSTOM_OP:
    @torch.library.custom_op("megamoe::grouped_mm_fp8", mutates_args=())
    def _grouped_fp8(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                     offs: torch.Tensor) -> torch.Tensor:
        return _grouped_mm_fp8(a, a_scales, b, b_scales, offs)

    _grouped_fp8.register_fake(lambda a, a_scales, b, b_scales, offs: a.new_empty((a.shape[0], b.shape[1]),
                                                                                  dtype=torch.bfloat16))
else:
    _grouped_fp8 = _grouped_mm_fp8


def grouped_mm_fp8(a, a_scales, b, b_scales, offs):
    """c [rows, N] bfloat16 = dequant(a) dequant(b[e])^T for the rows of group e, in FP8 e4m3 with block scales (the
    way DeepGEMM's m-grouped FP8 GEMM is used): a [rows, K] codes (torch.uint8 or float8_e4m3fn) with a_scales
    [rows, K / 128] per token and 128 channels (megamoe.fp8.quantize_tokens), b [groups, N, K] codes with b_scales
    [groups, N / 128, K / 128] per 128 x 128 block (a checkpoint's weight_scale_inv; megamoe.fp8.quantize_blocks).
    Scales float32, or UE8M0 exponents (torch.uint8; decoded to float32 each call). The MMA sums each 128-deep K
    block in the tensor cores and adds it, scaled, into a float32 accumulator. offs as grouped_mm_nt's. N a
    multiple of 128; K a multiple of 128, at least 256. Inference only (no gradient)."""
    return _grouped_fp8(a, a_scales, b, b_scales, offs)


# ---- per-token FP8 quantisation ----

QUANTIZE_MAX_H = 65536  # quantize_tokens_fp8's largest H (kernels/Registry.cpp)


def check_quantize_fp8_args(x, op="quantize_fp8"):
    """Boundary checks of quantize_fp8 (no device access; the fake runs them too): the kernel's rules, which the
    CPU path keeps as well; returns (rows, H)."""
    _tensor(op, "x", x, (torch.bfloat16,), 2, "[rows, H]")
    rows, H = x.shape
    if H < FP8_BLOCK or H % FP8_BLOCK:
        _fail(op, "H=%d must be a positive multiple of 128 (one scale per token and 128 channels)" % H)
    if H > QUANTIZE_MAX_H:
        _fail(op, "H=%d must be <= %d (quantize_tokens_fp8's rule)" % (H, QUANTIZE_MAX_H))
    if rows * (H // FP8_BLOCK) >= 2 ** 31:
        _fail(op, "rows * H / 128 = %d must be below 2^31 (one thread per 128-channel group, 32-bit thread "
                  "indices)" % (rows * (H // FP8_BLOCK)))
    _contiguous(op, x=x)
    return rows, H


def _quantize_fp8(x):
    op = "quantize_fp8"
    rows, H = check_quantize_fp8_args(x)
    if x.device.type not in ("cuda", "cpu"):
        _fail(op, "x must be on a CUDA device, or on the CPU (megamoe.fp8.quantize_tokens) (got %s)" % x.device)
    _aligned(op, x=(x, 16))
    if x.device.type == "cpu":
        from .fp8 import quantize_tokens  # fp8 imports this module
        return quantize_tokens(x)
    q = torch.empty(rows, H, dtype=torch.uint8, device=x.device)
    scales = torch.empty(rows, H // FP8_BLOCK, dtype=torch.float32, device=x.device)
    if rows == 0:
        return q, scales
    rt = _runtime(x.device)
    name, spec = "quantize_tokens_fp8", [("H", H), ("device_rows", 0)]
    kernel = with_kernels(lambda: rt.kernel(name, spec), _lib.generate_command(name, spec, rt.target), op)
    # One thread a (row, 128-channel group), kernel.threads a block; the blocks loop over the rows (any grid works).
    grid = -(-rows * (H // FP8_BLOCK) // kernel.threads)
    rt.launch(kernel, (grid, 1, 1), torch.cuda.current_stream(x.device).cuda_stream,
              x=x.data_ptr(), q=q.data_ptr(), scales=scales.data_ptr(), rows=rows, rows_at=0, grid=grid)
    return q, scales


def _quantize_fp8_fake(x):
    rows, H = check_quantize_fp8_args(x)
    return x.new_empty((rows, H), dtype=torch.uint8), x.new_empty((rows, H // FP8_BLOCK), dtype=torch.float32)


if HAS_CUSTOM_OP:
    @torch.library.custom_op("megamoe::quantize_fp8", mutates_args=())
    def _quantize(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return _quantize_fp8(x)

    _quantize.register_fake(_quantize_fp8_fake)
else:
    _quantize = _quantize_fp8


def quantize_fp8(x, dtype=torch.uint8):
    """(q, scales) of bf16 activations x [rows, H], quantised per token over groups of 128 channels as
    grouped_mm_fp8's a and a_scales: q [rows, H] e4m3 codes (torch.uint8, or torch.float8_e4m3fn with dtype=),
    scales float32 [rows, H / 128], each amax / 448 of its group (1 for an all-zero group), q = e4m3(x / scale)
    (IEEE quotient, nearest even, saturating). x bfloat16, contiguous, 16-byte aligned; H a positive multiple of
    128, at most 65536; rows may be 0. On CUDA: the quantize_tokens_fp8 kernel, bitwise megamoe.fp8.quantize_tokens
    (scale_format fp32) for finite x (not checked there, which would sync with the host: a non-finite group's codes
    and scale are unspecified). On the CPU: megamoe.fp8.quantize_tokens itself (pure torch, torch 1.13 too; a
    non-finite x is an ArgumentError), under the kernel's rules, so that one call serves both tiers and a shape one
    device refuses the other refuses too. That is no fallback in grouped_mm's sense (another implementation for
    shapes the kernels do not serve, hence its switch): the reference defines the kernel's bits, so there is
    nothing to switch off. Inference only (no gradient)."""
    if dtype not in _CODE_DTYPES:
        _fail("quantize_fp8", "dtype must be torch.uint8%s (got %s)" % (
            " or torch.float8_e4m3fn" if FLOAT8 is not None else " (this torch has no float8_e4m3fn)", dtype))
    q, scales = _quantize(x)
    return (q if dtype == torch.uint8 else q.view(dtype)), scales


# ---- fused_moe_fp8: the layer in FP8 (inference) ----

def check_fused_moe_fp8_args(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, workspace, x_scales=None,
                             op="fused_moe_fp8"):
    """The boundary checks of fused_moe_fp8 (no device access; the fake runs them too); returns (hidden,
    intermediate, experts, topk)."""
    _check_workspace(op, workspace)
    if workspace.dtype != "fp8_e4m3":
        _fail(op, "the workspace's dtype is %s; the FP8 layer needs a workspace made with dtype='fp8'" %
              workspace.dtype)
    _tensor(op, "x", x, (torch.bfloat16,) + _CODE_DTYPES, 2, "[tokens, hidden]")
    T, H = x.shape
    if H % FP8_BLOCK:
        _fail(op, "hidden=%d must be a multiple of 128 (x is quantised per token in groups of 128 channels, w1 and "
                  "w2 in 128 x 128 blocks)" % H)
    if x.dtype == torch.bfloat16:
        if x_scales is not None:
            _fail(op, "x_scales goes only with e4m3 codes x; x is bfloat16, which the layer quantises itself (pass "
                      "x alone, or its codes from quantize_fp8 with their scales)")
    elif x_scales is None:
        _fail(op, "x is e4m3 codes (%s), so x_scales, its per-token scales [tokens, hidden / 128], is required" %
              _dtype_name(x.dtype))
    else:
        _check_fp8_scales(op, "x_scales", x_scales, (T, H // FP8_BLOCK), "[tokens, hidden / 128]")
    K = _check_routing(op, T, topk_idx, topk_weights)
    _tensor(op, "w1", w1, _CODE_DTYPES, 3, "[local experts, 2 * intermediate, hidden] (e4m3 codes)")
    _tensor(op, "w2", w2, _CODE_DTYPES, 3, "[local experts, hidden, intermediate] (e4m3 codes)")
    E_local, I = _check_expert_shapes(op, H, w1, w2)
    if I % FP8_BLOCK:
        _fail(op, "intermediate=%d must be a multiple of 128 (act is quantised per token in groups of 128 channels, "
                  "and no block of w1 may span gate and up rows)" % I)
    _check_fp8_scales(op, "w1_scale", w1_scale, (E_local, 2 * I // FP8_BLOCK, H // FP8_BLOCK),
                      "[local experts, 2 * intermediate / 128, hidden / 128]")
    _check_fp8_scales(op, "w2_scale", w2_scale, (E_local, H // FP8_BLOCK, I // FP8_BLOCK),
                      "[local experts, hidden / 128, intermediate / 128]")
    E = _check_fits(op, workspace, T, H, I, E_local, K)
    tensors = dict(x=x, topk_idx=topk_idx, topk_weights=topk_weights, w1=w1, w1_scale=w1_scale, w2=w2,
                   w2_scale=w2_scale)
    if x_scales is not None:
        tensors["x_scales"] = x_scales
    _contiguous(op, **tensors)
    _on_device(op, workspace.device, **tensors)
    return H, I, E, K


def _check_fp8_layer_call(op, layer, x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, x_scales):
    """As _check_layer_call: the tensors against the FP8 layer the op runs, whoever calls it."""
    shape = check_fused_moe_fp8_args(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, layer.workspace,
                                     x_scales, op)
    _check_layer_key(op, layer, shape, topk_idx, "fp8_e4m3")


def _fused_moe_fp8_forward(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, x_scales, layer_id):
    op = "fused_moe_fp8"
    layer = layer_of(layer_id)
    _check_fp8_layer_call(op, layer, x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, x_scales)
    w1_scale, w2_scale = _float_scales(w1_scale), _float_scales(w2_scale)
    x_scales = _float_scales(x_scales) if x_scales is not None else None
    _aligned(op, x=(x, 16), w1=(w1, 16), w2=(w2, 16), topk_weights=(topk_weights, 4),
             topk_idx=(topk_idx, topk_idx.element_size()), w1_scale=(w1_scale, 4), w2_scale=(w2_scale, 4),
             **({"x_scales": (x_scales, 4)} if x_scales is not None else {}))
    ws = layer.workspace
    y = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    keep = []
    with ws._call():
        # x_scales 0: bf16 x, which the layer quantises (per token and 128 channels) before its dispatch.
        layer.handle.forward_fp8(_address(x, keep), _address(x_scales, keep) if x_scales is not None else 0,
                                 x.shape[0], _address(topk_idx, keep), _address(topk_weights, keep), w1.data_ptr(),
                                 w1_scale.data_ptr(), w2.data_ptr(), w2_scale.data_ptr(), _address(y, keep),
                                 ws.stream())
    return y


if HAS_CUSTOM_OP:
    @torch.library.custom_op("megamoe::fused_moe_fp8", mutates_args=())
    def _fused_moe_fp8_op(x: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor, w1: torch.Tensor,
                          w1_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                          x_scales: Optional[torch.Tensor], layer_id: int) -> torch.Tensor:
        return _fused_moe_fp8_forward(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, x_scales, layer_id)

    @_fused_moe_fp8_op.register_fake
    def _(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, x_scales, layer_id):
        _check_fp8_layer_call("fused_moe_fp8", layer_of(layer_id), x, topk_idx, topk_weights, w1, w1_scale, w2,
                              w2_scale, x_scales)
        return x.new_empty(x.shape, dtype=torch.bfloat16)

    _fused_moe_fp8_call = _fused_moe_fp8_op
else:
    _fused_moe_fp8_call = _fused_moe_fp8_forward


def fused_moe_fp8(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, workspace, x_scales=None):
    """The expert-parallel MoE layer in FP8 e4m3 on this rank, for inference: y [tokens, hidden] bf16, fused_moe's
    layer with its weights dequantised, on a workspace made with dtype="fp8". The argument names and layouts are
    megamoe.fp8's (quantize_experts, load_deepseek_experts and reference_moe_fp8 take and give the same):

    x: bf16 [tokens, hidden], which the layer quantises per token and 128 channels (quantize_fp8's codes and
    scales, bitwise), or e4m3 codes [tokens, hidden] (torch.uint8 or torch.float8_e4m3fn) with x_scales [tokens,
    hidden / 128]; topk_idx, topk_weights: as fused_moe's; w1: e4m3 codes [E/R, 2 * intermediate, hidden] (gate
    rows, then up rows) with w1_scale [E/R, 2 * intermediate / 128, hidden / 128], one per 128 x 128 block
    (dequantised = code * scale: a checkpoint's weight_scale_inv); w2: codes [E/R, hidden, intermediate] with
    w2_scale [E/R, hidden / 128, intermediate / 128]. Scales float32, or UE8M0 exponents (torch.uint8; decoded to
    float32 each call). All contiguous, on the workspace's device; hidden and intermediate multiples of 128 (and
    >= 256: the runtime's rule, met when the workspace was made). The layer: L1 in FP8 (fp32 accumulation), its
    output bf16, SwiGLU in fp32 written as bf16, act quantised per token and 128 channels, L2 in FP8, the rows
    summed in fp32 with topk_weights in pick order, y rounded to bf16 (megamoe.fp8.reference_moe_fp8 with
    swiglu="fp32"). No gradient: an input that requires grad under grad mode is an ArgumentError (run it under
    torch.no_grad() or torch.inference_mode())."""
    op = "fused_moe_fp8"
    H, I, E, K = check_fused_moe_fp8_args(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, workspace,
                                          x_scales)
    if torch.is_grad_enabled():
        wanting = [name for name, t in (("x", x), ("topk_weights", topk_weights), ("w1_scale", w1_scale),
                                        ("w2_scale", w2_scale), ("x_scales", x_scales))
                   if t is not None and t.requires_grad]
        if wanting:
            _fail(op, "%s require%s grad, but the FP8 layer is inference only (it has no backward): call it under "
                      "torch.no_grad() or torch.inference_mode(), or pass detached tensors" % (
                          " and ".join(wanting), "s" if len(wanting) == 1 else ""))
    bits = 64 if topk_idx.dtype == torch.int64 else 32
    layer = workspace.layer_for(H, I, E, K, False, bits, "fp8_e4m3")
    return _fused_moe_fp8_call(x, topk_idx, topk_weights, w1, w1_scale, w2, w2_scale, x_scales, layer.id)
