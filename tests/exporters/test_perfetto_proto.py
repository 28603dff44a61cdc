"""trace.perfetto-trace: parses as a ``perfetto.protos`` Trace with the tracks and events we
mean, GiB-valued counters, deterministic bytes, the golden file. (Loading it in Perfetto's
engine: test_perfetto_engine.py.)"""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import pytest
from tiny import GOLDEN, golden_bytes

from timeline.exporters import perfetto_proto
from timeline.exporters.trace_common import actions, counters, process_name

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2",
                         reason="the perfetto package is not installed (pip install -e '.[test]')")


def export(tl, **options) -> bytes:
    buf = io.BytesIO()
    perfetto_proto.write(tl, buf, options)
    return buf.getvalue()


def test_parses_with_the_tracks_and_events_we_mean(oom_timeline):
    tl = oom_timeline
    trace = pb.Trace.FromString(export(tl))
    packets = list(trace.packet)
    assert all(p.trusted_packet_sequence_id == perfetto_proto.SEQUENCE_ID for p in packets)
    assert packets[0].sequence_flags == pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    tracks = [p.track_descriptor for p in packets if p.HasField("track_descriptor")]
    # a root group ordering its children explicitly, one child per device in global-rank order
    root = tracks[0]
    assert root.uuid == perfetto_proto.ROOT_TRACK and root.child_ordering == pb.TrackDescriptor.EXPLICIT
    groups = [t for t in tracks if t.parent_uuid == root.uuid]
    assert [(t.name, t.sibling_order_rank) for t in groups] == [(process_name(dev), dev.device) for dev in tl.devices]
    assert all(t.child_ordering == pb.TrackDescriptor.EXPLICIT for t in groups)
    assert not any(t.HasField("process") or t.HasField("thread") for t in tracks)
    counter_tracks = [t for t in tracks if t.HasField("counter")]
    assert len(counter_tracks) == sum(len(counters(tl, d).keys) for d in range(tl.num_devices))
    assert {t.name for t in counter_tracks} >= {"memory reserved", "memory capacity"}
    assert all(t.counter.unit_name == "GiB" for t in counter_tracks)
    values = [p.track_event.double_counter_value for p in packets
              if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_COUNTER]
    assert all(float(v * 2**30).is_integer() for v in values)  # GiB, exactly: bytes / 2**30
    assert max(values) * 2**30 == max(int(counters(tl, d).values["reserved"].max()) for d in range(tl.num_devices))
    kinds = Counter(p.track_event.type for p in packets if p.HasField("track_event"))
    n_ops = sum(len(o.t_start_us) for o in tl.sim.ops)
    n_actions = sum(len(actions(tl, d).spans) for d in range(tl.num_devices))
    assert kinds[pb.TrackEvent.TYPE_SLICE_BEGIN] == kinds[pb.TrackEvent.TYPE_SLICE_END] == n_ops + n_actions
    assert kinds[pb.TrackEvent.TYPE_INSTANT] == 2 * tl.num_devices + sum(len(m.oom) for m in tl.memory)
    # each counter track holds a value where it changes (and at the end)
    changes = 0
    for d in range(tl.num_devices):
        c = counters(tl, d)
        for v in c.values.values():
            changes += 1 + int(np.count_nonzero(v[1:] != v[:-1])) + int(v[-1] == v[-2])
    assert kinds[pb.TrackEvent.TYPE_COUNTER] == changes
    names = {n.iid: n.name for p in packets for n in p.interned_data.event_names}
    assert "layers.0.all_gather" in names.values() and len(names) == len(set(names.values()))


def test_begin_end_balanced_per_track(tiny_timeline):
    depth: Counter = Counter()
    for p in pb.Trace.FromString(export(tiny_timeline)).packet:
        ev = p.track_event
        if ev.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            depth[ev.track_uuid] += 1
        elif ev.type == pb.TrackEvent.TYPE_SLICE_END:
            depth[ev.track_uuid] -= 1
            assert depth[ev.track_uuid] >= 0
    assert set(depth.values()) == {0}


def test_deterministic_and_golden(oom_timeline):
    assert export(oom_timeline) == export(oom_timeline)
    assert golden_bytes("trace.perfetto-trace") == (GOLDEN / "trace.perfetto-trace").read_bytes(), \
        "trace.perfetto-trace changed: review, then tools/regen_goldens.py trace.perfetto-trace"


def test_peaks_and_ooms_on_their_own_named_track(oom_timeline):
    tl = oom_timeline
    trace = pb.Trace.FromString(export(tl))
    named = {p.track_descriptor.uuid: p.track_descriptor.name for p in trace.packet
             if p.HasField("track_descriptor") and p.track_descriptor.name == "peaks & OOMs"}
    assert len(named) == tl.num_devices
    marks = [p.track_event for p in trace.packet
             if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_INSTANT]
    assert {m.track_uuid for m in marks} == set(named)
    assert len(marks) == 2 * tl.num_devices + sum(len(m.oom) for m in tl.memory)
    names = [m.name for m in marks]
    assert sum(n.startswith("out of memory +") and n.endswith(" GiB") for n in names) == sum(len(m.oom) for m in tl.memory)
    pk = tl.peak(0)
    assert f"peak reserved {pk.reserved_bytes / 2**30:,.2f} GiB" in names
