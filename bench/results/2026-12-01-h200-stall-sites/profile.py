# Experiment (2026-12-01, tenth session): where the warps of the NT TMA GEMM (single blocks and cluster pairs) and of
# torch._grouped_mm spend their time on DeepSeek-V3 L1, for ncu's source-level stall sampling.
# usage: python3 profile.py LIB [CASE | E,N,K,ROWS]   launches tma, pairs, grouped_mm twice each (WHAT picks a
# subset); E,N,K,ROWS: an NT problem of E groups of ROWS rows each.
import importlib.machinery, importlib.util, ctypes, os, sys, torch
spec = importlib.util.spec_from_loader("mb", importlib.machinery.SourceFileLoader(
    "mb", os.path.join(os.path.dirname(__file__), "../../../tools/megamoe-bench/megamoe-bench")))
mb = importlib.util.module_from_spec(spec); spec.loader.exec_module(mb)
mm = mb.Megamoe(sys.argv[1])
name = sys.argv[2] if len(sys.argv) > 2 else "dsv3-ep2-l1"
if name in mb.CASES:
    layout, E, N, K, total, dist = mb.CASES[name]
else:
    E, N, K, rows = map(int, name.split(",")); total = E * rows
sm = torch.cuda.get_device_properties(0).multi_processor_count
sizes = torch.full((E,), total // E, dtype=torch.long)
ends = torch.cumsum(sizes, 0).to(torch.int32).cuda()
offs = torch.cat([torch.zeros(1, dtype=torch.int32, device="cuda"), ends])
a = torch.randn(total, K, device="cuda").bfloat16(); b = torch.randn(E, N, K, device="cuda").bfloat16()
c = torch.empty(total + 64, N, device="cuda", dtype=torch.bfloat16)
ma = mm.tensor_map(a, [K, total], [K * 2], [64, 128]); mbm = mm.tensor_map(b, [K, E * N], [K * 2], [64, 128])
tickets = torch.zeros(2, dtype=torch.int32, device="cuda")
split = torch.zeros((sm * 2 + 63) // 64 * 64 + sm * 128 * 256, dtype=torch.int32, device="cuda")
bt = b.transpose(-2, -1)
def ours(pairs):
    k = mm.kernel("grouped_gemm_nt_tma", [("E", E), ("N", N), ("K", K), ("pairs", pairs)])
    g = sm // 2 * 2
    return lambda: mm.launch(k, (g, 1, 1), [a.data_ptr(), b.data_ptr(), c.data_ptr(), offs.data_ptr(),
                                            tickets.data_ptr(), split.data_ptr(), ctypes.c_int32(0), ctypes.c_int32(g),
                                            ma, mbm])
runs = {"tma": ours(0), "pairs": ours(1), "grouped_mm": lambda: torch._grouped_mm(a, bt, offs=ends)}
for what in [w for w in os.environ.get("WHAT", "tma,pairs,grouped_mm").split(",") if w in runs]:
    runs[what](); runs[what](); torch.cuda.synchronize()
    print(what, "launched twice", flush=True)
if os.environ.get("CHECK") == "1":  # our variants against torch._grouped_mm (fp32 accumulate, bf16 out)
    ref = runs["grouped_mm"]().float()
    for what in ("tma", "pairs"):
        c.fill_(float("nan")); runs[what](); torch.cuda.synchronize()
        err = ((c[:total].float() - ref).norm() / ref.norm()).item()
        print("check %s rel err vs torch %.2e" % (what, err), flush=True)
