"""`megamoe-bench layer` under torch.distributed.run, one process per GPU: the cases in order (layer_jobs), each
run with an error recorded per case, one run per --dedup mode; rank 0 prints and writes the JSON (and the plot)."""
import json
import os
import sys

import torch
import torch.distributed as dist

from .cases import TOKEN_CASES, presets
from .layer_bench import LayerBench
from .plots import plot_sweep
from .ranks import CaseError, on_all_ranks
from .report import print_layer_case, print_ragged, ragged_summary
from .runtime import Layer, Megamoe


def layer_jobs(bench, args):
    """(section, case name, function) of every layer case, in order."""
    T, world = args.tokens, bench.world
    routings = args.routings.split(",")
    if world == 1 and "remote" in routings:  # every expert is this rank's own: "only other ranks' experts" is empty
        routings.remove("remote")
        print("routing remote skipped: with one rank no expert belongs to another rank", flush=True)
        if not routings:
            raise SystemExit("megamoe-bench layer: --routings remote needs at least two ranks (--nproc 2)")
    jobs = [("routings", kind, lambda kind=kind: bench.routing_case(kind, T)) for kind in routings]
    # random against whole-tile routing, their steps in turns (the acceptance's ratio, steadier than two cases'
    # times taken minutes apart)
    for anchor in ("balanced", "shuffled"):
        if "uniform" in routings and anchor in routings:
            jobs.append(("interleaved", "uniform / " + anchor,
                         lambda anchor=anchor: on_all_ranks(lambda: bench.interleaved_case(anchor, T))))
    for pair in TOKEN_CASES:
        tokens = [min(pair[min(r, 1)], T) for r in range(world)]
        jobs.append(("token_cases", "tokens " + "/".join(map(str, tokens)),
                     lambda tokens=tokens: bench.check_case(tokens)))
    jobs.append(("skipped_picks", "skip 10%", lambda: bench.check_case([T] * world, skip=0.1)))
    jobs.append(("graph", "graph", lambda: bench.graph_case(min(args.graph_tokens, T), args.graph_replays,
                                                             routings)))
    if args.beside_gemm:
        jobs.append(("sm_budget", "beside gemm", lambda: bench.beside_gemm_case(T, args.reps)))
    if getattr(args, "clocks", 0):
        jobs.append(("clocks", "clocks", lambda: bench.clocks_case(T, args.clocks)))
    for n in sweep_tokens(args):
        jobs.append(("sweep", "sweep %d" % n, lambda n=n: bench.sweep_case(n)))
    return jobs


def sweep_tokens(args):
    """--sweep's token counts; with --plot and no --sweep, powers of two from 256 up to --tokens, and --tokens."""
    if args.sweep:
        return [n for n in (int(v) for v in args.sweep.split(",")) if 1 <= n <= args.tokens]
    if not args.plot:
        return []
    out, n = [], 256
    while n < args.tokens:
        out.append(n)
        n *= 2
    return out + [args.tokens]


def run_jobs(jobs, show):
    """Runs every job, recording an error per case; after a device error the layer is unusable: the rest is not
    run. Returns {section: [case results]}."""
    sections, dead = {}, None
    for section, name, fn in jobs:
        if dead:
            r = {"error": "not run: " + dead}
        else:
            try:
                r = fn()
            except CaseError as e:
                r = {"error": str(e)}
                if e.fatal:
                    dead = "the layer is unusable after the device error in " + name
            except Exception as e:  # this script's own failure: the same on every rank
                r = {"error": "%s: %s" % (type(e).__name__, e)}
        r = dict(case=name, **r)
        sections.setdefault(section, []).append(r)
        show(section, r)
        torch.cuda.empty_cache()
    return sections


