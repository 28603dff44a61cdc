"""Data structures of the caching allocator model: blocks, block pools, expandable segments.

A :class:`Block` is a contiguous address range inside one segment, linked to its neighbours
like PyTorch's ``Block`` (``prev``/``next``). A :class:`Pool` keeps the free (cached) blocks of
one pool kind (small or large) per stream in sorted lists of packed integer keys
``size << 48 | address`` — the order of PyTorch's ``BlockComparatorSize`` (stream, size,
address) without building tuples — and, for expandable segments, the unmapped ranges per stream
sorted by address. This module holds no policy: which block to take, split or release is
decided in :mod:`timeline.alloc.caching` and :mod:`timeline.alloc.expandable`.
"""

from __future__ import annotations

from bisect import bisect_left, insort

ADDRESS_BITS = 48
ADDRESS_MASK = (1 << ADDRESS_BITS) - 1


class ExpandableSegment:
    """One virtual address range of ``expandable_segments``, mapped in pages on demand."""

    __slots__ = ("base", "size", "page", "stream", "is_small")

    def __init__(self, base: int, size: int, page: int, stream: int, is_small: bool) -> None:
        self.base = base
        self.size = size
        self.page = page
        self.stream = stream
        self.is_small = is_small


class Block:
    """An address range: allocated, cached (free and mapped), awaiting events, or unmapped."""

    __slots__ = (
        "addr", "size", "stream", "pool", "prev", "next", "allocated", "requested",
        "es", "mapped", "event_count", "stream_uses",
    )

    def __init__(self, addr: int, size: int, stream: int, pool: Pool,
                 es: ExpandableSegment | None = None, mapped: bool = True) -> None:
        self.addr = addr
        self.size = size
        self.stream = stream
        self.pool = pool
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.requested = 0
        self.es = es
        self.mapped = mapped
        self.event_count = 0  # outstanding cross-stream events (record_stream) after free()
        self.stream_uses: set[int] | None = None

    @property
    def cached(self) -> bool:
        """Free, mapped and not waiting for events: it sits in its pool's free list."""
        return not self.allocated and self.event_count == 0 and self.mapped

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        state = "alloc" if self.allocated else ("pending" if self.event_count else
                                                ("free" if self.mapped else "unmapped"))
        return f"Block({self.addr:#x}, {self.size}, stream={self.stream}, {state})"


class Pool:
    """The cached blocks of one pool kind (small ≤ 1 MiB, or large), per stream."""

    __slots__ = ("is_small", "free", "unmapped")

    def __init__(self, is_small: bool) -> None:
        self.is_small = is_small
        self.free: dict[int, list[int]] = {}  # stream -> sorted size << 48 | addr
        self.unmapped: dict[int, list[int]] = {}  # stream -> sorted addr (expandable only)

    def insert(self, block: Block) -> None:
        """Add a free block: to the free list when mapped, else to the unmapped list."""
        if block.mapped:
            lst = self.free.get(block.stream)
            if lst is None:
                lst = self.free[block.stream] = []
            insort(lst, block.size << ADDRESS_BITS | block.addr)
        else:
            lst = self.unmapped.get(block.stream)
            if lst is None:
                lst = self.unmapped[block.stream] = []
            insort(lst, block.addr)

    def remove(self, block: Block) -> None:
        """Remove a block that :meth:`insert` added (with its current address and size)."""
        if block.mapped:
            lst = self.free[block.stream]
            key = block.size << ADDRESS_BITS | block.addr
        else:
            lst = self.unmapped[block.stream]
            key = block.addr
        i = bisect_left(lst, key)
        if i == len(lst) or lst[i] != key:
            raise AssertionError(f"block {block!r} is not in its pool")
        del lst[i]
