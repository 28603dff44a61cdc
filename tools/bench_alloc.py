"""Allocator operations per second on a synthetic training-like workload.

Each "micro-batch" allocates layer activations (kept until the backward) and short-lived
temporaries in the forward, then frees the activations in reverse while allocating and freeing
gradient temporaries; a few large buffers stay resident. Sizes come from a fixed-seed RNG, so
runs are comparable. One operation = one malloc or one free.

    .venv/bin/python tools/bench_alloc.py [--ops 1000000]
"""

from __future__ import annotations

import argparse
import random
import time

from timeline.alloc import AllocatorConfig, CachingAllocator, IdealAllocator

MIB = 1 << 20


def workload(num_ops: int, seed: int = 0) -> list[tuple[int, int]]:
    """(size, slot) pairs: size > 0 allocates into slot, size == 0 frees slot."""
    rng = random.Random(seed)
    shapes = [rng.choice([512 * 1024, 2 * MIB, 8 * MIB, 24 * MIB, 64 * MIB]) + rng.randrange(0, 4096) * 512
              for _ in range(64)]
    ops: list[tuple[int, int]] = []
    slot = 0
    while len(ops) < num_ops:
        saved = []
        for layer in range(32):  # forward
            for _ in range(3):
                size = shapes[(layer * 3 + len(saved)) % len(shapes)]
                ops.append((size, slot))
                saved.append(slot)
                slot += 1
            tmp = slot
            slot += 1
            ops.append((rng.randrange(1, 4 * MIB), tmp))
            ops.append((0, tmp))
        for s in reversed(saved):  # backward
            tmp = slot
            slot += 1
            ops.append((rng.randrange(512, 16 * MIB), tmp))
            ops.append((0, s))
            ops.append((0, tmp))
    return ops[:num_ops]


def run(allocator, ops: list[tuple[int, int]]) -> float:
    live: dict[int, int] = {}
    malloc, free = allocator.malloc, allocator.free
    start = time.perf_counter()
    for size, slot in ops:
        if size:
            live[slot] = malloc(size)
        else:
            addr = live.pop(slot, None)
            if addr is not None:
                free(addr)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    args = parser.parse_args()
    ops = workload(args.ops)
    cases = {
        "caching (defaults)": CachingAllocator(),
        "caching (expandable_segments)": CachingAllocator(AllocatorConfig(expandable_segments=True)),
        "caching (max_split_size_mb=64, roundup 4)": CachingAllocator(
            AllocatorConfig.from_options(max_split_size_mb=64, roundup_power2_divisions=4)),
        "ideal": IdealAllocator(),
    }
    for name, allocator in cases.items():
        seconds = run(allocator, ops)
        print(f"{name:44s} {len(ops) / seconds / 1e6:6.2f} M ops/s  ({len(ops)} ops in {seconds:.2f} s, "
              f"peak reserved {allocator.peak_reserved_bytes / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
