"""trace.json: the structural rules Perfetto's JSON importer enforces (reference/perfetto.md
§1.7), what the trace shows, downsampling, gzip, determinism and the golden file. The same
file in Perfetto's own engine: test_perfetto_engine.py."""

from __future__ import annotations

import gzip
import io
import json
import math
from collections import defaultdict

import numpy as np
import pytest
from tiny import GOLDEN, golden_bytes

from timeline.exporters import chrome_trace
from timeline.exporters.trace_common import COUNTERS, counters, downsample, nest, process_name
from timeline.graph.tensors import CATEGORIES
from timeline.result.timeline import MemorySeries


def export(tl, **options) -> bytes:
    buf = io.BytesIO()
    chrome_trace.write(tl, buf, options)
    return buf.getvalue()


def events(tl, **options) -> list[dict]:
    return json.loads(export(tl, **options))["traceEvents"]


def in_bytes(args: dict) -> dict[str, int]:
    """A counter event's args (``allocated (GiB)``: GiB) back in bytes — exact, as the writer
    divides by a power of two."""
    assert all(k.endswith(" (GiB)") for k in args)
    out = {k.removesuffix(" (GiB)"): v * 2**30 for k, v in args.items()}
    assert all(float(v).is_integer() for v in out.values())
    return {k: int(v) for k, v in out.items()}


def check_structure(evs: list[dict]) -> None:
    """Every case the importer drops or flags (§1.7)."""
    named = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    per_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in evs:
        assert "ph" in e
        assert isinstance(e["pid"], int) and 1 <= e["pid"] < 2**32
        assert e["pid"] in named
        if e["ph"] == "M":
            continue
        assert isinstance(e["ts"], int | float) and e["ts"] >= 0
        if "tid" in e:
            assert isinstance(e["tid"], int) and 1 <= e["tid"] < 2**32
        if e["ph"] == "X":
            assert e["dur"] >= 0
            per_thread[(e["pid"], e["tid"])].append((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)))
        if e["ph"] == "C":
            assert e["args"] and all(isinstance(v, float) and math.isfinite(v) for v in e["args"].values())
    for spans in per_thread.values():
        stack: list[int] = []
        for t0, t1 in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]))):
            while stack and stack[-1] <= t0:
                stack.pop()
            assert not stack or t1 <= stack[-1], "partial overlap on one thread"
            stack.append(t1)


def test_structure(tiny_timeline, oom_timeline):
    check_structure(events(tiny_timeline))
    check_structure(events(oom_timeline, max_samples=10))


