"""megamoe-bench's pure helpers (the package's megamoe.bench), without a GPU; its entry point's --help, and that
`import megamoe` leaves the bench out."""
import os
import subprocess
import sys

import pytest
torch = pytest.importorskip("torch")

from megamoe.bench import cases, cli, clocks, layer, layer_bench, report, timing  # noqa: E402

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")
ENTRY = os.path.join(ROOT, "tools", "megamoe-bench", "megamoe-bench")


def routing(name, forward_ms, fwd_bwd_ms=None):
    r = {"case": name, "T_layer": forward_ms}
    if fwd_bwd_ms is not None:
        r["backward"] = {"T_layer": fwd_bwd_ms}
    return r


def test_ragged_summary_is_random_over_whole_tile_routing():
    s = report.ragged_summary([routing("uniform", 9.5, 33.0), routing("zipf", 12.0), routing("balanced", 8.75, 31.0)])
    assert s["forward"]["ratio"] == pytest.approx(9.5 / 8.75)
    assert s["forward_backward"]["ratio"] == pytest.approx(33.0 / 31.0)
    assert s["forward"]["random_ms"] == 9.5 and s["forward"]["whole_tile_ms"] == 8.75
    assert s["wanted_at_most"] == 1.04


def test_ragged_summary_needs_both_routings_without_error():
    assert report.ragged_summary([routing("uniform", 9.5)]) is None
    assert report.ragged_summary([routing("uniform", 9.5), {"case": "balanced", "error": "device error"}]) is None
    forward_only = report.ragged_summary([routing("uniform", 9.5), routing("balanced", 9.0)])
    assert "forward_backward" not in forward_only


def test_ragged_summary_against_the_shuffled_anchor():
    runs = [routing("uniform", 9.5, 33.0), routing("balanced", 8.75, 31.0), routing("shuffled", 9.25, 32.0)]
    s = report.ragged_summary(runs, "shuffled")
    assert s["anchor"] == "shuffled" and s["forward"]["ratio"] == pytest.approx(9.5 / 9.25)
    assert s["forward_backward"]["ratio"] == pytest.approx(33.0 / 32.0)
    assert report.ragged_summary(runs)["anchor"] == "balanced"
    assert report.ragged_summary(runs[:2], "shuffled") is None


