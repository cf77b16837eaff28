"""The C ABI of libmegamoe (runtime/include/megamoe/megamoe.h) through ctypes: the one copy of its structures and
signatures in the repository. Everything here takes device addresses and streams as Python integers and knows
nothing of torch, so that it runs (and is tested) against the fake HIP backend on a machine without a GPU."""
import ctypes
import ctypes.util
import operator
import os
import sys
import threading

# Status codes (megamoe.h MEGAMOE_ERROR_*).
OK = 0
INVALID_ARGUMENT = 1
DRIVER_NOT_FOUND = 2
DRIVER = 3
KERNEL_NOT_FOUND = 4
BAD_METADATA = 5
RENDEZVOUS = 6
TIMEOUT = 7
DEVICE = 8
HEAP_UNUSABLE = 9
INVALID_ENV = 10
UNSUPPORTED = 11
INTERNAL = 12
STALE_KERNEL = 13
FATAL = (DEVICE, HEAP_UNUSABLE)  # the layer or heap is unusable afterwards

ARG_PTR, ARG_I32, ARG_I64, ARG_CONTEXT, ARG_TENSOR_MAP = range(5)  # MEGAMOE_ARG_*
LOG_LEVELS = {"off": 0, "error": 1, "warn": 2, "info": 3, "debug": 4}  # MEGAMOE_LOG_*
STAGE_COUNT = 3           # MEGAMOE_STAGE_COUNT
BACKWARD_STAGE_COUNT = 5  # MEGAMOE_BACKWARD_STAGE_COUNT
MAX_RANKS = 8             # MEGAMOE_MAX_RANKS
# The options text megamoe-cache generates each target's kernels with (runtime/src/KernelLoader.cpp
# defaultTargetOptions); a backend's kernels are of one target.
TARGET_OF_BACKEND = {"cuda": "sm_90a", "hip": "gfx950"}


class MegamoeError(RuntimeError):
    """A failed C ABI call: `status` is the MEGAMOE_ERROR_* code, the message is megamoe_last_error()'s."""

    def __init__(self, status, message):
        super().__init__("megamoe: " + message)
        self.status = status
        self.message = message


class Spec(ctypes.Structure):  # megamoe_spec_entry
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_int64)]


class Key(ctypes.Structure):  # megamoe_kernel_key
    _fields_ = [("kernel", ctypes.c_char_p), ("spec", ctypes.POINTER(Spec)), ("spec_count", ctypes.c_size_t),
                ("target", ctypes.c_char_p), ("options", ctypes.c_char_p), ("fingerprint", ctypes.c_char_p)]


class Dims(ctypes.Structure):  # megamoe_launch_dims
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("cluster", ctypes.c_uint32 * 3),
                ("shared_bytes", ctypes.c_uint32)]


# megamoe_layer_config.dtype (megamoe.h MEGAMOE_DTYPE_*) by the runtime's names (runtime/src/LayerRules.h dtypeName).
DTYPES = {"bf16": 0, "fp8_e4m3": 1}

CONFIG_FIELDS = ("hidden", "intermediate", "experts", "topk", "max_tokens", "swiglu_clamp_milli", "training", "dtype",
                 "dedup_tokens", "sm_budget", "receive_capacity", "topk_idx_bits", "drop_overflow")


INT32 = (-2 ** 31, 2 ** 31)
INT64 = (-2 ** 63, 2 ** 63)


