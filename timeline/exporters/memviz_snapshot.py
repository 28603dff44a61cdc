"""``snapshot.pickle``: a PyTorch memory snapshot of the simulated run, for pytorch.org/memory_viz.

The dict has the shape ``torch.cuda.memory._dump_snapshot`` writes (../shared/reference/
allocator.md §10), one device per simulated device (index = position in the run, the global
rank is in the frames and in ``timeline_devices``): ``segments`` with their ``blocks`` at the
end of the run, ``device_traces`` with ``alloc``, ``free_requested``, ``free_completed``,
``segment_alloc``, ``segment_free`` (``segment_map``/``segment_unmap`` under expandable
segments) and ``oom``, and ``allocator_settings``. Each entry's ``frames`` (innermost first)
name the tensor and its category, the op and its module path, and the phase, micro-batch,
stage and iteration of the action; ``time_us`` is run-relative µs.

Segment events and the end state come from the allocator pass (``DeviceMemory.segment_events``
and ``end_segments``), each placed before the alloc (or after the free) that caused it. Under
the ``ideal`` allocator (no layout) every tensor gets its own exact-size segment at increasing
addresses, so reserved = allocated = requested as that model says. Option ``max_entries``
keeps only each device's last N trace entries, as PyTorch's ring buffer does (0 = all); the
segments are always the full end state. Pickle protocol 4, like torch; deterministic bytes.
"""

from __future__ import annotations

import gc
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import numpy as np

from timeline.exporters import compiled
from timeline.result.categories import CATEGORIES
from timeline.result.timeline import Timeline

FILENAME = "snapshot.pickle"
_IDEAL_BASE = 1 << 36
_ALIGN = 512


#: the strings every frame and entry shares (one object each: pickle writes a shared object once)
STATIC_TENSOR = "static"  # a tensor frame's filename when no op module holds it
NO_MODULE = "-"  # an op frame's filename when the op has no module
SCHEDULE = "schedule"  # an action frame's filename
STATIC_STATE = "static state"  # the action frame of events outside every action


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    max_entries = int((options or {}).get("max_entries") or 0)
    writers = compiled.writers()
    with _gc_paused():
        if writers is not None:
            from timeline.exporters import memviz_stream  # it builds on this module

            if memviz_stream.write(tl, handle, max_entries, writers):
                return
        pickle.dump(snapshot(tl, max_entries), handle, protocol=4)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The snapshot is about a million small dicts and lists that refer to no cycle: while they
    are made, the cyclic collector would walk the growing heap again and again for nothing
    (reference counting frees them all), which took 40 % of this exporter's time (the stream
    writer's few thousand objects still set it off over the Timeline's heap)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def snapshot(tl: Timeline, max_entries: int = 0) -> dict[str, Any]:
    """The snapshot dict (what :func:`write` pickles)."""
    segments: list[dict] = []
    traces: list[list[dict]] = []
    for d in range(tl.num_devices):
        segs, trace = device_snapshot(tl, d)
        segments += segs
        traces.append(_last(trace, max_entries))
    return whole(tl, segments, traces)


def whole(tl: Timeline, segments: list[dict], traces: list) -> dict[str, Any]:
    """The snapshot dict around the devices' ``segments`` and ``traces``."""
    settings = {"PYTORCH_CUDA_ALLOC_CONF": _alloc_conf(tl.meta.allocator), **tl.meta.allocator_settings,
                "garbage_collection_threshold": 0.0}
    devices = [{"device": dev.device, "pp_rank": dev.pp_rank, "stages": list(dev.stages),
                "represents": dev.represents} for dev in tl.devices]
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings,
            "external_annotations": [], "timeline_devices": devices}


def _alloc_conf(al: Any) -> str:
    """``PYTORCH_CUDA_ALLOC_CONF`` as the run's ``[allocator]`` section (``al``) would set it."""
    parts = [f"expandable_segments:{'True' if al.expandable_segments else 'False'}"]
    if al.max_split_size_mb:
        parts.append(f"max_split_size_mb:{al.max_split_size_mb}")
    return ",".join(parts)


def _last(trace: list[dict], n: int) -> list[dict]:
    """The last ``n`` entries, not starting inside a free_requested/free_completed pair."""
    if not n or len(trace) <= n:
        return trace
    start = len(trace) - n
    while start < len(trace) and trace[start]["action"] == "free_completed":
        start += 1
    return trace[start:]


