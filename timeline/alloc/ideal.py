"""The ideal allocator: perfect packing, a lower bound for any real allocator.

Choice: ideal reserved == allocated == requested bytes — no 512-byte rounding, no segments, no
fragmentation, no caching, and a free takes effect at ``free()`` even when other streams still
use the block (``record_stream`` is accepted and ignored). So at every step its reserved bytes
are ≤ what :class:`~timeline.alloc.caching.CachingAllocator` reserves for the same sequence
(caching's allocated bytes ≥ requested, and reserved ≥ allocated). Addresses are unique handles
counting up from 1, not a layout. OOM works as in the caching model: ``malloc`` records it and
goes over capacity, ``try_malloc`` returns ``None``.
"""

from __future__ import annotations

from timeline.alloc.base import AllocatorBase
from timeline.alloc.caching import AllocatorStats, Listener


class IdealAllocator(AllocatorBase):
    """Perfect packing with the caching allocator's interface (lower bound on reserved bytes)."""

    def __init__(self, *, capacity_bytes: int | None = None, listener: Listener | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.listener = listener
        self._sizes: dict[int, int] = {}
        self._next = 1
        self.allocated_bytes = self.requested_bytes = self.reserved_bytes = 0
        self.peak_allocated_bytes = self.peak_requested_bytes = self.peak_reserved_bytes = 0
        self.num_allocs = self.num_ooms = 0
        self.last_oom = False

    def _malloc(self, size: int, stream: int, force: bool) -> int:
        self.last_oom = False
        if size <= 0:
            return 0
        if self.capacity_bytes is not None and self.allocated_bytes + size > self.capacity_bytes:
            self.num_ooms += 1
            self.last_oom = True
            if self.listener is not None:
                self.listener("oom", 0, size, stream)
            if not force:
                return -1
        addr = self._next
        self._next += 1
        self._sizes[addr] = size
        self.num_allocs += 1
        total = self.allocated_bytes + size
        self.allocated_bytes = self.requested_bytes = self.reserved_bytes = total
        if total > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.peak_requested_bytes = self.peak_reserved_bytes = total
        return addr

    def free(self, addr: int) -> bool:
        """Release the handle's bytes at once."""
        if addr == 0:
            return True
        size = self._sizes.pop(addr, None)
        if size is None:
            raise ValueError(f"free of an address that is not allocated: {addr:#x}")
        total = self.allocated_bytes - size
        self.allocated_bytes = self.requested_bytes = self.reserved_bytes = total
        return True

    def record_stream(self, addr: int, stream: int) -> None:
        """Accepted for interface parity; the ideal allocator never delays a free."""
        if addr not in self._sizes:
            raise ValueError(f"record_stream on an address that is not allocated: {addr:#x}")

    def complete_stream_events(self, stream: int) -> None:
        """Nothing waits on streams here."""

    def empty_cache(self) -> None:
        """Nothing is cached."""

    def block_size(self, addr: int) -> int:
        return self._sizes[addr]

    def stats(self) -> AllocatorStats:
        return AllocatorStats(
            allocated_bytes=self.allocated_bytes, requested_bytes=self.requested_bytes,
            reserved_bytes=self.reserved_bytes, active_bytes=self.allocated_bytes,
            peak_allocated_bytes=self.peak_allocated_bytes, peak_requested_bytes=self.peak_requested_bytes,
            peak_reserved_bytes=self.peak_reserved_bytes, num_allocs=self.num_allocs, num_segments=0,
            num_device_alloc=0, num_device_free=0, num_alloc_retries=0, num_ooms=self.num_ooms,
        )