def index_in(what, value, bounds=INT64):
    """value as a Python int through operator.index (ints, bools, numpy's and torch's integers; not floats, which
    int() would truncate), in [lo, hi) of bounds (default the int64 range): ctypes would wrap a value out of its
    C type's range silently (2^64 + 512 as int64 is 512). TypeError / ValueError naming `what` otherwise."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError("megamoe: %s must be an integer (got %r, a %s)" % (what, value, type(value).__name__)) \
            from None
    lo, hi = bounds
    if not lo <= number < hi:
        raise ValueError("megamoe: %s=%d is out of range: it must be in [%d, %d)" % (what, number, lo, hi - 1))
    return number


class LayerConfig(ctypes.Structure):
    """megamoe_layer_config; struct_size is always this Structure's size (megamoe.h: "Growing structs"). Every
    field is taken through index_in (an integer in the int64 range; TypeError / ValueError naming the field)."""
    _fields_ = [("struct_size", ctypes.c_size_t)] + [(name, ctypes.c_int64) for name in CONFIG_FIELDS]

    def __init__(self, **fields):
        super().__init__(struct_size=ctypes.sizeof(LayerConfig),
                         **{k: index_in("LayerConfig." + k, v) for k, v in fields.items()})

    def as_dict(self):
        return {name: getattr(self, name) for name in CONFIG_FIELDS}


class Model(ctypes.Structure):
    """megamoe_model: one row of the model table (compiler/abi/Models.h, read through megamoe_model_get)."""
    _fields_ = [("struct_size", ctypes.c_size_t), ("name", ctypes.c_char_p), ("source", ctypes.c_char_p)] + \
        [(name, ctypes.c_int64) for name in ("hidden", "intermediate", "experts", "topk", "ep", "shared_experts",
                                              "shared_intermediate")] + \
        [("lacks", ctypes.c_uint64), ("lacks_names", ctypes.c_char_p), ("refusal", ctypes.c_char_p)]


LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

_vp, _u64, _i64, _i32, _sz = ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int, ctypes.c_size_t
_P = ctypes.POINTER
_cfg = _P(LayerConfig)
# Every function the package calls: (restype, argtypes). Functions a library may lack (one older than the header
# that declared them) are bound when present; Library.has() says which.
SIGNATURES = {
    "megamoe_version": (ctypes.c_char_p, []),
    "megamoe_last_error": (ctypes.c_char_p, []),
    "megamoe_status_name": (ctypes.c_char_p, [_i32]),
    "megamoe_set_log_level": (_i32, [_i32]),
    "megamoe_get_log_level": (_i32, [_P(_i32)]),
    "megamoe_set_log_callback": (_i32, [LOG_CALLBACK, _vp]),
    "megamoe_runtime_create": (_i32, [ctypes.c_char_p, _i32, _P(_vp)]),
    "megamoe_runtime_destroy": (_i32, [_vp]),
    "megamoe_device_count": (_i32, [ctypes.c_char_p, _P(_i32)]),
    "megamoe_model_count": (_i32, [_P(_sz)]),
    "megamoe_model_get": (_i32, [_sz, _P(Model)]),
    "megamoe_kernel_load": (_i32, [_vp, _P(Key), ctypes.c_char_p, _P(_vp)]),
    "megamoe_kernel_info": (_i32, [_vp, _P(_i32), _P(_i32)]),
    "megamoe_kernel_arg_count": (_i32, [_vp, _P(_sz)]),
    "megamoe_kernel_arg": (_i32, [_vp, _sz, _P(ctypes.c_char_p), _P(_i32), _P(ctypes.c_char_p)]),
    "megamoe_split_scratch_bytes": (_i32, [_i64, _P(_u64), _P(_u64)]),
    "megamoe_launch": (_i32, [_vp, _vp, _P(Dims), _vp, _P(_vp), _vp]),
    "megamoe_tensor_map_bf16": (_i32, [_vp, _u64, _i32, _P(_u64), _P(_u64), _P(ctypes.c_uint32), _vp]),
    "megamoe_kernel_tensor_map": (_i32, [_vp, ctypes.c_char_p, _u64, _i64, _i64, _vp]),
    "megamoe_workspace_bytes": (_i32, [_cfg, _sz, _P(_u64), _P(_u64)]),
    "megamoe_layer_saved_bytes": (_i32, [_cfg, _sz, _P(_u64)]),
    "megamoe_workspace_create": (_i32, [_vp, _cfg, _i32, _i32, ctypes.c_char_p, _P(_vp)]),
    "megamoe_workspace_create_local": (_i32, [_P(_vp), _sz, _cfg, _P(_vp)]),
    "megamoe_workspace_destroy": (_i32, [_vp]),
    "megamoe_workspace_handle_size": (_sz, []),
    "megamoe_workspace_prepare": (_i32, [_vp, _cfg, _i32, _i32, _P(_vp)]),
    "megamoe_workspace_export": (_i32, [_vp, _vp, _sz]),
    "megamoe_workspace_join": (_i32, [_vp, _vp, _sz, _P(_vp)]),
    "megamoe_workspace_pending_destroy": (_i32, [_vp]),
    "megamoe_workspace_group_digest": (_i32, [_vp, _P(_u64)]),
    "megamoe_layer_create": (_i32, [_vp, _cfg, _i32, _i32, ctypes.c_char_p, _P(_vp)]),
    "megamoe_layer_create_on": (_i32, [_vp, _cfg, _P(_vp)]),
    "megamoe_layer_destroy": (_i32, [_vp]),
    "megamoe_layer_forward": (_i32, [_vp, _u64, _i64, _u64, _u64, _u64, _u64, _u64, _vp]),
    "megamoe_layer_backward": (_i32, [_vp, _u64, _u64, _i64, _u64, _u64, _u64, _u64, _u64, _u64, _u64, _u64, _vp]),
    "megamoe_layer_forward_saved": (_i32, [_vp, _u64, _i64, _u64, _u64, _u64, _u64, _u64, _u64, _vp]),
    "megamoe_layer_forward_fp8": (_i32, [_vp, _u64, _u64, _i64, _u64, _u64, _u64, _u64, _u64, _u64, _u64, _vp]),
    "megamoe_layer_backward_saved": (_i32, [_vp, _u64, _u64, _i64, _u64, _u64, _u64, _u64, _u64, _u64, _u64, _u64,
                                            _u64, _vp]),
    "megamoe_layer_set_legs": (_i32, [_vp, _i32, _i32]),
    "megamoe_layer_set_profiling": (_i32, [_vp, _i32]),
    "megamoe_layer_stage_ms": (_i32, [_vp, _P(ctypes.c_float)]),
    "megamoe_layer_backward_stage_ms": (_i32, [_vp, _P(ctypes.c_float)]),
    "megamoe_layer_activation_bytes": (_i32, [_vp, _P(_u64)]),
    "megamoe_layer_kept_bytes": (_i32, [_vp, _P(_u64), _P(_u64)]),
    "megamoe_layer_sm_budget": (_i32, [_vp, _P(_i32)]),
    "megamoe_layer_check_errors": (_i32, [_vp, _vp]),
    "megamoe_layer_dropped_picks": (_i32, [_vp, _vp, _P(_u64)]),
}


def env_choice(name, default, allowed):
    """$name, which must be one of `allowed` (strings), else MegamoeError(INVALID_ENV) in the runtime's words."""
    value = os.environ.get(name, default)
    if value not in allowed:
        raise MegamoeError(INVALID_ENV, "%s='%s' is invalid: expected %s (default %s)" % (
            name, value, " or ".join(allowed), default))
    return value


