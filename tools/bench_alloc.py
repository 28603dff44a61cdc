"""Allocator operations per second on a synthetic training-like workload, and on the shipped run.

Each "micro-batch" allocates layer activations (kept until the backward) and short-lived
temporaries in the forward, then frees the activations in reverse while allocating and freeing
gradient temporaries; a few large buffers stay resident. Sizes come from a fixed-seed RNG, so
runs are comparable. One operation = one malloc or one free.

Two ways in: one Python call per operation (``malloc``/``free`` on the model), and the batch
replay the simulator's allocator pass uses (:func:`timeline.alloc.batch.replay`: the whole
stream in one call, on the compiled core and on the Python model, which must agree).
``--shipped`` also replays the event streams of the shipped DeepSeek-V3 run (16 devices) both
ways and checks they are identical.

    .venv/bin/python tools/bench_alloc.py [--ops 1000000] [--shipped]
"""

from __future__ import annotations

import argparse
import random
import time
from array import array
from pathlib import Path

from timeline.alloc import AllocatorConfig, CachingAllocator, IdealAllocator
from timeline.alloc.batch import compiled_available, replay

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


def batch_columns(ops: list[tuple[int, int]]) -> tuple[array, array]:
    """The workload as the batch replay's (size, pair) columns: a free names its alloc's index."""
    size, pair, at = array("q"), array("q"), {}
    for sz, slot in ops:
        if sz:
            at[slot] = len(size)
            size.append(sz)
            pair.append(-1)
        elif slot in at:
            size.append(0)
            pair.append(at.pop(slot))
    return size, pair


def run_batch(core: str, config: AllocatorConfig, size, pair, capacity: int | None = None) -> tuple[float, list]:
    cols = [array("q", bytes(8 * len(size))) for _ in range(4)]
    start = time.perf_counter()
    res = replay(config, capacity, size, pair, *cols, core=core)
    seconds = time.perf_counter() - start
    assert res is not None
    return seconds, [c.tobytes() for c in cols] + [res.segment_events, res.ooms, res.end_segments]


def batch_cases(ops: list[tuple[int, int]]) -> None:
    size, pair = batch_columns(ops)
    for name, config in (("defaults", AllocatorConfig()),
                         ("max_split_size_mb=64, roundup 4",
                          AllocatorConfig.from_options(max_split_size_mb=64, roundup_power2_divisions=4))):
        py_s, py_out = run_batch("python", config, size, pair)
        line = f"batch replay ({name}): python {len(size) / py_s / 1e6:6.2f} M ops/s"
        if compiled_available():
            c_s, c_out = run_batch("compiled", config, size, pair)
            assert c_out == py_out, "compiled core and Python model disagree"
            line += f", compiled {len(size) / c_s / 1e6:6.2f} M ops/s ({py_s / c_s:.0f}x, identical results)"
        print(line)


def shipped_case() -> None:
    import numpy as np

    from timeline.io.runfile import load_run
    from timeline.result.build import build_timeline
    from timeline.sim.memory import allocator_config, pair_index

    run = load_run(str(Path(__file__).resolve().parents[1] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"), [])
    sim = build_timeline(run).sim  # the simulator's events (its allocator pass is timed again below)
    config, cap = allocator_config(run.allocator), run.hardware.capacity_bytes
    total = {"python": 0.0, "compiled": 0.0}
    n = 0
    for ev in sim.events:
        size, pair = np.ascontiguousarray(ev.size), pair_index(ev)
        n += len(size)
        py_s, py_out = run_batch("python", config, size, pair, cap)
        total["python"] += py_s
        if compiled_available():
            c_s, c_out = run_batch("compiled", config, size, pair, cap)
            assert c_out == py_out, "compiled core and Python model disagree on the shipped run"
            total["compiled"] += c_s
    line = f"shipped run ({n:,} events, 16 devices): python {n / total['python'] / 1e6:6.2f} M ops/s"
    if compiled_available():
        line += (f", compiled {n / total['compiled'] / 1e6:6.2f} M ops/s "
                 f"({total['python'] / total['compiled']:.0f}x, identical results)")
    print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--shipped", action="store_true", help="also replay the shipped run's event streams")
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
    batch_cases(ops)
    if args.shipped:
        shipped_case()


if __name__ == "__main__":
    main()
