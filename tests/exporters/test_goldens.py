"""Golden files of the summary and Parquet exporters (the tiny OOM run, byte for byte; refresh
with ``tools/regen_goldens.py NAME`` after a deliberate change), and what summary.json says
about peaks, capacity and the recompute policy."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import pytest
from tiny import GOLDEN, golden_bytes, synthetic_template, tiny_run

from timeline.exporters import summary
from timeline.result.build import build_timeline
from timeline.spec.run import RecomputeSpec


@pytest.mark.parametrize("name", ["summary.json", "memory.parquet", "events.parquet", "ops.parquet",
                                  "devices.parquet"])
def test_golden(name):
    new, old = golden_bytes(name), (GOLDEN / name).read_bytes()
    hint = f"{name} changed: review, then tools/regen_goldens.py {name}"
    if name.endswith(".parquet"):
        # Parquet footers name the writer's version, so compare schema, metadata and every value
        import pyarrow.parquet as pq

        a, b = pq.read_table(io.BytesIO(new)), pq.read_table(io.BytesIO(old))
        assert a.schema.equals(b.schema, check_metadata=True) and a.equals(b), hint
    else:
        assert new == old, hint


def test_each_peak_has_its_own_time(tiny_timeline):
    timeline = tiny_timeline
    dev = summary.summary_dict(timeline)["devices"][0]
    pk = timeline.peak(0)
    assert (dev["peak_time_us"], dev["peak_allocated_time_us"], dev["peak_reserved_time_us"]) == (
        pk.requested_time_us, pk.allocated_time_us, pk.reserved_time_us)
    assert dev["capacity_bytes"] == timeline.sim.run.hardware.capacity_bytes
    assert sum(dev["peak_breakdown_bytes"].values()) == dev["peak_requested_bytes"]


@pytest.mark.parametrize(("spec", "fields"), [
    (RecomputeSpec(), {"policy"}),
    (RecomputeSpec(policy="selective", modules=("mlp",)), {"policy", "modules"}),
    (RecomputeSpec(policy="full", num_layers=1), {"policy", "method", "num_layers"}),
])
def test_recompute_shows_only_what_applies(spec, fields):
    tl = build_timeline(replace(tiny_run(), recompute=spec), synthetic_template)
    buf = io.BytesIO()
    summary.write(tl, buf)
    assert set(json.loads(buf.getvalue())["run"]["recompute"]) == fields
