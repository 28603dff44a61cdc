"""Per-device metrics of one simulated variant, and simulating several variants side by side.

The metrics are Timeline queries (:mod:`timeline.result.metrics`: peaks, saved activations,
recomputation, iteration time, headroom to capacity and OOM per device), re-exported here; the
worst device's memory series is kept for plots. Variants run in at most two
worker processes (each simulation is CPU-bound and single-threaded), results in input order.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from timeline.compare.variants import Variant, recompute_name
from timeline.graph.source import SourceFn
from timeline.result.build import build_timeline
from timeline.result.metrics import DeviceMetrics, MemoryTrace, device_metrics, memory_trace
from timeline.result.queries import worst_device
from timeline.result.timeline import Timeline

__all__ = ["MAX_WORKERS", "DeviceMetrics", "MemoryTrace", "SourceFn", "VariantResult", "device_metrics",
           "evaluate", "memory_trace", "quiet_on_interrupt", "simulate_variants", "worker_pool"]

MAX_WORKERS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class VariantResult:
    name: str
    recompute: str
    devices: tuple[DeviceMetrics, ...]
    worst: MemoryTrace  # the device with the highest peak reserved

    @property
    def fits(self) -> bool:
        return all(d.fits for d in self.devices)

    def worst_device(self) -> DeviceMetrics:
        """The device short of the most memory, else the one with the least headroom (first on ties)."""
        return min(self.devices, key=lambda d: (-d.over_bytes, d.headroom_bytes))


def evaluate(variant: Variant, source_fn: SourceFn,
             on_timeline: Callable[[Timeline, Variant], None] | None = None) -> VariantResult:
    """Simulate one variant and reduce it to its metrics (picklable, for worker processes);
    ``on_timeline(tl, variant)`` (picklable too) sees the whole Timeline first, in the worker —
    e.g. to write the variant's own files without sending the Timeline back."""
    tl = build_timeline(variant.run, source_fn)
    if on_timeline is not None:
        on_timeline(tl, variant)
    devices = device_metrics(tl)
    return VariantResult(name=variant.name, recompute=recompute_name(variant.run.recompute),
                         devices=tuple(devices), worst=memory_trace(tl, worst_device(tl), variant.name))


def quiet_on_interrupt() -> None:
    """Worker-process initializer: on Ctrl-C (which the whole process group receives) a worker
    exits at once and silently; the parent reports the interrupt, once."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def worker_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, initializer=quiet_on_interrupt)


def simulate_variants(variants: Sequence[Variant], source_fn: SourceFn, *, workers: int = MAX_WORKERS,
                      progress: Callable[[str, int, int], None] | None = None,
                      on_timeline: Callable[[Timeline, Variant], None] | None = None) -> list[VariantResult]:
    """Every variant's result, in the order given; in worker processes when there are several.
    ``progress("variants", done, total)`` is called as results arrive (in order)."""
    workers = max(1, min(workers, MAX_WORKERS, len(variants)))
    report = progress or (lambda stage, done, total: None)
    report("variants", 0, len(variants))
    if workers == 1:
        out = []
        for v in variants:
            out.append(evaluate(v, source_fn, on_timeline))
            report("variants", len(out), len(variants))
        return out
    with worker_pool(workers) as pool:
        futures = [pool.submit(evaluate, v, source_fn, on_timeline) for v in variants]
        out = []
        for f in futures:
            out.append(f.result())
            report("variants", len(out), len(variants))
        return out
