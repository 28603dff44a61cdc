"""Per-device metrics of one simulated variant, and simulating several variants side by side.

For every device: peaks (allocated, reserved, fragmentation at the requested peak), saved
activations (at the peak and their own maximum), recomputation (FLOPs and the summed
durations of ops whose phase is ``R``, per iteration), iteration time, headroom to capacity
and OOM. The worst device's memory series is kept for plots. Variants run in at most two
worker processes (each simulation is CPU-bound and single-threaded), results in input order.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from timeline.compare.variants import Variant, recompute_name
from timeline.graph.ops import ChunkTemplate
from timeline.result.build import build_timeline
from timeline.result.timeline import Timeline

#: ``template_fn(run, chunk, pp_rank=…)``, as :func:`timeline.sim.simulate.simulate` calls it
TemplateFn = Callable[..., ChunkTemplate]
MAX_WORKERS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceMetrics:
    device: int
    pp_rank: int
    represents: int
    peak_requested_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fragmentation_bytes: int  # reserved − allocated at the requested peak
    activations_at_peak_bytes: int  # the activations category at the (requested) peak
    peak_activation_bytes: int  # the activations category's own maximum
    activation_bytes_per_microbatch: int
    recompute_flops: float  # per iteration
    recompute_time_us: float  # per iteration: summed durations of phase-"R" ops
    iteration_time_us: float
    capacity_bytes: int
    headroom_bytes: int  # capacity − peak reserved (negative: over capacity)
    oom: bool

    @property
    def fits(self) -> bool:
        """No OOM and the peak reserved within capacity."""
        return not self.oom and self.headroom_bytes >= 0

    @property
    def over_bytes(self) -> int:
        """0 if the device fits; else how much more it needs: peak reserved beyond capacity (the
        same number as the negative headroom beside it), at least 1 byte when only an OOM shows it."""
        if self.fits:
            return 0
        return max(-self.headroom_bytes, 1)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryTrace:
    """One device's memory over time, ready to plot (bytes; time in µs)."""

    label: str
    device: int
    pp_rank: int
    t_us: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    by_category: dict[str, np.ndarray]
    capacity_bytes: int
    iteration_starts_us: tuple[float, ...] = ()  # where each reported iteration begins
    oom_t_us: tuple[float, ...] = ()  # when each OOM happened


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


def device_metrics(tl: Timeline) -> list[DeviceMetrics]:
    sim, run = tl.sim, tl.sim.run
    iters = run.training.iterations
    cap = run.hardware.capacity_bytes
    r_code = sim.names.index("R") if "R" in sim.names else -1
    out = []
    for d, dev in enumerate(sim.devices):
        pk = tl.peak(d)
        ops = sim.ops[d]
        mask = ops.phase == r_code if len(ops.phase) else np.zeros(0, dtype=bool)
        acts = tl.series(d).by_category["activations"]
        out.append(DeviceMetrics(
            device=dev.device, pp_rank=dev.pp_rank, represents=dev.represents,
            peak_requested_bytes=pk.requested_bytes, peak_allocated_bytes=pk.allocated_bytes,
            peak_reserved_bytes=pk.reserved_bytes, fragmentation_bytes=pk.fragmentation_bytes,
            activations_at_peak_bytes=pk.breakdown_bytes["activations"],
            peak_activation_bytes=int(acts.max()) if len(acts) else 0,
            activation_bytes_per_microbatch=sim.activation_bytes_per_microbatch[d],
            recompute_flops=float(ops.flops[mask].sum()) / iters,
            recompute_time_us=float((ops.t_end_us[mask] - ops.t_start_us[mask]).sum()) / iters,
            iteration_time_us=sim.iteration_time_us, capacity_bytes=cap,
            headroom_bytes=cap - pk.reserved_bytes, oom=bool(tl.memory[d].oom)))
    return out


def memory_trace(tl: Timeline, d: int, label: str) -> MemoryTrace:
    s, dev = tl.series(d), tl.sim.devices[d]
    return MemoryTrace(label=label, device=dev.device, pp_rank=dev.pp_rank, t_us=s.t_us, allocated=s.allocated,
                       reserved=s.reserved, by_category=dict(s.by_category),
                       capacity_bytes=tl.sim.run.hardware.capacity_bytes,
                       iteration_starts_us=tuple(tl.iteration_starts(d)),
                       oom_t_us=tuple(float(o["t_us"]) for o in tl.memory[d].oom))


def evaluate(variant: Variant, template_fn: TemplateFn,
             on_timeline: Callable[[Timeline, Variant], None] | None = None) -> VariantResult:
    """Simulate one variant and reduce it to its metrics (picklable, for worker processes);
    ``on_timeline(tl, variant)`` (picklable too) sees the whole Timeline first, in the worker —
    e.g. to write the variant's own files without sending the Timeline back."""
    tl = build_timeline(variant.run, template_fn)
    if on_timeline is not None:
        on_timeline(tl, variant)
    devices = device_metrics(tl)
    worst = max(range(len(devices)), key=lambda i: (devices[i].peak_reserved_bytes, -i))
    return VariantResult(name=variant.name, recompute=recompute_name(variant.run.recompute),
                         devices=tuple(devices), worst=memory_trace(tl, worst, variant.name))


def quiet_on_interrupt() -> None:
    """Worker-process initializer: on Ctrl-C (which the whole process group receives) a worker
    exits at once and silently; the parent reports the interrupt, once."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def worker_pool(workers: int) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=workers, initializer=quiet_on_interrupt)


def simulate_variants(variants: Sequence[Variant], template_fn: TemplateFn, *, workers: int = MAX_WORKERS,
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
            out.append(evaluate(v, template_fn, on_timeline))
            report("variants", len(out), len(variants))
        return out
    with worker_pool(workers) as pool:
        futures = [pool.submit(evaluate, v, template_fn, on_timeline) for v in variants]
        out = []
        for f in futures:
            out.append(f.result())
            report("variants", len(out), len(variants))
        return out
