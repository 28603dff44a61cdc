"""A summary-level Timeline: per device, only what ``summary.json`` and the result table read.

``timeline simulate --format summary`` needs, per device, its peaks and when, the per-iteration
peaks, the OOMs, the event count and the tensors live at the requested peak — not every
event. :func:`summary_timeline` runs each device (its periodic stretches fast-forwarded,
:mod:`timeline.sim.fast_device`), takes those from a one-device Timeline over what was kept,
and keeps of the events only the tensors live at the requested peak, as the full stream has
them (micro-batch and allocation time of the tensor a skipped period made, in the full stream's
order), with the peak's own event last. Queries over every event (``series``, ``at``) are not
kept: the exporters that list events take the full replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from timeline.result.timeline import DeviceInfo, DeviceMemory, Peak, RunMeta, Timeline
from timeline.sim.engine import Span
from timeline.sim.fast_device import FastDevice
from timeline.sim.output import DeviceEvents, DeviceOps
from timeline.sim.plan import Compiled

EMPTY_OPS = DeviceOps(**{k: np.zeros(0) for k in DeviceOps.__slots__})


class SummaryTimeline(Timeline):
    """A Timeline whose devices keep their peaks, per-iteration peaks, OOMs, event counts and
    the tensors live at their requested peak; ``series`` (memory at every time) is not kept."""

    per_iteration: list[list[dict]]
    event_counts: list[int]

    @property
    def num_events(self) -> int:
        return int(sum(self.event_counts))

    def iteration_peaks(self, d: int) -> list[dict]:
        return self.per_iteration[d]

    def series(self, d: int) -> None:  # type: ignore[override]
        raise ValueError("a summary-level Timeline keeps no memory series; simulate with every output")


def reduce_device(meta: RunMeta, info: DeviceInfo, spans: list[Span], names: list[str], fd: FastDevice,
                  compiled: Compiled) -> tuple[DeviceEvents, DeviceMemory, Peak, list[dict], int]:
    """One device's kept stream reduced to the tensors live at its requested peak (then the
    peak's event): the reduced events and memory, its peak (``event_index`` into them), its
    per-iteration peaks and its event count in the full stream."""
    ev, res = fd.events, fd.alloc
    mem = DeviceMemory(block_bytes=res.block, reserved=res.reserved, address=res.address, segment=res.segment,
                       oom=res.ooms, pair=res.pair)
    one = Timeline(devices=[info], events=[ev], ops=[EMPTY_OPS], spans=[spans], names=names, memory=[mem], meta=meta)
    pk, per_iteration = one.peak(0), one.iteration_peaks(0)
    count = len(ev.t_us) + fd.skipped_events
    if pk.event_index < 0:
        idx = np.zeros(0, dtype=np.int64)
        out = _take(ev, idx)
    else:
        q = pk.event_index
        live = one.live_at(0, q)
        out, order = _true_live(ev, fd, live, q, spans, compiled)
        idx = live[order]
        out = _take(out, order)
        if ev.sign[q] < 0:  # a free peaks only after its own event: it goes last, live or not
            out = _concat(out, _take(ev, np.array([q])))
            idx = np.append(idx, q)
    n = len(idx)
    reduced = DeviceMemory(block_bytes=res.block[idx], reserved=res.reserved[idx], address=res.address[idx],
                           segment=res.segment[idx], oom=res.ooms, pair=np.full(n, -1, dtype=np.int64))
    peak = replace(pk, event_index=n - 1 if n else -1)
    return out, reduced, peak, per_iteration, count


def _true_live(ev: DeviceEvents, fd: FastDevice, live: np.ndarray, q: int, spans: list[Span],
               compiled: Compiled) -> tuple[DeviceEvents, np.ndarray]:
    """The live allocs as the full stream has them at event ``q``, and their full-stream order."""
    out = _take(ev, live)
    shift_q = int(fd.shift[: q + 1].max()) if q >= 0 else 0
    moved = shift_q - fd.shift[live]
    pos = fd.positions[live].astype(np.int64)
    mb, t_us, action = out.microbatch.astype(np.int64), out.t_us.copy(), out.action.astype(np.int64)
    where = np.flatnonzero((moved != 0) & (mb >= 0))
    if len(where):
        index = {(s.iteration, s.stage, s.kind, s.microbatch): i for i, s in enumerate(spans)}
        groups: dict[tuple[int, int], list[int]] = {}
        for w in where.tolist():
            groups.setdefault((int(action[w]), int(moved[w])), []).append(w)
        for (a, m), members in groups.items():
            sp = spans[a]
            target = index[(sp.iteration, sp.stage, sp.kind, sp.microbatch + m)]
            tsp = spans[target]
            ph = compiled[(tsp.stage, tsp.kind)]
            rows = np.array(members)
            p = pos[rows]
            inner = np.clip(p, 0, max(len(ph.ev_offset) - 1, 0))
            offsets = ph.ev_offset[inner] if tsp.scale == 1.0 else ph.ev_offset[inner] * tsp.scale
            t_us[rows] = np.where(p < 0, tsp.start_us, np.where(p >= len(ph.ev_offset), tsp.end_us,
                                                                  offsets + tsp.start_us))
            mb[rows] += m
            action[rows] = target
    # the full stream's order: by time, then push order (static state first, then span by span)
    rank = np.where(action >= 0, pos, live)
    order = np.lexsort((rank, action, t_us))
    out = replace(out, t_us=t_us, microbatch=mb.astype(np.int32), action=action.astype(np.int32))
    return out, order


def _take(ev: DeviceEvents, idx: np.ndarray) -> DeviceEvents:
    return DeviceEvents(**{k: getattr(ev, k)[idx] for k in DeviceEvents.__slots__})


def _concat(a: DeviceEvents, b: DeviceEvents) -> DeviceEvents:
    return DeviceEvents(**{k: np.concatenate([getattr(a, k), getattr(b, k)]) for k in DeviceEvents.__slots__})


def summary_timeline(base: Timeline, devices: list[DeviceInfo], spans: list[list[Span]], names: list[str],
                     run_device: Callable[[int], tuple[FastDevice, Compiled]]) -> SummaryTimeline:
    """The summary-level Timeline of ``devices``: ``base`` gives the run's facts (a Timeline of
    no devices), ``run_device(d)`` device ``d``'s kept stream and compiled phases."""
    events, memory, peaks, per_iteration, counts = [], [], [], [], []
    for d, info in enumerate(devices):
        fd, compiled = run_device(d)
        ev, mem, pk, it, n = reduce_device(base.meta, info, spans[d], names, fd, compiled)
        events.append(ev)
        memory.append(mem)
        peaks.append(pk)
        per_iteration.append(it)
        counts.append(n)
    tl = SummaryTimeline(devices=devices, events=events, ops=[EMPTY_OPS] * len(devices), spans=spans, names=names,
                         memory=memory, meta=base.meta, op_modules=base.op_modules)
    tl.per_iteration, tl.event_counts = per_iteration, counts
    tl._peaks.update(enumerate(peaks))
    return tl