def require_gpu_torch(what):
    """MegamoeError(UNSUPPORTED) unless this PyTorch was built for CUDA or ROCm: megamoe's layers and ops run on
    GPU tensors (a CPU-only torch would fail later in torch.cuda with a bare AssertionError)."""
    import torch
    if getattr(torch.version, "cuda", None) is None and getattr(torch.version, "hip", None) is None:
        raise MegamoeError(UNSUPPORTED, "%s needs a CUDA or ROCm build of PyTorch; this torch %s is built for the "
                                        "CPU only" % (what, torch.__version__))


def _here():
    return os.path.dirname(os.path.abspath(__file__))


def library_candidates():
    """Where libmegamoe.so is looked for, in order: $MEGAMOE_LIB; beside the package (a copy installed with it);
    the build folders of the source tree the package sits in or was installed from (README: scripts/setup.sh builds
    build/, the LLVM-free build build-rt/); the lib folder of an installed prefix (cmake --install) above the
    package; then the dynamic loader's own search (LD_LIBRARY_PATH, ldconfig)."""
    if os.environ.get("MEGAMOE_LIB"):
        return [os.environ["MEGAMOE_LIB"]]  # the one asked for, never another in its place
    out = []
    here = _here()
    out.append(os.path.join(here, "libmegamoe.so"))
    roots = [os.path.normpath(os.path.join(here, "..", ".."))]
    try:
        from . import _source_tree  # written by setup.py at install time: the tree it was installed from
        roots.append(_source_tree.ROOT)
    except ImportError:
        pass
    build = os.environ.get("MEGAMOE_BUILD_DIR", "build")
    for root in roots:
        for folder in dict.fromkeys((build, "build", "build-rt")):
            out.append(os.path.join(root, folder, "lib", "libmegamoe.so"))
    # <prefix>/lib/pythonX.Y/site-packages/megamoe -> <prefix>/lib
    out.append(os.path.normpath(os.path.join(here, "..", "..", "..", "libmegamoe.so")))
    out.append(os.path.join(sys.prefix, "lib", "libmegamoe.so"))
    return list(dict.fromkeys(out))


