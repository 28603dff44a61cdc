"""The allocator pass: run each device's time-ordered events through its allocator model.

Every device gets its own allocator (``[allocator] kind``: ``caching`` reproduces PyTorch's
caching allocator, ``ideal`` packs perfectly). Allocations happen on the compute stream, as
DESIGN §7 places them — but for a CUDA graph capture's, in its private pool, and those of TE's warm-up
side stream (:mod:`timeline.sim.graph_capture`), and Megatron-FSDP's all-gather buckets on their own stream
(:mod:`timeline.sim.fsdp_windows`), each from that stream's pool (``DeviceEvents.stream``; collective buffers are
freed when their communication ends, which the templates already express). An out-of-memory request is recorded
with its time, size and the allocator's state, then served beyond capacity so the run continues and shows by how
much the device overflows.

The plain caching allocator (no expandable segments) replays a device's whole event log, all on stream 0, in one
call (:func:`timeline.alloc.batch.replay`, the compiled core when built); every other setting,
and any stream the batch form cannot express — events on another stream or a CUDA graph's private
pool (``DeviceEvents.stream``) — goes event by event through the model (:func:`run_allocator_events`,
the reference the tests compare the batch pass against).

A 0-byte request (an EP rank routed no tokens: ``routing_skew = 2`` leaves the lightest rank
none) reaches no allocator: PyTorch's ``NativeCachingAllocator::allocate`` calls ``malloc``
only when ``size != 0`` and hands out a null pointer otherwise, whose free does nothing
(c10/cuda/CUDACachingAllocator.cpp); its event holds no block (address 0, no segment).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np

from timeline.alloc import AllocatorConfig, create_allocator
from timeline.alloc import batch as _batch
from timeline.alloc.caching import AddressSpaceError
from timeline.errors import UserError
from timeline.sim.graph_capture import GRAPH_POOL
from timeline.sim.optimizer_step import EMPTY_CACHE
from timeline.sim.output import DeviceEvents
from timeline.spec.run import AllocatorSpec

#: streams standing for private pools: the CUDA graphs' (:mod:`timeline.sim.graph_capture`)
PRIVATE_POOLS = frozenset({GRAPH_POOL})


def allocator_config(spec: AllocatorSpec) -> AllocatorConfig:
    return AllocatorConfig.from_spec(spec)


@dataclass(slots=True)
class AllocatorPass:
    """What one device's allocator did: per-event columns, OOMs, segment events, end state."""

    block: np.ndarray  # int64 signed bytes of the block each event hands out or returns
    reserved: np.ndarray  # int64 reserved bytes after each event
    address: np.ndarray  # int64 block address
    segment: np.ndarray  # int64 address of the segment holding the block (−1 under ideal)
    ooms: list[dict]
    #: (event index, action, address, size, stream, reserved bytes then): segment_alloc /
    #: segment_free / segment_map / segment_unmap / oom, in order, each tagged with the malloc or
    #: free that caused it
    segment_events: list[tuple[int, str, int, int, int, int]]
    end_segments: list  # the allocator's SegmentView list after the last event
    #: for each free, the index of the alloc it frees (−1 for allocs); None if not computed
    pair: np.ndarray | None = None


def run_allocator(spec: AllocatorSpec, capacity_bytes: int, ev: DeviceEvents, names: list[str],
                  core: str | None = None) -> AllocatorPass:
    """Run one device's events through its allocator model, ``spec`` (``[allocator]``) on a device
    of ``capacity_bytes`` (``core``: ``compiled`` | ``python``,
    default :func:`timeline.alloc.batch.active_core`). A run that would reserve past the modelled
    48-bit address space is a UserError: no device holds it, whatever the allocator does."""
    try:
        return _run_allocator(spec, capacity_bytes, ev, names, core)
    except AddressSpaceError:
        raise UserError("this run would reserve more than the 256 TiB a device can address on one device; "
                        "it is far beyond any GPU — shard the model (parallel.pp, tp, ep) or shrink it") from None


def _empties(ev: DeviceEvents, names: list[str]) -> np.ndarray:
    """Mask of the events that empty the allocator's cache (``--empty-unused-memory-level``'s markers,
    :data:`timeline.sim.optimizer_step.EMPTY_CACHE`: their 0-byte allocation)."""
    try:
        marker = names.index(EMPTY_CACHE)
    except ValueError:
        return np.zeros(len(ev.t_us), dtype=bool)
    return (ev.tensor == marker) & (ev.sign > 0)


