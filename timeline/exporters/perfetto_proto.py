"""``trace.perfetto-trace``: the same picture as ``trace.json`` in Perfetto's native protobuf.

Smaller and faster to load than JSON for long runs, and it carries what JSON cannot: an explicit
device order and counter units. Layout (uuids are ``pid << 16 | n``, ``pid`` = global rank + 1):
a root track ``devices`` (``child_ordering = EXPLICIT``) whose children are one group track per
device, named ``rank R · pp P · ×N``, with ``sibling_order_rank`` = its global rank (so the UI
shows them in pipeline order, 0, 64, 128, …) and ``child_ordering = EXPLICIT``. A group holds,
in this order: one slice track per op stream (compute first, then tp/cp/ep/dp/pp), the
``peaks & OOMs`` track (instants with their bytes in the name), then its counter tracks
``memory requested``, ``memory allocated``, ``memory reserved``, one per category it holds and
``memory capacity`` — values in GiB (bytes / 2**30, exact), ``unit_name`` GiB, the totals and
capacity sharing one y-axis across devices. On the compute track each action (F/B/I/W/step;
an overlapped F&B pair is one slice, ``0F5 & 31B2``) is a slice, debug args kind, microbatch,
stage, iteration, the parent of its compute ops; op slices (``SLICE_BEGIN``/``SLICE_END``, debug
annotations phase, layer, microbatch, stage, allocated_bytes; op names and keys interned); a
comm-stream op also carries action and iteration and ends a flow that its action's slice begins.
There are no process or thread descriptors (a process track cannot be a child). All packets
share one trusted sequence; timestamps are run-relative integer ns.

Packets are built with the protobuf classes of the ``perfetto`` package (PyPI
``perfetto==0.59.1``, extra ``timeline[perfetto]``) and framed as ``Trace.packet`` entries by
hand — byte-identical to its ``StreamingTraceProtoBuilder``, which wraps every packet in a new
``Trace`` message first (twice the serialisation work). Option: ``max_samples`` as for JSON.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from timeline.errors import UserError
from timeline.exporters.trace_common import (
    COUNTERS,
    MARKS_NAME,
    Actions,
    Thread,
    action_label,
    actions,
    counters,
    flow_id,
    instants,
    op_allocated_bytes,
    pid_of,
    process_name,
    threads,
)
from timeline.result.timeline import Timeline

FILENAME = "trace.perfetto-trace"
SEQUENCE_ID = 1
TOTALS = ("requested", "allocated", "reserved")
#: counter values are GiB (bytes / 2**30: exact), the unit named on each counter track
UNIT = "GiB"
GIB = 2**30
#: the root track: its children, one group per device, are shown in their sibling_order_rank order
ROOT_TRACK = 1
ROOT_NAME = "devices"
#: the low bits of the uuid (and the sibling_order_rank) of each device's "peaks & OOMs" track:
#: after the op streams (tid), before the counters (0x100 + k)
MARKS_TRACK = 0xFF


def _protos() -> Any:
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError:
        raise UserError("--format perfetto needs the perfetto package: pip install 'timeline[perfetto]' "
                        "(or use the default trace.json)") from None
    return perfetto_trace_pb2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    pb = _protos()
    max_samples = int((options or {}).get("max_samples") or 0)
    flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    chunk: list[bytes] = []
    for packet in _packets(tl, pb, max_samples):
        packet.trusted_packet_sequence_id = SEQUENCE_ID
        packet.sequence_flags = flags  # the interned names below live in the sequence's state
        flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        body = packet.SerializeToString(deterministic=True)
        chunk += (b"\x0a", _varint(len(body)), body)  # Trace.packet (field 1, length-delimited)
        if len(chunk) >= 30000:
            handle.write(b"".join(chunk))
            chunk.clear()
    handle.write(b"".join(chunk))


class _Interned:
    """Op names and debug-annotation keys sent once per sequence, then referred to by iid."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.keys: dict[str, int] = {}

    def name(self, packet: Any, text: str) -> int:
        return self._iid(self.names, packet.interned_data.event_names, text)

    def key(self, packet: Any, text: str) -> int:
        return self._iid(self.keys, packet.interned_data.debug_annotation_names, text)

    @staticmethod
    def _iid(table: dict[str, int], field: Any, text: str) -> int:
        iid = table.get(text)
        if iid is None:
            iid = table[text] = len(table) + 1
            entry = field.add()
            entry.iid, entry.name = iid, text
        return iid


def _descriptor(pb: Any, uuid: int, parent: int, name: str, rank: int) -> Any:
    p = pb.TracePacket()
    td = p.track_descriptor
    td.uuid, td.name, td.sibling_order_rank = uuid, name, rank
    if parent:
        td.parent_uuid = parent
    return p