class Library:
    """libmegamoe.so, loaded once per process (Library.get()); check() turns a status into MegamoeError."""

    _instance = None
    _lock = threading.Lock()

    def __init__(self, path=None):
        tried = []
        self.lib = None
        asked = path or os.environ.get("MEGAMOE_LIB")  # a library named by the caller: it, or an error naming it
        for candidate in ([asked] if asked else library_candidates()):
            if not os.path.exists(candidate):
                tried.append(candidate + " (no such file)")
                continue
            try:
                lib = ctypes.CDLL(candidate)
            except OSError as e:
                tried.append("%s (%s)" % (candidate, e))
                continue
            if getattr(lib, "megamoe_version", None) is None or getattr(lib, "megamoe_last_error", None) is None:
                tried.append("%s (not libmegamoe: it has no megamoe_version / megamoe_last_error)" % candidate)
                continue
            self.lib, self.path = lib, candidate
            break
        if self.lib is None and asked:
            raise OSError("megamoe: %s cannot be loaded: %s" % (
                "the library asked for" if path else "the library MEGAMOE_LIB names", tried[0]))
        if self.lib is None:
            try:
                self.lib = ctypes.CDLL("libmegamoe.so.0")
                self.path = "libmegamoe.so.0 (the dynamic loader's search)"
            except OSError as e:
                tried.append("libmegamoe.so.0 through the dynamic loader (%s)" % e)
        if self.lib is None:
            raise OSError("megamoe: libmegamoe.so not found; tried: %s. Build it with scripts/setup.sh (or "
                          "`cmake -S . -B build-rt -DMEGAMOE_WITH_COMPILER=OFF && cmake --build build-rt`), or set "
                          "MEGAMOE_LIB to its path" % "; ".join(tried))
        self.missing = []
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(self.lib, name, None)
            if fn is None:
                self.missing.append(name)
                continue
            fn.restype, fn.argtypes = restype, argtypes
        self._log_callback = None  # kept alive while installed

    @classmethod
    def get(cls, path=None):
        with cls._lock:
            if cls._instance is None or (path and cls._instance.path != path):
                cls._instance = Library(path)
            return cls._instance

    def has(self, name):
        return name not in self.missing

    def check(self, status):
        if status != OK:
            raise MegamoeError(status, self.lib.megamoe_last_error().decode(errors="replace"))

    def call(self, name, *args):
        if not self.has(name):
            raise MegamoeError(UNSUPPORTED, "%s: not in %s (a library older than this package)" % (name, self.path))
        self.check(getattr(self.lib, name)(*args))

    def version(self):
        return self.lib.megamoe_version().decode()

    def status_name(self, status):
        return self.lib.megamoe_status_name(status).decode()

    def set_log_level(self, level):
        """level: a name of LOG_LEVELS or its number."""
        self.call("megamoe_set_log_level", LOG_LEVELS[level] if isinstance(level, str) else
                  index_in("log level", level, INT32))

    def log_level(self):
        level = ctypes.c_int()
        self.call("megamoe_get_log_level", ctypes.byref(level))
        return level.value

    def set_log_callback(self, fn):
        """fn(level: int, message: str), or None for the default sink (stderr)."""
        if fn is None:
            self.call("megamoe_set_log_callback", ctypes.cast(None, LOG_CALLBACK), None)
            self._log_callback = None
            return
        cb = LOG_CALLBACK(lambda level, message, user: fn(level, message.decode(errors="replace")))
        self.call("megamoe_set_log_callback", cb, None)
        self._log_callback = cb

    def device_count(self, backend=None):
        n = ctypes.c_int()
        self.call("megamoe_device_count", backend.encode() if backend else None, ctypes.byref(n))
        return n.value

    def models(self):
        """The model table, in its order: a dict per model with name, source (its Hugging Face repository), hidden,
        intermediate, experts, topk, ep, shared_experts, shared_intermediate, lacks (the names of what the layer
        does not do for it) and refusal ("" when the layer runs its routed experts at ep ranks, else the rule)."""
        count = ctypes.c_size_t()
        self.call("megamoe_model_count", ctypes.byref(count))
        rows = []
        for i in range(count.value):
            m = Model(struct_size=ctypes.sizeof(Model))
            self.call("megamoe_model_get", ctypes.c_size_t(i), ctypes.byref(m))
            row = {name: getattr(m, name) for name, _ in Model._fields_ if name not in ("struct_size", "lacks")}
            for text in ("name", "source", "lacks_names", "refusal"):
                row[text] = row[text].decode()
            row["lacks"] = [n for n in row.pop("lacks_names").split(",") if n]
            rows.append(row)
        return rows

    def workspace_bytes(self, config, ranks):
        """(heap bytes, buffer bytes) of one rank's workspace for layers up to `config` at `ranks` ranks."""
        heap, buffers = ctypes.c_uint64(), ctypes.c_uint64()
        self.call("megamoe_workspace_bytes", ctypes.byref(config), index_in("ranks", ranks, INT32), ctypes.byref(heap),
                  ctypes.byref(buffers))
        return heap.value, buffers.value

    def saved_bytes(self, config, ranks):
        """Bytes of the saved state one training forward of a layer of `config` writes (0 without training)."""
        n = ctypes.c_uint64()
        self.call("megamoe_layer_saved_bytes", ctypes.byref(config), index_in("ranks", ranks, INT32), ctypes.byref(n))
        return n.value

    def split_scratch_bytes(self, grid):
        """(bytes, leading bytes that must be zero) of a grouped_gemm_*_tma split scratch for `grid` blocks."""
        total, zeroed = ctypes.c_uint64(), ctypes.c_uint64()
        self.call("megamoe_split_scratch_bytes", index_in("grid", grid), ctypes.byref(total), ctypes.byref(zeroed))
        return total.value, zeroed.value


