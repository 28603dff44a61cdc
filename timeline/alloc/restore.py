"""Put a caching allocator model into a given state: segments and the blocks live in them.

Used to start a replay from the state a memory snapshot implies (warm cache), and by tests.
The free space between live blocks becomes cached blocks (already merged, as the allocator
would hold them). This module does not infer the state; :mod:`timeline.alloc.reconstruct`
does that from a snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence

from timeline.alloc import expandable as _exp
from timeline.alloc.blocks import Block, ExpandableSegment
from timeline.alloc.caching import CachingAllocator

#: a live block: (address, rounded size, requested size)
LiveBlock = tuple[int, int, int]


def _chain(alloc: CachingAllocator, pieces: list[Block]) -> None:
    for a, b in zip(pieces, pieces[1:], strict=False):
        a.next = b
        b.prev = a
    for block in pieces:
        alloc._blocks[block.addr] = block
        if block.allocated:
            alloc.allocated_bytes += block.size
            alloc.requested_bytes += block.requested
        else:
            block.pool.insert(block)
        if block.mapped:
            alloc.add_reserved(block.size)
    alloc.peak_allocated_bytes = max(alloc.peak_allocated_bytes, alloc.allocated_bytes)
    alloc.peak_requested_bytes = max(alloc.peak_requested_bytes, alloc.requested_bytes)


def _fill(alloc: CachingAllocator, start: int, end: int, stream: int, is_small: bool,
          live: Sequence[LiveBlock], es: ExpandableSegment | None) -> list[Block]:
    """Blocks tiling mapped ``[start, end)``: the live ones and the free gaps between them."""
    pool = alloc._small if is_small else alloc._large
    pieces: list[Block] = []
    addr = start
    for b_addr, b_size, requested in sorted(live):
        if b_addr < addr or b_addr + b_size > end:
            raise ValueError(f"live block {b_addr:#x}+{b_size} outside or overlapping in [{start:#x}, {end:#x})")
        if b_addr > addr:
            pieces.append(Block(addr, b_addr - addr, stream, pool, es))
        block = Block(b_addr, b_size, stream, pool, es)
        block.allocated = True
        block.requested = min(requested, b_size)
        pieces.append(block)
        addr = b_addr + b_size
    if addr < end:
        pieces.append(Block(addr, end - addr, stream, pool, es))
    return pieces


def restore_segment(alloc: CachingAllocator, address: int, size: int, stream: int, is_small: bool,
                    live: Sequence[LiveBlock] = ()) -> None:
    """Add one ``cudaMalloc``'d segment holding ``live`` blocks; no ``segment_alloc`` is emitted."""
    alloc._segments[address] = size
    _chain(alloc, _fill(alloc, address, address + size, stream, is_small, live, None))


def restore_expandable(alloc: CachingAllocator, base: int, size: int, stream: int, is_small: bool,
                       mapped: Sequence[tuple[int, int]] = (), live: Sequence[LiveBlock] = ()) -> None:
    """Add one expandable virtual range at ``base`` with the ``mapped`` (address, size) ranges,
    which must lie on page boundaries, and ``live`` blocks inside them."""
    pool = alloc._small if is_small else alloc._large
    head = _exp.new_expandable_segment(alloc, pool, stream, base=base, size=size)
    es = head.es
    assert es is not None
    pool.remove(head)
    del alloc._blocks[base]
    end = base + es.size
    pieces: list[Block] = []
    addr = base
    for m_addr, m_size in sorted(mapped):
        if m_addr < addr or m_addr + m_size > end or (m_addr - base) % es.page or m_size % es.page:
            raise ValueError(f"mapped range {m_addr:#x}+{m_size} not on pages of [{base:#x}, {end:#x})")
        if m_addr > addr:
            pieces.append(Block(addr, m_addr - addr, stream, pool, es, mapped=False))
        inside = [b for b in live if m_addr <= b[0] < m_addr + m_size]
        pieces.extend(_fill(alloc, m_addr, m_addr + m_size, stream, is_small, inside, es))
        addr = m_addr + m_size
    if addr < end:
        pieces.append(Block(addr, end - addr, stream, pool, es, mapped=False))
    # adjacent mapped ranges given separately are one free run: merge free neighbours
    merged: list[Block] = []
    for block in pieces:
        last = merged[-1] if merged else None
        if last is not None and not last.allocated and not block.allocated and last.mapped == block.mapped:
            last.size += block.size
        else:
            merged.append(block)
    _chain(alloc, merged)