def test_processes_threads_and_slices(tiny_timeline):
    tl = tiny_timeline
    evs = events(tl)
    meta = {(e["name"], e["pid"], e.get("tid")): e["args"] for e in evs if e["ph"] == "M"}
    for d, dev in enumerate(tl.sim.devices):
        assert meta[("process_name", tl.sim.devices[d].device + 1, None)]["name"] == process_name(dev)
        assert meta[("process_sort_index", tl.sim.devices[d].device + 1, None)]["sort_index"] == dev.pp_rank
        assert meta[("thread_name", tl.sim.devices[d].device + 1, 1)]["name"] == "compute"
        assert meta[("thread_name", tl.sim.devices[d].device + 1, 2)]["name"] == "tp"
    assert process_name(tl.sim.devices[1]) == "rank 2 · pp 1 · ×2"
    assert [e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"] == [1, 3]  # global rank + 1
    assert all(meta[("thread_name", dev.device + 1, 3)]["name"] == "peaks & OOMs" for dev in tl.sim.devices)
    slices = [e for e in evs if e["ph"] == "X" and e["cat"] != "action"]
    assert len(slices) == sum(len(o.t_start_us) for o in tl.sim.ops)
    assert {e["args"]["phase"] for e in slices} == {"F", "B", "R", "step"}
    tp = [e for e in slices if e["tid"] == 2]
    assert tp and all("all_gather" in e["name"] or "reduce_scatter" in e["name"] for e in tp)
    ag = next(e for e in slices if e["name"] == "layers.0.all_gather")
    assert ag["args"] == {"phase": "F", "layer": 0, "microbatch": 0, "stage": 0, "allocated_bytes": 2 << 20,
                          "action": "0F0", "iteration": 0}  # a comm op names its action
    assert ag["flow_in"] is True and ag["bind_id"] == next(
        e["bind_id"] for e in evs if e["ph"] == "X" and e["name"] == "0F0" and e["pid"] == 1)
    attn = next(e for e in slices if e["name"] == "layers.1.attn")
    assert attn["args"]["allocated_bytes"] == 3 * 2**20 + 2**20 + 100
    # run-relative µs with exactly three decimals
    raw = export(tl).decode()
    assert '"ts":0.000,' in raw


def test_counters_equal_series_at_every_sample(tiny_timeline):
    tl = tiny_timeline
    evs = events(tl)
    for d in range(tl.num_devices):
        s = tl.series(d)
        samples = [e | {"args": in_bytes(e["args"])} for e in evs
                   if e["ph"] == "C" and e["pid"] == tl.sim.devices[d].device + 1]
        keys = ["requested", "allocated", "reserved", *(c for c in COUNTERS[3:-1] if s.by_category[c].any()),
                "capacity"]
        assert all(list(e["args"]) == keys for e in samples)  # totals, held categories, capacity
        assert all(e["args"]["capacity"] == tl.sim.run.hardware.capacity_bytes for e in samples)
        ts = np.array([round(e["ts"] * 1000) for e in samples])
        assert (np.diff(ts) > 0).all()  # one sample per distinct time
        rows = np.searchsorted(np.rint(s.t_us * 1000), ts, side="right") - 1
        for e, r in zip(samples, rows, strict=True):
            assert e["args"]["requested"] == s.requested[r]
            assert e["args"]["allocated"] == s.allocated[r]
            assert e["args"]["reserved"] == s.reserved[r]
            assert e["args"]["activations"] == s.by_category["activations"][r]
        assert samples[-1]["ts"] == pytest.approx(s.t_us[-1], abs=1e-3)


def test_counters_one_sample_per_nanosecond_and_change():
    """Distinct µs floats that round to one ns give one sample (the later row); unchanged rows go."""
    n = 6
    t = np.array([0.0, 1.0, 1.0000001, 2.0, 3.0, 4.0])  # rows 1 and 2 share a nanosecond
    req = np.array([5, 7, 9, 9, 9, 4], dtype=np.int64)  # row 3 and 4 change nothing
    zero = np.zeros(n, dtype=np.int64)
    series = MemorySeries(t_us=t, requested=req, allocated=req, reserved=req + 10,
                          by_category={c: (req if c == "temporary" else zero) for c in CATEGORIES},
                          event_index=np.arange(n))

    class Stub:
        meta = type("Meta", (), {"capacity_bytes": None})()  # a replay: no capacity series

        def series(self, d):
            return series

    c = counters(Stub(), 0)
    assert c.t_ns.tolist() == [0, 1000, 4000] and c.source_rows.tolist() == [0, 2, 5]
    assert c.values["requested"].tolist() == [5, 9, 4]


def test_max_samples_keeps_the_peaks(oom_timeline):
    tl = oom_timeline
    evs = events(tl, max_samples=12)
    for d in range(tl.num_devices):
        s = tl.series(d)
        samples = [in_bytes(e["args"]) for e in evs if e["ph"] == "C" and e["pid"] == tl.sim.devices[d].device + 1]
        assert len(samples) <= 12 < len(s.t_us)
        assert max(a["requested"] for a in samples) == s.requested.max()
        assert max(a["allocated"] for a in samples) == s.allocated.max()
        assert max(a["reserved"] for a in samples) == s.reserved.max()
        assert samples[-1]["reserved"] == s.reserved[-1]


def test_downsample_bounds():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 1000, size=(3, 10_000))
    for cap in (5, 13, 100, 1000):
        keep = downsample(x, cap)
        assert len(keep) <= cap and (np.diff(keep) > 0).all() and keep[0] == 0 and keep[-1] == 9999
        assert all(x[k, keep].max() == x[k].max() for k in range(3))