class Kernel:
    """A loaded kernel: its handle, block threads, shared bytes and declared arguments [(name, kind)]."""

    def __init__(self, handle, name, spec, threads, shared, signature):
        self.handle, self.name, self.spec = handle, name, spec
        self.threads, self.shared, self.signature = threads, shared, signature


def generate_command(name, spec, target):
    """The megamoe-cache command that builds one kernel (what the runtime names on a miss)."""
    return "megamoe-cache generate --kernel %s%s --targets %s" % (
        name, " --spec " + ",".join("%s=%d" % kv for kv in spec) if spec else "", target)


class Runtime:
    """One device (megamoe_runtime): kernel loads and launches by argument name, tensor maps."""

    def __init__(self, backend="cuda", device=0, lib=None):
        self.lib = lib or Library.get()
        self.backend, self.device = backend, device
        self.target = TARGET_OF_BACKEND.get(backend, "")
        self.handle = ctypes.c_void_p()
        self.lib.call("megamoe_runtime_create", backend.encode() if backend else None,
                      index_in("device ordinal", device, INT32),
                      ctypes.byref(self.handle))
        self.kernels = {}

    def close(self):
        if self.handle:
            self.lib.call("megamoe_runtime_destroy", self.handle)
            self.handle = ctypes.c_void_p()
            self.kernels = {}

    def kernel(self, name, spec, hint=None):
        """The kernel `name` with constants `spec` [(name, value)] in declared order, loaded once. A cache miss is
        MegamoeError(KERNEL_NOT_FOUND) naming `hint` (default: the megamoe-cache command for this kernel)."""
        key_id = (name, tuple(spec))
        if key_id not in self.kernels:
            entries = (Spec * max(len(spec), 1))(*[Spec(k.encode(), v) for k, v in spec])
            key = Key(name.encode(), entries, len(spec), self.target.encode(), None, None)  # options: the target's
            hint = hint or generate_command(name, spec, self.target)
            k = ctypes.c_void_p()
            self.lib.call("megamoe_kernel_load", self.handle, ctypes.byref(key), hint.encode(), ctypes.byref(k))
            threads, shared = ctypes.c_int(), ctypes.c_int()
            self.lib.call("megamoe_kernel_info", k, ctypes.byref(threads), ctypes.byref(shared))
            self.kernels[key_id] = Kernel(k, name, tuple(spec), threads.value, shared.value, self.signature(k))
        return self.kernels[key_id]

    def signature(self, k):
        """The kernel's declared arguments (compiler/abi/KernelAbi.h) as [(name, kind)], in parameter order."""
        count = ctypes.c_size_t()
        self.lib.call("megamoe_kernel_arg_count", k, ctypes.byref(count))
        args = []
        for i in range(count.value):
            name, kind, elem = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_char_p()
            self.lib.call("megamoe_kernel_arg", k, ctypes.c_size_t(i), ctypes.byref(name), ctypes.byref(kind),
                          ctypes.byref(elem))
            args.append((name.value.decode(), kind.value))
        return args

    def tensor_map(self, kernel, arg, base, rows, cols):
        """The CUtensorMap for tensor-map argument `arg` of `kernel` over a row-major [rows, cols] matrix at device
        address `base`, in the box the kernel's declaration gives (megamoe_kernel_tensor_map; zeros off CUDA).
        Returns its 128 bytes."""
        out = (ctypes.c_uint8 * 128)()
        self.lib.call("megamoe_kernel_tensor_map", kernel.handle, arg.encode(), ctypes.c_uint64(base),
                      ctypes.c_int64(rows), ctypes.c_int64(cols), out)
        return out

    def launch(self, kernel, grid, stream, /, **args):  # positional-only: kernels declare a "grid" argument too
        """Launches on `stream` (native handle, 0 = default) with arguments by their declared names: device
        addresses and integers as Python ints, tensor maps as tensor_map()'s bytes. A name the kernel does not
        declare, or one it declares and is not given, is a TypeError naming them."""
        names = [n for n, _ in kernel.signature]
        if set(args) != set(names):
            raise TypeError("%s arguments: missing %s, unknown %s (declared: %s)" % (
                kernel.name, sorted(set(names) - set(args)), sorted(set(args) - set(names)), ", ".join(names)))
        blocks = [_as_int(g) for g in grid]
        if len(blocks) != 3 or not all(g is not None and 1 <= g < 2 ** 31 for g in blocks):
            raise ValueError("%s: grid must be three ints in [1, 2^31) (got %r)" % (kernel.name, grid))
        dims = Dims((ctypes.c_uint32 * 3)(*blocks), (ctypes.c_uint32 * 3)(kernel.threads, 1, 1),
                    (ctypes.c_uint32 * 3)(0, 0, 0), kernel.shared)
        holders = [_launch_value(kernel.name, n, kind, args[n]) for n, kind in kernel.signature]
        params = (ctypes.c_void_p * max(len(holders), 1))(
            *[ctypes.cast(ctypes.byref(h), ctypes.c_void_p) for h in holders])
        self.lib.call("megamoe_launch", self.handle, kernel.handle, ctypes.byref(dims), ctypes.c_void_p(stream or None),
                      params, None)