def _run_allocator(spec: AllocatorSpec, capacity_bytes: int, ev: DeviceEvents, names: list[str],
                   core: str | None) -> AllocatorPass:
    if spec.kind == "caching" and not spec.expandable_segments and not ev.stream.any() \
            and not _empties(ev, names).any():  # the batch cores have no empty_cache: the reference runs it
        pair = pair_index(ev)
        if pair is not None:
            n = len(ev.t_us)
            zero = not ev.size.all()
            kept = np.flatnonzero(ev.size > 0) if zero else np.arange(n)  # 0 bytes: no allocator (module docstring)
            m = len(kept)
            block, reserved, address, segment = (np.zeros(m, dtype=np.int64) for _ in range(4))
            sizes, pairs = np.ascontiguousarray(ev.size), pair
            if zero:
                at = np.full(n, -1, dtype=np.int64)
                at[kept] = np.arange(m)
                sub = pair[kept]
                sizes, pairs = np.ascontiguousarray(ev.size[kept]), np.where(sub >= 0, at[np.maximum(sub, 0)], -1)
            res = _batch.replay(AllocatorConfig.from_spec(spec), capacity_bytes, sizes, pairs, block, reserved,
                                address, segment, core=core)
            if res is not None:
                if zero:  # back to every event: 0-byte ones hold no block and change nothing
                    before = np.searchsorted(kept, np.arange(n), side="right") - 1
                    reserved = np.where(before >= 0, reserved[np.maximum(before, 0)], 0)
                    block, address, segment = (_scatter(kept, n, col, fill) for col, fill in
                                               ((block, 0), (address, 0), (segment, -1)))
                    res.ooms = [(int(kept[i]), a, r) for i, a, r in res.ooms]
                    res.segment_events = [(int(kept[i]), act, a, sz, st, r) for i, act, a, sz, st, r in res.segment_events]
                ooms = _ooms(capacity_bytes, ev, names, res.ooms)
                # kept for Timeline.free_index; int32 halves what the 128-device runs hold
                return AllocatorPass(block, reserved, address, segment, ooms, res.segment_events, res.end_segments,
                                     pair.astype(np.int32) if n < 2**31 else pair)
    return run_allocator_events(spec, capacity_bytes, ev, names)


def _scatter(kept: np.ndarray, n: int, col: np.ndarray, fill: int) -> np.ndarray:
    out = np.full(n, fill, dtype=np.int64)
    out[kept] = col
    return out


def _ooms(capacity_bytes: int, ev: DeviceEvents, names: list[str], ooms: list[tuple[int, int, int]]) -> list[dict]:
    """The OOM record of each (event, allocated bytes before it, reserved after) of ``ooms`` (the
    allocator core's), the event columns read once."""
    if not ooms:
        return []
    at = np.fromiter((i for i, _, _ in ooms), dtype=np.int64, count=len(ooms))
    t_us, size, tensor = ev.t_us[at].tolist(), ev.size[at].tolist(), ev.tensor[at].tolist()
    mb, stage = ev.microbatch[at].tolist(), ev.stage[at].tolist()
    return [{"t_us": float(t_us[k]), "request_bytes": int(size[k]), "tensor": names[tensor[k]],
             "microbatch": int(mb[k]), "stage": int(stage[k]), "allocated_bytes": int(allocated),
             "reserved_bytes": int(reserved), "capacity_bytes": capacity_bytes}
            for k, (_, allocated, reserved) in enumerate(ooms)]


def pair_index(ev: DeviceEvents) -> np.ndarray | None:
    """For each free, the index of the alloc it frees (−1 for allocs): the last earlier event of
    the same (tensor, micro-batch, stage). ``None`` unless allocs and frees of every key
    alternate, starting with an alloc (what keying a live dict by it needs)."""
    n = len(ev.t_us)
    order, key = _key_order(ev)
    sign = ev.sign[order]
    same = np.zeros(n, dtype=bool)  # same key as the previous event in key order
    if n > 1 and key is not None:
        same[1:] = key[1:] == key[:-1]
    elif n > 1:
        tensor, mb, stage = ev.tensor[order], ev.microbatch[order], ev.stage[order]
        same[1:] = (tensor[1:] == tensor[:-1]) & (mb[1:] == mb[:-1]) & (stage[1:] == stage[:-1])
    alternate = np.where(same, sign != np.roll(sign, 1), sign > 0)
    if not alternate.all():
        return None
    pair = np.full(n, -1, dtype=np.int64)
    frees = np.flatnonzero(sign < 0)
    pair[order[frees]] = order[frees - 1]
    return pair


