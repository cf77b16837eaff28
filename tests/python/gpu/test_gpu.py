"""The package's GPU tier (one GPU; the kernels from $MEGAMOE_CACHE_DIR, scripts/gen-gpu-test-cache.sh): fused_moe
forward and backward against an fp32 reference, the op against the C++ layer bitwise, torch.compile(fullgraph) against
eager bitwise, CUDA-graph capture of forward and backward, several forwards in flight with backwards in any order,
a 4-layer model on one workspace, a finite-difference check, bad inputs and a device error, the grouped GEMMs (bf16
and FP8), the FP8 token quantiser bitwise against its reference, the FP8 layer (fused_moe_fp8) against its
references and its other forms bitwise, the op's overhead against the C++ layer (within 3%, eager and compiled),
two ranks on one GPU through a process group.
Runs under pytest, or without it: `python3 tests/python/gpu/test_gpu.py --junit FILE --json FILE`."""
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]

import torch  # noqa: E402

import harness  # noqa: E402
from harness import raises, skip  # noqa: E402

if not torch.cuda.is_available():
    if harness.pytest is not None and __name__ != "__main__":
        harness.pytest.skip("no CUDA device: the GPU tier needs one", allow_module_level=True)
    print("SKIPPED: no CUDA device: the GPU tier needs one")
    sys.exit(0)

import megamoe  # noqa: E402
from megamoe import _lib  # noqa: E402

H, I, E, K = 512, 256, 16, 4          # gpu_layer_test's shape; its kernels at EP1 and EP2 are in the test cache
SHAPE = dict(hidden=H, intermediate=I, experts=E, topk=K)
MAX_TOKENS = 256
TOL = 1e-2
DEV = torch.device("cuda", torch.cuda.current_device())
_ws = None


def ws():
    """The tier's workspace: one process, one GPU, training (made once)."""
    global _ws
    if _ws is None:
        _ws = megamoe.Workspace(max_tokens=MAX_TOKENS, **SHAPE)
    return _ws


def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def routing(T, seed, idx_dtype=torch.int32, skip_fraction=0.0, experts=E, topk=K):
    g = gen(seed)
    idx = torch.rand(T, experts, device="cuda", generator=g).topk(topk, dim=1).indices.to(idx_dtype)
    if skip_fraction:
        idx[torch.rand(T, topk, device="cuda", generator=g) < skip_fraction] = -1
    wts = torch.softmax(torch.randn(T, topk, device="cuda", generator=g), dim=1)
    return idx.contiguous(), wts


def tokens(T, seed, hidden=H):
    return torch.randn(T, hidden, device="cuda", generator=gen(seed)).to(torch.bfloat16)


def weights(seed, experts=E, hidden=H, inter=I):
    g = gen(seed)
    w1 = (torch.randn(experts, 2 * inter, hidden, device="cuda", generator=g) / math.sqrt(hidden)).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter, device="cuda", generator=g) / math.sqrt(inter)).to(torch.bfloat16)
    return w1, w2


def rel(got, ref):
    ref = ref.double()
    d = (got.double() - ref).norm()
    n = ref.norm()
    return float(d / n) if n > 0 else (0.0 if d == 0 else math.inf)