# Each argument kind's ctypes type and range: ctypes would wrap a value out of range silently (2^31 as int32 is
# -2^31), where the C++ launch path (KernelArgs) refuses it.
_ARG_RANGES = {ARG_PTR: (ctypes.c_uint64, 0, 2 ** 64), ARG_CONTEXT: (ctypes.c_uint64, 0, 2 ** 64),
               ARG_I64: (ctypes.c_int64, -2 ** 63, 2 ** 63), ARG_I32: (ctypes.c_int32, -2 ** 31, 2 ** 31)}


def _as_int(value):
    """value as a Python int (numpy's and torch's integers too), else None."""
    try:
        return operator.index(value)
    except TypeError:
        return None


def _launch_value(kernel, name, kind, value):
    if kind == ARG_TENSOR_MAP:
        if ctypes.sizeof(value) != 128:
            raise TypeError("%s: %s must be a tensor map's 128 bytes (Runtime.tensor_map), got %d bytes" % (
                kernel, name, ctypes.sizeof(value)))
        return value
    c_type, lo, hi = _ARG_RANGES[kind]
    number = _as_int(value)
    if number is None or not lo <= number < hi:
        raise ValueError("%s: %s=%r must be an int in [%d, %d)" % (kernel, name, value, lo, hi))
    return c_type(number)


