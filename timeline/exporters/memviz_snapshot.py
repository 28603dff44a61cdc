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

import pickle
from typing import Any, BinaryIO

from timeline.graph.tensors import CATEGORIES
from timeline.result.timeline import Timeline
from timeline.sim.memory import allocator_config

FILENAME = "snapshot.pickle"
_IDEAL_BASE = 1 << 36
_ALIGN = 512


def write(tl: Timeline, handle: BinaryIO, options: dict | None = None) -> None:
    pickle.dump(snapshot(tl, int((options or {}).get("max_entries") or 0)), handle, protocol=4)


def snapshot(tl: Timeline, max_entries: int = 0) -> dict[str, Any]:
    """The snapshot dict (what :func:`write` pickles)."""
    run = tl.sim.run
    segments: list[dict] = []
    traces: list[list[dict]] = []
    for d in range(tl.num_devices):
        segs, trace = device_snapshot(tl, d)
        segments += segs
        traces.append(_last(trace, max_entries))
    cfg = allocator_config(run)
    settings = {"PYTORCH_CUDA_ALLOC_CONF": _alloc_conf(run), **cfg.to_dict(),
                "garbage_collection_threshold": 0.0}
    devices = [{"device": dev.device, "pp_rank": dev.pp_rank, "stages": list(dev.stages),
                "represents": dev.represents} for dev in tl.sim.devices]
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings,
            "external_annotations": [], "timeline_devices": devices}


def _alloc_conf(run: Any) -> str:
    al = run.allocator
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


class _Frames:
    """Shared frame dicts and lists (pickle stores each shared object once)."""

    def __init__(self, tl: Timeline, d: int) -> None:
        self.tl, self.d = tl, d
        self.module = {op.name: op.module for t in tl.sim.templates.values()
                       for op in (*t.forward, *t.backward_i, *t.backward_w)}
        self.cache: dict[tuple, Any] = {}

    def _get(self, key: tuple, make: Any) -> Any:
        value = self.cache.get(key)
        if value is None:
            value = self.cache[key] = make()
        return value

    def frames(self, tensor: int, cat: int, op: int, action: int, mb: int, stage: int) -> list[dict]:
        names = self.tl.sim.names
        op_name = names[op] if op >= 0 else None
        module = self.module.get(op_name, "") if op_name else ""
        t = self._get(("t", tensor, cat, module), lambda: {
            "filename": module or "static", "line": 0, "name": f"{names[tensor]} [{CATEGORIES[cat]}]"})
        a = self._get(("a", action, mb, stage), lambda: {"filename": "schedule", "line": 0,
                                                         "name": self._action(action, mb, stage)})
        if op_name is None:
            return self._get(("f", tensor, cat, action, mb, stage), lambda: [t, a])
        o = self._get(("o", op), lambda: {"filename": module or "-", "line": 0, "name": op_name})
        return self._get(("f", tensor, cat, op, action, mb, stage), lambda: [t, o, a])

    def _action(self, action: int, mb: int, stage: int) -> str:
        if action < 0:
            return "static state"
        sp = self.tl.sim.spans[self.d][action]
        return f"{sp.kind} microbatch {mb} stage {stage} iteration {sp.iteration}"


def device_snapshot(tl: Timeline, d: int) -> tuple[list[dict], list[dict]]:
    """(end-state segments, full trace) of device ``d``."""
    run = tl.sim.run
    ev, mem = tl.sim.events[d], tl.memory[d]
    fr = _Frames(tl, d)
    trace: list[dict] = []
    ideal = run.allocator.kind == "ideal"
    cap = run.hardware.capacity_bytes
    # segment events the allocator pass recorded, by the event that caused them
    caused: dict[int, list[tuple[str, int, int, int, int]]] = {}
    for i, action, addr, size, stream, reserved_then in mem.segment_events:
        caused.setdefault(i, []).append((action, addr, size, stream, reserved_then))
    placed: dict[int, tuple[int, int]] = {}  # ideal: handle → (address, size)
    frames_at: dict[int, list[dict]] = {}  # live block address → frames of its alloc
    next_addr = _IDEAL_BASE
    cols = (ev.t_us.tolist(), ev.sign.tolist(), ev.size.tolist(), ev.cat.tolist(), ev.tensor.tolist(),
            ev.op.tolist(), ev.microbatch.tolist(), ev.stage.tolist(), ev.action.tolist(), ev.stream.tolist(),
            mem.address.tolist())
    for i, (t, sign, size, cat, tensor, op, mb, stage, action, stream, handle) in enumerate(zip(*cols, strict=True)):
        now = int(round(t))
        if sign > 0:
            frames = fr.frames(tensor, cat, op, action, mb, stage)
            for name, a, sz, st, reserved_then in caused.get(i, ()):
                entry = {"action": name, "addr": a, "size": sz, "stream": st, "time_us": now, "frames": frames}
                if name == "oom":  # cudaMemGetInfo's free bytes after the retry released the cache
                    entry["device_free"] = max(cap - reserved_then, 0)
                trace.append(entry)
            addr = handle
            if ideal:
                addr = next_addr
                next_addr += max(-(-size // _ALIGN) * _ALIGN, _ALIGN)
                placed[handle] = (addr, size)
                trace.append({"action": "segment_alloc", "addr": addr, "size": size, "stream": stream,
                              "time_us": now, "frames": frames})
            frames_at[addr] = frames
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": stream, "time_us": now,
                          "frames": frames})
        else:
            addr = placed[handle][0] if ideal else handle
            frames = frames_at.pop(addr)
            for action_name in ("free_requested", "free_completed"):
                trace.append({"action": action_name, "addr": addr, "size": size, "stream": stream,
                              "time_us": now, "frames": frames})
            for name, a, sz, st, _ in caused.get(i, ()):
                trace.append({"action": name, "addr": a, "size": sz, "stream": st, "time_us": now,
                              "frames": frames})
            if ideal:
                del placed[handle]
                trace.append({"action": "segment_free", "addr": addr, "size": size, "stream": stream,
                              "time_us": now, "frames": frames})
    if ideal:
        segments = [_segment(d, a, s, 0, False, False, [(a, s, s, "active_allocated")], frames_at)
                    for a, s in sorted(placed.values())]
    else:
        segments = [_segment(d, v.address, v.size, v.stream, v.is_small, v.expandable, v.blocks, frames_at)
                    for v in mem.end_segments]
    return segments, trace


def _segment(d: int, address: int, size: int, stream: int, small: bool, expandable: bool,
             blocks: Any, frames_at: dict[int, list[dict]]) -> dict[str, Any]:
    out_blocks = [{"address": a, "size": s, "requested_size": r, "state": state,
                   "frames": frames_at.get(a, []) if state != "inactive" else []} for a, s, r, state in blocks]
    allocated = sum(b["size"] for b in out_blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in out_blocks if b["state"] != "inactive")
    requested = sum(b["requested_size"] for b in out_blocks if b["state"] == "active_allocated")
    return {"device": d, "address": address, "total_size": size, "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": stream,
            "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
            "is_expandable": expandable, "frames": [], "blocks": out_blocks}
