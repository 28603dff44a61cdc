"""``snapshot.pickle`` written from the event columns: the bytes of ``pickle.dump(snapshot(tl))``
(:mod:`timeline.exporters.memviz_snapshot`, the reference) without a dict per trace entry.

Each device's trace entries become one table of columns (action, address, size, stream, time,
frames, free device bytes after an OOM) in the order :func:`memviz_snapshot.device_snapshot`
appends them; the frame dicts and lists are nodes made from the same :class:`Frames` specs;
segments, settings and devices are the reference's own dicts (with the frames of live blocks
standing in as :class:`Ref`). :mod:`pickle_graph` keeps the objects the reference shares shared,
so memo references fall where they fall in the reference's pickle. Whenever the columns are not
what the reference's loop assumes — an alloc and its free that do not alternate per address, or
a value that is not a plain int — :func:`write` returns False and the caller pickles the dict.
"""

from __future__ import annotations

from typing import Any, BinaryIO

import numpy as np

from timeline.exporters import memviz_snapshot as ref
from timeline.exporters.pickle_graph import ABSENT, DICT, LIST, Graph, Ref, Unsupported
from timeline.result.timeline import Timeline

#: the entry keys in the reference's insertion order, ``device_free`` last (OOM entries only)
KEYS = ("action", "addr", "size", "stream", "time_us", "frames", "device_free")


def write(tl: Timeline, handle: BinaryIO, max_entries: int, writer: Any) -> bool:
    """Write the snapshot to ``handle`` with the compiled ``writer``; False (nothing written):
    the reference must write it."""
    ref.check_replay(tl)
    g = Graph()
    segments: list[dict] = []
    traces: list[Ref] = []
    try:
        keys = [g.node(k) for k in KEYS]
        for d in range(tl.num_devices):
            part = _device(g, tl, d, max_entries, keys)
            if part is None:
                return False
            segments += part[0]
            traces.append(Ref(part[1]))
        root = g.node(ref.whole(tl, segments, traces))
    except Unsupported:
        return False
    g.dump(root, handle.write, writer)
    return True


def _frame_lists(g: Graph, frames: ref.Frames) -> np.ndarray:
    """The node of each alloc's frames list (lists shared as the reference shares them)."""
    key_f, key_l, key_n, zero = g.node("filename"), g.node("line"), g.node("name"), g.node(0)

    def dicts(specs: list[tuple[str, str]]) -> np.ndarray:
        if not specs:
            return np.zeros(0, dtype=np.int64)
        k = len(specs)
        vals = g.nodes([x for spec in specs for x in spec]).reshape(k, 2)
        kids = np.stack([np.full(k, key_f), vals[:, 0], np.full(k, key_l), np.full(k, zero), np.full(k, key_n),
                         vals[:, 1]], axis=1)
        return g.containers(DICT, kids.ravel(), np.full(k, 3))

    t_nodes = dicts(frames.tensor_frames)
    a_nodes = dicts([(ref.SCHEDULE, n) for n in frames.action_frames])
    codes = np.array(sorted(frames.op_frames), dtype=np.int64)
    o_of_code = dicts([frames.op_frames[c] for c in codes.tolist()])
    op = frames.list_op
    has_op = op >= 0
    o_nodes = o_of_code[np.searchsorted(codes, op)] if len(codes) else np.full(len(op), -1)
    counts = 2 + has_op.astype(np.int64)
    start = np.cumsum(counts) - counts
    kids = np.empty(int(counts.sum()), dtype=np.int64)
    kids[start] = t_nodes[frames.list_tensor]
    kids[start + 1] = np.where(has_op, o_nodes, a_nodes[frames.list_action])
    kids[start[has_op] + 2] = a_nodes[frames.list_action[has_op]]
    return g.containers(LIST, kids, counts)[frames.of_alloc]


