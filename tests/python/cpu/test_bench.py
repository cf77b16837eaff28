"""megamoe-bench's pure helpers, without a GPU: the tool is a script (no .py), loaded as a module."""
import importlib.machinery
import importlib.util
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


@pytest.fixture(scope="module")
def bench():
    path = os.path.join(ROOT, "tools", "megamoe-bench", "megamoe-bench")
    loader = importlib.machinery.SourceFileLoader("megamoe_bench", path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("megamoe_bench", loader))
    loader.exec_module(module)
    return module


def routing(name, forward_ms, fwd_bwd_ms=None):
    r = {"case": name, "T_layer": forward_ms}
    if fwd_bwd_ms is not None:
        r["backward"] = {"T_layer": fwd_bwd_ms}
    return r


def test_ragged_summary_is_random_over_whole_tile_routing(bench):
    s = bench.ragged_summary([routing("uniform", 9.5, 33.0), routing("zipf", 12.0), routing("balanced", 8.75, 31.0)])
    assert s["forward"]["ratio"] == pytest.approx(9.5 / 8.75)
    assert s["forward_backward"]["ratio"] == pytest.approx(33.0 / 31.0)
    assert s["forward"]["random_ms"] == 9.5 and s["forward"]["whole_tile_ms"] == 8.75
    assert s["wanted_at_most"] == 1.04


def test_ragged_summary_needs_both_routings_without_error(bench):
    assert bench.ragged_summary([routing("uniform", 9.5)]) is None
    assert bench.ragged_summary([routing("uniform", 9.5), {"case": "balanced", "error": "device error"}]) is None
    forward_only = bench.ragged_summary([routing("uniform", 9.5), routing("balanced", 9.0)])
    assert "forward_backward" not in forward_only


def test_print_ragged_names_both_times_and_the_target(bench, capsys):
    bench.print_ragged(bench.ragged_summary([routing("uniform", 9.5, 33.0), routing("balanced", 8.75, 31.0)]))
    out = capsys.readouterr().out
    assert "forward 9.500 / 8.750 ms = 1.086" in out
    assert "forward + backward 33.000 / 31.000 ms = 1.065" in out
    assert "(wanted <= 1.04)" in out