@pytest.mark.parametrize("kind", ["balanced", "shuffled"])
def test_whole_tile_picks_give_every_expert_the_same_rows(kind):
    world, n, experts, topk = 2, 1024, 64, 8
    picks = [cases.whole_tile_picks(kind, r, world, n, experts, topk, torch.Generator().manual_seed(7))
             for r in range(world)]
    every = torch.cat(picks)
    assert every.shape == (world * n, topk)
    assert torch.bincount(every.flatten(), minlength=experts).tolist() == [world * n * topk // experts] * experts
    assert all(len(set(row.tolist())) == topk for row in every)  # distinct experts per token


def test_shuffled_picks_scatter_each_experts_tokens():
    gen = lambda: torch.Generator().manual_seed(7)
    balanced = cases.whole_tile_picks("balanced", 0, 1, 1024, 64, 8, gen())
    shuffled = cases.whole_tile_picks("shuffled", 0, 1, 1024, 64, 8, gen())
    # balanced: token t's picks are 8t .. 8t + 7 (mod 64), consecutive; shuffled: not for (almost) any token.
    consecutive = lambda idx: int(((idx[:, 1:] - idx[:, :-1]) % 64 == 1).all(dim=1).sum())
    assert consecutive(balanced) == 1024
    assert consecutive(shuffled) < 10
    assert torch.equal(shuffled, cases.whole_tile_picks("shuffled", 0, 1, 1024, 64, 8, gen()))  # same draws


def test_print_ragged_names_both_times_and_the_target(capsys):
    report.print_ragged(report.ragged_summary([routing("uniform", 9.5, 33.0), routing("balanced", 8.75, 31.0)]))
    out = capsys.readouterr().out
    assert "forward 9.500 / 8.750 ms = 1.086" in out
    assert "forward + backward 33.000 / 31.000 ms = 1.065" in out
    assert "(wanted <= 1.04)" in out
    assert "(uniform / balanced, same rows)" in out


def test_timeline_summary_counts_busy_idle_and_the_gaps():
    # us: a [0, 100), b [100, 260), c overlaps b [200, 300), a gap of 50, then a [350, 400), a gap of 100, d.
    kernels = [("b", 100, 260), ("a", 0, 100), ("c", 200, 300), ("a", 350, 400), ("d", 500, 510)]
    t = timing.timeline_summary(kernels, top=1)
    assert t["kernels"] == 5
    assert t["span_ms"] == pytest.approx(0.510)
    assert t["busy_ms"] == pytest.approx(0.360)
    assert t["idle_ms"] == pytest.approx(0.150)
    assert t["overlap_ms"] == pytest.approx(0.060)  # c with b in [200, 260)
    assert t["gaps"] == [{"ms": pytest.approx(0.100), "before": "d"}]
    assert t["by_kernel"]["a"] == {"count": 2, "ms": pytest.approx(0.150)}
    assert list(t["by_kernel"])[0] == "b"  # longest first
    assert [(k["name"], k["start_ms"], k["ms"]) for k in t["sequence"]] == [
        ("a", 0.0, pytest.approx(0.100)), ("b", pytest.approx(0.100), pytest.approx(0.160)),
        ("c", pytest.approx(0.200), pytest.approx(0.100)), ("a", pytest.approx(0.350), pytest.approx(0.050)),
        ("d", pytest.approx(0.500), pytest.approx(0.010))]
    assert timing.timeline_summary([]) is None


def test_print_timeline_names_the_gaps(capsys):
    report.print_timeline(timing.timeline_summary([("x", 0, 1000), ("y", 1500, 2000)]), "fwd+bwd")
    out = capsys.readouterr().out
    assert "fwd+bwd timeline (rank 0): 2 kernels over 2.000 ms, busy 1.500, idle 0.500, overlapped 0.000" in out
    assert "0.500 before y" in out and "x x1 1.000" in out
    assert "in order: x 1.000 | y 0.500" in out


def test_interleaved_ms_times_the_steps_in_turns():
    calls, times = [], iter([10.0, 8.0, 12.0, 10.0, 11.0, 10.0])  # a, b, a, b, a, b (ms)
    a, b = (lambda: calls.append("a")), (lambda: calls.append("b"))
    r = timing.interleaved_ms(a, b, 3, timer=lambda step: (step(), next(times))[1])
    assert calls == ["a", "b"] * 4  # one warm-up each, then three turns
    assert r["random_ms"] == 11.0 and r["whole_tile_ms"] == 10.0
    assert r["ratio"] == pytest.approx(1.2)  # the median of 1.25, 1.2, 1.1


def test_layer_jobs_time_random_against_each_whole_tile_anchor_in_turns():
    import types
    args = types.SimpleNamespace(tokens=64, routings="uniform,balanced,shuffled", graph_tokens=64, graph_replays=1,
                                 beside_gemm=False, sweep=None, plot=False)
    names = [(section, name) for section, name, _ in layer.layer_jobs(types.SimpleNamespace(world=1), args)]
    assert ("interleaved", "uniform / balanced") in names and ("interleaved", "uniform / shuffled") in names
    args.routings = "uniform,zipf"
    assert not [n for n in layer.layer_jobs(types.SimpleNamespace(world=1), args) if n[0] == "interleaved"]


def test_layer_jobs_skip_remote_routing_on_one_rank(capsys):
    import types
    args = types.SimpleNamespace(tokens=64, routings="uniform,remote", graph_tokens=64, graph_replays=1,
                                 beside_gemm=False, sweep=None, plot=False)
    one = [name for section, name, _ in layer.layer_jobs(types.SimpleNamespace(world=1), args) if section == "routings"]
    assert one == ["uniform"] and "routing remote skipped" in capsys.readouterr().out
    two = [name for section, name, _ in layer.layer_jobs(types.SimpleNamespace(world=2), args) if section == "routings"]
    assert two == ["uniform", "remote"]
    args.routings = "remote"
    with pytest.raises(SystemExit, match="at least two ranks"):
        layer.layer_jobs(types.SimpleNamespace(world=1), args)


def test_print_ragged_says_how_the_steps_were_timed(capsys):
    r = {"anchor": "balanced", "forward": {"random_ms": 11.0, "whole_tile_ms": 10.0, "ratio": 1.1},
         "wanted_at_most": 1.04}
    report.print_ragged(r, ", steps in turns, rank 0")
    out = capsys.readouterr().out
    assert "(uniform / balanced, same rows, steps in turns, rank 0): forward 11.000 / 10.000 ms = 1.100" in out



def test_clock_summary_takes_medians_past_the_first_samples_and_counts_reasons():
    query = list(clocks.CLOCK_FIELDS) + ["clocks_event_reasons.%s" % k for k in clocks.CLOCK_REASONS]
    idle = ["1980, 120.5, 700.00, 40"] + ["Not Active"] * len(clocks.CLOCK_REASONS)
    capped = lambda mhz: ["%d, 690.1, 700.00, 62" % mhz] + ["Active"] + ["Not Active"] * (len(clocks.CLOCK_REASONS) - 1)
    lines = [", ".join(idle)] * 2 + [", ".join(capped(m)) for m in (1500, 1530, 1410)] + [", ".join(idle)]
    lines += ["garbled", ""]
    r = clocks.clock_summary(query, lines, skip=2)
    assert r["samples"] == 4
    assert r["sm_mhz"] == 1515 and r["sm_mhz_min"] == 1410 and r["sm_mhz_max"] == 1980
    assert r["power_cap_w"] == 700 and r["reasons"] == {"sw_power_cap": 3, "none": 1}
    assert clocks.clock_summary(query, lines[:2], skip=2) is None


def test_clock_summary_reads_na_as_missing():
    query = list(clocks.CLOCK_FIELDS)
    r = clocks.clock_summary(query, ["1400, [N/A], 700, 60", "1420, 650, 700, 61"], skip=0)
    assert r["power_w"] == 650 and r["reasons"] == {"none": 2}


def test_layer_jobs_add_the_clocks_case_only_when_asked():
    import types
    args = types.SimpleNamespace(tokens=64, routings="uniform", graph_tokens=64, graph_replays=1,
                                 beside_gemm=False, sweep=None, plot=False, clocks=0.0)
    assert not [n for n in layer.layer_jobs(types.SimpleNamespace(world=1), args) if n[0] == "clocks"]
    args.clocks = 2.0
    assert [n[1] for n in layer.layer_jobs(types.SimpleNamespace(world=1), args) if n[0] == "clocks"] == ["clocks"]


def test_print_clocks_names_clock_power_and_reasons(capsys):
    r = {"case": "clocks", "phases": {"dense cuBLAS": {"ms": 0.714, "tflops": 673.0, "sm_mhz": 1530.0,
                                                       "sm_mhz_min": 1410.0, "sm_mhz_max": 1980.0, "power_w": 689.0,
                                                       "power_cap_w": 700.0, "temperature_c": 65.0, "samples": 56,
                                                       "reasons": {"sw_power_cap": 51, "none": 5}},
                                      "layer forward": {"ms": 10.787}}}
    report.print_clocks(r)
    out = capsys.readouterr().out
    assert "dense cuBLAS" in out and "(673 TF/s) | SM clock 1530 MHz (1410-1980) | 689 W of a 700 W cap" in out
    assert "reasons: sw_power_cap 51, none 5" in out
    assert "layer forward      10.787 ms | no nvidia-smi samples" in out


def test_layer_refuses_more_ranks_than_gpus_by_name(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "argv", ["megamoe-bench", "layer", "--nproc", "2"])
    with pytest.raises(SystemExit) as e:
        cli.main(ENTRY, "libmegamoe.so")
    assert e.value.code == 2
    assert "--nproc 2 needs 2 GPUs, this machine has 1" in capsys.readouterr().err


def test_stage_medians_time_each_leg_after_a_steady_lead_of_it(monkeypatch):
    events = []

    class Layer:
        def set_legs(self, dispatch, combine):
            events.append(("legs", dispatch))

    monkeypatch.setattr(layer_bench, "steady_lead", lambda fn, ms: events.append(("lead", ms)))
    monkeypatch.setattr(layer_bench, "sync_ranks", lambda: None)
    times = iter([9.0, 9.0, 9.0, 3.0, 5.0, 4.0])  # three warm-up samples, then the three timed ones
    step = lambda: events.append("step")
    r = layer_bench.stage_medians(Layer(), 2, step, 3, lambda: [next(times), 1.0], {"dispatch": 0, "combine": 1})
    assert events[:2] == [("legs", 2), ("lead", timing.STEADY_LEAD_MS)]  # the leg set, then its lead, then the steps
    assert events[2:] == ["step"] * 6
    assert r == {"dispatch": 4.0, "combine": 1.0}  # the warm-up samples are left out


def run_entry(*args):
    """The entry point as a user runs it (python3, its own way to the package: no PYTHONPATH from this tier)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, ENTRY] + list(args), capture_output=True, text=True, env=env, timeout=120)


def test_the_entry_point_is_an_executable_script():
    assert os.access(ENTRY, os.X_OK)
    with open(ENTRY) as f:
        assert f.readline().startswith("#!") and "megamoe.bench" in f.read()


def test_the_entry_points_help_names_the_subcommands():
    r = run_entry("--help")
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())  # argparse wraps at the terminal's width
    assert "usage: megamoe-bench [-h] {gemm,layer,layer-fp8} ..." in out
    assert "megamoe-bench: benchmarks on the GPU machine." in out  # cli's docstring, the description
    assert "gemm grouped GEMM against torch._grouped_mm and dense cuBLAS" in out
    assert "layer the fused MoE layer over --nproc GPUs against the PyTorch pipeline" in out
    assert "layer-fp8 the FP8 layer's forward against the bf16 layer's, one GPU, one rank" in out


def test_the_entry_points_subcommand_help():
    gemm = run_entry("gemm", "--help")
    assert gemm.returncode == 0, gemm.stderr
    assert "usage: megamoe-bench gemm" in gemm.stdout
    assert "--dtype {bf16,fp8}" in gemm.stdout and "--lib LIB" in gemm.stdout
    layer = run_entry("layer", "--help")
    assert layer.returncode == 0, layer.stderr
    assert "usage: megamoe-bench layer" in layer.stdout
    for flag in ("--tokens", "--routings", "--nproc", "--preset", "--backward", "--dedup", "--sm-budget", "--timeline",
                 "--clocks SECONDS", "--beside-gemm", "--sweep", "--plot", "--graph-tokens", "--graph-replays"):
        assert flag in layer.stdout, flag
    bad = run_entry("layer", "--routings", "uniform,bogus")
    assert bad.returncode == 2 and "unknown routing bogus" in bad.stderr


def test_import_megamoe_leaves_the_bench_out():
    # In a fresh interpreter: this module has imported megamoe.bench itself.
    code = ("import sys, megamoe; bench = sorted(m for m in sys.modules if m.startswith('megamoe.bench'));"
            "print('bench modules:', bench); sys.exit(1 if bench else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
    assert r.returncode == 0, r.stdout + r.stderr
