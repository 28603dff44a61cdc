"""Replaying a whole event stream through the caching allocator model in one call.

The simulator's allocator pass hands one device's events over at once: event ``i`` allocates
``size[i]`` bytes when ``pair[i] < 0``, else frees the block of allocation ``pair[i]``; every
event is on stream 0, with no ``record_stream`` and no expandable segments. Two cores do it:

- ``compiled``: the optional C extension :mod:`timeline.alloc._ccore`, a port of the request
  path of :class:`~timeline.alloc.caching.CachingAllocator` (built when a compiler is there);
- ``python``: :class:`~timeline.alloc.caching.CachingAllocator` itself, the reference.

Both fill the same int64 output columns and return the same segment events, OOMs and end
state; the tests compare them event for event. ``TIMELINE_ALLOC_CORE=python`` forces the
reference. This module decides nothing about allocation itself and imports no numpy: columns
are any int64 buffers (numpy arrays, ``array('q')``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from timeline.alloc.caching import CachingAllocator
from timeline.alloc.config import AllocatorConfig
from timeline.alloc.views import SegmentView

#: a contiguous int64 column (a numpy ``int64`` array from the simulator; this layer imports no numpy,
#: it reads and writes the columns through ``memoryview`` and item assignment)
Int64Column = Any

try:  # the optional compiled core
    from timeline.alloc import _ccore  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the install
    _ccore = None

#: segment event codes of the compiled core → the listener's action names
_ACTIONS = ("segment_alloc", "segment_free", "oom")
CORES = ("compiled", "python")


def compiled_available() -> bool:
    return _ccore is not None


def active_core() -> str:
    """``compiled`` when the extension is built and not switched off by
    ``TIMELINE_ALLOC_CORE=python``, else ``python``."""
    wanted = os.environ.get("TIMELINE_ALLOC_CORE", "").strip().lower()
    return "compiled" if _ccore is not None and wanted != "python" else "python"


@dataclass(slots=True)
class BatchResult:
    """What the allocator did besides the per-event columns the caller passed in."""

    #: (event, action, address, size, stream, reserved bytes then), as the listener reports them
    segment_events: list[tuple[int, str, int, int, int, int]]
    ooms: list[tuple[int, int, int]]  # (event, allocated bytes before it, reserved bytes after)
    end_segments: list[SegmentView]  # the state after the last event, in address order


def replay(config: AllocatorConfig, capacity_bytes: int | None, size: Int64Column, pair: Int64Column,
           block: Int64Column, reserved: Int64Column, address: Int64Column,
           segment: Int64Column, core: str | None = None) -> BatchResult | None:
    """Fill ``block`` (signed block bytes), ``reserved`` (after each event), ``address`` and
    ``segment`` (start of the segment holding the block). ``None``: the compiled core met a
    state it does not model (the caller then runs the reference model its own way); the
    Python core never returns ``None``."""
    if config.expandable_segments:
        raise ValueError("batch replay models plain segments only (expandable_segments = false)")
    core = core or active_core()
    if core == "compiled" and _ccore is not None:
        mss = config.max_split_size_bytes if config.has_max_split else -1
        out = _ccore.replay(size, pair, block, reserved, address, segment,
                            -1 if capacity_bytes is None else capacity_bytes, mss,
                            config.max_non_split_rounding_bytes, config.roundup_power2_divisions)
        if out is None:
            return None
        events, ooms, segs = out
        return BatchResult(
            segment_events=[(i, _ACTIONS[code], a, s, st, r) for i, code, a, s, st, r in events],
            ooms=ooms,
            end_segments=[SegmentView(addr, sum(b[1] for b in blocks), 0, bool(small), False,
                                      tuple((a, s, r, "active_allocated" if on else "inactive")
                                            for a, s, r, on in blocks))
                          for addr, small, blocks in segs])
    return replay_python(config, capacity_bytes, size, pair, block, reserved, address, segment)


def replay_python(config: AllocatorConfig, capacity_bytes: int | None, size: Int64Column, pair: Int64Column,
                  block: Int64Column, reserved: Int64Column, address: Int64Column,
                  segment: Int64Column) -> BatchResult:
    """:func:`replay` on the reference :class:`CachingAllocator`."""
    events: list[tuple[int, str, int, int, int, int]] = []
    ooms: list[tuple[int, int, int]] = []
    seg_of: dict[int, int] = {}  # block address → its segment's start (blocks move only when free)
    current = 0

    def listener(action: str, addr: int, sz: int, stream: int) -> None:
        events.append((current, action, addr, sz, stream, alloc.reserved_bytes))

    alloc = CachingAllocator(config, capacity_bytes=capacity_bytes, listener=listener)
    malloc, free, blocks = alloc.malloc, alloc.free, alloc._blocks
    addrs = [0] * len(size)
    # plain ints: the model packs keys as size << 48 | address, which numpy ints would overflow
    sizes, pairs = memoryview(size).tolist(), memoryview(pair).tolist()
    for i, (sz, p) in enumerate(zip(sizes, pairs, strict=True)):
        current = i
        if p < 0:
            addr = malloc(sz)
            b = blocks[addr]
            head = b
            while head.prev is not None:
                head = head.prev
            seg_of[addr] = head.addr
            block[i] = b.size
            if alloc.last_oom:
                ooms.append((i, alloc.allocated_bytes - b.size, alloc.reserved_bytes))
        else:
            addr = addrs[p]
            block[i] = -blocks[addr].size
            free(addr)
        addrs[i] = addr
        address[i] = addr
        segment[i] = seg_of[addr]
        reserved[i] = alloc.reserved_bytes
    return BatchResult(segment_events=events, ooms=ooms, end_segments=alloc.segments())