def _device(g: Graph, tl: Timeline, d: int, max_entries: int, keys: list[int]) -> tuple[list[dict], int] | None:
    """(end-state segments, node of the trace list) of device ``d``; None where the reference's
    loop would find what this does not model."""
    ev, mem = tl.events(d), tl.memory[d]
    assert tl.meta.allocator is not None and tl.meta.capacity_bytes is not None
    ideal, cap = tl.meta.allocator.kind == "ideal", tl.meta.capacity_bytes
    n = len(ev.t_us)
    is_alloc = ev.sign > 0
    allocs = np.flatnonzero(is_alloc)
    frames = np.zeros(n, dtype=np.int64)
    frames[allocs] = _frame_lists(g, ref.Frames(tl, d, allocs))
    # each free takes its alloc's frames: the previous event at its address (the reference keys
    # live frames by address, and by handle under ideal: mem.address either way)
    order = np.argsort(mem.address, kind="stable")
    key, alloc_sorted = mem.address[order], is_alloc[order]
    same = np.zeros(n, dtype=bool)
    same[1:] = key[1:] == key[:-1]
    if not np.where(same, alloc_sorted != np.roll(alloc_sorted, 1), alloc_sorted).all():
        return None
    frees_sorted = np.flatnonzero(~alloc_sorted)
    partner = np.full(n, -1, dtype=np.int64)
    partner[order[frees_sorted]] = order[frees_sorted - 1]
    frees = np.flatnonzero(~is_alloc)
    frames[frees] = frames[partner[frees]]
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same[1:]
    live = np.sort(order[last & alloc_sorted])
    size = ev.size.astype(np.int64)
    if ideal:  # every alloc its own segment, at increasing addresses
        step = np.maximum(-(-size[allocs] // ref._ALIGN) * ref._ALIGN, ref._ALIGN)
        address = np.zeros(n, dtype=np.int64)
        address[allocs] = ref._IDEAL_BASE + np.cumsum(step) - step
        address[frees] = address[partner[frees]]
    else:
        address = mem.address.astype(np.int64)
    caused = _caused(g, mem.segment_events, is_alloc, cap)
    literal = {name: g.node(name) for name in ENTRY_ACTIONS}

    def columns() -> list[np.ndarray]:  # made when the pickler reaches this device's trace
        cols, fc = _entries(ev, ideal, is_alloc, address, frames, caused, literal)
        total = len(cols[0])
        if max_entries and total > max_entries:  # ref._last
            start = total - max_entries
            while start < total and fc[start]:
                start += 1
            cols = [c[start:] for c in cols]
        return cols

    trace = g.records(keys, "niiiini", columns)
    frames_at: dict[int, Any] = {a: Ref(f) for a, f in zip(address[live].tolist(), frames[live].tolist(), strict=True)}
    if ideal:
        return ref.ideal_segments(d, list(zip(address[live].tolist(), size[live].tolist(), strict=True)),
                                  frames_at), trace
    return ref.end_segments(d, mem.end_segments, frames_at), trace


def _caused(g: Graph, segment_events: list, is_alloc: np.ndarray,
            cap: int) -> list[tuple[int, int, int, int, int, int, bool]]:
    """The segment events as (event, action node, address, size, stream, free device bytes or
    ABSENT, is a free_completed), each event's in their order; the free bytes only on an alloc's
    OOM, as the reference writes them."""
    n = len(is_alloc)
    rows = [row for row in segment_events if 0 <= row[0] < n]
    if not rows:
        return []
    event, names, a, sz, st, reserved = zip(*rows, strict=True)
    free = [max(cap - r, 0) if name == "oom" and is_alloc[i] else None
            for i, name, r in zip(event, names, reserved, strict=True)]
    if {type(x) for col in (a, sz, st) for x in col} != {int} or any(
            f is not None and type(f) is not int for f in free):
        raise Unsupported("a segment event holds a non-int")
    out = list(zip(event, g.nodes(names).tolist(), a, sz, st, [ABSENT if f is None else f for f in free],
                   [name == "free_completed" for name in names], strict=True))
    out.sort(key=lambda row: row[0])  # stable: each event's own in their order
    return out


#: the actions of the entries the events themselves make
ENTRY_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")


def _entries(ev: Any, ideal: bool, is_alloc: np.ndarray, address: np.ndarray, frames: np.ndarray,
             caused: list, literal: dict[str, int]) -> tuple[list[np.ndarray], np.ndarray]:
    """The entry columns (:data:`KEYS`) in the reference's order, and where an entry is a
    ``free_completed`` (a capped trace does not start on one). Per alloc: the segment events it
    caused, (ideal) its segment_alloc, the alloc; per free: free_requested, free_completed, the
    segment events it caused, (ideal) its segment_free."""
    n = len(is_alloc)
    c_event = np.array([row[0] for row in caused], dtype=np.int64)
    n_caused = np.bincount(c_event, minlength=n) if len(caused) else np.zeros(n, dtype=np.int64)
    count = np.where(is_alloc, 1, 2) + int(ideal) + n_caused
    offset = np.cumsum(count) - count
    total = int(count.sum())
    cols = [np.full(total, ABSENT, dtype=np.int64) for _ in KEYS]
    action, addr, size, stream, time, frame, device_free = cols
    fc = np.zeros(total, dtype=bool)
    now = np.rint(ev.t_us).astype(np.int64)  # int(round(t)): both round half to even
    ev_size, ev_stream = ev.size.astype(np.int64), ev.stream.astype(np.int64)
    allocs, frees = np.flatnonzero(is_alloc), np.flatnonzero(~is_alloc)

    def put(pos: np.ndarray, rows: np.ndarray, name: str) -> None:
        action[pos] = literal[name]
        addr[pos], size[pos], stream[pos] = address[rows], ev_size[rows], ev_stream[rows]
        time[pos], frame[pos] = now[rows], frames[rows]

    put(offset[allocs] + n_caused[allocs] + int(ideal), allocs, "alloc")
    put(offset[frees], frees, "free_requested")
    put(offset[frees] + 1, frees, "free_completed")
    fc[offset[frees] + 1] = True
    if ideal:
        put(offset[allocs] + n_caused[allocs], allocs, "segment_alloc")
        put(offset[frees] + 2 + n_caused[frees], frees, "segment_free")
    if caused:
        rank = np.arange(len(caused)) - (np.cumsum(n_caused) - n_caused)[c_event]
        pos = offset[c_event] + np.where(is_alloc[c_event], 0, 2) + rank
        values = np.array([row[1:6] for row in caused], dtype=np.int64)
        action[pos], addr[pos], size[pos], stream[pos], device_free[pos] = values.T
        time[pos], frame[pos] = now[c_event], frames[c_event]
        fc[pos] = [row[6] for row in caused]
    return cols, fc
