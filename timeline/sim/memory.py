"""The allocator pass: run each device's time-ordered events through its allocator model.

Every device gets its own allocator (``[allocator] kind``: ``caching`` reproduces PyTorch's
caching allocator, ``ideal`` packs perfectly). Allocations happen on the compute stream, as
DESIGN §7 places them (collective buffers are freed when their communication ends, which the
templates already express). An out-of-memory request is recorded with its time, size and the
allocator's state, then served beyond capacity so the run continues and shows by how much the
device overflows.
"""

from __future__ import annotations

import numpy as np

from timeline.alloc import AllocatorConfig, create_allocator
from timeline.sim.simulate import DeviceEvents
from timeline.spec.run import RunSpec


def allocator_config(run: RunSpec) -> AllocatorConfig:
    al = run.allocator
    rpd = al.roundup_power2_divisions
    return AllocatorConfig.from_options(
        max_split_size_mb=al.max_split_size_mb or None,
        max_non_split_rounding_mb=al.max_non_split_rounding_mb,
        expandable_segments=al.expandable_segments,
        roundup_power2_divisions=dict(rpd) if isinstance(rpd, tuple) else rpd,
    )


def run_allocator(run: RunSpec, ev: DeviceEvents, names: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                               list[dict]]:
    """(signed block bytes, reserved after, address) per event, and the OOM records."""
    alloc = create_allocator(run.allocator.kind, allocator_config(run),
                             capacity_bytes=run.hardware.capacity_bytes)
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
        key = (tensor[i], mb[i], stage[i])
        if sign[i] > 0:
            addr = malloc(size[i])
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
    return block, reserved, address, ooms
