"""libmegamoe as the bench drives it, through the package's bindings (megamoe._lib, the one copy of the C ABI's
structures): Megamoe, the runtime of torch's current device (kernels, tensor maps, launches on torch's stream);
Layer, one rank's megamoe_layer; the ABI's leg and stage codes they take, and the statuses after which the layer is
unusable."""
import torch

from .. import _lib
from ..kernels import layer_command, with_kernels


class Megamoe:
    """The runtime of torch's current device through the package's bindings, taking torch tensors."""

    def __init__(self, path):
        self.lib = _lib.Library.get(path)
        self.runtime = _lib.Runtime("cuda", torch.cuda.current_device(), self.lib)

    def kernel(self, name, spec):
        return self.runtime.kernel(name, spec)

    def split_scratch_bytes(self, grid):
        """(bytes, leading bytes that must be zero) of a grouped_gemm_*_tma split scratch for `grid` blocks."""
        return self.lib.split_scratch_bytes(grid)

    def tensor_map(self, kernel, arg, tensor, rows, cols):
        """The CUtensorMap for tensor-map argument `arg` of `kernel` over `tensor` as a row-major [rows, cols]
        matrix, in the box the kernel's declaration gives (_lib.Runtime.tensor_map)."""
        return self.runtime.tensor_map(kernel, arg, tensor.data_ptr(), rows, cols)

    def launch(self, kernel, grid, /, **args):  # positional-only: the grouped GEMMs declare a "grid" argument
        """Launches on torch's current stream with arguments by their declared names (_lib.Runtime.launch)."""
        self.runtime.launch(kernel, grid, torch.cuda.current_stream().cuda_stream, **args)


LEGS = {"fused": 0, "comm": 1, "gemm": 2}  # MEGAMOE_LEG_FUSED, _COMM_ONLY, _GEMM_ONLY
STAGES = {"dispatch": 1, "combine": 2}  # MEGAMOE_STAGE_DISPATCH_GEMM, _GEMM_COMBINE (of MEGAMOE_STAGE_COUNT = 3)
# MEGAMOE_BACKWARD_STAGE_*: every stage of one backward; the fused ones (a dispatch or a combine in the GEMM).
BACKWARD_STAGES = {"dgrad_dispatch": 0, "swiglu_backward": 1, "wgrad_w2": 2, "wgrad_w1_dispatch": 3,
                   "dgrad_combine": 4}
FUSED_BACKWARD = ("dgrad_dispatch", "wgrad_w1_dispatch", "dgrad_combine")
MegamoeError = _lib.MegamoeError
FATAL = _lib.FATAL  # MEGAMOE_ERROR_DEVICE, MEGAMOE_ERROR_HEAP_UNUSABLE: the layer is unusable afterwards


class Layer:
    """One rank's megamoe_layer with a workspace of its own (the package's _lib.LayerHandle); every call on torch's
    current stream, on torch tensors."""

    def __init__(self, mm, cfg, rank, world, rendezvous_path):
        # A cache miss names the megamoe-cache command of the whole layer (or compiles it where the compiler is).
        command = layer_command(cfg["hidden"], cfg["intermediate"], cfg["experts"], cfg["topk"], world,
                                mm.runtime.target)
        self.handle = with_kernels(lambda: _lib.LayerHandle.create(mm.runtime, _lib.LayerConfig(**cfg), rank, world,
                                                                   rendezvous_path), command, "megamoe-bench layer")

    @staticmethod
    def stream():
        return torch.cuda.current_stream().cuda_stream

    def forward(self, x, idx, wts, w1, w2, y, check=False):
        self.handle.forward(x.data_ptr(), x.shape[0], idx.data_ptr(), wts.data_ptr(), w1.data_ptr(), w2.data_ptr(),
                            y.data_ptr(), self.stream())
        if check:
            self.check_errors()

    def backward(self, dy, x, idx, wts, w1, w2, dx, dwts, dw1, dw2, check=False):
        """The backward of the last forward (same x, idx, wts, w1, w2): dx, d_topk_weights, dW1, dW2 written."""
        self.handle.backward(dy.data_ptr(), x.data_ptr(), x.shape[0], idx.data_ptr(), wts.data_ptr(), w1.data_ptr(),
                             w2.data_ptr(), dx.data_ptr(), dwts.data_ptr(), dw1.data_ptr(), dw2.data_ptr(),
                             self.stream())
        if check:
            self.check_errors()

    def check_errors(self):
        self.handle.check_errors(self.stream())

    def set_legs(self, dispatch, combine):
        self.handle.set_legs(dispatch, combine)

    def set_profiling(self, on):
        self.handle.set_profiling(on)

    def set_plain(self):
        """As a model runs it: both operators fused, no per-stage profiling."""
        self.set_legs(LEGS["fused"], LEGS["fused"])
        self.set_profiling(False)

    def stage_ms(self):
        return self.handle.stage_ms()

    def backward_stage_ms(self):
        return self.handle.backward_stage_ms()

    @property
    def sm_budget(self):
        return self.handle.sm_budget()

    def activation_bytes(self):
        return self.handle.activation_bytes()

    def kept_bytes(self):
        """What the training forward keeps for the backward; without recomputation; the difference (dispatched x)."""
        kept, without = self.handle.kept_bytes()
        return {"kept": kept, "kept_without_recompute": without, "dispatched_x": without - kept}

    def destroy(self):
        self.handle.destroy()