def layer_main(args):
    """One rank under torch.distributed.run; rank 0 prints and writes the JSON."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(int.from_bytes(os.urandom(4), "little") * world + rank)  # fresh, distinct per rank
    modes = {"off": [0], "on": [1], "both": [0, 1]}[args.dedup]
    runs = []
    for mode in modes:
        path = ["/tmp/megamoe-bench-%d-%d.sock" % (os.getpid(), mode)]
        dist.broadcast_object_list(path, src=0)
        runs.append(layer_run(args, rank, world, mode, path[0]))
    report = {k: runs[0][k] for k in ("device", "torch", "ranks")}
    report.update(runs=runs, passed=all(r["passed"] for r in runs))
    if rank == 0:
        if len(runs) > 1:
            print("all runs: %s" % ("all correctness checks passed" if report["passed"] else "CORRECTNESS FAILED"))
        if args.plot:
            report["plot"] = args.plot if plot_sweep(report, args.plot) else None
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    dist.destroy_process_group()
    return 0 if report["passed"] else 1


def layer_shape(args):
    """hidden, intermediate, experts, topk: --preset's, each overridden by its own option."""
    shape = dict(presets(args.lib)[args.preset])
    for k in shape:
        if getattr(args, k):
            shape[k] = getattr(args, k)
    return shape


def layer_run(args, rank, world, dedup, path):
    """Every layer case on a layer with token deduplication `dedup` (0 / 1); rank 0 prints. Returns the report."""
    cfg = dict(layer_shape(args), max_tokens=args.tokens, swiglu_clamp_milli=0, training=int(args.backward), dtype=0,
               dedup_tokens=dedup, sm_budget=args.sm_budget)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "ranks": world, "config": cfg}
    show = print_layer_case if rank == 0 else lambda section, r: None
    layer = bench = None
    try:
        mm = on_all_ranks(lambda: Megamoe(args.lib))
        layer = on_all_ranks(lambda: Layer(mm, cfg, rank, world, path))
        report["activation_bytes"] = [None] * world
        dist.all_gather_object(report["activation_bytes"], on_all_ranks(layer.activation_bytes))
        if args.backward:
            report["kept_bytes"] = [None] * world
            dist.all_gather_object(report["kept_bytes"], on_all_ranks(layer.kept_bytes))
        bench = on_all_ranks(lambda: LayerBench(layer, cfg, args.reps, args.backward, args.timeline))
        if args.backward:
            report["torch_backward"] = {"mode": bench.gmm_bwd.backward, "padded": bench.gmm_bwd.padded,
                                        "why": bench.gmm_bwd_why}
    except CaseError as e:
        report["error"] = str(e)
    if rank == 0:
        print("device: %s x%d | torch %s | H %d I %d E %d top-%d | %d tokens per rank | token dedup %s" % (
            report["device"], world, report["torch"], cfg["hidden"], cfg["intermediate"], cfg["experts"],
            cfg["topk"], args.tokens, "on" if dedup else "off"))
        if "error" in report:
            print("ERROR", report["error"])
        else:
            print("activations per rank: %s | times: medians, max over ranks | TF/s, GB/s: per rank" % "/".join(
                "%.2f GiB" % (b / 2 ** 30) for b in report["activation_bytes"]))
            if args.backward:
                gib = lambda key: "/".join("%.2f" % (k[key] / 2 ** 30) for k in report["kept_bytes"])
                print("training layer: kept for the backward per rank %s GiB | without recompute %s GiB | the "
                      "dispatched x not kept %s GiB" % (gib("kept"), gib("kept_without_recompute"),
                                                         gib("dispatched_x")))
                print("PyTorch pipeline backward:", report["torch_backward"]["why"])
        sys.stdout.flush()
    if bench:
        report.update(run_jobs(layer_jobs(bench, args), show))
        padded = [None] * world
        dist.all_gather_object(padded, bench.gmm.padded)
        report["grouped_mm_padded"] = any(padded)
        if args.backward:
            dist.all_gather_object(padded, bench.gmm_bwd.padded)
            report["torch_backward"]["padded"] = any(padded)
    cases = [r for section in ("routings", "token_cases", "skipped_picks", "graph", "sm_budget", "sweep")
             for r in report.get(section, [])]
    report["passed"] = "error" not in report and bool(cases) and all(r.get("correct") for r in cases)
    ragged = {key: ragged_summary(report.get("routings", []), anchor)
              for key, anchor in (("ragged", "balanced"), ("ragged_shuffled", "shuffled"))}
    report.update({key: s for key, s in ragged.items() if s})
    if rank == 0:
        for s in ragged.values():
            print_ragged(s)
        if report.get("grouped_mm_padded"):
            print("note: this torch._grouped_mm refuses group ends that are not multiples of 16: the PyTorch pipeline "
                  "pads every group to 16 rows (zero rows)")
        print("all correctness checks passed" if report["passed"] else "CORRECTNESS FAILED")
    if layer:
        layer.destroy()
    return report
