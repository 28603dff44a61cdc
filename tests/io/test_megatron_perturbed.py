"""Measured Megatron-LM configurations perturbed as a user's job differs from a test's (other parallel sizes, layer
counts, batch shapes, recompute, Megatron-LM's boolean arguments) either simulate or are refused in one line: no
draw crashes (``tools/perturb_megatron_configs.py``, which runs as many draws as asked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_run import tool_module

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "measured" / "megatron_calibration.json"
pytestmark = pytest.mark.skipif(not DATA.exists(), reason=f"{DATA} is absent (the measured jobs live in ../shared)")


def _tool():
    return tool_module("perturb_megatron_configs")


def test_perturbed_measured_configurations_simulate_or_are_refused_in_one_line():
    tool = _tool()
    out = tool.run(json.loads(DATA.read_text()), seed=3, draws=40, flags=True)
    assert out.crashed == []
    assert out.ran >= 20  # seed 3: 22 of the 40 simulate
    for message in out.refused:
        assert "\n" not in message and "Traceback" not in message


def test_draws_are_the_same_for_the_same_seed():
    tool = _tool()
    records = [r for r in json.loads(DATA.read_text()) if r.get("model_args")][:20]
    first = [(r["name"], c) for r, c in tool.perturbed(records, 5, 10, ["--use-flash-attn"])]
    assert first == [(r["name"], c) for r, c in tool.perturbed(records, 5, 10, ["--use-flash-attn"])]
    assert any("--use-flash-attn" in c for _, c in first)
