# Experiment: one-rank layer (no cross-GPU waits), legs timed, for profiling the fused kernels' GEMM.
import ctypes, os, sys, statistics, torch
lib = ctypes.CDLL(sys.argv[1]); lib.megamoe_last_error.restype = ctypes.c_char_p
def ck(s):
    if s: raise RuntimeError(lib.megamoe_last_error().decode())
class Cfg(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("hidden", "intermediate", "experts", "topk", "max_tokens", "clamp", "training", "dtype", "dedup")]
E, H, I, K, T = int(os.environ.get("E", 128)), 7168, 2048, 8, 8192
rt = ctypes.c_void_p(); ck(lib.megamoe_runtime_create(b"cuda", 0, ctypes.byref(rt)))
layer = ctypes.c_void_p(); cfg = Cfg(H, I, E, K, T, 0, 0, 0, 0)
ck(lib.megamoe_layer_create(rt, ctypes.byref(cfg), 0, 1, None, ctypes.byref(layer)))
dev = "cuda"
x = torch.randn(T, H, device=dev).bfloat16(); w1 = (torch.randn(E, 2 * I, H, device=dev) / H ** .5).bfloat16()
w2 = (torch.randn(E, H, I, device=dev) / I ** .5).bfloat16()
idx = torch.stack([torch.randperm(E, device=dev)[:K] for _ in range(T)]).int(); wt = torch.rand(T, K, device=dev)
y = torch.empty(T, H, device=dev, dtype=torch.bfloat16)
lib.megamoe_layer_forward.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64] + [ctypes.c_uint64] * 5 + [ctypes.c_void_p]
def fwd():
    ck(lib.megamoe_layer_forward(layer, x.data_ptr(), T, idx.data_ptr(), wt.data_ptr(), w1.data_ptr(), w2.data_ptr(), y.data_ptr(), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)))
fwd(); ck(lib.megamoe_layer_check_errors(layer, None))
ck(lib.megamoe_layer_set_profiling(layer, 1))
for legs, name in [l for l in ((0, "fused"), (1, "comm-only"), (2, "gemm-only")) if str(l[0]) in os.environ.get("LEGS", "012")]:
    ck(lib.megamoe_layer_set_legs(layer, legs, legs)); ms = []
    for r in range(int(os.environ.get("REPS", 10))):
        fwd(); out = (ctypes.c_float * 3)(); ck(lib.megamoe_layer_stage_ms(layer, out)); ms.append(list(out))
    med = [statistics.median(m[i] for m in ms) for i in range(3)]
    print("E=%d one rank %-9s: prologue %.3f dispatch %.3f combine %.3f ms | L1 %.0f TF/s L2 %.0f TF/s" % (E, name, *med, 2*T*K*2*I*H/med[1]/1e9, 2*T*K*H*I/med[2]/1e9))
ck(lib.megamoe_layer_check_errors(layer, None))
