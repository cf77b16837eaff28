"""`layer --plot`: the sweep's layer and pipeline times against tokens per rank (matplotlib, where importable)."""


def plot_sweep(report, path):
    """Layer time against tokens per rank, ours against the PyTorch pipeline (PNG); matplotlib only if importable."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        print("note: no plot (%s); the sweep is in the JSON" % e)
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in report["runs"]:
        rows = [r for r in run.get("sweep", []) if "error" not in r]
        if not rows:
            continue
        cfg = run["config"]
        tag = " (dedup)" if cfg.get("dedup_tokens") else ""
        t = [r["tokens"] for r in rows]
        ax.plot(t, [r["T_layer"] for r in rows], "o-", label="megamoe forward" + tag)
        ax.plot(t, [r["T_torch"] for r in rows], "s--", label="PyTorch pipeline forward" + tag)
        if "T_layer_fwd_bwd" in rows[0]:
            ax.plot(t, [r["T_layer_fwd_bwd"] for r in rows], "o-", label="megamoe forward + backward" + tag)
            ax.plot(t, [r["T_torch_fwd_bwd"] for r in rows], "s--", label="PyTorch pipeline + autograd" + tag)
    cfg = report["runs"][0]["config"]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per rank")
    ax.set_ylabel("ms per layer call (max over ranks)")
    ax.set_title("H %d I %d E %d top-%d, %d rank(s), %s" % (cfg["hidden"], cfg["intermediate"], cfg["experts"],
                                                          cfg["topk"], report["ranks"], report["device"]))
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print("plot: %s" % path)
    return True
