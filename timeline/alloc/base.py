"""What every allocator model shares: the two public ways to ask for memory.

A model implements ``_malloc(size, stream, force)`` returning an address, or ``-1`` when the
request does not fit and ``force`` is false; with ``force`` it records the out-of-memory and
serves the request beyond capacity, so a simulation can go on.
"""

from __future__ import annotations


class AllocatorBase:
    __slots__ = ()

    def _malloc(self, size: int, stream: int, force: bool) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate ``size`` bytes on ``stream``; on OOM record it and allocate beyond capacity."""
        return self._malloc(size, stream, True)

    def try_malloc(self, size: int, stream: int = 0) -> int | None:
        """Like :meth:`malloc`, but an OOM (recorded the same way) returns ``None``."""
        addr = self._malloc(size, stream, False)
        return None if addr < 0 else addr
