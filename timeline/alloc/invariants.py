"""Accounting identities of the caching allocator model, checked by walking every segment.

``reserved = allocated + pending-free + cached`` bytes; blocks tile each segment with no
overlap and no gap; no two adjacent cached blocks (they would have merged); requested ≤ block
size; the pools' free lists hold exactly the cached blocks. Used by tests and debugging; the
allocator never calls it on its own (it walks everything: O(blocks)).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from timeline.alloc.blocks import ADDRESS_BITS, Block

if TYPE_CHECKING:
    from timeline.alloc.caching import CachingAllocator


def _walk(head: Block) -> list[Block]:
    chain = []
    block: Block | None = head
    while block is not None:
        chain.append(block)
        block = block.next
    return chain


def check(alloc: CachingAllocator) -> None:
    """Raise AssertionError naming the first broken identity."""
    chains: list[tuple[int, int, list[Block]]] = []
    for start, size in alloc._segments.items():
        chains.append((start, size, _walk(alloc._blocks[start])))
    for es in alloc._expandable:
        chains.append((es.base, es.size, _walk(alloc._blocks[es.base])))
    allocated = pending = cached = reserved = 0
    free_keys: set[tuple[bool, int, int]] = set()
    unmapped_keys: set[tuple[bool, int, int]] = set()
    seen: set[int] = set()
    for start, size, chain in chains:
        assert chain[0].prev is None, f"segment {start:#x} head has a predecessor"
        addr = start
        for block in chain:
            assert block.addr == addr, f"gap or overlap at {addr:#x} (block at {block.addr:#x})"
            assert alloc._blocks.get(block.addr) is block, f"block {block.addr:#x} not indexed"
            assert block.size > 0
            if block.next is not None:
                assert block.next.prev is block, f"broken links after {block.addr:#x}"
            seen.add(block.addr)
            addr += block.size
            if block.mapped:
                reserved += block.size
            if block.allocated:
                assert block.requested <= block.size, f"requested > size at {block.addr:#x}"
                allocated += block.size
            elif block.event_count:
                pending += block.size
            elif block.mapped:
                cached += block.size
                free_keys.add((block.pool.is_small, block.stream, block.size << ADDRESS_BITS | block.addr))
            else:
                unmapped_keys.add((block.pool.is_small, block.stream, block.addr))
            nxt = block.next
            if nxt is not None and not block.allocated and not nxt.allocated and not block.event_count \
                    and not nxt.event_count and block.mapped == nxt.mapped:
                raise AssertionError(f"adjacent free blocks at {block.addr:#x} and {nxt.addr:#x} not merged")
        assert addr == start + size, f"segment {start:#x} blocks sum to {addr - start}, not {size}"
    assert seen == set(alloc._blocks), "blocks indexed outside any segment"
    listed = {(p.is_small, s, k) for p in (alloc._small, alloc._large) for s, lst in p.free.items() for k in lst}
    assert listed == free_keys, "free lists differ from the cached blocks"
    listed_u = {(p.is_small, s, a) for p in (alloc._small, alloc._large) for s, lst in p.unmapped.items() for a in lst}
    assert listed_u == unmapped_keys, "unmapped lists differ from the unmapped blocks"
    for pool in (alloc._small, alloc._large):
        for lst in pool.free.values():
            assert lst == sorted(lst), "free list out of order"
    assert allocated == alloc.allocated_bytes, f"allocated {alloc.allocated_bytes} != blocks {allocated}"
    assert pending == alloc.pending_free_bytes, f"pending {alloc.pending_free_bytes} != blocks {pending}"
    assert reserved == alloc.reserved_bytes, f"reserved {alloc.reserved_bytes} != mapped {reserved}"
    assert reserved == allocated + pending + cached
    assert alloc.requested_bytes <= alloc.allocated_bytes
    if alloc.capacity_bytes is not None and not alloc.num_ooms:
        assert alloc.reserved_bytes <= alloc.capacity_bytes, "reserved beyond capacity without an OOM"