def _first_ids(*cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(inverse, first): each row's id among the distinct rows of ``cols``, ids numbered in order
    of first occurrence, and the first row of each id."""
    if not len(cols[0]):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    key, span = np.zeros(len(cols[0]), dtype=np.int64), 1
    for c in cols:  # one int64 key (mixed radix) where the columns' ranges fit in it: a 1-d unique
        c = np.asarray(c, dtype=np.int64)
        lo, width = int(c.min()), int(c.max()) - int(c.min()) + 1
        span *= width
        if span >= 2**62:
            break
        key = key * width + (c - lo)
    if span < 2**62:
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    else:
        keys = np.stack([np.asarray(c, dtype=np.int64) for c in cols], axis=1)
        _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    order = np.argsort(first, kind="stable")
    rank[order] = np.arange(len(first))
    return rank[inverse.reshape(-1)], first[order]


class Frames:
    """Shared frame dicts and lists (pickle stores each shared object once): one ``tensor
    [category]`` dict per (tensor, category, module), one op dict per op, one schedule dict per
    (action, micro-batch, stage), one list per distinct combination — each object made at the
    first alloc that needs it, with that alloc's values, so the pickled bytes do not depend on
    how the sharing is found (here: distinct rows of the alloc columns, numbered by first use).

    The contents are kept as specs — (filename, name) of each tensor frame, the name of each
    action frame, (filename, name) of each op frame by op code, and per distinct list its tensor
    frame, op code (−1: none) and action frame — so the dict builder (:meth:`alloc_frames`) and
    the stream writer (:mod:`memviz_stream`) make the same objects from the same strings."""

    def __init__(self, tl: Timeline, d: int, rows: np.ndarray) -> None:
        """The frames of the alloc events ``rows`` (event indices, in order) of device ``d``."""
        self.tl, self.d = tl, d
        ev, names, module = tl.events(d), tl.names, tl.op_modules
        tensor, cat, op = ev.tensor[rows], ev.cat[rows], ev.op[rows]
        action, mb, stage = ev.action[rows], ev.microbatch[rows], ev.stage[rows]
        # the module each op code stands for, and an id per distinct module string
        op_codes = sorted(set(op.tolist()))
        module_of = {c: (module.get(names[c], "") if names[c] else "") if c >= 0 else "" for c in op_codes}
        module_id: dict[str, int] = {}
        mod_col = np.array([module_id.setdefault(module_of[c], len(module_id)) for c in op_codes], dtype=np.int64)
        mod = mod_col[np.searchsorted(np.array(op_codes, dtype=np.int64), op)] if len(op) else op
        t_inv, t_first = _first_ids(tensor, cat, mod)
        a_inv, a_first = _first_ids(action, mb, stage)
        f_inv, f_first = _first_ids(tensor, cat, op, action, mb, stage)
        self.tensor_frames = [(module_of[o] or STATIC_TENSOR, f"{names[t]} [{CATEGORIES[c]}]")
                              for t, c, o in zip(tensor[t_first].tolist(), cat[t_first].tolist(),
                                                 op[t_first].tolist(), strict=True)]
        self.action_frames = [self._action(a, m, s) for a, m, s in zip(
            action[a_first].tolist(), mb[a_first].tolist(), stage[a_first].tolist(), strict=True)]
        self.op_frames = {c: (module_of[c] or NO_MODULE, names[c]) for c in op_codes if c >= 0}
        self.list_tensor, self.list_op, self.list_action = t_inv[f_first], op[f_first], a_inv[f_first]
        self.of_alloc = f_inv  # each alloc's list

    def alloc_frames(self) -> list[list[dict]]:
        """The frames list of each alloc event, as dicts."""
        t_objs = [{"filename": f, "line": 0, "name": n} for f, n in self.tensor_frames]
        a_objs = [{"filename": SCHEDULE, "line": 0, "name": n} for n in self.action_frames]
        o_objs = {c: {"filename": f, "line": 0, "name": n} for c, (f, n) in self.op_frames.items()}
        lists = [[t_objs[t], a_objs[a]] if o < 0 else [t_objs[t], o_objs[o], a_objs[a]]
                 for t, o, a in zip(self.list_tensor.tolist(), self.list_op.tolist(), self.list_action.tolist(),
                                    strict=True)]
        if len(lists) == len(self.of_alloc):  # every alloc has its own combination (the usual case)
            return [lists[i] for i in self.of_alloc.tolist()]
        return list(map(lists.__getitem__, self.of_alloc.tolist()))

    def _action(self, action: int, mb: int, stage: int) -> str:
        if action < 0:
            return STATIC_STATE
        sp = self.tl.spans[self.d][action]
        return f"{sp.kind} microbatch {mb} stage {stage} iteration {sp.iteration}"


def check_replay(tl: Timeline) -> None:
    if tl.meta.allocator is None or tl.meta.capacity_bytes is None:
        raise ValueError("a replayed Timeline has no allocator settings to write a snapshot with")


def device_snapshot(tl: Timeline, d: int) -> tuple[list[dict], list[dict]]:
    """(end-state segments, full trace) of device ``d``."""
    ev, mem = tl.events(d), tl.memory[d]
    trace: list[dict] = []
    append = trace.append
    meta = tl.meta
    check_replay(tl)
    assert meta.allocator is not None and meta.capacity_bytes is not None
    ideal = meta.allocator.kind == "ideal"
    cap = meta.capacity_bytes
    # segment events the allocator pass recorded, by the event that caused them
    caused: dict[int, list[tuple[str, int, int, int, int]]] = {}
    for i, action, addr, size, stream, reserved_then in mem.segment_events:
        caused.setdefault(i, []).append((action, addr, size, stream, reserved_then))
    placed: dict[int, tuple[int, int]] = {}  # ideal: handle → (address, size)
    frames_at: dict[int, list[dict]] = {}  # live block address → frames of its alloc
    next_addr = _IDEAL_BASE
    alloc_frames = iter(Frames(tl, d, np.flatnonzero(ev.sign > 0)).alloc_frames())
    # int(round(t)): both round half to even
    cols = (ev.sign.tolist(), ev.size.tolist(), ev.stream.tolist(), mem.address.tolist(),
            np.rint(ev.t_us).astype(np.int64).tolist())
    for i, (sign, size, stream, handle, now) in enumerate(zip(*cols, strict=True)):
        if sign > 0:
            frames = next(alloc_frames)
            if i in caused:
                for name, a, sz, st, reserved_then in caused[i]:
                    entry = {"action": name, "addr": a, "size": sz, "stream": st, "time_us": now, "frames": frames}
                    if name == "oom":  # cudaMemGetInfo's free bytes after the retry released the cache
                        entry["device_free"] = max(cap - reserved_then, 0)
                    append(entry)
            addr = handle
            if ideal:
                addr = next_addr
                next_addr += max(-(-size // _ALIGN) * _ALIGN, _ALIGN)
                placed[handle] = (addr, size)
                append({"action": "segment_alloc", "addr": addr, "size": size, "stream": stream,
                        "time_us": now, "frames": frames})
            frames_at[addr] = frames
            append({"action": "alloc", "addr": addr, "size": size, "stream": stream, "time_us": now,
                    "frames": frames})
        else:
            addr = placed[handle][0] if ideal else handle
            frames = frames_at.pop(addr)
            append({"action": "free_requested", "addr": addr, "size": size, "stream": stream, "time_us": now,
                    "frames": frames})
            append({"action": "free_completed", "addr": addr, "size": size, "stream": stream, "time_us": now,
                    "frames": frames})
            if i in caused:
                for name, a, sz, st, _ in caused[i]:
                    append({"action": name, "addr": a, "size": sz, "stream": st, "time_us": now, "frames": frames})
            if ideal:
                del placed[handle]
                append({"action": "segment_free", "addr": addr, "size": size, "stream": stream,
                        "time_us": now, "frames": frames})
    if ideal:
        return ideal_segments(d, list(placed.values()), frames_at), trace
    return end_segments(d, mem.end_segments, frames_at), trace


def ideal_segments(d: int, live: list[tuple[int, int]], frames_at: dict[int, Any]) -> list[dict[str, Any]]:
    """Under the ideal allocator, one exact segment per (address, size) still ``live`` at the end."""
    return [_segment(d, a, s, 0, False, False, [(a, s, s, "active_allocated")], frames_at) for a, s in sorted(live)]


def end_segments(d: int, views: list, frames_at: dict[int, Any]) -> list[dict[str, Any]]:
    """The allocator's segments after the last event (``frames_at``: live block address → frames)."""
    return [_segment(d, v.address, v.size, v.stream, v.is_small, v.expandable, v.blocks, frames_at) for v in views]


def _segment(d: int, address: int, size: int, stream: int, small: bool, expandable: bool,
             blocks: Any, frames_at: dict[int, Any]) -> dict[str, Any]:
    out_blocks = [{"address": a, "size": s, "requested_size": r, "state": state,
                   "frames": frames_at.get(a, []) if state != "inactive" else []} for a, s, r, state in blocks]
    allocated = sum(b["size"] for b in out_blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in out_blocks if b["state"] != "inactive")
    requested = sum(b["requested_size"] for b in out_blocks if b["state"] == "active_allocated")
    return {"device": d, "address": address, "total_size": size, "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": stream,
            "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
            "is_expandable": expandable, "frames": [], "blocks": out_blocks}
