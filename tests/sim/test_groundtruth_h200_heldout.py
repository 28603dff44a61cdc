"""The ``hf`` profile on the held-out H200 recordings (``traces/groundtruth-h200/heldout``): six configs recorded
before the ``hf`` rules of the calibration cases were written, compared once those rules were final. This file
holds what they reached; no rule may be written from these cases (calibration: ``test_groundtruth_h200.py``).

Reached at main 1278fa4 (default allocator / expandable segments):
- peak allocated within 0.03 % on Llama-3-8B (2 layers), Qwen3 dense, Mistral, Qwen3-MoE and Mixtral;
- GPT-2 medium-width −13.6 %: each block saved 121.8 MB on the GPU against the profile's 71.5 MB;
- peak reserved (not asserted): Llama-3-8B −0.54 %, Mistral −1.14 %, Mixtral +0.14 %, Qwen3-MoE +6.85 %,
  Qwen3 dense −12.24 %, GPT-2 −9.81 % (default); the recorded requests replayed from an empty cache reach
  within 0.2 % on all but GPT-2's expandable run, so the gaps are in the simulated request sequence, not in the
  allocator model.

GPT-2 once more, after the activation rule (``spec/hf_activations.py``: ``gelu_new`` is transformers'
``NewGELUActivation`` expression, which keeps x, tanh, 0.5·x and 1 + tanh) was written from the calibration
recording ``../gpt2-calibration`` and real autograd on the CPU: every block's saved bytes equal the H200's
(121,798,672 B), peak allocated −0.02 % / −0.03 %, peak reserved −0.74 % / −0.43 %. The second held-out set
(``heldout2``: two GPT-2 configs recorded in the same call, chosen before the rule) is held in
``test_gpt2_second_held_out_set``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from timeline.result.build import build_timeline

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = ROOT / "traces" / "groundtruth-h200" / "heldout"
sys.path.insert(0, str(ROOT / "tools"))
import compare_groundtruth as cg  # noqa: E402

MATCHED = ("llama3_8b_2l", "qwen3_dense", "mistral_gqa", "qwen3_moe_small", "mixtral_small")


def recorded(allocator: str, case: str) -> dict:
    return next(c for c in json.loads((HELD_OUT / allocator / "results.json").read_text()) if c["case"] == case)


def peak_allocated(allocator: str, case: str, tmp: Path) -> tuple[int, int]:
    rec = recorded(allocator, case)
    timeline = build_timeline(cg.case_run(rec, tmp))
    return timeline.peak(0).allocated_bytes, rec["max_allocated_bytes"]


@pytest.mark.parametrize("allocator", ["default", "expandable"])
@pytest.mark.parametrize("case", MATCHED)
def test_held_out_peak_allocated_within_0_1_percent(allocator, case, tmp_path):
    model, measured = peak_allocated(allocator, case, tmp_path)
    assert abs(model - measured) / measured <= 0.001, (model, measured)


@pytest.mark.parametrize("allocator", ["default", "expandable"])
def test_gpt2_held_out_peak_allocated_within_0_1_percent(allocator, tmp_path):
    model, measured = peak_allocated(allocator, "gpt2_medium", tmp_path)
    assert abs(model - measured) / measured <= 0.001, (model, measured)


HELD_OUT2 = ROOT / "traces" / "groundtruth-h200" / "heldout2"


@pytest.mark.parametrize("allocator", ["default", "expandable"])
@pytest.mark.parametrize("case", ["gpt2_h1280", "gpt2_narrow_gelu"])
def test_gpt2_second_held_out_set(allocator, case, tmp_path):
    """Compared once, with the rule final: saved bytes per block to the byte, peak allocated within 0.15 %
    (reached −0.04 % / −0.03 % and −0.11 % / −0.05 %; peak reserved, not asserted, −11.24 % / −4.21 % and
    −0.27 % / −4.08 %: the first's recorded requests from an empty cache reach −1.05 %, the rest is the cache
    the recorder's warm-up pass left)."""
    rec = next(c for c in json.loads((HELD_OUT2 / allocator / "results.json").read_text()) if c["case"] == case)
    timeline = build_timeline(cg.case_run(rec, tmp_path))
    layers = timeline.sim.templates[0].layer_activation_bytes
    assert [layers[i] for i in range(len(rec["layer_saved_bytes"]))] == rec["layer_saved_bytes"]
    model, measured = timeline.peak(0).allocated_bytes, rec["max_allocated_bytes"]
    assert abs(model - measured) / measured <= 0.0015, (model, measured)
