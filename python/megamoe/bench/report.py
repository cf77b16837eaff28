"""What rank 0 prints of the layer bench's cases (one line or a few per case), and the random / whole-tile routing
summary the JSON keeps ("ragged", issue 24)."""
import sys

from .runtime import BACKWARD_STAGES, STAGES


BACKWARD_LABELS = {"dgrad_dispatch": "dgrad-disp", "swiglu_backward": "swiglu-bwd", "wgrad_w2": "wgrad-w2",
                   "wgrad_w1_dispatch": "wgrad-w1-disp", "dgrad_combine": "dgrad-comb"}


def print_clocks(r):
    """--clocks' phases as rank 0 saw them."""
    if "skipped" in r:
        print("%-16s skipped: %s" % (r["case"], r["skipped"]))
        return
    for name, p in r["phases"].items():
        rate = " (%.0f TF/s)" % p["tflops"] if "tflops" in p else ""
        if "sm_mhz" not in p:
            print("%-16s %-18s %.3f ms%s | no nvidia-smi samples" % (r["case"], name, p["ms"], rate))
            continue
        print("%-16s %-18s %.3f ms%s | SM clock %.0f MHz (%.0f-%.0f) | %.0f W of a %.0f W cap | %.0f C | %d samples, "
              "reasons: %s" % (r["case"], name, p["ms"], rate, p["sm_mhz"], p["sm_mhz_min"], p["sm_mhz_max"],
                               p["power_w"], p["power_cap_w"], p["temperature_c"], p["samples"],
                               ", ".join("%s %d" % kv for kv in p["reasons"].items())))


def print_layer_case(section, r):
    name = r["case"]
    if "error" in r:
        print("%-16s ERROR %s" % (name, r["error"]))
    elif section == "sm_budget":
        print("%-16s layer on %d SMs: alone %.3f ms, beside the GEMM %.3f ms | dense GEMM alone %.3f ms (%.0f TF/s), "
              "beside the layer %.3f ms (%.0f TF/s) | both loops %.1f ms against %.1f ms one after the other (%.2f) "
              "| y identical %s" % (name, r["sm_budget"], r["layer_alone_ms"], r["layer_beside_ms"],
                                   r["gemm_alone_ms"], r["gemm_tflops_alone"], r["gemm_beside_ms"],
                                   r["gemm_tflops_beside"], r["wall_ms"], r["serial_ms"], r["wall_over_serial"],
                                   r["rerun_identical"]))
    elif section == "sweep":
        print_sweep(r)
    elif section == "clocks":
        print_clocks(r)
    elif section == "interleaved":
        print_ragged(r, ", steps in turns, rank 0")
    elif section == "graph":
        print("%-16s T=%d per rank: %d replays, mismatches %s, fp32 reference err max %.2e, check_errors %s -> %s" % (
            name, r["tokens"][0], r["replays"], "/".join(map(str, r["mismatches"])), max(r["ref_rel_err"]),
            "; ".join(r["check_errors"]) or "ok", "ok" if r["correct"] else "FAIL"))
    else:
        print("%-16s err %.2e written=%s guard=%s rerun=%s -> %s" % (
            name, r["rel_err"], r["all_written"], r["guard_untouched"], r["rerun_identical"],
            "ok" if r.get("forward_correct", r["correct"]) else "FAIL"))
        if section == "routings":
            print("%16s layer %.3f ms (dispatch_prologue %.3f) | torch %.3f ms | torch/layer %.2f (wanted >= 2.3)" % (
                "", r["T_layer"], r.get("prologue_ms", float("nan")), r["T_torch"], r["ratio"]))
            print_dense(r.get("dense"), {})
            print_timeline(r.get("timeline"), "forward")
            for op in STAGES:
                legs = r["legs"]
                print("%16s %-8s fused %.3f comm %.3f gemm %.3f ms eta %.2f speedup %.2f | TF/s %s | link GB/s %s" % (
                    "", op, legs["fused"][op], legs["comm"][op], legs["gemm"][op], r["eta"][op], r["speedup"][op],
                    "/".join("%.0f" % p["tflops"][op] for p in r["per_rank"]),
                    "/".join("%.0f" % p["link_gbps"][op] for p in r["per_rank"])))
        if "backward" in r:
            print_backward(r["backward"])
    sys.stdout.flush()


RAGGED_WANTED = 1.04  # issue 24: random routing within 4% of routing in whole-tile groups with the same rows


