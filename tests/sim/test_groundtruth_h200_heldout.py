"""The ``hf`` profile on the held-out H200 recordings (``traces/groundtruth-h200/heldout``): six configs recorded
before the ``hf`` rules of the calibration cases were written, compared once those rules were final. This file
holds what they reached; no rule may be written from these cases (calibration: ``test_groundtruth_h200.py``).

Reached at main 1278fa4 (default allocator / expandable segments):
- peak allocated within 0.03 % on Llama-3-8B (2 layers), Qwen3 dense, Mistral, Qwen3-MoE and Mixtral;
- GPT-2 medium-width −13.6 %: each block saves 121.8 MB on the GPU against the profile's 71.5 MB (the
  profile's GPT-2 rules came from CPU captures; not explained yet), so it is held as a known gap below;
- peak reserved (not asserted): Llama-3-8B −0.54 %, Mistral −1.14 %, Mixtral +0.14 %, Qwen3-MoE +6.85 %,
  Qwen3 dense −12.24 %, GPT-2 −9.81 % (default); the recorded requests replayed from an empty cache reach
  within 0.2 % on all but GPT-2's expandable run, so the gaps are in the simulated request sequence, not in the
  allocator model.
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


def test_gpt2_held_out_gap_is_the_known_one(tmp_path):
    """GPT-2 stays 13.6 % under until its GPU saved tensors are explained: a change that moves it either way
    shows here (and must be reported apart, this being held out)."""
    model, measured = peak_allocated("default", "gpt2_medium", tmp_path)
    assert (model - measured) / measured == pytest.approx(-0.1359, abs=0.002)
