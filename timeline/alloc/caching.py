"""A faithful model of PyTorch's CUDA caching allocator (v2.6) for one device.

Implements the request path of ``DeviceCachingAllocator::malloc``/``free``
(``../shared/reference/allocator.md`` §2-§7): 512-byte and power-of-two rounding, small and
large pools, 2 / 20 MiB / rounded segments, best fit on (stream, size, address) with the
single-candidate rule and the ``max_split_size`` filters, splitting and merging,
``release_available_cached_blocks``, free-all-cached-and-retry, per-stream caches,
``record_stream`` delayed frees and ``empty_cache``. Expandable segments live in
:mod:`timeline.alloc.expandable`.

Out-of-memory: a request that cannot be served even after the retry increments ``num_ooms``,
emits an ``oom`` event and then — in :meth:`CachingAllocator.malloc` — is allocated *virtually*
beyond the capacity, so a simulator records the OOM and keeps going and the user sees by how
much the device overflows; :meth:`CachingAllocator.try_malloc` returns ``None`` instead.
Nothing here raises on OOM, does I/O, or models CUDA graphs, memory fractions or the GC.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable

from timeline.alloc import expandable as _exp
from timeline.alloc.base import AllocatorBase
from timeline.alloc.blocks import ADDRESS_BITS, ADDRESS_MASK, Block, ExpandableSegment, Pool
from timeline.alloc.config import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    AllocatorConfig,
    allocation_size,
    round_size,
)
from timeline.alloc.views import AllocatorStats, SegmentView, segment_views

#: ``listener(action, address, size, stream)``; action is one of segment_alloc, segment_free,
#: segment_map, segment_unmap, oom (address 0, size = rounded request).
Listener = Callable[[str, int, int, int], None]
#: ``segment_address(size, stream, is_small, expandable) -> address`` of a new segment.
AddressSource = Callable[[int, int, bool, bool], int]

_SEGMENT_ALIGN = 2 << 20
_FIRST_ADDRESS = 1 << 36



class AddressSpaceError(ValueError):
    """A segment would lie outside the modelled 48-bit device address space: the run holds more
    than any device could map (simulated past an OOM), not a bug of the model."""

class CachingAllocator(AllocatorBase):
    """PyTorch's caching allocator for one device; addresses are plain ints (0 = null)."""

    def __init__(
        self,
        config: AllocatorConfig | None = None,
        *,
        capacity_bytes: int | None = None,
        listener: Listener | None = None,
        segment_address: AddressSource | None = None,
        expandable_reserve_bytes: int | None = None,
        private_streams: frozenset[int] = frozenset(),
    ) -> None:
        self.config = config or AllocatorConfig()
        #: streams standing for private pools (a CUDA graph's ``graph_pool_handle``): their cached blocks stay
        #: for the graphs' life, never released by ``release_cached_blocks`` / ``empty_cache``
        #: (``CUDACachingAllocator.cpp: release_cached_blocks`` frees a private pool only once unused)
        self.private_streams = private_streams
        self.capacity_bytes = capacity_bytes
        self.listener = listener
        self.segment_address = segment_address
        # PyTorch reserves 1.125 x totalGlobalMem of virtual space per expandable segment
        self.expandable_reserve_bytes = expandable_reserve_bytes or (capacity_bytes or 80 << 30) * 9 // 8
        self._plain_rounding = not any(d > 1 for d in self.config.roundup_power2_divisions)
        self._mss = self.config.max_split_size_bytes
        self._small = Pool(True)
        self._large = Pool(False)
        self._blocks: dict[int, Block] = {}  # every block (allocated, cached, pending, unmapped)
        self._segments: dict[int, int] = {}  # non-expandable segment start -> size
        self._expandable: list[ExpandableSegment] = []
        self._events: dict[int, deque[tuple[int, Block]]] = {}
        self._event_seq: dict[int, int] = {}
        self._event_done: dict[int, int] = {}
        self._num_pending = 0
        self._next_address = _FIRST_ADDRESS
        self.allocated_bytes = self.requested_bytes = self.reserved_bytes = 0
        self.pending_free_bytes = 0
        self.peak_allocated_bytes = self.peak_requested_bytes = self.peak_reserved_bytes = 0
        self.num_allocs = self.num_device_alloc = self.num_device_free = 0
        self.num_alloc_retries = self.num_ooms = 0
        self.last_oom = False

    # -- public API -------------------------------------------------------------------------------

    def free(self, addr: int) -> bool:
        """Free the block at ``addr``; False when it awaits stream events (``record_stream``)."""
        if addr == 0:
            return True
        block = self._blocks.get(addr)
        if block is None or not block.allocated:
            raise ValueError(f"free of an address that is not allocated: {addr:#x}")
        block.allocated = False
        self.allocated_bytes -= block.size
        self.requested_bytes -= block.requested
        uses = block.stream_uses
        if uses:
            block.stream_uses = None
            for s in sorted(uses):
                seq = self._event_seq[s] = self._event_seq.get(s, 0) + 1
                self._events.setdefault(s, deque()).append((seq, block))
                block.event_count += 1
            self._num_pending += 1
            self.pending_free_bytes += block.size
            return False
        self._free_block(block)
        return True

    def record_stream(self, addr: int, stream: int) -> None:
        """``Tensor.record_stream``: the block's free waits for ``stream``'s work enqueued so far."""
        block = self._blocks.get(addr)
        if block is None or not block.allocated:
            raise ValueError(f"record_stream on an address that is not allocated: {addr:#x}")
        if stream != block.stream:
            if block.stream_uses is None:
                block.stream_uses = set()
            block.stream_uses.add(stream)

    def complete_stream_events(self, stream: int) -> None:
        """Every event recorded on ``stream`` so far has completed; the frees waiting on them
        happen at the start of the next :meth:`malloc` (``process_events``) or in :meth:`empty_cache`."""
        self._event_done[stream] = self._event_seq.get(stream, 0)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: sync all events, release every unsplit cached segment and
        unmap every free page of expandable segments."""
        self._release_cached_blocks()

    def block_size(self, addr: int) -> int:
        """Rounded size of the allocated block at ``addr`` (what ``allocated_bytes`` counts)."""
        return self._blocks[addr].size

    def stats(self) -> AllocatorStats:
        return AllocatorStats(
            allocated_bytes=self.allocated_bytes,
            requested_bytes=self.requested_bytes,
            reserved_bytes=self.reserved_bytes,
            active_bytes=self.allocated_bytes + self.pending_free_bytes,
            peak_allocated_bytes=self.peak_allocated_bytes,
            peak_requested_bytes=self.peak_requested_bytes,
            peak_reserved_bytes=self.peak_reserved_bytes,
            num_allocs=self.num_allocs,
            num_segments=len(self.segments()),
            num_device_alloc=self.num_device_alloc,
            num_device_free=self.num_device_free,
            num_alloc_retries=self.num_alloc_retries,
            num_ooms=self.num_ooms,
        )

    # -- request path -------------------------------------------------------------------------------

    def _malloc(self, size: int, stream: int, force: bool) -> int:
        self.last_oom = False
        if size <= 0:
            return 0
        if self._num_pending:
            self._process_events()
        if size < K_MIN_BLOCK_SIZE:
            rsize = K_MIN_BLOCK_SIZE
        elif self._plain_rounding:
            rsize = -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
        else:
            rsize = round_size(size, self.config)
        pool = self._small if rsize <= K_SMALL_SIZE else self._large
        block = self._get_free_block(pool, stream, rsize)
        if block is None:
            block = self._alloc_block(pool, stream, rsize, False, False)
            if block is None and self.config.has_max_split and self._release_available_cached_blocks(
                    pool, stream, rsize):
                block = self._alloc_block(pool, stream, rsize, False, False)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(pool, stream, rsize, True, False)
            if block is None:
                self.num_ooms += 1
                self.last_oom = True
                if self.listener is not None:
                    self.listener("oom", 0, rsize, stream)
                if not force:
                    return -1
                block = self._alloc_block(pool, stream, rsize, False, True)
                assert block is not None
        return self._alloc_found_block(block, pool, rsize, size)

    def _get_free_block(self, pool: Pool, stream: int, rsize: int) -> Block | None:
        lst = pool.free.get(stream)
        if not lst:
            return None
        i = bisect_left(lst, rsize << ADDRESS_BITS)
        if i == len(lst):
            return None
        block = self._blocks[lst[i] & ADDRESS_MASK]
        if block.es is not None:
            if self.config.expandable_segments:
                i = _exp.best_expandable_candidate(self._blocks, lst, i)
            else:  # expandable blocks left over from an earlier setting are skipped
                i += 1
                while i < len(lst) and self._blocks[lst[i] & ADDRESS_MASK].es is not None:
                    i += 1
                if i == len(lst):
                    return None
            block = self._blocks[lst[i] & ADDRESS_MASK]
        mss = self._mss
        if rsize < mss:
            if block.size >= mss:
                return None
        elif block.size >= rsize + self.config.max_non_split_rounding_bytes:
            return None
        del lst[i]
        return block

    def _alloc_found_block(self, block: Block, pool: Pool, rsize: int, orig: int) -> int:
        remaining = block.size - rsize
        if pool.is_small or self.config.expandable_segments:
            split = remaining >= K_MIN_BLOCK_SIZE
        else:
            split = rsize < self._mss and remaining > K_SMALL_SIZE
        if split:
            rest = Block(block.addr + rsize, remaining, block.stream, pool, block.es)
            nxt = block.next
            rest.prev = block
            rest.next = nxt
            if nxt is not None:
                nxt.prev = rest
            block.next = rest
            block.size = rsize
            self._blocks[rest.addr] = rest
            pool.insert(rest)
        block.allocated = True
        block.requested = orig
        self.num_allocs += 1
        self.allocated_bytes += block.size
        if self.allocated_bytes > self.peak_allocated_bytes:
            self.peak_allocated_bytes = self.allocated_bytes
        self.requested_bytes += orig
        if self.requested_bytes > self.peak_requested_bytes:
            self.peak_requested_bytes = self.requested_bytes
        return block.addr

    def _alloc_block(self, pool: Pool, stream: int, rsize: int, retry: bool, ignore_capacity: bool) -> Block | None:
        """``alloc_block``: one new segment (``cudaMalloc``) or, expandable, newly mapped pages."""
        if retry:
            self.num_alloc_retries += 1
        if self.config.expandable_segments:
            return _exp.try_allocate_expandable_block(self, pool, stream, rsize, ignore_capacity)
        size = allocation_size(rsize)
        if not ignore_capacity and not self.fits(size):
            return None
        addr = self.new_segment_address(size, stream, pool.is_small, False)
        block = Block(addr, size, stream, pool)
        self._blocks[addr] = block
        self._segments[addr] = size
        self.num_device_alloc += 1
        self.add_reserved(size)
        if self.listener is not None:
            self.listener("segment_alloc", addr, size, stream)
        return block

    # -- free path ------------------------------------------------------------------------------------

    def _free_block(self, block: Block) -> None:
        """``free_block``: merge with cached neighbours and return to the pool."""
        prev = block.prev
        if prev is not None and not prev.allocated and prev.event_count == 0 and prev.mapped == block.mapped:
            self.merge(block, prev)
        nxt = block.next
        if nxt is not None and not nxt.allocated and nxt.event_count == 0 and nxt.mapped == block.mapped:
            self.merge(block, nxt)
        block.pool.insert(block)

    def merge(self, dst: Block, src: Block) -> None:
        """``try_merge_blocks`` after its checks: ``dst`` (in no list) absorbs neighbour ``src``."""
        src.pool.remove(src)
        del self._blocks[src.addr]
        if dst.prev is src:
            blocks = self._blocks
            del blocks[dst.addr]
            dst.addr = src.addr
            blocks[dst.addr] = dst
            dst.prev = src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size

    def _process_events(self) -> None:
        for stream, queue in self._events.items():
            done = self._event_done.get(stream, 0)
            while queue and queue[0][0] <= done:
                block = queue.popleft()[1]
                block.event_count -= 1
                if block.event_count == 0:
                    self._num_pending -= 1
                    self.pending_free_bytes -= block.size
                    self._free_block(block)

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks``: sync events, then release large pool, then small pool."""
        for stream in self._events:
            self.complete_stream_events(stream)
        if self._num_pending:
            self._process_events()
        for pool in (self._large, self._small):
            to_unmap: list[Block] = []
            for stream in sorted(pool.free):
                if stream in self.private_streams:
                    continue
                for key in list(pool.free[stream]):
                    block = self._blocks[key & ADDRESS_MASK]
                    if block.es is not None:
                        to_unmap.append(block)
                    elif block.prev is None and block.next is None:
                        self._release_block(block)
            for block in to_unmap:
                _exp.unmap_block(self, block)
                if block.prev is None and block.next is None and not block.mapped:
                    _exp.release_expandable_segment(self, block)

    def _release_available_cached_blocks(self, pool: Pool, stream: int, rsize: int) -> bool:
        """Free one oversize cached segment ≥ the request, else oversize ones largest first."""
        mss = self._mss
        need = max(rsize, mss)
        lst = pool.free.get(stream) or []
        i = bisect_left(lst, need << ADDRESS_BITS)
        if i < len(lst) and self._blocks[lst[i] & ADDRESS_MASK].es is None:
            self._release_block(self._blocks[lst[i] & ADDRESS_MASK])
            return True
        released = 0
        j = i - 1
        while released < need and j >= 0:
            block = self._blocks[lst[j] & ADDRESS_MASK]
            if block.size < mss:
                break
            if block.es is None and block.prev is None and block.next is None:
                released += block.size
                self._release_block(block)
            j -= 1
        return released >= need

    def _release_block(self, block: Block) -> None:
        """``release_block``: ``cudaFree`` a whole cached segment."""
        block.pool.remove(block)
        del self._blocks[block.addr]
        del self._segments[block.addr]
        self.reserved_bytes -= block.size
        self.num_device_free += 1
        if self.listener is not None:
            self.listener("segment_free", block.addr, block.size, block.stream)

    # -- helpers shared with expandable.py and restore.py ---------------------------------------------

    def fits(self, size: int) -> bool:
        return self.capacity_bytes is None or self.reserved_bytes + size <= self.capacity_bytes

    def add_reserved(self, size: int) -> None:
        self.reserved_bytes += size
        if self.reserved_bytes > self.peak_reserved_bytes:
            self.peak_reserved_bytes = self.reserved_bytes

    def new_segment_address(self, size: int, stream: int, is_small: bool, expandable: bool) -> int:
        if self.segment_address is not None:
            addr = self.segment_address(size, stream, is_small, expandable)
        else:
            addr = self._next_address
        if addr <= 0 or addr + size > ADDRESS_MASK:
            raise AddressSpaceError(f"segment address {addr:#x} (+{size}) outside the modelled 48-bit space")
        end = -(-(addr + size) // _SEGMENT_ALIGN) * _SEGMENT_ALIGN
        self._next_address = max(self._next_address, end + _SEGMENT_ALIGN)
        return addr

    # -- inspection ----------------------------------------------------------------------------------

    def segments(self) -> list[SegmentView]:
        """Segments in address order; an expandable segment lists each contiguous mapped range."""
        return segment_views(self)

    def check_invariants(self) -> None:
        """Assert the accounting identities; raises AssertionError on the first violation."""
        from timeline.alloc.invariants import check

        check(self)
