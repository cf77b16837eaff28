"""megamoe-bench: benchmarks on the GPU machine. Our kernels run through the C ABI (libmegamoe.so) by way of the
Python package's bindings (python/megamoe/_lib.py, the one copy of them) on the same torch tensors as the anchors,
in the same run, so every ratio compares like with like.

  megamoe-bench gemm [--cases NAME,...] [--json FILE] [--reps N]
  megamoe-bench layer [--tokens 8192] [--routings uniform,remote,zipf,hot] [--reps 10] [--json FILE] [--lib PATH]
                      [--nproc 2] [--experts 256] [--graph-tokens 1024] [--graph-replays 1000] [--backward]
                      [--dedup off|on|both] [--sm-budget N] [--beside-gemm] [--clocks SECONDS]
                      [--preset NAME | --hidden H --intermediate I --experts E --topk K] [--sweep T,...] [--plot PNG]
  megamoe-bench layer-fp8 [--tokens 512,2048,8192] [--hidden 7168 --intermediate 2048 --experts 128 --topk 8]
                          [--reps 10] [--json FILE] [--lib PATH]

gemm: grouped GEMM NT / NN / TN (variable K) against torch._grouped_mm (CUTLASS) and a dense cuBLAS GEMM of the
same total size; TFLOP/s and ratios, plus a correctness check per case (fp32 reference, sentinel rows, rerun
bitwise identical). Kernels come from the cache ($MEGAMOE_CACHE_DIR); generate them with
`megamoe-cache generate --kernel grouped_gemm_nt --spec E=..,N=..,K=..` (scripts/gen-bench-cache.sh does all cases).

layer: the fused MoE layer forward (megamoe_layer_*, any model shape: --preset (default deepseek-v3) or --hidden
--intermediate --experts --topk, each overriding the preset's; one process per GPU: without $RANK the
script re-runs itself under torch.distributed.run with --nproc processes) against the same layer written the way a
PyTorch user writes it (all_to_all_single, torch._grouped_mm, index_add_), on the same tensors. Correctness against
a distributed fp32 reference (relative Frobenius error <= 1e-2 over all ranks, all rows written, NaN guard rows
untouched, rerun bitwise identical) for each routing, for token counts that differ between ranks and for picks of
-1; same-run times of the layer and the PyTorch pipeline; the legs of each fused operator (fused, comm only, GEMM
only: overlap, TFLOP/s, link GB/s); a forward captured in a CUDA graph and replayed with routing written in place,
every replay bitwise equal to a plain forward. Times are medians, reported per rank and as the max over ranks.
The layer's and the pipeline's times are taken after a 300 ms lead of back-to-back calls, in the steady state
under the board's power cap (a few calls after an idle spell run faster). Beside each routing's times, the
dense-cuBLAS equivalent: the layer's (and each stage's) FLOPs at the rate of one dense cuBLAS bf16 GEMM ([8192, H] x
[H, 2I]) measured in the same run (back to back, in the same steady state), and its ratio to the layer's time and
to the PyTorch pipeline's (1.0: as fast as dense cuBLAS on the same FLOPs). With --routings uniform,balanced (balanced:
every expert the same rows, whole 128-row tiles where they divide) the run ends with the ratio of the two layer times
(forward, and with --backward forward + backward; the JSON's "ragged"), which issue 24 wants at most 1.04; with
shuffled as well (the same rows an expert, each token's picks at random), the ratio to it ("ragged_shuffled").
The same ratios also come from the two routings' steps timed in turns (uniform, balanced, uniform, ...: the JSON's
"interleaved", the median of the turns' ratios), which clocks and temperature drifting over the run leave alone.

layer --timeline: each routing's forward (and with --backward, forward + backward) step once more under
torch.profiler: how long some kernel ran and how long the GPU sat idle between the step's kernels, the longest
gaps and the kernel after each, the time per kernel name (the JSON's "timeline"; rank 0's printed).

layer --sweep T,... / --plot PNG: the layer and the pipeline timed at each token count per rank (forward; with
--backward forward + backward too), in the JSON's "sweep"; --plot draws them against tokens per rank (matplotlib
when importable, else only the JSON; without --sweep, powers of two from 256 up to --tokens).
Exit status 0 only if every correctness check passed.

layer --backward: all of the above on a training layer (config.training = 1), and per case the backward too
(megamoe_layer_backward after a forward on the same inputs): dx, d_topk_weights, dW1, dW2 (and y) against an fp32
reference (autograd of each expert's share of <dy, y> on its owner, the exchanges' adjoints by hand), each within
relative Frobenius error 1e-2 over all ranks, every output NaN-filled first and fully written, guard rows / guard
experts untouched, 0 for the -1 picks and for experts without tokens, a second forward + backward bitwise identical.
Per routing: forward + backward of the layer against the PyTorch pipeline with autograd (torch._grouped_mm's own
backward, or one written by hand in grouped GEMMs where this torch has none); the legs of each backward stage
(fused, comm only, GEMM only) with eta = max(comm, gemm) / fused for the three fused ones; the bytes the training
forward keeps (and would keep without recomputing the dispatched x).

layer --dedup on|both: the layer with token deduplication (config.dedup_tokens: a token crosses to an owner rank
once, however many of that rank's experts it picked); `both` runs every case once without, then once with it, in
the same process (the JSON's "runs"). The dispatch's link GB/s then counts the rows that cross: one per (token,
remote owner).

layer --sm-budget N: the layer's kernels on N SMs (config.sm_budget; default every SM). --beside-gemm adds a case:
the layer at its budget while a dense bf16 GEMM (8192 x 4096 x 7168, torch.matmul) runs in a loop on another stream,
which gets the SMs the layer leaves; per-call ms of each alone and side by side, and the wall time of both loops
together against running them one after the other (the y of the side-by-side run must equal a plain forward's).

layer --clocks SECONDS: what the board does under each part of the comparison (uniform routing): the dense anchor,
the layer's forward (also with its GEMM legs only, and under balanced routing; with --backward its forward +
backward) and the PyTorch pipeline's forward, each back to back for SECONDS while nvidia-smi samples the SM clock,
board power, temperature and the active clock event reasons every 50 ms (the JSON's "clocks"). Under the board's
power cap time is energy: a kernel that holds a lower clock than cuBLAS at the same power spends more energy per
product.
"""
# The docstring above is the command line's --help (main's argparse description): megamoe.bench.cli holds the command
# line; tools/megamoe-bench/megamoe-bench, its entry point, finds the package and calls main.
import argparse
import json
import os
import subprocess
import sys