class WorkspaceHandle:
    """One rank's megamoe_workspace. create(): one process per rank meeting at a rendezvous path (or nranks 1);
    prepare() / export() / join(): the ranks meet through the caller, who exchanges the handle bytes."""

    def __init__(self, lib, handle, config, rank, ranks):
        self.lib, self.handle, self.config, self.rank, self.ranks = lib, handle, config, rank, ranks

    @staticmethod
    def create(runtime, config, rank=0, ranks=1, rendezvous_path=None):
        h = ctypes.c_void_p()
        rank, ranks = index_in("rank", rank, INT32), index_in("ranks", ranks, INT32)
        runtime.lib.call("megamoe_workspace_create", runtime.handle, ctypes.byref(config), rank, ranks,
                         rendezvous_path.encode() if rendezvous_path else None, ctypes.byref(h))
        return WorkspaceHandle(runtime.lib, h, config, rank, ranks)

    @staticmethod
    def create_local(runtimes, config):
        n = len(runtimes)
        handles = (ctypes.c_void_p * n)(*[r.handle.value for r in runtimes])
        out = (ctypes.c_void_p * n)()
        lib = runtimes[0].lib
        lib.call("megamoe_workspace_create_local", handles, n, ctypes.byref(config), out)
        return [WorkspaceHandle(lib, ctypes.c_void_p(out[i]), config, i, n) for i in range(n)]

    @staticmethod
    def exchange_supported(lib):
        return all(lib.has(n) for n in ("megamoe_workspace_handle_size", "megamoe_workspace_prepare",
                                        "megamoe_workspace_export", "megamoe_workspace_join"))

    @staticmethod
    def join_through(runtime, config, rank, ranks, all_gather):
        """prepare, export this rank's handle, all_gather(bytes) -> every rank's handles concatenated in rank
        order, join. The caller meets its ranks (a barrier) before the first layer call."""
        lib = runtime.lib
        rank, ranks = index_in("rank", rank, INT32), index_in("ranks", ranks, INT32)
        size = lib.lib.megamoe_workspace_handle_size()
        pending = ctypes.c_void_p()
        lib.call("megamoe_workspace_prepare", runtime.handle, ctypes.byref(config), rank, ranks, ctypes.byref(pending))
        try:
            mine = (ctypes.c_uint8 * size)()
            lib.call("megamoe_workspace_export", pending, mine, size)
            gathered = bytes(all_gather(bytes(mine)))
            if len(gathered) != size * ranks:
                raise MegamoeError(INVALID_ARGUMENT, "the gathered handles are %d bytes, expected %d ranks x %d" % (
                    len(gathered), ranks, size))
            buf = (ctypes.c_uint8 * len(gathered)).from_buffer_copy(gathered)
            h = ctypes.c_void_p()
            lib.call("megamoe_workspace_join", pending, buf, len(gathered), ctypes.byref(h))
        finally:
            lib.call("megamoe_workspace_pending_destroy", pending)
        return WorkspaceHandle(lib, h, config, rank, ranks)

    def group_digest(self):
        """The digest of the group this workspace joined (the same on every rank of one group), or None from a
        library without megamoe_workspace_group_digest."""
        if not self.lib.has("megamoe_workspace_group_digest"):
            return None
        out = ctypes.c_uint64()
        self.lib.call("megamoe_workspace_group_digest", self.handle, ctypes.byref(out))
        return out.value

    def destroy(self):
        if self.handle:
            self.lib.call("megamoe_workspace_destroy", self.handle)
            self.handle = ctypes.c_void_p()


