"""The allocator pass: run each device's time-ordered events through its allocator model.

Every device gets its own allocator (``[allocator] kind``: ``caching`` reproduces PyTorch's
caching allocator, ``ideal`` packs perfectly). Allocations happen on the compute stream, as
DESIGN §7 places them (collective buffers are freed when their communication ends, which the
templates already express). An out-of-memory request is recorded with its time, size and the
allocator's state, then served beyond capacity so the run continues and shows by how much the
device overflows.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass

import numpy as np

from timeline.alloc import AllocatorConfig, create_allocator
from timeline.alloc.caching import AddressSpaceError
from timeline.errors import UserError
from timeline.sim.simulate import DeviceEvents
from timeline.spec.run import RunSpec


def allocator_config(run: RunSpec) -> AllocatorConfig:
    return AllocatorConfig.from_spec(run.allocator)


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


def run_allocator(run: RunSpec, ev: DeviceEvents, names: list[str]) -> AllocatorPass:
    """Run one device's events through its allocator model."""
    segment_events: list[tuple[int, str, int, int, int, int]] = []
    current = [0]

    def listener(action: str, addr: int, size: int, stream: int) -> None:
        segment_events.append((current[0], action, addr, size, stream, alloc.reserved_bytes))

    alloc = create_allocator(run.allocator.kind, allocator_config(run),
                             capacity_bytes=run.hardware.capacity_bytes, listener=listener)
    n = len(ev.t_us)
    block = np.zeros(n, dtype=np.int64)
    reserved = np.zeros(n, dtype=np.int64)
    address = np.zeros(n, dtype=np.int64)
    live: dict[tuple[int, int, int], int] = {}
    ooms: list[dict] = []
    sign, size, tensor, mb, stage = (ev.sign.tolist(), ev.size.tolist(), ev.tensor.tolist(),
                                     ev.microbatch.tolist(), ev.stage.tolist())
    malloc, free, block_size = alloc.malloc, alloc.free, alloc.block_size
    for i in range(n):
        current[0] = i
        key = (tensor[i], mb[i], stage[i])
        if sign[i] > 0:
            try:
                addr = malloc(size[i])
            except AddressSpaceError:
                raise UserError(f"{names[tensor[i]]}: this device would reserve more than the 256 TiB a "
                                f"device can address ({alloc.reserved_bytes / 2**40:,.1f} TiB already); the run "
                                "is far beyond any device — shard the model (parallel.pp, tp, ep) or shrink it"
                                ) from None
            if alloc.last_oom:
                ooms.append({"t_us": float(ev.t_us[i]), "request_bytes": size[i],
                             "tensor": names[tensor[i]], "microbatch": mb[i], "stage": stage[i],
                             "allocated_bytes": int(alloc.allocated_bytes - block_size(addr)),
                             "reserved_bytes": int(alloc.reserved_bytes),
                             "capacity_bytes": run.hardware.capacity_bytes})
            live[key] = addr
            block[i] = block_size(addr)
        else:
            addr = live.pop(key)
            block[i] = -block_size(addr)
            free(addr)
        address[i] = addr
        reserved[i] = alloc.reserved_bytes
    plain = run.allocator.kind == "caching" and not run.allocator.expandable_segments
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
