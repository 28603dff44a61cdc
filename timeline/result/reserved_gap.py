"""Why reserved exceeds allocated at a device's reserved peak, read off the event stream.

Reserved − allocated is the free space inside the caching allocator's segments. At the reserved
peak this query rebuilds the live segments (from the allocator's segment events) and the live
blocks (from the alloc/free events with their addresses), cuts each segment into its free gaps,
and names what last occupied each gap: the tensor whose block was freed there most recently (its
category, and when it was freed), or ``never used`` for the tail of a segment that no block has
reached (the rounding of a request up to a 2 MiB / 20 MiB / power-of-two segment). A gap
left by an activation of the previous iteration inside a segment that now also holds, say, Adam's
moments is how fragmentation shows. The bytes
are exact: the gaps sum to reserved − allocated. A pure query; it prints nothing.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

import numpy as np

from timeline.result.categories import CATEGORIES
from timeline.result.timeline import Timeline


def _mapped_ranges(tl: Timeline, d: int, index: int) -> list[tuple[int, int]]:
    """Sorted (start, end) address ranges of memory mapped just after event ``index``: segments, or
    under expandable segments the mapped pages (``segment_unmap`` may cut a range)."""
    ranges: list[tuple[int, int]] = []
    for ev_i, action, addr, size, _stream, _reserved in tl.memory[d].segment_events:
        if ev_i > index:
            break
        if action in ("segment_alloc", "segment_map"):
            ranges.append((addr, addr + size))
        elif action in ("segment_free", "segment_unmap"):
            lo, hi = addr, addr + size
            cut = []
            for a, b in ranges:
                if b <= lo or a >= hi:
                    cut.append((a, b))
                    continue
                if a < lo:
                    cut.append((a, lo))
                if b > hi:
                    cut.append((hi, b))
            ranges = cut
    merged: list[tuple[int, int]] = []  # adjacent mapped pages hold blocks that span them
    for a, b in sorted(ranges):
        if merged and merged[-1][1] == a:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return merged


def reserved_gap(tl: Timeline, d: int, top: int = 5) -> dict:
    """Reserved, allocated and their gap at device ``d``'s reserved peak, the gap by what last
    occupied the free space (category or ``never used``), and the ``top`` largest gaps."""
    ev, mem = tl.events(d), tl.memory[d]
    if not len(ev.t_us) or (mem.address < 0).all():
        return {"reserved_bytes": 0, "allocated_bytes": 0, "gap_bytes": 0, "by_last_occupant": {}, "gaps": []}
    index = int(np.argmax(mem.reserved))
    allocated = int(np.cumsum(mem.block_bytes)[index])
    ranges = _mapped_ranges(tl, d, index)
    live = tl.live_at(d, index)
    occupied: dict[int, list[tuple[int, int]]] = defaultdict(list)
    range_starts = [a for a, _ in ranges]
    for i in live.tolist():
        addr = int(mem.address[i])
        k = bisect.bisect_right(range_starts, addr) - 1
        if k >= 0:
            occupied[k].append((addr, int(mem.block_bytes[i])))
    # blocks freed before the peak: the most recent one overlapping a gap names what left it
    freed = np.flatnonzero((ev.sign[: index + 1] < 0) & (mem.address[: index + 1] >= 0))
    f_lo = mem.address[freed]
    f_hi = f_lo - mem.block_bytes[freed]  # a free's block_bytes is negative
    by_cause: dict[str, int] = defaultdict(int)
    gaps: list[dict] = []
    for k, (seg, end) in enumerate(ranges):
        cursor = seg
        for addr, nbytes in sorted(occupied.get(k, [])) + [(end, 0)]:
            if addr > cursor:
                # the most recent free at or inside this gap names it
                hit = freed[(f_lo < addr) & (f_hi > cursor)]
                if len(hit):
                    i = int(hit[-1])
                    cause = CATEGORIES[ev.cat[i]]
                    gaps.append({"address": cursor, "bytes": addr - cursor, "last_tensor": tl.names[ev.tensor[i]],
                                 "category": cause, "freed_at_us": float(ev.t_us[i])})
                else:
                    cause = "never used"
                    gaps.append({"address": cursor, "bytes": addr - cursor, "last_tensor": None,
                                 "category": cause, "freed_at_us": None})
                by_cause[cause] += addr - cursor
            cursor = max(cursor, addr + nbytes)
    gaps.sort(key=lambda g: -g["bytes"])
    reserved = int(mem.reserved[index])
    return {"reserved_bytes": reserved, "allocated_bytes": allocated, "gap_bytes": reserved - allocated,
            "explained_bytes": sum(by_cause.values()), "t_us": float(ev.t_us[index]),
            "by_last_occupant": dict(sorted(by_cause.items(), key=lambda kv: -kv[1])), "gaps": gaps[:top]}
