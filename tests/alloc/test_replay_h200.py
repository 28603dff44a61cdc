"""Replaying the H200 ground truth this project recorded (traces/groundtruth-h200/) through the caching model.

Eight snapshots from ``record_groundtruth.py`` on one NVIDIA H200 (torch 2.11.0+cu130): four small Hugging
Face models trained in a pipeline-like order, with the default allocator and with expandable segments.
Every allocation lands at the real address, every segment the model maps is the real one, and the peak
reserved is ``torch.cuda.max_memory_reserved()`` as the script printed it, to the byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timeline.alloc import replay_snapshot
from timeline.io.snapshot import load_snapshot

GT = Path(__file__).parents[2] / "traces" / "groundtruth-h200"
CASES = ("llama_mha", "llama_gqa", "qwen2_tied", "deepseek_v3_tiny")
#: (settings, case): (allocs, segments mapped) as the snapshot records them
EXPECTED = {
    ("default", "llama_mha"): (6294, 27), ("default", "llama_gqa"): (6294, 98),
    ("default", "qwen2_tied"): (6804, 39), ("default", "deepseek_v3_tiny"): (13716, 77),
    ("expandable", "llama_mha"): (6294, 34), ("expandable", "llama_gqa"): (6294, 96),
    ("expandable", "qwen2_tied"): (6804, 44), ("expandable", "deepseek_v3_tiny"): (13716, 84),
}


@pytest.mark.parametrize(("settings", "case"), sorted(EXPECTED))
def test_h200_snapshot_replays_exactly(settings, case):
    measured = {r["case"]: r for r in json.loads((GT / settings / "results.json").read_text())}[case]
    (rep,) = replay_snapshot(load_snapshot(GT / settings / f"{case}.pickle.gz"))
    assert rep.allocator_settings["expandable_segments"] is (settings == "expandable")
    allocs, segments = EXPECTED[settings, case]
    assert (rep.allocs, rep.alloc_address_matches) == (allocs, allocs)
    assert (rep.segment_allocs, rep.segment_alloc_matches) == (segments, segments)
    assert rep.peak_reserved_bytes_model == rep.peak_reserved_bytes_real == measured["max_reserved_bytes"]
    assert rep.end_segments_match and rep.end_blocks_match
