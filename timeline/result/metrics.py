"""Per-device metrics of one Timeline, and one device's memory ready to plot: the numbers
``timeline compare``, ``fit`` and ``plan`` rank variants by.

For every device: peaks (allocated, reserved, fragmentation at the requested peak), saved
activations (at the peak and their own maximum), recomputation (FLOPs and the summed durations of
ops whose phase is ``R``, per iteration), iteration time, headroom to capacity and OOM. Pure
queries of a simulated Timeline (a replay has no capacity to measure headroom against).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from timeline.result.timeline import Timeline


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
        return fit_of(self.headroom_bytes, self.oom)[0]

    @property
    def over_bytes(self) -> int:
        """0 if the device fits; else how much more it needs (:func:`fit_of`)."""
        return fit_of(self.headroom_bytes, self.oom)[1]


def fit_of(headroom_bytes: int, oom: bool) -> tuple[bool, int]:
    """(fits, over bytes) of a device: it fits without an OOM and with the peak reserved within
    capacity; otherwise it needs the peak reserved beyond capacity (the negative headroom), at
    least 1 byte when only an OOM shows it."""
    fits = not oom and headroom_bytes >= 0
    return fits, 0 if fits else max(-headroom_bytes, 1)


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


def _capacity(tl: Timeline) -> int:
    cap = tl.meta.capacity_bytes
    if cap is None:
        raise ValueError("a replayed Timeline has no capacity: metrics need a simulated run")
    return cap


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceFit:
    """What a plan reads of one device: its peaks and whether it fits (as :class:`DeviceMetrics`
    says it), from peaks and OOMs alone — a summary-level Timeline has them."""

    device: int
    peak_requested_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    over_bytes: int
    fits: bool


def device_fits(tl: Timeline) -> list[DeviceFit]:
    """Every device's :class:`DeviceFit`, in device order (fits and over_bytes as DeviceMetrics')."""
    cap = _capacity(tl)
    out = []
    for d, dev in enumerate(tl.devices):
        pk = tl.peak(d)
        fits, over = fit_of(cap - pk.reserved_bytes, bool(tl.memory[d].oom))
        out.append(DeviceFit(device=dev.device, peak_requested_bytes=pk.requested_bytes,
                             peak_allocated_bytes=pk.allocated_bytes, peak_reserved_bytes=pk.reserved_bytes,
                             over_bytes=over, fits=fits))
    return out


def device_metrics(tl: Timeline) -> list[DeviceMetrics]:
    """Every device's :class:`DeviceMetrics`, in device order."""
    iters = tl.meta.iterations
    cap = _capacity(tl)
    r_code = tl.names.index("R") if "R" in tl.names else -1
    out = []
    for d, dev in enumerate(tl.devices):
        pk = tl.peak(d)
        ops = tl.ops[d]
        mask = ops.phase == r_code if len(ops.phase) else np.zeros(0, dtype=bool)
        acts = tl.series(d).by_category["activations"]
        out.append(DeviceMetrics(
            device=dev.device, pp_rank=dev.pp_rank, represents=dev.represents,
            peak_requested_bytes=pk.requested_bytes, peak_allocated_bytes=pk.allocated_bytes,
            peak_reserved_bytes=pk.reserved_bytes, fragmentation_bytes=pk.fragmentation_bytes,
            activations_at_peak_bytes=pk.breakdown_bytes["activations"],
            peak_activation_bytes=int(acts.max()) if len(acts) else 0,
            activation_bytes_per_microbatch=dev.activation_bytes_per_microbatch,
            recompute_flops=float(ops.flops[mask].sum()) / iters,
            recompute_time_us=float((ops.t_end_us[mask] - ops.t_start_us[mask]).sum()) / iters,
            iteration_time_us=tl.meta.iteration_time_us, capacity_bytes=cap,
            headroom_bytes=cap - pk.reserved_bytes, oom=bool(tl.memory[d].oom)))
    return out


def memory_trace(tl: Timeline, d: int, label: str) -> MemoryTrace:
    """Device ``d``'s memory series as a :class:`MemoryTrace` named ``label``."""
    s, dev = tl.series(d), tl.devices[d]
    return MemoryTrace(label=label, device=dev.device, pp_rank=dev.pp_rank, t_us=s.t_us, allocated=s.allocated,
                       reserved=s.reserved, by_category=dict(s.by_category), capacity_bytes=_capacity(tl),
                       iteration_starts_us=tuple(tl.iteration_starts(d)),
                       oom_t_us=tuple(float(o["t_us"]) for o in tl.memory[d].oom))
