"""Replay a PyTorch memory snapshot's trace through the caching allocator model.

For each device: rebuild the state at the start of its trace (:mod:`timeline.alloc.reconstruct`),
then feed every ``alloc`` / ``free_requested`` / ``oom`` to a :class:`CachingAllocator` that decides
*by itself* whether a request is served from the cache, which block it takes, and when a new
segment (or mapping) is needed and how big. Only a new segment's address is borrowed from the
trace (the ``segment_alloc`` that precedes the real allocation), since ``cudaMalloc``'s choice is
outside the allocator. A run of ``segment_free``/``segment_unmap`` entries is an ``empty_cache``
(or, when a capacity is known, the OOM retry the model must reproduce itself). Frees address the
model's block through a real → model address map, so one divergence does not derail the rest.

Works on the plain dicts of a loaded snapshot; no file I/O, no printing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from timeline.alloc.caching import CachingAllocator
from timeline.alloc.config import K_ROUND_LARGE, AllocatorConfig
from timeline.alloc.reconstruct import reconstruct
from timeline.alloc.restore import restore_expandable, restore_segment

SCHEMA = "timeline.replay/1"
_RELEASES = ("segment_free", "segment_unmap")
_GROWS = ("segment_alloc", "segment_map")


@dataclass(slots=True)
class DeviceReplay:
    """How closely the model followed one device's trace.

    ``cache_allocs`` are the allocations the real allocator served from cached blocks (no
    ``segment_alloc``/``segment_map`` right before them); ``segment_allocs`` the others, matched
    when the model grew memory by the same sizes (one ``segment_alloc``, or the same
    ``segment_map`` list with expandable segments) in the same call. ``release_runs`` are runs of
    ``segment_free``/``segment_unmap`` (``empty_cache`` or an OOM retry), matched when the model
    released the same set. ``max_reserved_rel_error`` compares reserved bytes after every
    alloc / free / oom entry.
    """

    device: int
    allocator_settings: dict[str, Any]
    allocs: int = 0
    alloc_address_matches: int = 0
    cache_allocs: int = 0
    cache_alloc_address_matches: int = 0
    segment_allocs: int = 0
    segment_alloc_matches: int = 0
    model_segment_allocs: int = 0
    release_runs: int = 0
    release_run_matches: int = 0
    ooms_real: int = 0
    ooms_model: int = 0
    oom_matches: int = 0
    peak_reserved_bytes_real: int = 0
    peak_reserved_bytes_model: int = 0
    peak_allocated_bytes_model: int = 0
    max_reserved_rel_error: float = 0.0
    capacity_bytes: int | None = None
    start_reserved_bytes: int = 0
    estimated_start_blocks: int = 0
    trace_entries: int = 0
    end_segments_match: bool = True  # the model's final segments are the snapshot's, byte for byte
    end_blocks_match: bool = True  # the model's live blocks at the end are the snapshot's

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def snapshot_devices(snapshot: Mapping[str, Any]) -> list[int]:
    """Devices with a trace or segments, in order."""
    traces = snapshot.get("device_traces") or []
    devices = {i for i, t in enumerate(traces) if t}
    devices.update(int(s.get("device", 0)) for s in snapshot.get("segments") or ())
    return sorted(devices)


def replay_snapshot(snapshot: Mapping[str, Any], *, config: AllocatorConfig | None = None,
                    capacity_bytes: int | None = None,
                    records: dict[int, list[tuple]] | None = None) -> list[DeviceReplay]:
    """Replay every device of ``snapshot``; ``config`` overrides its ``allocator_settings``.
    With ``records``, each device's model-side event list is stored under its index."""
    cfg = config or AllocatorConfig.from_snapshot_settings(snapshot.get("allocator_settings"))
    traces = snapshot.get("device_traces") or []
    results = []
    for device in snapshot_devices(snapshot):
        segments = [s for s in snapshot.get("segments") or () if int(s.get("device", 0)) == device]
        trace = traces[device] if device < len(traces) else []
        record = records.setdefault(device, []) if records is not None else None
        results.append(replay_device(device, segments, trace, cfg, capacity_bytes, record))
    return results


