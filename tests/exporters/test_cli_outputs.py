"""``timeline simulate``'s output writing: the trace formats in the run directory, ``--gzip``
naming, and options reaching the exporters (the CLI's own parser: tests/cli)."""

from __future__ import annotations

import gzip
import json
import pickle

from timeline.cli.simulate import write_outputs
from timeline.exporters import DEFAULT_FORMATS


def test_default_formats_include_trace_and_snapshot():
    assert {"trace", "snapshot"} <= set(DEFAULT_FORMATS) and "perfetto" not in DEFAULT_FORMATS


def test_write_outputs_gzip_and_options(tiny_timeline, tmp_path):
    out = tmp_path / "run"
    write_outputs(tiny_timeline, out, ["trace", "snapshot", "perfetto"], force=False,
                  options={"gzip": True, "max_samples": 8, "max_entries": 10})
    assert sorted(p.name for p in out.iterdir()) == ["snapshot.pickle", "timeline-output.json", "trace.json.gz",
                                                        "trace.perfetto-trace"]
    trace = json.loads(gzip.decompress((out / "trace.json.gz").read_bytes()))
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C" and e["pid"] == 1]
    assert len(counters) <= 8
    snap = pickle.loads((out / "snapshot.pickle").read_bytes())
    assert all(len(t) <= 10 for t in snap["device_traces"])


def test_replayed_timeline_has_a_trace(tmp_path):
    """``timeline replay -o`` writes trace.json for a replayed snapshot: devices without stages
    or ops still get a process, counters and peak markers."""
    from timeline.result.replayed import timeline_from_replay

    # (t_us, sign, requested, block, address, reserved after, frame)
    rec = {0: [(10.0, 1, 1000, 1024, 4096, 2 << 20, "a"), (12.5, 1, 10, 512, 8192, 2 << 20, "b"),
               (20.0, -1, 1000, 1024, 4096, 2 << 20, "a")]}
    tl = timeline_from_replay(rec)
    write_outputs(tl, tmp_path / "r", ["trace"], force=False)
    evs = json.loads((tmp_path / "r" / "trace.json").read_bytes())["traceEvents"]
    assert evs[0]["args"]["name"] == "rank 0"
    assert [e["args"]["reserved (GiB)"] * 2**30 for e in evs if e["ph"] == "C"] == [2 << 20] * 3  # GiB, exact
    assert {e["name"] for e in evs if e["ph"] == "i"} == {"peak requested 0.00 GiB", "peak reserved 0.00 GiB"}