def _packets(tl: Timeline, pb: Any, max_samples: int) -> Iterator[Any]:
    TE = pb.TrackEvent
    EXPLICIT = pb.TrackDescriptor.EXPLICIT
    interned = _Interned()
    root = pb.TracePacket()
    root.track_descriptor.uuid = ROOT_TRACK
    root.track_descriptor.name = ROOT_NAME
    root.track_descriptor.child_ordering = EXPLICIT
    yield root
    for d in range(tl.num_devices):
        dev = tl.devices[d]
        pid = pid_of(dev)
        group = pid << 16
        p = _descriptor(pb, group, ROOT_TRACK, process_name(dev), dev.device)  # pipeline order = rank order
        p.track_descriptor.child_ordering = EXPLICIT
        yield p
        acts = actions(tl, d)
        ths = threads(tl, d, acts)
        for th in ths:  # op streams first, compute on top
            yield _descriptor(pb, group | th.tid, group, th.name, th.tid)
        marks = instants(tl, d)
        if marks:  # peaks and OOMs on their own named track (a descriptor without events shows nothing)
            yield _descriptor(pb, group | MARKS_TRACK, group, MARKS_NAME, MARKS_TRACK)
        c = counters(tl, d, max_samples)
        for name in c.keys:  # the device's own series: totals, the categories it holds, capacity
            k = 0x100 + COUNTERS.index(name)
            p = _descriptor(pb, group | k, group, f"memory {name}", k)
            td = p.track_descriptor
            td.counter.unit_name = UNIT  # the values are GiB: the UI labels its axis with this name
            if name in TOTALS or name == "capacity":
                td.counter.y_axis_share_key = "memory"
            yield p
        yield from _slices(tl, d, pb, group, ths, acts, interned)
        last = len(c.t_ns) - 1
        for name in c.keys:
            k = COUNTERS.index(name)
            values = c.values[name]
            # each track is a step function: a value only where it changes (and the last sample);
            # v52 ignores extra_counter_values on counter events, so it is one packet per value
            changed = np.ones(len(values), dtype=bool)
            changed[1:] = values[1:] != values[:-1]
            if last >= 0:
                changed[last] = True
            gib = (values[changed] / GIB).tolist()  # exact: a power-of-two divisor
            for t, v in zip(c.t_ns[changed].tolist(), gib, strict=True):
                p = pb.TracePacket()
                p.timestamp = t
                p.track_event.type = TE.TYPE_COUNTER
                p.track_event.track_uuid = group | (0x100 + k)
                p.track_event.double_counter_value = v
                yield p
        for inst in marks:
            p = pb.TracePacket()
            p.timestamp = inst.t_ns
            ev = p.track_event
            ev.type = TE.TYPE_INSTANT
            ev.track_uuid = group | MARKS_TRACK
            ev.name = inst.name
            for key, value in inst.args.items():
                _annotate(ev, key, value)
            yield p


def _slices(tl: Timeline, d: int, pb: Any, group: int, ths: list[Thread], acts: Actions,
            interned: _Interned) -> Iterator[Any]:
    """Begin/end packets per thread in nesting order (an end before a begin at the same time).
    An action slice begins the flows to the comm-stream ops it contains; each of those ends one."""
    TE = pb.TrackEvent
    names = tl.names
    ops = tl.ops[d]
    pid = group >> 16
    allocated = op_allocated_bytes(tl, d).tolist()
    op_name, phase = ops.name.tolist(), ops.phase.tolist()
    mb, stage, layer = ops.microbatch.tolist(), ops.stage.tolist(), ops.layer.tolist()
    of_op = acts.of_op.tolist()
    flows_of: dict[int, list[int]] = {}
    comm = {i for th in ths if th.name != "compute" for i in th.index.tolist()}
    for i in sorted(comm):
        if of_op[i] >= 0:
            flows_of.setdefault(of_op[i], []).append(flow_id(pid, i))
    for th in ths:
        uuid = group | th.tid
        open_ends: list[int] = []

        def end(t: int, uuid: int = uuid) -> Any:
            p = pb.TracePacket()
            p.timestamp = t
            p.track_event.type = TE.TYPE_SLICE_END
            p.track_event.track_uuid = uuid
            return p

        for i, t0, dur in zip(th.index.tolist(), th.start_ns.tolist(), th.dur_ns.tolist(), strict=True):
            while open_ends and open_ends[-1] <= t0:
                yield end(open_ends.pop())
            p = pb.TracePacket()
            p.timestamp = t0
            ev = p.track_event
            ev.type = TE.TYPE_SLICE_BEGIN
            ev.track_uuid = uuid
            if i < 0:  # an action slice: the parent of its compute ops
                k = -1 - i
                ev.name = acts.name(k)
                for key, value in acts.args(k).items():
                    _annotate(ev, key, value)
                ev.flow_ids.extend(flows_of.get(k, []))
                yield p
                open_ends.append(t0 + dur)
                continue
            ev.name_iid = interned.name(p, names[op_name[i]])
            a = ev.debug_annotations.add()
            a.name_iid, a.string_value = interned.key(p, "phase"), names[phase[i]]
            extra: tuple[tuple[str, int], ...] = ()
            if i in comm and of_op[i] >= 0:  # a comm op names the action it serves
                sp = acts.of(i)
                a = ev.debug_annotations.add()
                a.name_iid, a.string_value = interned.key(p, "action"), action_label(sp)
                extra = (("iteration", sp.iteration),)
                ev.terminating_flow_ids.append(flow_id(pid, i))
                m, st = (mb[i] if mb[i] >= 0 else sp.microbatch), (stage[i] if stage[i] >= 0 else sp.stage)
            else:
                m, st = mb[i], stage[i]
            for key, value in (("layer", layer[i]), ("microbatch", m), ("stage", st),
                               ("allocated_bytes", allocated[i]), *extra):
                if value >= 0:
                    a = ev.debug_annotations.add()
                    a.name_iid, a.int_value = interned.key(p, key), value
            yield p
            open_ends.append(t0 + dur)
        while open_ends:
            yield end(open_ends.pop())


def _annotate(ev: Any, key: str, value: int | str) -> None:
    a = ev.debug_annotations.add()
    a.name = key
    if isinstance(value, str):
        a.string_value = value
    else:
        a.int_value = int(value)
