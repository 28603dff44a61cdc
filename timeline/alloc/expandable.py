"""Expandable segments (``expandable_segments:True``) of the caching allocator model.

One virtual range per (stream, pool), mapped in pages — 2 MiB in the small pool, 20 MiB in the
large — for the *rounded request* at the lowest address with enough free + unmapped space;
newly mapped pages merge with adjacent free mapped blocks; ``empty_cache`` and the OOM retry
unmap every fully free page and destroy a fully unmapped range (``../shared/reference/allocator.md``
§8; CCA.cpp ``find_expandable_block``, ``map_block``, ``try_allocate_expandable_block``,
``unmap_block``). The functions operate on a :class:`~timeline.alloc.caching.CachingAllocator`;
they hold no state of their own and do not decide *when* to map or unmap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeline.alloc.blocks import ADDRESS_MASK, Block, ExpandableSegment, Pool
from timeline.alloc.config import K_LARGE_BUFFER, K_SMALL_BUFFER

if TYPE_CHECKING:
    from timeline.alloc.caching import CachingAllocator


def _expandable_size(block: Block) -> int:
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


def best_expandable_candidate(blocks: dict[int, Block], lst: list[int], i: int) -> int:
    """``get_free_block``'s expandable rule: move from the best-fit index ``i`` to later blocks
    while they can grow to a smaller size (size + unmapped tail) than the current one."""
    block = blocks[lst[i] & ADDRESS_MASK]
    size = _expandable_size(block)
    while block.es is not None and i + 1 < len(lst):
        nxt = blocks[lst[i + 1] & ADDRESS_MASK]
        nsize = _expandable_size(nxt)
        if nsize >= size:
            break
        i, block, size = i + 1, nxt, nsize
    return i


def _allocatable(block: Block | None) -> bool:
    return block is not None and not block.allocated and block.event_count == 0


def _has_space(block: Block | None, size: int) -> bool:
    total = 0
    while total < size and _allocatable(block):
        assert block is not None
        total += block.size
        block = block.next
    return total >= size


def new_expandable_segment(alloc: CachingAllocator, pool: Pool, stream: int, base: int | None = None,
                           size: int | None = None) -> Block:
    """Reserve a new virtual range (one unmapped block spanning it) for ``pool`` on ``stream``."""
    page = K_SMALL_BUFFER if pool.is_small else K_LARGE_BUFFER
    vsize = -(-(size or alloc.expandable_reserve_bytes) // page) * page
    if base is None:
        base = alloc.new_segment_address(vsize, stream, pool.is_small, True)
    es = ExpandableSegment(base, vsize, page, stream, pool.is_small)
    block = Block(base, vsize, stream, pool, es, mapped=False)
    alloc._blocks[base] = block
    alloc._expandable.append(es)
    pool.insert(block)
    return block


def find_expandable_block(alloc: CachingAllocator, pool: Pool, stream: int, size: int) -> Block:
    """Lowest-address unmapped range (with its free mapped predecessor) that can hold ``size``."""
    blocks = alloc._blocks
    for addr in pool.unmapped.get(stream, ()):
        candidate = blocks[addr]
        prev = candidate.prev
        if prev is not None and _allocatable(prev):
            candidate = prev
        if _has_space(candidate, size):
            return candidate
    # a request beyond the usual reservation (possible only when going over capacity) gets its own
    return new_expandable_segment(alloc, pool, stream, size=max(size, alloc.expandable_reserve_bytes))


def map_block(alloc: CachingAllocator, block: Block, size: int, ignore_capacity: bool) -> bool:
    """Map whole pages for the first ``size`` bytes of unmapped ``block``; merge with free neighbours."""
    assert not block.mapped and size <= block.size
    es = block.es
    assert es is not None
    mapped = min(-(-size // es.page) * es.page, block.size)
    if not ignore_capacity and not alloc.fits(mapped):
        return False
    pool = block.pool
    pool.remove(block)
    block.mapped = True
    if mapped < block.size:
        rest = Block(block.addr + mapped, block.size - mapped, block.stream, pool, es, mapped=False)
        rest.prev = block
        rest.next = block.next
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = mapped
        alloc._blocks[rest.addr] = rest
        pool.insert(rest)
    start = block.addr
    prev = block.prev
    if prev is not None and prev.mapped and not prev.allocated and prev.event_count == 0:
        alloc.merge(block, prev)
    nxt = block.next
    if nxt is not None and nxt.mapped and not nxt.allocated and nxt.event_count == 0:
        alloc.merge(block, nxt)
    pool.insert(block)
    alloc.num_device_alloc += 1
    alloc.add_reserved(mapped)
    if alloc.listener is not None:
        alloc.listener("segment_map", start, mapped, block.stream)
    return True


def try_allocate_expandable_block(alloc: CachingAllocator, pool: Pool, stream: int, size: int,
                                  ignore_capacity: bool) -> Block | None:
    """``try_allocate_expandable_block``: map pages until a free block of ``size`` exists; take it
    out of the free list. Pages mapped before a failure stay mapped, as in PyTorch."""
    candidate = find_expandable_block(alloc, pool, stream, size)
    if not candidate.mapped and not map_block(alloc, candidate, min(candidate.size, size), ignore_capacity):
        return None
    while candidate.size < size:
        nxt = candidate.next
        assert nxt is not None and not nxt.mapped
        if not map_block(alloc, nxt, min(size - candidate.size, nxt.size), ignore_capacity):
            return None
        candidate = nxt
    pool.remove(candidate)
    return candidate


def unmap_block(alloc: CachingAllocator, block: Block) -> None:
    """Unmap every page that lies wholly inside cached ``block``; the edges stay mapped and free."""
    es = block.es
    assert es is not None and block.mapped
    page = es.page
    offset = block.addr - es.base
    begin = -(-offset // page)
    end = (offset + block.size) // page
    if begin >= end:
        return
    pool = block.pool
    pool.remove(block)
    start = es.base + begin * page
    size = (end - begin) * page
    before = start - block.addr
    after = block.size - before - size
    blocks = alloc._blocks
    if before > 0:
        head = Block(block.addr, before, block.stream, pool, es)
        head.prev = block.prev
        if block.prev is not None:
            block.prev.next = head
        head.next = block
        block.prev = head
        blocks[head.addr] = head  # replaces block under its old address
        pool.insert(head)
    else:
        del blocks[block.addr]
    if after > 0:
        tail = Block(start + size, after, block.stream, pool, es)
        tail.prev = block
        tail.next = block.next
        if block.next is not None:
            block.next.prev = tail
        block.next = tail
        blocks[tail.addr] = tail
        pool.insert(tail)
    block.addr = start
    block.size = size
    block.mapped = False
    blocks[start] = block
    prev = block.prev
    if prev is not None and not prev.mapped:
        alloc.merge(block, prev)
    nxt = block.next
    if nxt is not None and not nxt.mapped:
        alloc.merge(block, nxt)
    pool.insert(block)
    alloc.reserved_bytes -= size
    alloc.num_device_free += 1
    if alloc.listener is not None:
        alloc.listener("segment_unmap", start, size, block.stream)


def release_expandable_segment(alloc: CachingAllocator, block: Block) -> None:
    """Destroy a virtual range that is wholly unmapped (one unmapped block spanning it)."""
    es = block.es
    assert es is not None and block.addr == es.base and block.size == es.size
    block.pool.remove(block)
    del alloc._blocks[block.addr]
    alloc._expandable.remove(es)
