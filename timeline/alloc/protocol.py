"""The interface every allocator model offers the simulator, and a factory by kind name.

``caching`` is :class:`~timeline.alloc.caching.CachingAllocator`, ``ideal`` is
:class:`~timeline.alloc.ideal.IdealAllocator`. This module holds no allocation logic.
"""

from __future__ import annotations

from typing import Protocol

from timeline.alloc.caching import AllocatorStats, CachingAllocator, Listener
from timeline.alloc.config import AllocatorConfig
from timeline.alloc.ideal import IdealAllocator
from timeline.errors import UserError

KINDS = ("caching", "ideal")


class Allocator(Protocol):
    """What a simulator calls; addresses are ints, 0 is the null pointer of a 0-byte request."""

    allocated_bytes: int
    requested_bytes: int
    reserved_bytes: int
    last_oom: bool

    def malloc(self, size: int, stream: int = 0) -> int: ...
    def try_malloc(self, size: int, stream: int = 0) -> int | None: ...
    def free(self, addr: int) -> bool: ...
    def record_stream(self, addr: int, stream: int) -> None: ...
    def complete_stream_events(self, stream: int) -> None: ...
    def empty_cache(self) -> None: ...
    def block_size(self, addr: int) -> int: ...
    def stats(self) -> AllocatorStats: ...


def create_allocator(kind: str, config: AllocatorConfig | None = None, *, capacity_bytes: int | None = None,
                     listener: Listener | None = None, private_streams: frozenset[int] = frozenset()) -> Allocator:
    """An allocator model of ``kind`` (``caching`` | ``ideal``) for one device (``private_streams``: streams
    standing for private pools, :class:`~timeline.alloc.caching.CachingAllocator`)."""
    if kind == "caching":
        return CachingAllocator(config, capacity_bytes=capacity_bytes, listener=listener,
                                private_streams=private_streams)
    if kind == "ideal":
        return IdealAllocator(capacity_bytes=capacity_bytes, listener=listener)
    raise UserError(f"allocator kind {kind!r} is not one of {', '.join(KINDS)}")