def _key_order(ev: DeviceEvents) -> tuple[np.ndarray, np.ndarray | None]:
    """Event indices sorted by (tensor, micro-batch, stage), stable (index order within a key), and
    the keys in that order: one int64 key sorted once where the three fit in it (None where they do
    not, and a lexicographic sort)."""
    n = len(ev.t_us)
    if not n:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    mb, st, tensor = ev.microbatch.astype(np.int64), ev.stage.astype(np.int64), ev.tensor.astype(np.int64)
    mb_lo, st_lo, t_lo = int(mb.min()), int(st.min()), int(tensor.min())
    n_mb, n_st = int(mb.max()) - mb_lo + 1, int(st.max()) - st_lo + 1
    if (int(tensor.max()) - t_lo + 1) * n_mb * n_st >= 2**62:
        return np.lexsort((np.arange(n), ev.stage, ev.microbatch, ev.tensor)), None
    key = ((tensor - t_lo) * n_mb + (mb - mb_lo)) * n_st + (st - st_lo)
    bits = n.bit_length()
    if int(key.max()) < 2 ** (62 - bits):
        # the event index in the low bits makes every key distinct: a plain sort of them is the stable
        # argsort (several times faster than it on a device's million events)
        both = np.sort((key << bits) | np.arange(n, dtype=np.int64))
        return both & ((1 << bits) - 1), both >> bits
    order = np.argsort(key, kind="stable")
    return order, key[order]


def run_allocator_events(spec: AllocatorSpec, capacity_bytes: int, ev: DeviceEvents, names: list[str]) -> AllocatorPass:
    """Run one device's events through its allocator model one call per event (the reference)."""
    segment_events: list[tuple[int, str, int, int, int, int]] = []
    current = [0]

    def listener(action: str, addr: int, size: int, stream: int) -> None:
        segment_events.append((current[0], action, addr, size, stream, alloc.reserved_bytes))

    alloc = create_allocator(spec.kind, AllocatorConfig.from_spec(spec), capacity_bytes=capacity_bytes,
                             listener=listener, private_streams=PRIVATE_POOLS)
    n = len(ev.t_us)
    block = np.zeros(n, dtype=np.int64)
    reserved = np.zeros(n, dtype=np.int64)
    address = np.zeros(n, dtype=np.int64)
    live: dict[tuple[int, int, int], int] = {}
    ooms: list[dict] = []
    sign, size, tensor, mb, stage, stream = (ev.sign.tolist(), ev.size.tolist(), ev.tensor.tolist(),
                                             ev.microbatch.tolist(), ev.stage.tolist(), ev.stream.tolist())
    malloc, free, block_size = alloc.malloc, alloc.free, alloc.block_size
    empties = set(np.flatnonzero(_empties(ev, names)).tolist())
    for i in range(n):
        current[0] = i
        if not size[i]:  # no block, nothing freed
            if i in empties:  # torch.cuda.empty_cache(): every cached segment without a live block is released
                alloc.empty_cache()
            reserved[i] = alloc.reserved_bytes
            continue
        key = (tensor[i], mb[i], stage[i])
        if sign[i] > 0:
            addr = malloc(size[i], stream[i])
            if alloc.last_oom:
                ooms.append({"t_us": float(ev.t_us[i]), "request_bytes": size[i],
                             "tensor": names[tensor[i]], "microbatch": mb[i], "stage": stage[i],
                             "allocated_bytes": int(alloc.allocated_bytes - block_size(addr)),
                             "reserved_bytes": int(alloc.reserved_bytes),
                             "capacity_bytes": capacity_bytes})
            live[key] = addr
            block[i] = block_size(addr)
        else:
            addr = live.pop(key)
            block[i] = -block_size(addr)
            free(addr)
        address[i] = addr
        reserved[i] = alloc.reserved_bytes
    plain = spec.kind == "caching" and not spec.expandable_segments
    segment = _segment_of(address, ev.sign, segment_events) if plain else np.full(n, -1, dtype=np.int64)
    return AllocatorPass(block, reserved, address, segment, ooms, segment_events,
                         alloc.segments() if hasattr(alloc, "segments") else [])


def _segment_of(address: np.ndarray, sign: np.ndarray,
                segment_events: list[tuple[int, str, int, int, int, int]]) -> np.ndarray:
    """Start address of the segment holding each event's block: the live segment (from the
    segment_alloc / segment_free events up to that event) whose range contains the address."""
    out = np.full(len(address), -1, dtype=np.int64)
    starts: list[int] = []
    size_of: dict[int, int] = {}
    k, m = 0, len(segment_events)
    addr = address.tolist()
    for i in range(len(addr)):
        while k < m and segment_events[k][0] <= i:
            _, action, a, size, _, _ = segment_events[k]
            if action == "segment_alloc":
                insort(starts, a)
                size_of[a] = size
            elif action == "segment_free":
                starts.pop(bisect_left(starts, a))
                del size_of[a]
            k += 1
        j = bisect_right(starts, addr[i]) - 1
        if j >= 0 and addr[i] < starts[j] + size_of[starts[j]]:
            out[i] = starts[j]
    return out
