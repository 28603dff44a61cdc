"""The published checkpoints served under drawn engines, releases, GPUs and settings either compute their startup
budget (and serve a small load) or are refused in one line: no draw crashes (``tools/perturb_serving_configs.py``,
which runs as many draws as asked)."""

from __future__ import annotations

from helpers_run import tool_module


def _tool():
    return tool_module("perturb_serving_configs")


def test_drawn_serving_configurations_compute_their_budget_or_are_refused_in_one_line():
    tool = _tool()
    out = tool.run(seed=2, n=30)
    assert out.crashed == []
    assert out.ran >= 18  # seed 2's first 30 draws: 21 compute
    full = tool.run(seed=4, n=6, full=True)
    assert full.crashed == [] and full.ran >= 4  # seed 4's first 6: 5 serve their load


def test_draws_are_the_same_for_the_same_seed():
    tool = _tool()
    assert tool.draws(7, 12) == tool.draws(7, 12)
    assert tool.draws(7, 12) != tool.draws(8, 12)