def bitwise(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def reference(x, idx, wts, w1, w2, dy):
    """y, dx, d_topk_weights, dw1, dw2 in fp32 (autograd of reference_moe on fp32 copies)."""
    leaves = [t.detach().float().requires_grad_() for t in (x, wts, w1, w2)]
    with torch.enable_grad():
        y = megamoe.reference_moe(leaves[0], idx, leaves[1], leaves[2], leaves[3])
        grads = torch.autograd.grad(y, leaves, dy.float())
    return (y.detach(),) + tuple(grads)


def op_fwd_bwd(x, idx, wts, w1, w2, dy, fn=None):
    leaves = [t.detach().requires_grad_() for t in (x, wts, w1, w2)]
    fn = fn or (lambda a, i, b, c, d: megamoe.fused_moe(a, i, b, c, d, ws()))
    y = fn(leaves[0], idx, leaves[1], leaves[2], leaves[3])
    grads = torch.autograd.grad(y, leaves, dy)
    return (y.detach(),) + tuple(grads)


NAMES = ("y", "dx", "d_topk_weights", "dw1", "dw2")


def test_forward_backward_against_fp32_reference():
    w1, w2 = weights(1)
    for T, idx_dtype, skip_fraction in ((MAX_TOKENS, torch.int32, 0.0), (37, torch.int64, 0.0),
                                        (200, torch.int32, 0.1), (1, torch.int64, 0.0)):
        x = tokens(T, 2 + T)
        idx, wts = routing(T, 3 + T, idx_dtype, skip_fraction)
        dy = tokens(T, 4 + T)
        got = op_fwd_bwd(x, idx, wts, w1, w2, dy)
        ref = reference(x, idx, wts, w1, w2, dy)
        for name, g, r in zip(NAMES, got, ref):
            assert torch.isfinite(g.float()).all(), "%s not all written (T=%d)" % (name, T)
            assert rel(g, r) <= TOL, "%s rel err %.3e at T=%d %s skip %.1f" % (name, rel(g, r), T, idx_dtype,
                                                                             skip_fraction)
        assert bool((got[2][idx < 0] == 0).all()), "d_topk_weights of -1 picks must be 0"


def test_zero_tokens():
    w1, w2 = weights(1)
    x = tokens(0, 5)
    idx, wts = routing(0, 6)
    got = op_fwd_bwd(x, idx, wts, w1, w2, tokens(0, 7))
    assert got[0].shape == (0, H) and bool((got[3] == 0).all()) and bool((got[4] == 0).all())


def test_op_bitwise_equals_the_cpp_layer():
    w1, w2 = weights(11)
    T = 199
    x, dy = tokens(T, 12), tokens(T, 13)
    idx, wts = routing(T, 14)
    got = op_fwd_bwd(x, idx, wts, w1, w2, dy)
    layer = ws().layer(training=True, topk_idx_bits=32, **SHAPE)
    y, dx = torch.empty_like(x), torch.empty_like(x)
    dtw = torch.empty_like(wts)
    dw1, dw2 = torch.empty_like(w1), torch.empty_like(w2)
    saved = torch.empty(layer.saved_bytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    layer.handle.forward(x.data_ptr(), T, idx.data_ptr(), wts.data_ptr(), w1.data_ptr(), w2.data_ptr(), y.data_ptr(),
                         stream, saved=saved.data_ptr())
    layer.handle.backward(dy.data_ptr(), x.data_ptr(), T, idx.data_ptr(), wts.data_ptr(), w1.data_ptr(),
                          w2.data_ptr(), dx.data_ptr(), dtw.data_ptr(), dw1.data_ptr(), dw2.data_ptr(), stream,
                          saved=saved.data_ptr())
    layer.handle.check_errors(stream)
    for name, g, c in zip(NAMES, got, (y, dx, dtw, dw1, dw2)):
        assert bitwise(g, c), "%s: the op differs from the C++ layer" % name


def test_compiled_fullgraph_bitwise_equals_eager():
    if not megamoe.HAS_CUSTOM_OP:
        skip("torch %s has no torch.library.custom_op" % torch.__version__)
    w1, w2 = weights(21)
    compiled = torch.compile(lambda a, i, b, c, d: megamoe.fused_moe(a, i, b, c, d, ws()), fullgraph=True)
    for T, idx_dtype in ((MAX_TOKENS, torch.int32), (77, torch.int64)):
        x, dy = tokens(T, 22 + T), tokens(T, 23 + T)
        idx, wts = routing(T, 24 + T, idx_dtype)
        eager = op_fwd_bwd(x, idx, wts, w1, w2, dy)
        comp = op_fwd_bwd(x, idx, wts, w1, w2, dy, fn=compiled)
        for name, e, c in zip(NAMES, eager, comp):
            assert bitwise(e, c), "%s: compiled differs from eager at T=%d" % (name, T)
    with torch.no_grad():  # inference under compile: the layer without saved state
        x = tokens(64, 25)
        idx, wts = routing(64, 26)
        assert bitwise(compiled(x, idx, wts, w1, w2), megamoe.fused_moe(x, idx, wts, w1, w2, ws()))


def test_cuda_graph_captures_forward_and_backward():
    w1, w2 = [torch.nn.Parameter(w) for w in weights(31)]
    T = 128
    x = tokens(T, 32).requires_grad_()
    idx, wts = routing(T, 33)
    wts.requires_grad_()
    dy = tokens(T, 34)
    leaves = [x, wts, w1, w2]

    def step():
        y = megamoe.fused_moe(x, idx, wts, w1, w2, ws())
        return (y,) + torch.autograd.grad(y, leaves, dy)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        static = step()
    for seed in range(3):  # fresh inputs written in place, then a replay against an eager call on them
        with torch.no_grad():
            x.copy_(tokens(T, 40 + seed))
            new_idx, new_wts = routing(T, 50 + seed)
            idx.copy_(new_idx)
            wts.copy_(new_wts)
            dy.copy_(tokens(T, 60 + seed))
        graph.replay()
        eager = op_fwd_bwd(x, idx, wts, w1, w2, dy)
        for name, s, e in zip(NAMES, static, eager):
            assert bitwise(s, e), "%s: replay %d differs from eager" % (name, seed)
    ws().check_errors()


def test_forwards_in_flight_backwards_in_any_order():
    w1, w2 = weights(71)
    cases = []
    for i in range(3):
        T = 60 + 50 * i
        x, dy = tokens(T, 72 + i), tokens(T, 75 + i)
        idx, wts = routing(T, 78 + i)
        cases.append((x, idx, wts, dy))
    pairs = [op_fwd_bwd(x, idx, wts, w1, w2, dy) for x, idx, wts, dy in cases]  # forward, then its backward
    outstanding = []
    for x, idx, wts, dy in cases:  # three forwards in flight
        leaves = [t.detach().requires_grad_() for t in (x, wts, w1, w2)]
        outstanding.append((megamoe.fused_moe(leaves[0], idx, leaves[1], leaves[2], leaves[3], ws()), leaves, dy))
    for i in (1, 2, 0):
        y, leaves, dy = outstanding[i]
        grads = torch.autograd.grad(y, leaves, dy)
        for name, a, b in zip(NAMES, (y.detach(),) + grads, pairs[i]):
            assert bitwise(a, b), "forward %d's %s differs from its forward + backward pair" % (i, name)


def test_four_layer_model_on_one_workspace():
    layers = [megamoe.MoeExperts(H, I, E, K, ws()) for _ in range(4)]
    T = 96
    x = tokens(T, 81).requires_grad_()
    routes = [routing(T, 82 + l) for l in range(4)]
    wts = [w.requires_grad_() for _, w in routes]
    h = x
    for l, m in enumerate(layers):  # residual blocks; all four forwards in flight before the backward
        h = h + m(h, routes[l][0], wts[l])
    loss = h.float().square().mean()
    params = [x] + wts + [p for m in layers for p in (m.w1, m.w2)]
    grads = torch.autograd.grad(loss, params)
    ref_params = [p.detach().float().requires_grad_() for p in params]
    with torch.enable_grad():
        rh = ref_params[0]
        for l in range(4):
            w1, w2 = ref_params[5 + 2 * l], ref_params[6 + 2 * l]
            rh = rh + megamoe.reference_moe(rh, routes[l][0], ref_params[1 + l], w1, w2)
        ref_loss = rh.square().mean()
        ref_grads = torch.autograd.grad(ref_loss, ref_params)
    assert abs(float(loss) - float(ref_loss)) <= TOL * abs(float(ref_loss))
    for i, (g, r) in enumerate(zip(grads, ref_grads)):
        assert rel(g, r) <= 2 * TOL, "parameter %d: rel err %.3e" % (i, rel(g, r))
    assert len(ws().layers) == 4  # one shape: every module uses the workspace's own layers


def test_finite_differences_on_a_tiny_shape():
    w1, w2 = weights(91)
    T = 8
    x, dy = tokens(T, 92), tokens(T, 93)
    idx, wts = routing(T, 94)
    _, dx, dtw, dw1, dw2 = op_fwd_bwd(x, idx, wts, w1, w2, dy)

    def loss(x_, wts_, w1_, w2_):
        with torch.no_grad():
            return float((megamoe.fused_moe(x_, idx, wts_, w1_, w2_, ws()).double() * dy.double()).sum())

    g = gen(95)
    for name, grad, base in (("x", dx, x), ("w1", dw1, w1), ("w2", dw2, w2), ("topk_weights", dtw, wts)):
        # along the gradient's signs (scaled at random): the change in the loss then dwarfs y's bf16 rounding
        v = torch.sign(grad.float()) * (0.5 + torch.rand(base.shape, device="cuda", generator=g))
        # 5% of the typical magnitude; y is linear in topk_weights, so a larger step there costs no accuracy
        eps = (0.5 if name == "topk_weights" else 0.05) * float(base.float().abs().mean())
        plus = (base.double() + eps * v).to(base.dtype)  # the perturbation as the dtype holds it
        minus = (base.double() - eps * v).to(base.dtype)
        args = {"x": x, "topk_weights": wts, "w1": w1, "w2": w2}
        call = lambda t: loss(*[t if n == name else a for n, a in args.items()])
        fd = call(plus) - call(minus)
        analytic = float((grad.double() * (plus.double() - minus.double())).sum())
        assert analytic > 0 and abs(fd - analytic) <= 2e-2 * analytic, "%s: finite difference %.6e, gradient %.6e" % (
            name, fd, analytic)


def test_bad_inputs():
    w1, w2 = weights(101)
    x = tokens(16, 102)
    idx, wts = routing(16, 103)
    w = ws()
    with raises(megamoe.ArgumentError, match=r"x must be on cuda:\d, the workspace's device \(got cpu\)"):
        megamoe.fused_moe(x.cpu(), idx, wts, w1, w2, w)
    flat = torch.empty(x.numel() + 8, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:1 + x.numel()].view(x.shape)
    with raises(megamoe.ArgumentError, match="x must be 16-byte aligned"):
        megamoe.fused_moe(shifted, idx, wts, w1, w2, w)
    big = tokens(MAX_TOKENS + 1, 104)
    bidx, bwts = routing(MAX_TOKENS + 1, 105)
    with raises(megamoe.ArgumentError, match="x has 257 tokens, above the workspace's max_tokens=256"):
        megamoe.fused_moe(big, bidx, bwts, w1, w2, w)
    with raises(megamoe.ArgumentError, match="topk_weights must be float32"):
        megamoe.fused_moe(x, idx, wts.half(), w1, w2, w)
    with raises(megamoe.ArgumentError, match="w1 must be contiguous"):
        megamoe.fused_moe(x, idx, wts, w1.transpose(1, 2).contiguous().transpose(1, 2), w2, w)
    with raises(megamoe.ArgumentError, match="topk_idx must be int32 or int64"):
        megamoe.fused_moe(x, idx.short(), wts, w1, w2, w)


def test_grouped_gemms_against_fp32_and_torch():
    g = gen(111)
    G, N, Kd, rows = 8, 512, 256, 1000
    sizes = torch.tensor([0, 200, 13, 300, 77, 0, 250, 160])
    offs = torch.cumsum(sizes, 0).to(torch.int32).cuda()
    starts = [0] + torch.cumsum(sizes, 0).tolist()
    a = torch.randn(rows, Kd, device="cuda", generator=g).to(torch.bfloat16)
    b_nt = torch.randn(G, N, Kd, device="cuda", generator=g).to(torch.bfloat16)
    b_nn = torch.randn(G, Kd, N, device="cuda", generator=g).to(torch.bfloat16)
    bt = torch.randn(rows, N, device="cuda", generator=g).to(torch.bfloat16)
    ref_nt = torch.cat([a[starts[e]:starts[e + 1]].float() @ b_nt[e].float().t() for e in range(G)])
    ref_nn = torch.cat([a[starts[e]:starts[e + 1]].float() @ b_nn[e].float() for e in range(G)])
    ref_tn = torch.stack([a[starts[e]:starts[e + 1]].float().t() @ bt[starts[e]:starts[e + 1]].float()
                          for e in range(G)])
    nt, nn, tn = megamoe.grouped_mm_nt(a, b_nt, offs), megamoe.grouped_mm_nn(a, b_nn, offs), \
        megamoe.grouped_mm_tn(a, bt, offs)
    for name, got, ref in (("nt", nt, ref_nt), ("nn", nn, ref_nn), ("tn", tn, ref_tn)):
        assert rel(got, ref) <= TOL, "%s rel err %.3e" % (name, rel(got, ref))
    assert bool((tn[0] == 0).all()) and bool((tn[5] == 0).all()), "empty groups give zeros"
    # the drop-in picks the layout from b's strides, as torch._grouped_mm takes b [groups, K, N]
    assert bitwise(megamoe.grouped_mm(a, b_nt.transpose(-2, -1), offs), nt)
    assert bitwise(megamoe.grouped_mm(a, b_nn, offs), nn)
    assert bitwise(megamoe.grouped_mm(a.t(), bt, offs), tn)
    if hasattr(torch, "_grouped_mm"):
        try:
            theirs = torch._grouped_mm(a, b_nt.transpose(-2, -1), offs=offs)
        except RuntimeError as e:  # e.g. offsets that are not multiples of 16
            theirs = None
            print("torch._grouped_mm refused the ragged offsets: %s" % str(e).splitlines()[0])
        if theirs is not None:
            assert rel(nt, theirs.float()) <= TOL
    if megamoe.HAS_CUSTOM_OP:
        compiled = torch.compile(megamoe.grouped_mm_nt, fullgraph=True)
        assert bitwise(compiled(a, b_nt, offs), nt)


def test_grouped_mm_nt_gradients():
    g = gen(121)
    G, N, Kd = 8, 512, 256
    sizes = torch.tensor([64, 0, 100, 36, 128, 50, 70, 52])
    offs = torch.cumsum(sizes, 0).to(torch.int32).cuda()
    rows = int(sizes.sum())
    a = torch.randn(rows, Kd, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    b = torch.randn(G, N, Kd, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    dc = torch.randn(rows, N, device="cuda", generator=g).to(torch.bfloat16)
    da, db = torch.autograd.grad(megamoe.grouped_mm_nt(a, b, offs), [a, b], dc)
    af, bf = a.detach().float().requires_grad_(), b.detach().float().requires_grad_()
    starts = [0] + torch.cumsum(sizes, 0).tolist()
    with torch.enable_grad():
        c = torch.cat([af[starts[e]:starts[e + 1]] @ bf[e].t() for e in range(G)])
        rda, rdb = torch.autograd.grad(c, [af, bf], dc.float())
    assert rel(da, rda) <= TOL and rel(db, rdb) <= TOL, (rel(da, rda), rel(db, rdb))
    assert bool((db[1] == 0).all())


def interleaved_ms(fns, rounds=7, calls=5):
    """Median per-call ms of each function, measured in shuffled interleaved rounds (one warm-up round)."""
    import random
    import statistics
    order = random.Random(2026)
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds + 1):
        order.shuffle(names)
        for n in names:
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            fns[n]()
            s.record()
            for _ in range(calls):
                fns[n]()
            e.record()
            e.synchronize()
            if r:
                times[n].append(s.elapsed_time(e) / calls)
    return {n: statistics.median(t) for n, t in times.items()}


def test_overhead_of_the_op_within_3_percent_of_the_cpp_layer():
    """DeepSeek-V3 at EP2's per-GPU work on one rank (128 experts, 8192 tokens): forward + backward through the op,
    eagerly and compiled, against the C++ layer's calls into preallocated buffers, in the same run."""
    H2, I2, E2, K2, T = 7168, 2048, 128, 8, 8192
    big = megamoe.Workspace(H2, I2, E2, K2, T)
    try:
        w1, w2 = weights(131, E2, H2, I2)
        x, dy = tokens(T, 132, H2), tokens(T, 133, H2)
        idx, wts = routing(T, 134, experts=E2, topk=K2)
        leaves = [t.detach().requires_grad_() for t in (x, wts, w1, w2)]
        layer = big.layer(H2, I2, E2, K2, True, 32)
        out = [torch.empty_like(x), torch.empty_like(x), torch.empty_like(wts), torch.empty_like(w1),
               torch.empty_like(w2)]
        saved = torch.empty(layer.saved_bytes, dtype=torch.uint8, device="cuda")

        def cpp():
            stream = torch.cuda.current_stream().cuda_stream
            layer.handle.forward(x.data_ptr(), T, idx.data_ptr(), wts.data_ptr(), w1.data_ptr(), w2.data_ptr(),
                                 out[0].data_ptr(), stream, saved=saved.data_ptr())
            layer.handle.backward(dy.data_ptr(), x.data_ptr(), T, idx.data_ptr(), wts.data_ptr(), w1.data_ptr(),
                                  w2.data_ptr(), out[1].data_ptr(), out[2].data_ptr(), out[3].data_ptr(),
                                  out[4].data_ptr(), stream, saved=saved.data_ptr())

        def through(fn):
            def run():
                y = fn(leaves[0], idx, leaves[1], leaves[2], leaves[3])
                torch.autograd.grad(y, leaves, dy)
            return run

        eager = lambda a, i, b, c, d: megamoe.fused_moe(a, i, b, c, d, big)
        fns = {"cpp": cpp, "op_eager": through(eager)}
        if megamoe.HAS_CUSTOM_OP:
            fns["op_compiled"] = through(torch.compile(eager, fullgraph=True))
        for fn in fns.values():
            fn()  # compiles, loads, warms
        ms = interleaved_ms(fns)
        big.check_errors()
        report = {"shape": dict(hidden=H2, intermediate=I2, experts=E2, topk=K2, tokens=T), "ms": ms,
                  "ratio": {n: ms[n] / ms["cpp"] for n in ms}}
        print("fwd+bwd ms: " + ", ".join("%s %.3f (%.4f)" % (n, ms[n], report["ratio"][n]) for n in ms))
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "python-overhead.json"), "w") as f:
                json.dump(report, f, indent=1)
        for n in ms:
            assert ms[n] <= 1.03 * ms["cpp"], "%s: %.3f ms against the C++ layer's %.3f ms (%.4f)" % (
                n, ms[n], ms["cpp"], ms[n] / ms["cpp"])
    finally:
        big.close()


def test_grouped_mm_clamps_offsets_past_the_rows():
    """Group ends past the rows, or below the previous end, are clamped on the device: the kernels store only rows
    that exist, bitwise as with the well-formed offsets they clamp to."""
    g = gen(131)
    G, N, Kd, rows = 8, 512, 256, 1000  # test_grouped_gemms_against_fp32_and_torch's kernels
    a = torch.randn(rows, Kd, device="cuda", generator=g).to(torch.bfloat16)
    b = torch.randn(G, N, Kd, device="cuda", generator=g).to(torch.bfloat16)
    bt = torch.randn(rows, N, device="cuda", generator=g).to(torch.bfloat16)
    bad = torch.tensor([100, 50, 250, 400, 300, 900, rows + 4000, -7], dtype=torch.int32, device="cuda")
    good = torch.tensor([100, 100, 250, 400, 400, 900, rows, rows], dtype=torch.int32, device="cuda")
    assert bitwise(megamoe.grouped_mm_nt(a, b, bad), megamoe.grouped_mm_nt(a, b, good))
    assert bitwise(megamoe.grouped_mm_tn(a, bt, bad), megamoe.grouped_mm_tn(a, bt, good))


def test_grouped_mm_fp8_against_the_reference():
    """The FP8 grouped GEMM on ragged groups (two empty) against the float64 product of the dequantised operands,
    with fp32 and UE8M0 weight scales, float8 and uint8 codes alike, a bitwise rerun, torch.compile and a CUDA graph;
    rows past the last end stay unwritten."""
    g = gen(141)
    G, N, Kd = 8, 256, 512  # gen-gpu-test-cache.sh's grouped_gemm_nt_fp8 E=8,N=256,K=512
    sizes = torch.tensor([40, 0, 300, 1, 129, 0, 64, 200])
    rows = int(sizes.sum())
    offs = torch.cumsum(sizes, 0).to(torch.int32).cuda()
    x = torch.randn(rows + 16, Kd, device="cuda", generator=g)
    xq, xs = megamoe.fp8.quantize_tokens(x)
    w = torch.randn(G, N, Kd, device="cuda", generator=g) * 0.05
    for fmt in ("fp32", "ue8m0"):
        wq, ws = megamoe.fp8.quantize_blocks(w, scale_format=fmt)
        ref = megamoe.fp8.reference_grouped_mm_fp8(xq, xs, wq, ws, offs)
        got = megamoe.grouped_mm_fp8(xq, xs, wq, ws, offs)
        assert got.dtype == torch.bfloat16 and got.shape == (rows + 16, N)
        err = rel(got[:rows], ref[:rows])
        print("grouped_mm_fp8 %s scales: rel err %.3e" % (fmt, err))
        assert err <= TOL, "%s rel err %.3e" % (fmt, err)
        assert bitwise(megamoe.grouped_mm_fp8(xq, xs, wq, ws, offs)[:rows], got[:rows])
    sentinel = torch.full((rows + 16, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = megamoe.grouped_mm_fp8(xq, xs, wq, ws, offs)
    if megamoe.fp8.FLOAT8 is not None:
        assert bitwise(megamoe.grouped_mm_fp8(xq.view(megamoe.fp8.FLOAT8), xs, wq.view(megamoe.fp8.FLOAT8), ws,
                                              offs)[:rows], out[:rows])
    if megamoe.HAS_CUSTOM_OP:
        compiled = torch.compile(megamoe.grouped_mm_fp8, fullgraph=True)
        assert bitwise(compiled(xq, xs, wq, ws, offs)[:rows], out[:rows])
    graph = torch.cuda.CUDAGraph()
    megamoe.grouped_mm_fp8(xq, xs, wq, ws, offs)  # loads the kernel outside the capture
    with torch.cuda.graph(graph):
        captured = megamoe.grouped_mm_fp8(xq, xs, wq, ws, offs)
    captured.copy_(sentinel)
    graph.replay()
    torch.cuda.synchronize()
    assert bitwise(captured[:rows], out[:rows])
    assert bool(torch.isnan(captured[rows:].float()).all()), "rows past the last group were written"



def fp8_tokens(rows, H, g):
    """bf16 [rows, H] on the GPU: each 128-channel group its own magnitude (2^-20 .. 2^12), an all-zero row (rows >
    1), a first group of large values (2^100) and a last one of bf16 subnormals (a float32 subnormal scale)."""
    groups = H // 128
    x = torch.randn(rows, groups, 128, device="cuda", generator=g) * torch.exp2(
        torch.randint(-20, 13, (rows, groups, 1), device="cuda", generator=g).float())
    x = x.view(rows, H)
    if rows > 1:
        x[rows // 2] = 0.0
    x[0, :128] = torch.randn(128, device="cuda", generator=g) * 2.0 ** 100
    x[-1, H - 128:] = torch.randn(128, device="cuda", generator=g) * 2.0 ** -130
    return x.to(torch.bfloat16)


def test_quantize_fp8_bitwise_equals_the_reference():
    """megamoe.quantize_fp8 (the quantize_tokens_fp8 kernel) against megamoe.fp8.quantize_tokens on the input moved to
    the CPU, codes and scales bitwise, at 1 and 777 rows and H = 2048 and 7168 (gen-gpu-test-cache.sh's
    quantize_tokens_fp8 entries); a bitwise rerun, float8 codes, torch.compile, and a CUDA graph whose replays, on
    fresh inputs written in place, overwrite outputs filled with a sentinel (0xFF, the NaN code, and NaN scales)."""
    g = gen(171)
    for H in (2048, 7168):
        for rows in (1, 777):
            x = fp8_tokens(rows, H, g)
            rq, rs = megamoe.fp8.quantize_tokens(x.cpu())
            q, s = megamoe.quantize_fp8(x)
            assert q.dtype == torch.uint8 and q.shape == (rows, H) and q.device == x.device
            assert s.dtype == torch.float32 and s.shape == (rows, H // 128) and s.device == x.device
            code_diffs = int((q.cpu() != rq).sum())
            scale_diffs = int((s.cpu().view(torch.int32) != rs.view(torch.int32)).sum())
            print("quantize_fp8 H=%d rows=%d: code_diffs=%d scale_diffs=%d" % (H, rows, code_diffs, scale_diffs))
            assert code_diffs == 0 and scale_diffs == 0, (H, rows, code_diffs, scale_diffs)
            again = megamoe.quantize_fp8(x)
            assert bitwise(again[0], q) and bitwise(again[1], s), "a rerun differs (H=%d rows=%d)" % (H, rows)
    # the last shape (H = 7168, 777 rows) through the other paths
    if megamoe.fp8.FLOAT8 is not None:
        q8, s8 = megamoe.quantize_fp8(x, dtype=megamoe.fp8.FLOAT8)
        assert q8.dtype == megamoe.fp8.FLOAT8 and bitwise(q8, q) and bitwise(s8, s)
    empty = megamoe.quantize_fp8(x[:0])
    assert empty[0].shape == (0, H) and empty[1].shape == (0, H // 128)
    if megamoe.HAS_CUSTOM_OP:
        compiled = torch.compile(megamoe.quantize_fp8, fullgraph=True)
        cq, cs = compiled(x)
        assert bitwise(cq, q) and bitwise(cs, s), "compiled differs from eager"
    static = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = megamoe.quantize_fp8(static)
    for seed in range(2):
        static.copy_(fp8_tokens(rows, H, gen(172 + seed)))
        captured[0].fill_(0xFF)
        captured[1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rq, rs = megamoe.fp8.quantize_tokens(static.cpu())
        assert bitwise(captured[0].cpu(), rq) and bitwise(captured[1].cpu(), rs), "replay %d differs" % seed

_fp8_ws = None


def fp8_ws():
    """The FP8 tests' workspace: one process, one GPU, dtype fp8 (inference; made once). Its layer's kernels at EP1
    are gen-gpu-test-cache.sh's "512 256 16 4" FP8 shape."""
    global _fp8_ws
    if _fp8_ws is None:
        _fp8_ws = megamoe.Workspace(max_tokens=MAX_TOKENS, dtype="fp8", **SHAPE)
    return _fp8_ws


# The FP8 layer against reference_moe_fp8 end to end: act's e4m3 codes flip wherever the kernel's fp32 L1 sums and
# the exact ones round across a code boundary, ~1-2e-2 of y (tests/gpu/LayerFp8Test.cpp checks each stage to 1e-2).
FP8_END_TO_END = 3e-2


def fp8_case(T=100, seed=181, scale_format="fp32"):
    """x bf16 [T, H], routing with a tenth of the picks skipped (-1), and weights() quantised on the GPU
    (quantize_experts' dict: w1, w1_scale, w2, w2_scale)."""
    w1, w2 = weights(seed)
    x = tokens(T, seed + 1)
    idx, wts = routing(T, seed + 2, skip_fraction=0.1)
    return x, idx, wts, megamoe.fp8.quantize_experts(w1, w2, scale_format=scale_format)


def fp8_layer(x, idx, wts, q, **kw):
    with torch.no_grad():
        y = megamoe.fused_moe_fp8(x, idx, wts, workspace=fp8_ws(), **dict(q, **kw))
    fp8_ws().check_errors()
    return y


def test_fused_moe_fp8_against_the_references():
    """The FP8 layer on one rank (H=512, I=256, E=16, topk=4, 100 tokens, skipped picks) against
    megamoe.fp8.reference_moe_fp8 on the same codes and scales with the kernel's rounding points (SwiGLU in fp32,
    act bf16 then quantised per 128 channels, L2 rows bf16 summed in fp32) within FP8_END_TO_END, and against the bf16
    layer's reference (reference_moe, in fp32) on the dequantised weights within 1e-1, where the FP8 activations'
    quantisation is the difference; a rerun bitwise identical, and e4m3 x with its scales from quantize_fp8
    bitwise equal to the layer quantising bf16 x itself."""
    x, idx, wts, q = fp8_case()
    y = fp8_layer(x, idx, wts, q)
    assert y.dtype == torch.bfloat16 and y.shape == x.shape and bool(torch.isfinite(y.float()).all())
    ref = megamoe.fp8.reference_moe_fp8(x, idx, wts, swiglu="fp32", **q)
    dequantised = [megamoe.fp8.dequantize_blocks(q[n], q[n + "_scale"]) for n in ("w1", "w2")]
    bf16_layer = megamoe.reference_moe(x.float(), idx, wts, *dequantised)
    err, err_bf16 = rel(y, ref), rel(y, bf16_layer)
    print("fused_moe_fp8: rel err %.3e against reference_moe_fp8, %.3e against the bf16 layer (dequantised)" % (
        err, err_bf16))
    assert err <= FP8_END_TO_END, err
    assert err_bf16 <= 1e-1, err_bf16
    assert bitwise(fp8_layer(x, idx, wts, q), y), "a rerun differs"
    xq, xs = megamoe.quantize_fp8(x)
    assert bitwise(fp8_layer(xq, idx, wts, q, x_scales=xs), y), "e4m3 x with its scales differs from bf16 x"


def test_fused_moe_fp8_forms_agree_bitwise():
    """The same layer call through its other forms: float8_e4m3fn codes, UE8M0 scales as uint8 exponents (against
    the same scales as float32), int64 topk_idx, an MoeExperts module quantised from the bf16 weights,
    torch.compile(fullgraph=True) and a CUDA-graph replay into a sentinel-filled output; zero tokens; gradients
    refused by name."""
    x, idx, wts, q = fp8_case(T=77, seed=191)
    y = fp8_layer(x, idx, wts, q)
    F8 = megamoe.fp8.FLOAT8
    if F8 is not None:
        as_f8 = dict(q, w1=q["w1"].view(F8), w2=q["w2"].view(F8))
        xq, xs = megamoe.quantize_fp8(x, dtype=F8)
        assert bitwise(fp8_layer(xq, idx, wts, as_f8, x_scales=xs), y), "float8 codes differ"
    assert bitwise(fp8_layer(x, idx.long(), wts, q), y), "int64 topk_idx differs"
    _, _, _, u = fp8_case(T=77, seed=191, scale_format="ue8m0")
    yu = fp8_layer(x, idx, wts, u)
    exponents = dict(u, w1_scale=megamoe.fp8.float_to_ue8m0(u["w1_scale"]),
                     w2_scale=megamoe.fp8.float_to_ue8m0(u["w2_scale"]))
    assert bitwise(fp8_layer(x, idx, wts, exponents), yu), "UE8M0 exponents differ from their float32 scales"
    assert rel(yu, megamoe.fp8.reference_moe_fp8(x, idx, wts, swiglu="fp32", **u)) <= FP8_END_TO_END
    w1, w2 = weights(191)
    m = megamoe.MoeExperts.from_checkpoint(fp8_ws(), K, w2, gate=w1[:, :I], up=w1[:, I:])
    for name, t in q.items():
        assert bitwise(getattr(m, name), t), "MoeExperts' %s differs from quantize_experts'" % name
    with torch.no_grad():
        assert bitwise(m(x, idx, wts), y), "the module differs"
    if megamoe.HAS_CUSTOM_OP:
        compiled = torch.compile(lambda a, i, b: megamoe.fused_moe_fp8(a, i, b, workspace=fp8_ws(), **q),
                                 fullgraph=True)
        with torch.no_grad():
            assert bitwise(compiled(x, idx, wts), y), "compiled differs from eager"
    static = x.clone()
    side = torch.cuda.Stream()  # a warm-up on a side stream before the capture, as torch advises
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        megamoe.fused_moe_fp8(static, idx, wts, workspace=fp8_ws(), **q)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"), torch.no_grad():
        captured = megamoe.fused_moe_fp8(static, idx, wts, workspace=fp8_ws(), **q)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert bitwise(captured, y), "the graph's replay differs"
    x2 = tokens(77, 199)
    static.copy_(x2)
    graph.replay()
    assert bitwise(captured, fp8_layer(x2, idx, wts, q)), "a replay on new x differs"
    assert fp8_layer(x[:0], idx[:0], wts[:0], q).shape == (0, H)
    with raises(megamoe.ArgumentError, match="x requires grad, but the FP8 layer is inference only"):
        megamoe.fused_moe_fp8(x.clone().requires_grad_(), idx, wts, workspace=fp8_ws(), **q)


def test_workspace_on_cuda_without_an_index_serves_calls():
    w = megamoe.Workspace(max_tokens=64, training=False, device="cuda", **SHAPE)
    try:
        assert w.device == DEV, w.device
        w1, w2 = weights(151)
        x = tokens(8, 152)
        idx, wts = routing(8, 153)
        with torch.no_grad():
            assert megamoe.fused_moe(x, idx, wts, w1, w2, w).shape == x.shape
        w.check_errors()
    finally:
        w.close()


def test_check_errors_inside_a_capture_is_refused_and_breaks_nothing():
    w1, w2 = weights(161)
    x = tokens(16, 162)
    idx, wts = routing(16, 163)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        megamoe.fused_moe(x, idx, wts, w1, w2, ws())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"), torch.no_grad():
        y = megamoe.fused_moe(x, idx, wts, w1, w2, ws())
        with raises(megamoe.MegamoeError, match="the stream is being captured"):
            ws().check_errors()
    graph.replay()
    with torch.no_grad():
        assert bitwise(y, megamoe.fused_moe(x, idx, wts, w1, w2, ws()))
    ws().check_errors()


def test_two_ranks_on_one_gpu_through_a_process_group():
    script = os.path.join(HERE, "two_ranks.py")
    env = dict(os.environ, MEGAMOE_WAIT_TIMEOUT_MS=os.environ.get("MEGAMOE_WAIT_TIMEOUT_MS", "60000"))
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=400)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-6000:]
    assert "two ranks: all checks passed" in done.stdout


def test_device_error_surfaces_at_check_errors():
    """Last: an expert index outside [-1, E) is found on the device and named at check_errors (a workspace of its
    own, which the error makes unusable)."""
    bad = megamoe.Workspace(max_tokens=64, training=False, **SHAPE)
    try:
        w1, w2 = weights(141)
        x = tokens(8, 142)
        idx, wts = routing(8, 143)
        idx[3, 1] = E + 5
        with torch.no_grad():
            megamoe.fused_moe(x, idx, wts, w1, w2, bad)
        with raises(megamoe.MegamoeError) as e:
            bad.check_errors()
        assert e.value.status == _lib.DEVICE, e.value
    finally:
        bad.close()


if __name__ == "__main__":
    sys.exit(harness.main(globals()))