def ragged_summary(routings, anchor="balanced"):
    """Random (uniform) routing against the whole-tile groups of `anchor` (balanced or shuffled), same rows, from one
    run's routing cases: the forward's and (training) forward + backward's time ratios; None unless both ran
    without error."""
    by = {r["case"]: r for r in routings if "error" not in r}
    if "uniform" not in by or anchor not in by:
        return None
    u, b = by["uniform"], by[anchor]
    out = {"anchor": anchor, "forward": {"random_ms": u["T_layer"], "whole_tile_ms": b["T_layer"],
                                         "ratio": u["T_layer"] / b["T_layer"]}, "wanted_at_most": RAGGED_WANTED}
    if "T_layer" in u.get("backward", {}) and "T_layer" in b.get("backward", {}):
        ub, bb = u["backward"]["T_layer"], b["backward"]["T_layer"]
        out["forward_backward"] = {"random_ms": ub, "whole_tile_ms": bb, "ratio": ub / bb}
    return out


def print_ragged(s, how=""):
    if not s:
        return
    print("random / whole-tile routing (uniform / %s, same rows%s): " % (s["anchor"], how) + " | ".join(
        "%s %.3f / %.3f ms = %.3f" % (k.replace("_", " + "), s[k]["random_ms"], s[k]["whole_tile_ms"], s[k]["ratio"])
        for k in ("forward", "forward_backward") if k in s) + " (wanted <= %.2f)" % s["wanted_at_most"])


def print_dense(d, labels):
    """The dense-cuBLAS-equivalent line: the layer's and each stage's FLOPs at this run's dense bf16 rate."""
    if not d:
        return
    print("%16s dense-equivalent (cuBLAS bf16 %.0f TF/s this run): %.3f ms = %.2f of the layer's time, %.2f of "
          "torch's | %s" % ("", d["tflops"], d["ms"], d["ratio_layer"], d["ratio_torch"], " ".join(
              "%s %.3f (%.2f)" % (labels.get(op, op) if isinstance(labels, dict) else op, d["stage_ms"][op],
                                  d["stage_ratio"][op]) for op in d["stage_ms"])))


def print_sweep(r):
    line = "%16s T=%d layer %.3f ms torch %.3f ms (%.2f)" % ("", r["tokens"], r["T_layer"], r["T_torch"], r["ratio"])
    if "T_layer_fwd_bwd" in r:
        line += " | fwd+bwd layer %.3f ms torch %.3f ms (%.2f)" % (r["T_layer_fwd_bwd"], r["T_torch_fwd_bwd"],
                                                                  r["ratio_fwd_bwd"])
    print(line)


def print_timeline(t, label):
    if not t:
        return
    gaps = ", ".join("%.3f before %s" % (g["ms"], g["before"]) for g in t["gaps"]) or "none"
    print("%16s %s timeline (rank 0): %d kernels over %.3f ms, busy %.3f, idle %.3f, overlapped %.3f | longest gaps "
          "%s" % ("", label, t["kernels"], t["span_ms"], t["busy_ms"], t["idle_ms"], t["overlap_ms"], gaps))
    print("%16s %s" % ("", " | ".join("%s x%d %.3f" % (name, k["count"], k["ms"]) for name, k in t["by_kernel"].items())))
    # Each kernel of 0.1 ms or more in its place in the step (the same name's launches told apart by order).
    print("%16s in order: %s" % ("", " | ".join("%s %.3f" % (k["name"], k["ms"]) for k in t["sequence"] if k["ms"] >= 0.1)
                                 or "none of 0.1 ms"))


def print_backward(b):
    e = b["rel_err"]
    print("%16s backward err dx %.2e dtw %.2e dW1 %.2e dW2 %.2e y %.2e written=%s guard=%s rerun=%s zeros=%s -> %s" % (
        "", e["dx"], e["d_topk_weights"], e["dw1"], e["dw2"], e["y"], b["all_written"], b["guard_untouched"],
        b["rerun_identical"], b["skipped_zero"] and b["empty_experts_zero"], "ok" if b["correct"] else "FAIL"))
    if "legs" not in b:
        return
    print("%16s fwd+bwd layer %.3f ms | torch %.3f ms | torch/layer %.2f (wanted >= 1.85)" % (
        "", b["T_layer"], b["T_torch"], b["ratio"]))
    print_dense(b.get("dense"), BACKWARD_LABELS)
    print_timeline(b.get("timeline"), "fwd+bwd")
    legs = b["legs"]
    for op in BACKWARD_STAGES:
        line = "%16s %-13s fused %.3f comm %.3f gemm %.3f ms" % (
            "", BACKWARD_LABELS[op], legs["fused"][op], legs["comm"][op], legs["gemm"][op])
        if op in b["eta"]:
            line += " eta %.2f speedup %.2f" % (b["eta"][op], b["speedup"][op])
        if op in b["per_rank"][0]["tflops"]:
            line += " | TF/s %s" % "/".join("%.0f" % p["tflops"][op] for p in b["per_rank"])
        if op in b["per_rank"][0]["link_gbps"]:
            line += " | link GB/s %s" % "/".join("%.0f" % p["link_gbps"][op] for p in b["per_rank"])
        print(line)
