"""A summary-level Timeline: per device, only what ``summary.json`` and the result table read.

``timeline simulate --format summary`` needs, per device, its peaks and when, the per-iteration
peaks, the OOMs, the event count and the tensors live at the requested peak — not every
event. :func:`summary_timeline` simulates one device at a time (its events and allocator pass,
exactly as the full build makes them), takes those from it and keeps of its events only the
tensors live at the requested peak, with the peak's own event last, before the next device:
memory holds one device's events, not the run's (2,048-GPU DeepSeek-V3 under skewed routing:
1,024 devices, 156 M events). Queries over every event (``series``, ``at``) are not kept: the
outputs that list events take the full build.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from timeline.graph.tensors import CATEGORIES
from timeline.result.timeline import (
    DeviceInfo,
    DeviceMemory,
    MemorySeries,
    Peak,
    RunMeta,
    Timeline,
    iteration_peaks_of,
    peak_of,
)
from timeline.sim.engine import Span
from timeline.sim.memory import AllocatorPass
from timeline.sim.output import DeviceEvents, DeviceOps

EMPTY_OPS = DeviceOps(**{k: np.zeros(0) for k in DeviceOps.__slots__})
#: the peak of a device without events (as :meth:`Timeline.peak` gives it)
EMPTY_PEAK = Peak(requested_bytes=0, requested_time_us=0.0, allocated_bytes=0, allocated_time_us=0.0, reserved_bytes=0,
                  reserved_time_us=0.0, fragmentation_bytes=0, breakdown_bytes=dict.fromkeys(CATEGORIES, 0),
                  event_index=-1)


class SummaryTimeline(Timeline):
    """A Timeline whose devices keep their peaks, per-iteration peaks, OOMs, event counts and
    the tensors live at their requested peak; ``series`` (memory at every time) is not kept."""

    def __init__(self, *, per_iteration: list[list[dict]], event_counts: list[int], peaks: list[Peak],
                 **timeline: Any) -> None:
        super().__init__(**timeline)
        self.per_iteration = per_iteration  # per device: Timeline.iteration_peaks
        self.event_counts = event_counts  # per device: memory events simulated
        self._peaks.update(enumerate(peaks))
        self._starts: dict[int, list[float]] = {}  # iteration starts by the spans' identity

    @property
    def num_events(self) -> int:
        return int(sum(self.event_counts))

    def iteration_peaks(self, d: int) -> list[dict]:
        return self.per_iteration[d]

    def iteration_starts(self, d: int) -> list[float]:
        """As :meth:`Timeline.iteration_starts`, found once per pipeline rank (its EP ranks share spans)."""
        key = id(self.spans[d])
        if key not in self._starts:
            self._starts[key] = super().iteration_starts(d)
        return list(self._starts[key])

    def series(self, d: int) -> MemorySeries:
        raise ValueError("a summary-level Timeline keeps no memory series; build it without summary_only")


def reduce_device(meta: RunMeta, info: DeviceInfo, spans: list[Span], names: list[str], ev: DeviceEvents,
                  res: AllocatorPass) -> tuple[DeviceEvents, DeviceMemory, Peak, list[dict]]:
    """One device's events and allocator pass reduced to the tensors live at its requested peak
    (then the peak's own event, when it is a free): the reduced events and memory, its peak
    (``event_index`` into them) and its per-iteration peaks."""
    mem = DeviceMemory(block_bytes=res.block, reserved=res.reserved, address=res.address, segment=res.segment,
                       oom=res.ooms, pair=res.pair)
    if not len(ev.t_us):
        return ev, mem, EMPTY_PEAK, []
    one = Timeline(devices=[info], events=[ev], ops=[EMPTY_OPS], spans=[spans], names=names, memory=[mem], meta=meta)
    requested = np.cumsum(ev.sign.astype(np.int64) * ev.size)
    allocated = np.cumsum(res.block)
    pk = peak_of(ev, requested, allocated, res.reserved, meta.report_start_us)
    per_iteration = iteration_peaks_of(ev, requested, allocated, res.reserved, meta.warmup_iterations)
    del requested, allocated
    q = pk.event_index
    idx = one.live_at(0, q)
    if ev.sign[q] < 0:  # a free peaks just after its own event: it goes last
        idx = np.append(idx, q)
    n = len(idx)
    reduced = DeviceMemory(block_bytes=res.block[idx], reserved=res.reserved[idx], address=res.address[idx],
                           segment=res.segment[idx], oom=res.ooms, pair=np.full(n, -1, dtype=np.int64))
    return _take(ev, idx), reduced, replace(pk, event_index=n - 1), per_iteration


def _take(ev: DeviceEvents, idx: np.ndarray) -> DeviceEvents:
    return DeviceEvents(**{k: getattr(ev, k)[idx] for k in DeviceEvents.__slots__})


def summary_timeline(base: Timeline, spans: list[list[Span]], names: list[str],
                     run_device: Callable[[int], tuple[DeviceEvents, AllocatorPass]],
                     same_as: Callable[[int], tuple[int, dict[int, int]] | None]) -> SummaryTimeline:
    """The summary-level Timeline of ``base``'s devices (``base``: the run's facts and devices,
    no events), ``run_device(d)`` device ``d``'s events and allocator pass, made one device at a
    time and reduced before the next (:func:`reduce_device`). ``same_as(d)``: an earlier device
    whose event stream is ``d``'s but for micro-batch numbers, with the renaming (its stream
    renamed is ``d``'s, so is its allocator pass), or None: ``d`` then takes the earlier one's
    summaries renamed instead of being simulated."""
    events: list[DeviceEvents] = []
    memory: list[DeviceMemory] = []
    peaks: list[Peak] = []
    per_iteration: list[list[dict]] = []
    counts: list[int] = []
    for d in range(len(base.devices)):
        twin = same_as(d)
        if twin is not None:
            j, rename = twin
            small, mem = _renamed(events[j], memory[j], rename)
            pk, it, n = peaks[j], per_iteration[j], counts[j]
        else:
            ev, res = run_device(d)
            n = len(ev.t_us)
            small, mem, pk, it = reduce_device(base.meta, base.devices[d], spans[d], names, ev, res)
            del ev, res
        events.append(small)
        memory.append(mem)
        peaks.append(pk)
        per_iteration.append(it)
        counts.append(n)
    return SummaryTimeline(per_iteration=per_iteration, event_counts=counts, peaks=peaks, devices=base.devices,
                           events=events, ops=[EMPTY_OPS] * len(events), spans=spans, names=names, memory=memory,
                           meta=base.meta, op_modules=base.op_modules)


def _renamed(ev: DeviceEvents, mem: DeviceMemory, rename: dict[int, int]) -> tuple[DeviceEvents, DeviceMemory]:
    """A device's reduced events and memory with every micro-batch renamed (−1 stays)."""
    keys = np.array(sorted(rename), dtype=np.int64)
    values = np.array([rename[k] for k in keys.tolist()], dtype=np.int64)
    mb = ev.microbatch.astype(np.int64)
    at = np.searchsorted(keys, mb)
    if len(mb) and not (keys[np.minimum(at, len(keys) - 1)] == mb).all():
        raise ValueError("a micro-batch the renaming does not cover")
    renamed = replace(ev, microbatch=values[at].astype(ev.microbatch.dtype) if len(mb) else ev.microbatch)
    oom = [dict(o, microbatch=rename[o["microbatch"]]) for o in mem.oom]
    return renamed, replace(mem, oom=oom)