def _upper_address(segments: Sequence[Mapping[str, Any]], trace: Sequence[Mapping[str, Any]]) -> int:
    top = 0
    for s in segments:
        top = max(top, int(s["address"]) + int(s["total_size"]))
    for e in trace:
        if "addr" in e:
            top = max(top, int(e["addr"]) + int(e.get("size", 0)))
    return -(-top // K_ROUND_LARGE) * K_ROUND_LARGE + (1 << 40)


def _oom_capacity(trace: Sequence[Mapping[str, Any]], start_reserved: int) -> int | None:
    """Memory PyTorch could have reserved: reserved + ``device_free`` at the tightest ``oom``."""
    reserved, capacity = start_reserved, None
    for e in trace:
        action = e.get("action")
        if action in _GROWS:
            reserved += int(e["size"])
        elif action in _RELEASES:
            reserved -= int(e["size"])
        elif action == "oom" and e.get("device_free") is not None:
            cap = reserved + int(e["device_free"])
            capacity = cap if capacity is None else min(capacity, cap)
    return capacity


def replay_device(device: int, segments: Sequence[Mapping[str, Any]], trace: Sequence[Mapping[str, Any]],
                  config: AllocatorConfig, capacity_bytes: int | None = None,
                  record: list[tuple] | None = None) -> DeviceReplay:
    """Replay one device's trace from the start state its final ``segments`` imply.

    With ``record``, appends one ``(time_us, sign, requested, block_bytes, address, reserved_after,
    frame)`` tuple per model allocation and free — the blocks live at the start first, at the
    trace's first time — so the replay can be written out like a simulated run."""
    start = reconstruct(segments, trace, config)
    capacity = capacity_bytes if capacity_bytes is not None else _oom_capacity(trace, start.reserved_bytes)
    result = DeviceReplay(device=device, allocator_settings=config.to_dict(), capacity_bytes=capacity,
                          start_reserved_bytes=start.reserved_bytes, estimated_start_blocks=start.estimated_blocks,
                          trace_entries=len(trace))
    events: list[tuple[str, int, int, int]] = []
    borrowed: list[int] = []  # addresses of real segment_alloc entries awaiting their alloc
    model_segments: dict[int, int] = {}
    synthetic = [_upper_address(segments, trace)]

    def listener(action: str, addr: int, size: int, stream: int) -> None:
        events.append((action, addr, size, stream))
        if action == "segment_alloc":
            model_segments[addr] = size
        elif action == "segment_free":
            model_segments.pop(addr, None)

    def segment_address(size: int, stream: int, is_small: bool, expandable: bool) -> int:
        while borrowed and not expandable:
            addr = borrowed.pop(0)
            if all(addr + size <= a or a + s <= addr for a, s in model_segments.items()):
                return addr
        addr = synthetic[0]
        synthetic[0] += -(-size // K_ROUND_LARGE) * K_ROUND_LARGE + K_ROUND_LARGE
        return addr

    model = CachingAllocator(config, capacity_bytes=capacity, listener=listener, segment_address=segment_address)
    addr_map: dict[int, int] = {}
    for addr, size, stream, is_small, live in start.segments:
        restore_segment(model, addr, size, stream, is_small, live)
        model_segments[addr] = size
        addr_map.update((b[0], b[0]) for b in live)
    for base, vsize, stream, is_small, mapped, live in start.expandable:
        restore_expandable(model, base, vsize or model.expandable_reserve_bytes, stream, is_small, mapped, live)
        addr_map.update((b[0], b[0]) for b in live)
    t_first = float(trace[0].get("time_us", 0)) if trace else 0.0
    requested: dict[int, int] = {}  # model address -> requested bytes, for recorded frees
    if record is not None:
        for addr in sorted(addr_map):
            bs = requested[addr] = model.block_size(addr)
            record.append((t_first, 1, bs, bs, addr, model.reserved_bytes, "live at trace start"))
    real_reserved = peak_real = start.reserved_bytes
    grows: list[tuple[str, int, int]] = []  # real segment_alloc/map entries since the last alloc
    expected_release: list[tuple[int, int]] | None = None  # an OOM retry's release, left to the model
    after_oom: tuple[int, int] | None = None  # (size, stream) of the last oom entry, until the next alloc
    n, i = len(trace), 0
    while i < n:
        entry = trace[i]
        action = entry.get("action")
        if action in _GROWS:
            size = int(entry["size"])
            real_reserved += size
            peak_real = max(peak_real, real_reserved)
            grows.append((action, int(entry["addr"]), size))
            if action == "segment_alloc":
                borrowed.append(int(entry["addr"]))
            i += 1
            continue
        if action in _RELEASES:
            j = i
            released = []
            while j < n and trace[j].get("action") in _RELEASES:
                released.append((int(trace[j]["addr"]), int(trace[j]["size"])))
                real_reserved -= int(trace[j]["size"])
                j += 1
            result.release_runs += 1
            follows = trace[j].get("action") if j < n else None
            if capacity is not None and follows in _GROWS:
                expected_release = released  # the retry inside the next malloc must release these
            else:
                events.clear()
                model.empty_cache()
                model_release = [(a, s) for act, a, s, _ in events if act in _RELEASES]
                result.release_run_matches += sorted(model_release) == sorted(released)
            i = j
            continue
        if action == "alloc":
            addr, size, stream = int(entry["addr"]), int(entry["size"]), int(entry.get("stream", 0))
            events.clear()
            got_addr = model.malloc(size, stream)
            model_grows = [(act, a, s) for act, a, s, _ in events if act in _GROWS]
            result.allocs += 1
            hit = got_addr == addr
            result.alloc_address_matches += hit
            if grows:
                result.segment_allocs += 1
                result.segment_alloc_matches += [(g[0], g[2]) for g in grows] == [(g[0], g[2]) for g in model_grows]
            else:
                result.cache_allocs += 1
                result.cache_alloc_address_matches += hit
            result.model_segment_allocs += bool(model_grows)
            if expected_release is not None:
                model_release = [(a, s) for act, a, s, _ in events if act in _RELEASES]
                result.release_run_matches += sorted(model_release) == sorted(expected_release)
                expected_release = None
            if model.last_oom and after_oom != (size, stream):
                result.ooms_model += 1  # (an alloc right after its own oom entry is that request, counted there)
            after_oom = None
            grows.clear()
            borrowed.clear()
            addr_map[addr] = got_addr
            if record is not None:
                requested[got_addr] = size
                record.append((float(entry.get("time_us", i)), 1, size, model.block_size(got_addr), got_addr,
                               model.reserved_bytes, _frame(entry)))
        elif action in ("free_requested", "free_completed"):
            got = addr_map.pop(int(entry.get("addr", -1)), None)
            if got is not None:
                bs = model.block_size(got)
                model.free(got)
                if record is not None:
                    record.append((float(entry.get("time_us", i)), -1, requested.pop(got, bs), bs, got,
                                   model.reserved_bytes, ""))
        elif action == "oom":
            result.ooms_real += 1
            # a timeline snapshot goes on past capacity: the request's alloc entry follows its oom entry
            after_oom = (int(entry.get("size", 0)), int(entry.get("stream", 0)))
            events.clear()
            got = model.try_malloc(int(entry.get("size", 0)), int(entry.get("stream", 0)))
            if got is None:
                result.ooms_model += 1
                result.oom_matches += 1
            else:
                model.free(got)  # the model found room where the real allocator did not
            expected_release = None
        else:
            i += 1
            continue
        if real_reserved > 0:
            err = abs(model.reserved_bytes - real_reserved) / real_reserved
            result.max_reserved_rel_error = max(result.max_reserved_rel_error, err)
        i += 1
    _compare_end(result, model, segments)
    result.peak_reserved_bytes_real = peak_real
    result.peak_reserved_bytes_model = model.peak_reserved_bytes
    result.peak_allocated_bytes_model = model.peak_allocated_bytes
    return result


def _frame(entry: Mapping[str, Any]) -> str:
    """The innermost frame outside PyTorch's own files, as ``name (file:line)``."""
    frames = entry.get("frames") or ()
    for f in frames:
        name = str(f.get("filename", ""))
        if "/torch/" not in name and not name.startswith("??"):
            return f"{f.get('name', '?')} ({name.rsplit('/', 1)[-1]}:{f.get('line', 0)})"
    return str(frames[0].get("name", "alloc")) if frames else "alloc"


def _compare_end(result: DeviceReplay, model: CachingAllocator, segments: Sequence[Mapping[str, Any]]) -> None:
    views = model.segments()
    result.end_segments_match = sorted((v.address, v.size) for v in views) == sorted(
        (int(s["address"]), int(s["total_size"])) for s in segments)
    real_blocks = sorted((int(b["address"]), int(b["size"])) for s in segments for b in s.get("blocks") or ()
                         if b.get("state") == "active_allocated")
    model_blocks = sorted((b[0], b[1]) for v in views for b in v.blocks if b[3] == "active_allocated")
    result.end_blocks_match = real_blocks == model_blocks


def replay_report(snapshot: Mapping[str, Any], *, config: AllocatorConfig | None = None,
                  capacity_bytes: int | None = None) -> dict[str, Any]:
    """The ``timeline.replay/1`` JSON document for ``snapshot``."""
    devices = replay_snapshot(snapshot, config=config, capacity_bytes=capacity_bytes)
    return {"schema": SCHEMA, "devices": [d.to_dict() for d in devices]}
