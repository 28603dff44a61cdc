"""Rebuild the allocator state at the start of a snapshot's trace from its final ``segments``.

A memory snapshot lists the segments and blocks at the *end*; its ``device_traces`` (a ring
buffer) may begin with a warm cache. Walking the trace backwards — as MemoryViz's "Allocator
State History" does — undoes each event: an ``alloc`` frees its block, a ``free_*`` makes it live,
``segment_alloc``/``segment_map`` remove memory, ``segment_free``/``segment_unmap`` restore it.
Live blocks that are freed during the trace but were allocated before it have no recorded
rounded size; it is estimated as ``round_size(requested)`` plus, in the large pool, a following
gap of ≤ 1 MiB that ``should_split`` would not have split off, or the slack a later traced
``alloc`` proves it held (:func:`_refine`). Expandable ranges are grouped per (stream, pool) from
the final segments' types; a range's virtual size is the distance to the next range's base.
Works on plain snapshot dicts;
it does not replay anything forwards (that is :mod:`timeline.alloc.replay`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from timeline.alloc.config import K_SMALL_BUFFER, K_SMALL_SIZE, AllocatorConfig, round_size

PAGE = K_SMALL_BUFFER  # bookkeeping granularity of mapped memory (both page sizes are multiples)
LIVE_STATES = ("active_allocated", "active_pending_free")


@dataclass(slots=True)
class StartState:
    """Segments (address, size, stream, is_small, live blocks) and expandable ranges
    (base, virtual size or None, stream, is_small, mapped ranges, live blocks) at trace start."""

    segments: list[tuple[int, int, int, bool, list[tuple[int, int, int]]]] = field(default_factory=list)
    expandable: list[tuple[int, int | None, int, bool, list[tuple[int, int]], list[tuple[int, int, int]]]] = \
        field(default_factory=list)
    reserved_bytes: int = 0
    estimated_blocks: int = 0  # live blocks whose rounded size had to be estimated


def _live_at_end(segments: Sequence[Mapping[str, Any]]) -> dict[int, list[Any]]:
    live: dict[int, list[Any]] = {}
    for seg in segments:
        for block in seg.get("blocks") or ():
            if block.get("state") in LIVE_STATES:
                live[int(block["address"])] = [int(block["size"]), int(block.get("requested_size", block["size"]))]
    return live


def _undo_blocks(live: dict[int, list[Any]], entry: Mapping[str, Any]) -> None:
    action = entry.get("action")
    if action == "alloc":
        live.pop(int(entry.get("addr", -1)), None)
    elif action in ("free_completed", "free_requested"):
        addr = entry.get("addr")
        if addr is not None and addr not in live:
            live[int(addr)] = [None, int(entry.get("size", 0))]


def _place(live: dict[int, list[Any]], ranges: list[tuple[int, int]], small: list[bool],
           config: AllocatorConfig, exact_split: bool) -> tuple[list[list[tuple[int, int, int]]], int]:
    """Assign live blocks to the (sorted, disjoint) ranges containing them; estimate unknown sizes."""
    starts = [r[0] for r in ranges]
    per_range: list[list[list[Any]]] = [[] for _ in ranges]
    for addr, (size, requested) in live.items():
        i = bisect_right(starts, addr) - 1
        if i >= 0 and addr < ranges[i][0] + ranges[i][1]:
            per_range[i].append([addr, size, requested])
    estimated = 0
    out: list[list[tuple[int, int, int]]] = []
    for (start, length), is_small, blocks in zip(ranges, small, per_range, strict=True):
        blocks.sort()
        placed: list[tuple[int, int, int]] = []
        for k, (addr, size, requested) in enumerate(blocks):
            limit = blocks[k + 1][0] if k + 1 < len(blocks) else start + length
            if size is None:
                estimated += 1
                size = round_size(max(requested, 1), config)
                gap = limit - addr - size
                if not exact_split and not is_small and 0 < gap and (
                        gap <= K_SMALL_SIZE or size >= config.max_split_size_bytes):
                    size += gap  # the allocator would not have split such a remainder off
            placed.append((addr, max(0, min(size, limit - addr)), requested))
        out.append([b for b in placed if b[1] > 0])
    return out, estimated


def _refine(placed: list[list[tuple[int, int, int]]], ranges: list[tuple[int, int]], unknown: set[int],
            small: list[bool], trace: Sequence[Mapping[str, Any]], config: AllocatorConfig) -> None:
    """Grow estimated large-pool blocks to what later allocations prove about them.

    An allocation lands at the front of a free block, so the range just below its address is
    allocated or the segment start. When the nearest live block below a traced ``alloc`` is an
    estimated start block ending short of it by ≤ 1 MiB, that block held the gap as unsplit slack.
    """
    where: dict[int, tuple[int, int]] = {}
    for i, blocks in enumerate(placed):
        for k, block in enumerate(blocks):
            if block[0] in unknown and not small[i]:
                where[block[0]] = (i, k)
    if not where:
        return
    live = sorted(b[0] for blocks in placed for b in blocks)
    ends = {b[0]: b[0] + b[1] for blocks in placed for b in blocks}
    for entry in trace:
        action = entry.get("action")
        if action == "alloc":
            addr = int(entry["addr"])
            j = bisect_right(live, addr) - 1
            below = live[j] if j >= 0 else None
            if below is not None and below in where and ends[below] < addr <= ends[below] + K_SMALL_SIZE:
                i, k = where.pop(below)
                start, length = ranges[i]
                if start <= below and addr <= start + length:
                    b_addr, _, requested = placed[i][k]
                    placed[i][k] = (b_addr, addr - b_addr, requested)
            ends[addr] = addr + round_size(max(int(entry["size"]), 1), config)
            insort(live, addr)
        elif action == "free_completed" or (action == "free_requested"):
            addr = int(entry["addr"])
            j = bisect_left(live, addr)
            if j < len(live) and live[j] == addr:
                del live[j]
                where.pop(addr, None)


def reconstruct(segments: Sequence[Mapping[str, Any]], trace: Sequence[Mapping[str, Any]],
                config: AllocatorConfig) -> StartState:
    """Start state of one device's trace; ``segments`` are that device's final segments."""
    if config.expandable_segments:
        return _reconstruct_expandable(segments, trace, config)
    segs: dict[int, tuple[int, int, bool]] = {
        int(s["address"]): (int(s["total_size"]), int(s.get("stream", 0)), s.get("segment_type") == "small")
        for s in segments
    }
    live = _live_at_end(segments)
    for entry in reversed(trace):
        action = entry.get("action")
        if action == "segment_alloc":
            segs.pop(int(entry["addr"]), None)
        elif action == "segment_free":
            size = int(entry["size"])
            segs[int(entry["addr"])] = (size, int(entry.get("stream", 0)), size == K_SMALL_BUFFER)
        else:
            _undo_blocks(live, entry)
    order = sorted(segs)
    ranges = [(a, segs[a][0]) for a in order]
    unknown = {addr for addr, (size, _) in live.items() if size is None}
    placed, estimated = _place(live, ranges, [segs[a][2] for a in order], config, False)
    _refine(placed, ranges, unknown, [segs[a][2] for a in order], trace, config)
    state = StartState(estimated_blocks=estimated)
    for addr, blocks in zip(order, placed, strict=True):
        size, stream, is_small = segs[addr]
        state.segments.append((addr, size, stream, is_small, blocks))
        state.reserved_bytes += size
    return state


def _reconstruct_expandable(segments: Sequence[Mapping[str, Any]], trace: Sequence[Mapping[str, Any]],
                            config: AllocatorConfig) -> StartState:
    known = sorted((int(s["address"]), int(s.get("stream", 0)), s.get("segment_type") == "small") for s in segments)
    known_starts = [k[0] for k in known]

    def kind(addr: int, stream: int, size: int) -> tuple[int, bool]:
        if known:
            i = max(bisect_right(known_starts, addr) - 1, 0)
            return stream, known[i][2]
        return stream, size % (20 << 20) != 0

    pages: set[int] = set()
    for seg in segments:
        start = int(seg["address"]) // PAGE
        pages.update(range(start, start + int(seg["total_size"]) // PAGE))
    bases: dict[tuple[int, bool], int] = {(k[1], k[2]): k[0] for k in reversed(known)}
    live = _live_at_end(segments)
    for entry in reversed(trace):
        action = entry.get("action")
        if action in ("segment_map", "segment_unmap"):
            addr, size = int(entry["addr"]), int(entry["size"])
            key = kind(addr, int(entry.get("stream", 0)), size)
            bases[key] = min(bases.get(key, addr), addr)
            span = range(addr // PAGE, (addr + size) // PAGE)
            if action == "segment_map":
                pages.difference_update(span)
            else:
                pages.update(span)
        else:
            _undo_blocks(live, entry)
    ordered = sorted(bases.items(), key=lambda kv: kv[1])
    gaps = [b[1] - a[1] for a, b in zip(ordered, ordered[1:], strict=False)]
    widest = max(gaps) if gaps else None
    state = StartState()
    all_ranges: list[tuple[int, int]] = []
    owners: list[int] = []
    for i, (key, base) in enumerate(ordered):
        vsize = min(gaps[i], widest) if i < len(gaps) and widest is not None else widest
        mapped = _runs(sorted(p for p in pages if p * PAGE >= base and (vsize is None or p * PAGE < base + vsize)))
        if mapped:
            needed = mapped[-1][0] + mapped[-1][1] - base
            vsize = max(vsize or 0, needed)
        state.expandable.append((base, vsize, key[0], key[1], mapped, []))
        all_ranges.extend(mapped)
        owners.extend([i] * len(mapped))
        state.reserved_bytes += sum(m[1] for m in mapped)
    order = sorted(range(len(all_ranges)), key=lambda j: all_ranges[j][0])
    ranges = [all_ranges[j] for j in order]
    placed, state.estimated_blocks = _place(live, ranges, [False] * len(ranges), config, True)
    for j, blocks in zip(order, placed, strict=True):
        state.expandable[owners[j]][5].extend(blocks)
    return state


def _runs(pages: list[int]) -> list[tuple[int, int]]:
    """Contiguous (address, size) ranges of sorted page indices."""
    runs: list[tuple[int, int]] = []
    for p in pages:
        if runs and runs[-1][0] + runs[-1][1] == p * PAGE:
            runs[-1] = (runs[-1][0], runs[-1][1] + PAGE)
        else:
            runs.append((p * PAGE, PAGE))
    return runs