def test_instants_mark_peaks_and_ooms(oom_timeline):
    tl = oom_timeline
    evs = events(tl)
    inst = [e for e in evs if e["ph"] == "i"]
    assert all(e["s"] == "t" and e["tid"] == 3 for e in inst)  # on each device's "peaks & OOMs" thread
    for d in range(tl.num_devices):
        pk = tl.peak(d)
        mine = {e["name"].rsplit(" ", 2)[0]: e for e in inst if e["pid"] == tl.sim.devices[d].device + 1
                and e["name"].startswith("peak")}
        assert {e["name"] for e in mine.values()} == {f"peak requested {pk.requested_bytes / 2**30:,.2f} GiB",
                                                      f"peak reserved {pk.reserved_bytes / 2**30:,.2f} GiB"}
        assert mine["peak requested"]["args"]["requested_bytes"] == pk.requested_bytes
        assert mine["peak reserved"]["args"]["reserved_bytes"] == pk.reserved_bytes
        assert mine["peak requested"]["ts"] == pytest.approx(pk.requested_time_us, abs=1e-3)
    ooms = [e for e in inst if e["name"].startswith("out of memory +")]
    assert len(ooms) == sum(len(m.oom) for m in tl.memory) > 0
    assert ooms[0]["args"]["capacity_bytes"] == 40 << 20


def test_action_slices_parent_their_compute_ops(tiny_timeline):
    """Each F/B/step action is a slice on the compute thread around the compute ops it runs."""
    tl = tiny_timeline
    evs = events(tl)
    for dev in tl.sim.devices:
        acts = [e for e in evs if e["ph"] == "X" and e["pid"] == dev.device + 1 and e["cat"] == "action"]
        ops = [e for e in evs if e["ph"] == "X" and e["pid"] == dev.device + 1 and e["cat"] != "action"
               and e["tid"] == 1]
        assert len(acts) == len(tl.spans[0]) and all(a["tid"] == 1 for a in acts)
        assert {a["args"]["kind"] for a in acts} == {"F", "B", "step"}
        for op in ops:  # every compute op lies inside one action of its micro-batch and stage
            (a,) = [a for a in acts if a["ts"] <= op["ts"] and op["ts"] + op["dur"] <= a["ts"] + a["dur"] + 1e-9
                    and (op["ts"] < a["ts"] + a["dur"] or op["dur"] == 0 and op["ts"] == a["ts"])]
            if a["args"]["kind"] != "step":
                assert (a["args"]["microbatch"], a["args"]["stage"]) == (op["args"]["microbatch"], op["args"]["stage"])


def test_nest_clips_partial_overlaps():
    start = np.array([0, 10, 5, 10, 20, 20], dtype=np.int64)
    end = np.array([10, 20, 15, 10, 20, 30], dtype=np.int64)  # [5,15) crosses [0,10); zero-length ones
    order, dur, clipped = nest(start, end)
    assert clipped == 1 and dur[2] == 5  # clipped to end with its parent
    assert list(order[:2]) == [0, 2]  # same start: the longer one first


def test_gzip_and_determinism(tiny_timeline):
    plain = export(tiny_timeline)
    assert plain == export(tiny_timeline)
    gz = export(tiny_timeline, gzip=True)
    assert gz[:2] == b"\x1f\x8b" and gzip.decompress(gz) == plain
    assert gz == export(tiny_timeline, gzip=True)


@pytest.mark.parametrize("name", ["trace.json", "trace_max_samples_16.json"])
def test_golden(name):
    path = GOLDEN / name
    assert golden_bytes(name) == path.read_bytes(), f"{name} changed: review, then tools/regen_goldens.py {name}"
