"""Every run file in schedules/ loads, validates and reports static memory; the DualPipeV
example's claim (every rank fits in 80 GiB with full recompute) holds when simulated."""

from __future__ import annotations

from pathlib import Path

import pytest
from sources import devices_of

from timeline.io.runfile import load_run
from timeline.result.build import build_timeline

SCHEDULES = Path(__file__).resolve().parents[1] / "schedules"
SERVING = sorted(p for p in SCHEDULES.glob("*.toml") if "[serving]" in p.read_text())


@pytest.mark.parametrize("path", sorted(set(SCHEDULES.glob("*.toml")) - set(SERVING)), ids=lambda p: p.stem)
def test_run_file_loads(path):
    run = load_run(path)
    assert run.name == path.stem
    assert all(d.total_bytes > 0 for d in devices_of(run))


@pytest.mark.parametrize("path", SERVING, ids=lambda p: p.stem)
def test_serving_file_starts_its_engine(path):
    from timeline.io.serve_runfile import load_serve_run
    from timeline.serve.budget import compute_budget

    run = load_serve_run(path)
    assert run.name == path.stem
    b = compute_budget(run)
    assert not b.failure and b.num_kv_blocks * b.block_size >= run.max_model_len


def test_dualpipev_example_fits_every_rank():
    run = load_run(SCHEDULES / "deepseek-v3-dualpipev-megatron.toml", ["training.iterations=1"])
    tl = build_timeline(run)
    for d in range(tl.num_devices):
        assert not tl.memory[d].oom
        assert tl.peak(d).reserved_bytes <= run.hardware.capacity_bytes