import torch

from .cases import FP8_CASES, OPTIONAL_ROUTINGS, ROUTINGS, presets
from .gemm import gemm_main
from .layer import layer_main
from .layer_fp8 import layer_fp8_main


def main(script, default_lib):
    """The command line (sys.argv); script: the entry point that torch.distributed.run runs once per rank when
    `layer` runs outside it; default_lib: --lib's default. Returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gemm", help="grouped GEMM against torch._grouped_mm and dense cuBLAS")
    g.add_argument("--cases", help="comma-separated case names (default: all; with --dtype fp8: %s)" % ",".join(FP8_CASES))
    g.add_argument("--dtype", choices=("bf16", "fp8"), default="bf16",
                   help="fp8: grouped_gemm_nt_fp8 (e4m3, 128 x 128 block scales) against bf16 and torch's FP8 GEMMs")
    g.add_argument("--reps", type=int, default=10)
    g.add_argument("--json")
    g.add_argument("--lib", default=default_lib)
    m = sub.add_parser("layer", help="the fused MoE layer over --nproc GPUs against the PyTorch pipeline")
    m.add_argument("--tokens", type=int, default=8192, help="tokens per rank (the layer's max_tokens)")
    m.add_argument("--routings", default=",".join(ROUTINGS))
    m.add_argument("--reps", type=int, default=10)
    m.add_argument("--json")
    m.add_argument("--lib", default=default_lib)
    m.add_argument("--nproc", type=int, default=2, help="processes (GPUs), when not already under torchrun")
    m.add_argument("--preset", default="deepseek-v3",
                   help="the model shape: a model of the model table (`megamoe-cache presets`)")
    m.add_argument("--hidden", type=int, default=0, help="H (default: the preset's)")
    m.add_argument("--intermediate", type=int, default=0, help="I (default: the preset's)")
    m.add_argument("--experts", type=int, default=0,
                   help="experts in all (default: the preset's); e.g. 128 with --nproc 1: DeepSeek-V3 EP2's per-GPU "
                        "work on one GPU")
    m.add_argument("--topk", type=int, default=0, help="top-k (default: the preset's)")
    m.add_argument("--sweep", help="token counts per rank to time the layer and the pipeline at (e.g. 512,2048,8192)")
    m.add_argument("--plot", help="PNG of layer time against tokens per rank, ours and the pipeline's (--sweep, "
                                  "default powers of two up to --tokens); needs matplotlib, else only the JSON")
    m.add_argument("--graph-tokens", type=int, default=1024)
    m.add_argument("--graph-replays", type=int, default=1000)
    m.add_argument("--dedup", choices=("off", "on", "both"), default="off",
                   help="token deduplication in the forward dispatch (a token crosses to an owner once); both: the "
                        "whole run once without, then once with it")
    m.add_argument("--backward", action="store_true",
                   help="a training layer: the backward too (correctness, times against autograd, stage legs)")
    m.add_argument("--sm-budget", type=int, default=0,
                   help="SMs of the layer's kernels (config.sm_budget, even); 0: MEGAMOE_SM_BUDGET, else every SM")
    m.add_argument("--timeline", action="store_true",
                   help="each routing's step (and fwd+bwd step) once under torch.profiler: its kernels' busy and idle "
                        "time, the longest gaps, time per kernel (JSON \"timeline\", rank 0's printed)")
    m.add_argument("--clocks", type=float, default=0.0, metavar="SECONDS",
                   help="the dense anchor, the layer and the PyTorch pipeline each back to back for SECONDS under "
                        "nvidia-smi: SM clock, power, clock event reasons (JSON \"clocks\"); 0: off")
    m.add_argument("--beside-gemm", action="store_true",
                   help="a case with a dense GEMM looping on another stream beside the layer (use with --sm-budget)")
    f = sub.add_parser("layer-fp8", help="the FP8 layer's forward against the bf16 layer's, one GPU, one rank")
    f.add_argument("--tokens", default="512,2048,8192", help="token counts (the largest is max_tokens)")
    f.add_argument("--hidden", type=int, default=7168)
    f.add_argument("--intermediate", type=int, default=2048)
    f.add_argument("--experts", type=int, default=128, help="128: DeepSeek-V3 EP2's per-GPU work")
    f.add_argument("--topk", type=int, default=8)
    f.add_argument("--reps", type=int, default=10)
    f.add_argument("--json")
    f.add_argument("--lib", default=default_lib)
    args = ap.parse_args()
    if args.cmd == "gemm":
        return gemm_main(args)
    if args.cmd == "layer-fp8":
        result = layer_fp8_main(args)
        if args.json:
            with open(args.json, "w") as out:
                json.dump(result, out, indent=1)
        return 0
    unknown = set(args.routings.split(",")) - set(ROUTINGS) - set(OPTIONAL_ROUTINGS)
    if unknown:
        ap.error("unknown routing %s (known: %s)" % (",".join(sorted(unknown)), ",".join(ROUTINGS + OPTIONAL_ROUTINGS)))
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    if "RANK" not in os.environ:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus and args.nproc > gpus:  # each rank takes a GPU of its own; NCCL refuses two ranks on one
            ap.error("--nproc %d needs %d GPUs, this machine has %d (for one GPU's share of a larger layer: --nproc 1 "
                     "--experts E, e.g. --experts 128 for DeepSeek-V3 EP2; gpu_layer_test runs several ranks on one "
                     "GPU)" % (args.nproc, args.nproc, gpus))
        check_preset(ap, args)
        # Our own arguments again, without --nproc (torch.distributed.run would take it for its --nproc-per-node).
        rest, skip = [], False
        for a in sys.argv[1:]:
            if skip or a.startswith("--nproc="):
                skip = False
                continue
            if a == "--nproc":
                skip = True
                continue
            rest.append(a)
        return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                str(args.nproc), script] + rest)
    check_preset(ap, args)
    return layer_main(args)


def check_preset(ap, args):
    """--preset names a model of the model table (read from --lib), else the usage error that lists them."""
    known = presets(args.lib)
    if args.preset not in known:
        ap.error("unknown preset %s (the model table's: %s)" % (args.preset, ", ".join(known)))