class LayerHandle:
    """One rank's megamoe_layer: on a workspace (create_on) or with a workspace of its own (create)."""

    def __init__(self, lib, handle, config):
        self.lib, self.handle, self.config = lib, handle, config

    @staticmethod
    def create_on(workspace, config):
        h = ctypes.c_void_p()
        workspace.lib.call("megamoe_layer_create_on", workspace.handle, ctypes.byref(config), ctypes.byref(h))
        return LayerHandle(workspace.lib, h, config)

    @staticmethod
    def create(runtime, config, rank=0, ranks=1, rendezvous_path=None):
        h = ctypes.c_void_p()
        rank, ranks = index_in("rank", rank, INT32), index_in("ranks", ranks, INT32)
        runtime.lib.call("megamoe_layer_create", runtime.handle, ctypes.byref(config), rank, ranks,
                         rendezvous_path.encode() if rendezvous_path else None, ctypes.byref(h))
        return LayerHandle(runtime.lib, h, config)

    def call(self, name, *args):
        self.lib.call("megamoe_layer_" + name, self.handle, *args)

    def forward(self, x, tokens, topk_idx, topk_weights, w1, w2, y, stream, saved=None):
        """Device addresses; saved None: the layer's own saved state (megamoe_layer_forward)."""
        tokens = index_in("tokens", tokens)
        if saved is None:
            self.call("forward", x, tokens, topk_idx, topk_weights, w1, w2, y, ctypes.c_void_p(stream or None))
        else:
            self.call("forward_saved", x, tokens, topk_idx, topk_weights, w1, w2, y, saved,
                      ctypes.c_void_p(stream or None))

    def forward_fp8(self, x, x_scales, tokens, topk_idx, topk_weights, w1, w1_scales, w2, w2_scales, y, stream):
        """Device addresses (megamoe_layer_forward_fp8): x_scales 0 for bf16 x, which the layer quantises."""
        tokens = index_in("tokens", tokens)
        self.call("forward_fp8", x, x_scales, tokens, topk_idx, topk_weights, w1, w1_scales, w2, w2_scales, y,
                  ctypes.c_void_p(stream or None))

    def backward(self, dy, x, tokens, topk_idx, topk_weights, w1, w2, dx, d_topk_weights, dw1, dw2, stream,
                 saved=None):
        tokens = index_in("tokens", tokens)
        if saved is None:
            self.call("backward", dy, x, tokens, topk_idx, topk_weights, w1, w2, dx, d_topk_weights, dw1, dw2,
                      ctypes.c_void_p(stream or None))
        else:
            self.call("backward_saved", dy, x, tokens, topk_idx, topk_weights, w1, w2, dx, d_topk_weights, dw1, dw2,
                      saved, ctypes.c_void_p(stream or None))

    def check_errors(self, stream):
        self.call("check_errors", ctypes.c_void_p(stream or None))

    def dropped_picks(self, stream):
        """The picks the forwards on this layer's workspace dropped so far (drop_overflow); synchronises stream."""
        out = ctypes.c_uint64(0)
        self.call("dropped_picks", ctypes.c_void_p(stream or None), ctypes.byref(out))
        return out.value

    def set_legs(self, dispatch, combine):
        self.call("set_legs", index_in("dispatch legs", dispatch, INT32), index_in("combine legs", combine, INT32))

    def set_profiling(self, on):
        self.call("set_profiling", int(on))

    def stage_ms(self):
        ms = (ctypes.c_float * STAGE_COUNT)()
        self.call("stage_ms", ms)
        return list(ms)

    def backward_stage_ms(self):
        ms = (ctypes.c_float * BACKWARD_STAGE_COUNT)()
        self.call("backward_stage_ms", ms)
        return list(ms)

    def sm_budget(self):
        n = ctypes.c_int()
        self.call("sm_budget", ctypes.byref(n))
        return n.value

    def activation_bytes(self):
        n = ctypes.c_uint64()
        self.call("activation_bytes", ctypes.byref(n))
        return n.value

    def kept_bytes(self):
        """(kept for the backward, what would be kept without recomputing the dispatched x)."""
        kept, without = ctypes.c_uint64(), ctypes.c_uint64()
        self.call("kept_bytes", ctypes.byref(kept), ctypes.byref(without))
        return kept.value, without.value

    def destroy(self):
        if self.handle:
            self.lib.call("megamoe_layer_destroy", self.handle)
            self.handle = ctypes.c_void_p()
