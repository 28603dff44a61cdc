"""Read-only views of a caching allocator model: counters and snapshot-style segment lists.

:class:`AllocatorStats` copies the counters under ``torch.cuda.memory_stats`` names;
:func:`segment_views` lists segments the way a memory snapshot's ``segments`` does (one entry per
contiguous mapped range for expandable segments). Nothing here changes allocator state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from timeline.alloc.blocks import Block

if TYPE_CHECKING:
    from timeline.alloc.caching import CachingAllocator


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocatorStats:
    """A copy of the counters, named as ``torch.cuda.memory_stats`` names them."""

    allocated_bytes: int
    requested_bytes: int
    reserved_bytes: int
    active_bytes: int
    peak_allocated_bytes: int
    peak_requested_bytes: int
    peak_reserved_bytes: int
    num_allocs: int
    num_segments: int
    num_device_alloc: int
    num_device_free: int
    num_alloc_retries: int
    num_ooms: int


@dataclass(frozen=True, slots=True)
class SegmentView:
    """One segment as a memory snapshot lists it; ``blocks`` are (address, size, requested, state)
    with state ``active_allocated`` | ``active_pending_free`` | ``inactive``."""

    address: int
    size: int
    stream: int
    is_small: bool
    expandable: bool
    blocks: tuple[tuple[int, int, int, str], ...]


def _view(head: Block, expandable: bool) -> SegmentView:
    blocks = []
    block: Block | None = head
    while block is not None and block.mapped:
        state = ("active_allocated" if block.allocated else
                 "active_pending_free" if block.event_count else "inactive")
        blocks.append((block.addr, block.size, block.requested if block.allocated else 0, state))
        block = block.next
    size = sum(b[1] for b in blocks)
    return SegmentView(head.addr, size, head.stream, head.pool.is_small, expandable, tuple(blocks))


def segment_views(alloc: CachingAllocator) -> list[SegmentView]:
    """Segments in address order; an expandable segment lists each contiguous mapped range."""
    views = [_view(alloc._blocks[start], False) for start in alloc._segments]
    for es in alloc._expandable:
        block: Block | None = alloc._blocks[es.base]
        while block is not None:
            if block.mapped:
                views.append(_view(block, True))
                while block is not None and block.mapped:
                    block = block.next
            else:
                block = block.next
    views.sort(key=lambda v: v.address)
    return views
