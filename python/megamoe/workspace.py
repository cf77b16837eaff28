"""A megamoe workspace for PyTorch: one per process and GPU, shared by every MoE layer of a model. Made from a
torch.distributed process group (the ranks' handles exchanged over it) or, without one, for one process and one GPU."""
import contextlib
import itertools
import os
import tempfile
import threading
import weakref

import torch

from . import _lib
from .kernels import layer_command, with_kernels

# layer id -> _Layer: what the custom op's integer argument names (see ops.py). Weak, and a layer's reference to its
# workspace is weak too: a workspace holds its layers, so dropping the last reference to a workspace frees it (and
# its device memory) at once, not at the next cyclic collection. A pending backward keeps its workspace itself.
_layers = weakref.WeakValueDictionary()
_ids = itertools.count(1)
_lock = threading.Lock()


def layer_of(layer_id):
    try:
        return _layers[layer_id]
    except KeyError:
        raise ValueError("megamoe: layer id %d names no live layer (its workspace was closed)" % layer_id) from None


# The dtype names a workspace takes -> the runtime's (_lib.DTYPES).
DTYPE_NAMES = {"bf16": "bf16", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3"}


def dtype_name(dtype, what="Workspace"):
    """The runtime's name ("bf16" or "fp8_e4m3") of a dtype given as "bf16", "fp8" or "fp8_e4m3"."""
    if not isinstance(dtype, str) or dtype not in DTYPE_NAMES:
        raise ValueError("%s: dtype must be 'bf16', 'fp8' or 'fp8_e4m3' (got %r)" % (what, dtype))
    return DTYPE_NAMES[dtype]


class _Layer:
    """One megamoe_layer on a workspace; its key (hidden, intermediate, experts, topk, training, topk_idx bits,
    dtype) says its shape, training or not, int32 or int64 topk_idx, bf16 or fp8_e4m3."""

    def __init__(self, workspace, handle, key, saved_bytes):
        self._workspace, self.handle, self.key, self.saved_bytes = weakref.ref(workspace), handle, key, saved_bytes
        with _lock:
            self.id = next(_ids)
            _layers[self.id] = self

    @property
    def workspace(self):
        ws = self._workspace()
        if ws is None:
            raise ValueError("megamoe: layer %d's workspace was dropped" % self.id)
        return ws


def _dist():
    import torch.distributed as dist
    return dist


class Workspace:
    """The symmetric heap and working buffers of this rank, sized for layers up to (hidden, intermediate, topk) with
    the same experts, at up to max_tokens tokens per rank and call.

    group: a torch.distributed process group (None: the default group when one is initialised, else one process on
    one GPU); every rank of it makes its workspace with the same arguments, and its ranks are the expert-parallel
    ranks (rank r owns experts [r E/R, (r+1) E/R)). The handles are exchanged over the group (all_gather_into_tensor;
    a CUDA tensor on an NCCL group, a CPU one on gloo), then the ranks meet (a barrier) before the first layer call.
    training: the workspace serves training layers (it holds their dh buffer); None (the default): True in bf16,
    False in FP8; sm_budget: SMs of this rank's kernels (even; 0: MEGAMOE_SM_BUDGET, else every SM);
    receive_capacity, drop_overflow, dedup_tokens, swiglu_clamp_milli: as in megamoe_layer_config
    (runtime/include/megamoe/MoeLayer.h). dtype: "bf16" (fused_moe) or "fp8" / "fp8_e4m3" (fused_moe_fp8: e4m3
    weights with 128 x 128 block scales, inference only, no dedup_tokens, hidden and intermediate >= 256); every
    layer on the workspace has its dtype, and what the runtime refuses of a combination is its MegamoeError. All
    layer calls run on torch's current stream, and must be ordered on one stream. close() (or `with`)
    synchronises, meets the ranks and frees the workspace.

    Threads: every call that enters a layer handle (fused_moe's forward and backward, check_errors, dropped_picks,
    making a layer) holds the workspace against close(), and calls from several threads are serialised by the
    workspace's lock; they must still be issued in a consistent order on one stream (and, over a group, in the same
    order on every rank). close() waits until no call is in flight, then frees the workspace; a call after it (or
    one that starts once close() has marked it closed) raises RuntimeError("megamoe: the workspace is closed")."""

    def __init__(self, hidden, intermediate, experts, topk, max_tokens, group=None, training=None, sm_budget=0,
                 receive_capacity=0, dedup_tokens=False, swiglu_clamp_milli=0, device=None, backend=None,
                 drop_overflow=False, dtype="bf16",
                 _host_tensors=False):
        self.dtype = dtype_name(dtype)
        if training is None:
            training = self.dtype == "bf16"
        dist = _dist() if torch.distributed.is_available() else None
        if group is None and dist is not None and dist.is_initialized():
            group = dist.group.WORLD
        self.group = group
        self.rank = dist.get_rank(group) if group is not None else 0
        self.ranks = dist.get_world_size(group) if group is not None else 1
        if self.ranks > _lib.MAX_RANKS:
            raise ValueError("Workspace: the group has %d ranks, above the most a workspace spans (%d)" % (
                self.ranks, _lib.MAX_RANKS))
        self.backend = backend or ("hip" if getattr(torch.version, "hip", None) else "cuda")
        # _host_tensors (the CPU test tier only): the fake HIP backend's "device memory" is host memory, so the
        # layer calls take CPU tensors there and run on the default stream.
        self._host_tensors = _host_tensors
        if _host_tensors:
            self.device = torch.device("cpu")
            ordinal = _lib.index_in("device ordinal", device or 0, _lib.INT32)
        else:
            _lib.require_gpu_torch("Workspace")
            if device is None:
                device = torch.device("cuda", torch.cuda.current_device())
            self.device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
            if self.device.type != "cuda":
                raise ValueError("Workspace: device must be a CUDA device (got %s)" % self.device)
            ordinal = self.device.index if self.device.index is not None else torch.cuda.current_device()
            self.device = torch.device("cuda", ordinal)  # tensors' devices carry their index: compare like with like
        self.lib = _lib.Library.get()
        self.shape = dict(hidden=hidden, intermediate=intermediate, experts=experts, topk=topk)
        self.max_tokens = _lib.index_in("max_tokens", max_tokens)
        self.training = bool(training)
        self.options = dict(sm_budget=sm_budget, receive_capacity=receive_capacity, dedup_tokens=int(dedup_tokens),
                            drop_overflow=int(drop_overflow),
                            swiglu_clamp_milli=swiglu_clamp_milli)
        self.config = self._config(training=int(training), **self.shape)
        self.runtime = _lib.Runtime(self.backend, ordinal, self.lib)
        self.layers = {}
        self.handle = None
        # _call(): _state guards _callers and _closed (close() waits on it); _serial serialises the calls.
        self._state = threading.Condition(threading.Lock())
        self._serial = threading.RLock()
        self._callers = {}  # thread id -> its calls in flight; close() waits for none, and refuses from inside one
        self._closed = False
        self.handle = self._create()
        # The layers of the workspace's own shape, made now: a compiled graph then only looks them up.
        for training_layer in ((False, True) if self.training else (False,)):
            for idx_bits in (32, 64):
                self.layer(training=training_layer, topk_idx_bits=idx_bits, **self.shape)

    def _config(self, hidden, intermediate, experts, topk, training=0, topk_idx_bits=0, dtype=None):
        return _lib.LayerConfig(hidden=hidden, intermediate=intermediate, experts=experts, topk=topk,
                                max_tokens=self.max_tokens, training=training,
                                dtype=_lib.DTYPES[dtype or self.dtype], topk_idx_bits=topk_idx_bits, **self.options)

    def _create(self):
        rt, cfg = self.runtime, self.config
        if self.ranks == 1:
            return _lib.WorkspaceHandle.create(rt, cfg, 0, 1, None)
        dist = _dist()
        handle, error, digest = None, None, None
        try:
            if _lib.WorkspaceHandle.exchange_supported(self.lib):
                handle = _lib.WorkspaceHandle.join_through(rt, cfg, self.rank, self.ranks, self._all_gather)
            else:
                # A library without the caller-exchanged rendezvous: the ranks meet at a socket path rank 0 names.
                path = [os.path.join(tempfile.gettempdir(), "megamoe-ws-%d-%d.sock" % (os.getpid(), id(self)))]
                dist.broadcast_object_list(path, src=dist.get_global_rank(self.group, 0) if hasattr(
                    dist, "get_global_rank") else 0, group=self.group)
                handle = _lib.WorkspaceHandle.create(rt, cfg, self.rank, self.ranks, path[0])
            digest = handle.group_digest()
        except Exception as e:  # every rank must still reach the exchange below, or its peers wait there forever
            error = e
        self._agree(handle, error, digest)
        self._barrier()
        return handle

    def _agree(self, handle, error, digest):
        """Every rank's (joined, error message, group digest), all-gathered over the group: a rank that failed to
        join, or ranks that joined different groups, make every rank raise MegamoeError naming them."""
        dist = _dist()
        mine = (error is None, "" if error is None else (getattr(error, "message", None) or str(error)), digest)
        everyone = [None] * self.ranks
        try:
            dist.all_gather_object(everyone, mine, group=self.group)
        except Exception:
            if error is not None:
                raise error
            raise
        failed = [(r, message) for r, (ok, message, _) in enumerate(everyone) if not ok]
        problem = None
        if failed:
            problem = "rank%s %s failed to join the workspace: %s" % (
                "s" if len(failed) > 1 else "", ", ".join(str(r) for r, _ in failed),
                "; ".join("rank %d: %s" % (r, m) for r, m in failed))
        else:
            by_digest = {}
            for r, (_, _, d) in enumerate(everyone):
                by_digest.setdefault(d, []).append(r)
            if len([d for d in by_digest if d is not None]) > 1:
                problem = "the ranks joined different groups: %s" % "; ".join(
                    "rank%s %s: digest %s" % ("s" if len(rs) > 1 else "", ", ".join(map(str, rs)),
                                              "unknown" if d is None else "%016x" % d)
                    for d, rs in by_digest.items())
        if problem is None:
            return
        if handle is not None:
            try:
                handle.destroy()
            except Exception:
                pass
        status = getattr(error, "status", _lib.RENDEZVOUS)
        raise _lib.MegamoeError(status, problem) from error

    def _all_gather(self, mine):
        """Every rank's handle bytes, in rank order: all_gather_into_tensor of a uint8 tensor (a CUDA one on an NCCL
        group, a CPU one otherwise); a backend without it (gloo on an older torch) gathers into a list instead."""
        dist = _dist()
        on_cuda = dist.get_backend(self.group) == "nccl"
        dev = self.device if on_cuda else torch.device("cpu")
        local = torch.tensor(list(mine), dtype=torch.uint8, device=dev)
        try:
            out = torch.empty(len(mine) * self.ranks, dtype=torch.uint8, device=dev)
            dist.all_gather_into_tensor(out, local, group=self.group)
        except (AttributeError, RuntimeError, NotImplementedError):
            if on_cuda:
                raise
            parts = [torch.empty_like(local) for _ in range(self.ranks)]
            dist.all_gather(parts, local, group=self.group)
            out = torch.cat(parts)
        return bytes(out.cpu().tolist())

    def _barrier(self):
        dist = _dist()
        if dist.get_backend(self.group) == "nccl":
            dist.barrier(group=self.group, device_ids=[self.device.index])
        else:
            dist.barrier(group=self.group)

    @contextlib.contextmanager
    def _call(self):
        """Held around every call that enters this workspace's handles: close() waits for it to leave. Calls are
        serialised (an RLock: a call may nest another on its thread). RuntimeError when the workspace is closed."""
        with self._state:
            if self._closed or self.handle is None:
                raise RuntimeError("megamoe: the workspace is closed")
            me = threading.get_ident()
            self._callers[me] = self._callers.get(me, 0) + 1
        try:
            with self._serial:
                yield
        finally:
            with self._state:
                self._callers[me] -= 1
                if not self._callers[me]:
                    del self._callers[me]
                if not self._callers:
                    self._state.notify_all()

    def layer(self, hidden, intermediate, experts, topk, training, topk_idx_bits=32, dtype=None):
        """The layer of that shape on this workspace (made once): a _Layer with its handle, id and saved bytes.
        dtype: "bf16", "fp8" or "fp8_e4m3"; None, the workspace's (the runtime refuses any other)."""
        dtype = dtype_name(dtype, "Workspace.layer") if dtype is not None else self.dtype
        key = (hidden, intermediate, experts, topk, bool(training), topk_idx_bits, dtype)
        if key in self.layers:
            return self.layers[key]
        if self.handle is None:
            raise RuntimeError("megamoe: the workspace is closed")
        if training and not self.training:
            raise ValueError("megamoe: a training layer needs a workspace made with training=True")
        cfg = self._config(hidden, intermediate, experts, topk, int(training), topk_idx_bits, dtype)
        command = layer_command(hidden, intermediate, experts, topk, self.ranks, self.runtime.target, dtype)
        what = "the %sMoE layer hidden=%d intermediate=%d experts=%d topk=%d at %d ranks" % (
            "FP8 " if dtype != "bf16" else "", hidden, intermediate, experts, topk, self.ranks)
        with self._call():
            if key in self.layers:  # another thread made it meanwhile
                return self.layers[key]
            handle = with_kernels(lambda: _lib.LayerHandle.create_on(self.handle, cfg), command, what)
            saved = self.lib.saved_bytes(cfg, self.ranks) if training else 0
            self.layers[key] = _Layer(self, handle, key, saved)
            return self.layers[key]

    def layer_for(self, hidden, intermediate, experts, topk, training, topk_idx_bits, dtype=None):
        """A pure lookup (what a compiled graph runs): the layer must have been made (layer(), or the workspace's
        own shape, or an MoeExperts module on it). dtype: the runtime's name; None, the workspace's."""
        if self._closed:
            raise RuntimeError("megamoe: the workspace is closed")
        dtype = dtype or self.dtype
        try:
            return self.layers[(hidden, intermediate, experts, topk, training, topk_idx_bits, dtype)]
        except KeyError:
            raise ValueError("megamoe: no layer hidden=%d intermediate=%d experts=%d topk=%d (training %s, %s) on "
                             "this workspace (dtype %s); make it first with workspace.layer(...) or an MoeExperts "
                             "module" % (hidden, intermediate, experts, topk, training, dtype, self.dtype)) from None

    def bytes(self):
        """(heap bytes, buffer bytes) of this rank's workspace."""
        return self.lib.workspace_bytes(self.config, self.ranks)

    def stream(self):
        if self._host_tensors:
            return 0
        return torch.cuda.current_stream(self.device).cuda_stream

    def _any_layer(self):
        # The layers share the workspace's heap and its error record: any one of them reads it. Called in _call().
        for layer in self.layers.values():
            return layer
        raise RuntimeError("megamoe: the workspace is closed")

    def check_errors(self):
        """Synchronises torch's current stream and raises MegamoeError naming the first device error."""
        with self._call():
            self._any_layer().handle.check_errors(self.stream())

    def dropped_picks(self):
        """Picks past the receive capacity this rank's forwards dropped so far (drop_overflow=True); synchronises
        torch's current stream."""
        with self._call():
            return self._any_layer().handle.dropped_picks(self.stream())

    def close(self):
        """Waits until no call is in flight (every thread's), marks the workspace closed, synchronises, meets the
        ranks (a barrier over the group), then frees the layers and the workspace."""
        state = getattr(self, "_state", None)
        if state is None:  # __init__ failed before the lock was made
            return
        with state:
            if threading.get_ident() in self._callers:
                raise RuntimeError("megamoe: close() was called from inside a call on this workspace (a hook or "
                                   "callback of that call): it would wait for that call to end, forever; close it "
                                   "after the call returns")
            while self._callers:
                state.wait()
            if self._closed or self.handle is None:
                return
            self._closed = True
        if not self._host_tensors:
            torch.cuda.synchronize(self.device)
        if self.ranks > 1:
            self._barrier()
        with _lock:
            for layer in self.layers.values():
                _layers.pop(layer.id, None)
        for layer in self.layers.values():
            layer.handle.destroy()
        self.layers = {}
        self.handle.destroy()
        self.handle = None
        self.runtime.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __deepcopy__(self, memo):
        # One per process and GPU, shared by every layer: a deep copy of a model (EMA, teacher) shares it too.
        return self

    def __reduce__(self):
        raise TypeError("megamoe.Workspace cannot be pickled: it holds device memory mapped into its peers; save the "
                        "model's state_dict and make a workspace where it is loaded")

    def __del__(self):
        # One rank frees itself; several ranks must close() together (a peer may still write into this heap).
        try:
            if self.handle is not None and self.ranks == 1:
                self.close()
        except Exception:
            pass
