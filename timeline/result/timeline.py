"""The Timeline: a columnar event log per device with pure queries.

A Timeline owns what a run's outputs are made of: its devices (:class:`DeviceInfo`), per device
the memory events, the op spans, the timed actions and the allocator pass's columns
(:class:`DeviceMemory`), the interned names, and the run's facts (:class:`RunMeta`). It is built
from the simulator's output (:meth:`Timeline.from_simulation`) or from a replayed PyTorch
snapshot (:meth:`Timeline.from_replay`). It answers: memory at every distinct time (requested,
allocated, reserved, and per category), the peak of each and when, the breakdown by category at
the peak, and the largest tensors live at the peak with the op and micro-batch that made them.
Nothing here writes files or prints; exporters format what these queries return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from timeline.graph.tensors import CATEGORIES
from timeline.sim.engine import Span
from timeline.sim.memory import allocator_config, pair_index
from timeline.sim.plan import shift_layers
from timeline.sim.simulate import DeviceEvents, DeviceOps, SimOutput

if TYPE_CHECKING:
    from timeline.spec.run import AllocatorSpec, RunSpec

__all__ = ["DeviceEvents", "DeviceInfo", "DeviceMemory", "DeviceOps", "MemorySeries", "Peak",
           "RunMeta", "Span", "Timeline"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceInfo:
    """One simulated device's static facts: where it sits, what it holds, what it stands for."""

    device: int  # global rank
    pp_rank: int
    stages: tuple[int, ...]  # () for a replayed snapshot's device: no pipeline
    represents: int  # how many ranks behave like this one
    layers: tuple[int, ...] = ()
    params_by_module: Mapping[str, int] = field(default_factory=dict)
    weights_bytes: int = 0
    grads_bytes: int = 0
    optimizer_bytes: int = 0
    activation_bytes_per_microbatch: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMeta:
    """The run's facts the queries and exporters need. A replayed snapshot has no run: ``run``
    and ``capacity_bytes`` are None, its times and iterations zero."""

    run: RunSpec | None  # the resolved run (``summary.json`` writes it); None for a replay
    name: str
    profile: str | None
    schedule_kind: str | None
    capacity_bytes: int | None
    iteration_time_us: float
    iterations: int  # reported iterations
    warmup_iterations: int  # simulated before them, left out of every reported peak
    report_start_us: float  # reported peaks start here: the end of the warm-up (0: all reported)
    allocator: AllocatorSpec | None
    allocator_settings: Mapping[str, Any] = field(default_factory=dict)  # the snapshot's spelling
    #: a replayed snapshot: no tensor identities (frees pair with the live block at their address)
    replayed: bool = False


@dataclass(slots=True)
class MemorySeries:
    """One row per distinct time (the state after the last event at that time)."""

    t_us: np.ndarray
    requested: np.ndarray
    allocated: np.ndarray
    reserved: np.ndarray
    by_category: dict[str, np.ndarray]
    event_index: np.ndarray  # index of the last event at each time



@dataclass(frozen=True, slots=True, kw_only=True)
class Peak:
    """One device's peaks. Each quantity peaks at its own instant (the earliest event where it is
    highest); the breakdown, the fragmentation and ``event_index`` are at the requested peak, so
    the table's ``frag.`` is the gap an engineer sees at the moment it prints."""

    requested_bytes: int
    requested_time_us: float
    allocated_bytes: int
    allocated_time_us: float
    reserved_bytes: int
    reserved_time_us: float
    fragmentation_bytes: int  # reserved − allocated at the requested peak's event
    breakdown_bytes: dict[str, int]  # requested bytes by category at the requested peak
    event_index: int  # the requested peak's event; −1 without events



@dataclass(slots=True)
class DeviceMemory:
    """Per-event allocator columns for one device (from the allocator pass)."""

    block_bytes: np.ndarray  # int64 rounded/handed-out block size of each event's tensor (signed like size)
    reserved: np.ndarray  # int64 reserved bytes after each event
    address: np.ndarray  # int64 address of the block (−1 under ideal)
    segment: np.ndarray  # int64 address of the segment (−1 under ideal)
    oom: list[dict]
    #: (event index, action, address, size, stream, reserved then) of segment_alloc/free/map/unmap, oom
    segment_events: list[tuple[int, str, int, int, int, int]] = field(default_factory=list)
    end_segments: list = field(default_factory=list)  # allocator SegmentViews after the last event
    pair: np.ndarray | None = None  # for each free, its alloc's index (−1: allocs), if the pass found it


def peak_of(ev: DeviceEvents, requested: np.ndarray, allocated: np.ndarray, reserved: np.ndarray,
            report_start_us: float) -> Peak:
    """A device's :class:`Peak` from its events (at least one) and the requested, allocated and
    reserved bytes after each, counting from the first event at or after ``report_start_us``."""
    # peaks over events, not distinct times: an alloc freed at the same microsecond still counts;
    # argmax takes the first occurrence, the earliest time a peak is reached
    # warm-up iterations are simulated but left out of every reported peak
    i0 = int(np.searchsorted(ev.t_us, report_start_us, side="left")) if report_start_us else 0
    i_req, i_alloc, i_res = (i0 + int(np.argmax(requested[i0:])), i0 + int(np.argmax(allocated[i0:])),
                             i0 + int(np.argmax(reserved[i0:])))
    # bytes by category up to the requested peak; every partial sum is a category's live bytes
    # (under 2**48, the modelled address space), so the float64 sums are exact integers
    by_cat = np.bincount(ev.cat[: i_req + 1], weights=(ev.sign[: i_req + 1].astype(np.int64) * ev.size[: i_req + 1]),
                         minlength=len(CATEGORIES))
    return Peak(requested_bytes=int(requested[i_req]), requested_time_us=float(ev.t_us[i_req]),
                allocated_bytes=int(allocated[i_alloc]), allocated_time_us=float(ev.t_us[i_alloc]),
                reserved_bytes=int(reserved[i_res]), reserved_time_us=float(ev.t_us[i_res]),
                fragmentation_bytes=int(reserved[i_req] - allocated[i_req]),
                breakdown_bytes={name: int(by_cat[code]) for code, name in enumerate(CATEGORIES)}, event_index=i_req)


def iteration_peaks_of(ev: DeviceEvents, requested: np.ndarray, allocated: np.ndarray, reserved: np.ndarray,
                       first: int) -> list[dict]:
    """:meth:`Timeline.iteration_peaks` from a device's events and byte columns (``first``: the
    first reported iteration)."""
    it = ev.iteration
    out = []
    for k in range(first, int(it.max()) + 1 if len(it) else 0):
        idx = np.flatnonzero(it == k)
        if not len(idx):
            continue
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        j = lo + int(np.argmax(requested[lo:hi]))
        out.append({"iteration": k, "peak_requested_bytes": int(requested[j]),
                    "peak_allocated_bytes": int(allocated[lo:hi].max()),
                    "peak_reserved_bytes": int(reserved[lo:hi].max()), "peak_time_us": float(ev.t_us[j])})
    return out


class Timeline:
    """A run's result. ``devices``, ``events``, ``ops``, ``spans`` and ``memory`` are per device
    (in the same order); ``names`` holds every tensor, op, stream and phase name the columns
    index; ``op_modules`` maps an op name to its module path. ``sim`` is the simulator output a
    simulated Timeline was built from (None for a replay): for the simulator's own tests; nothing
    in the package outside ``result/`` and ``sim/`` reads it (``tests/test_layering.py``)."""

    def __init__(self, *, devices: Sequence[DeviceInfo], events: list[DeviceEvents], ops: list[DeviceOps],
                 spans: list[list[Span]], names: list[str], memory: list[DeviceMemory], meta: RunMeta,
                 op_modules: Mapping[str, str] | None = None, sim: SimOutput | None = None) -> None:
        self.devices = list(devices)
        self._events = events
        self.ops = ops
        self.spans = spans
        self.names = names
        self.memory = memory
        self.meta = meta
        self.op_modules: Mapping[str, str] = op_modules or {}
        self.sim = sim
        self._series: dict[int, MemorySeries] = {}
        self._peaks: dict[int, Peak] = {}
        self._pairs: dict[int, np.ndarray] = {}

    @classmethod
    def from_simulation(cls, sim: SimOutput, memory: list[DeviceMemory]) -> Timeline:
        """The simulator's output and each device's allocator pass as a Timeline."""
        run = sim.run
        assert run is not None, "the simulation's door sets the run"
        devices = [DeviceInfo(device=dev.device, pp_rank=dev.pp_rank, stages=tuple(dev.stages),
                              represents=dev.represents, layers=tuple(dev.layers),
                              params_by_module=dev.params_by_module, weights_bytes=dev.weights_bytes,
                              grads_bytes=dev.grads_bytes, optimizer_bytes=dev.optimizer_bytes,
                              activation_bytes_per_microbatch=act)
                   for dev, act in zip(sim.devices, sim.activation_bytes_per_microbatch, strict=True)]
        meta = RunMeta(run=run, name=run.name, profile=run.profile, schedule_kind=run.schedule.kind,
                       capacity_bytes=run.hardware.capacity_bytes, iteration_time_us=sim.iteration_time_us,
                       iterations=run.training.iterations, warmup_iterations=run.training.warmup_iterations,
                       report_start_us=sim.report_start_us, allocator=run.allocator,
                       allocator_settings=allocator_config(run.allocator).to_dict())
        op_modules = {op.name: op.module for t in sim.templates.values()
                      for op in (*t.forward, *t.backward_i, *t.backward_w)}
        for rep, delta in sorted(set(sim.template_shifts.values())):  # chunks sharing another's template
            t = sim.templates[rep]
            ops = (*t.forward, *t.backward_i, *t.backward_w)
            memo: dict[int, str] = {}  # one object shifted is one object (pickled outputs share it)
            names = shift_layers([op.name for op in ops], delta, memo, keep_identity=True)
            modules = shift_layers([op.module for op in ops], delta, memo, keep_identity=True)
            op_modules.update(zip(names, modules, strict=True))
        return cls(devices=devices, events=sim.events, ops=sim.ops, spans=sim.spans, names=sim.names,
                   memory=memory, meta=meta, op_modules=op_modules, sim=sim)

    @classmethod
    def from_replay(cls, records: Mapping[int, Sequence[tuple]],
                    devices: Mapping[int, Mapping] | None = None) -> Timeline:
        """A replayed PyTorch snapshot as a Timeline (see :mod:`timeline.result.replayed`)."""
        from timeline.result.replayed import timeline_from_replay

        return timeline_from_replay(records, devices)

    # -- basic shapes -----------------------------------------------------------------
    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_events(self) -> int:
        return int(sum(len(e.t_us) for e in self._events))

    def events(self, d: int) -> DeviceEvents:
        return self._events[d]

    # -- series --------------------------------------------------------------------------
    def series(self, d: int) -> MemorySeries:
        if d not in self._series:
            self._build(d)
        return self._series[d]

    def _build(self, d: int) -> None:
        """One cumulative pass over device ``d``'s events: its series and its peaks."""
        ev = self._events[d]
        delta = ev.sign.astype(np.int64) * ev.size
        requested = np.cumsum(delta)
        allocated = np.cumsum(self.memory[d].block_bytes)
        reserved = self.memory[d].reserved
        by_cat = {name: np.cumsum(np.where(ev.cat == code, delta, 0)) for code, name in enumerate(CATEGORIES)}
        # the last event at each distinct time
        if len(ev.t_us):
            last = np.flatnonzero(np.append(ev.t_us[1:] != ev.t_us[:-1], True))
        else:
            last = np.zeros(0, dtype=np.int64)
        self._series[d] = MemorySeries(t_us=ev.t_us[last], requested=requested[last], allocated=allocated[last],
                                       reserved=reserved[last], by_category={k: v[last] for k, v in by_cat.items()},
                                       event_index=last)
        if not len(ev.t_us):
            self._peaks[d] = Peak(requested_bytes=0, requested_time_us=0.0, allocated_bytes=0, allocated_time_us=0.0,
                                  reserved_bytes=0, reserved_time_us=0.0, fragmentation_bytes=0,
                                  breakdown_bytes=dict.fromkeys(CATEGORIES, 0), event_index=-1)
            return
        self._peaks[d] = peak_of(ev, requested, allocated, reserved, self.meta.report_start_us)

    # -- peaks ---------------------------------------------------------------------------
    def peak(self, d: int) -> Peak:
        """Peaks of requested, allocated and reserved, each with its own time, and the breakdown
        at the requested peak (computed with the series, once per device)."""
        if d not in self._peaks:
            self._build(d)
        return self._peaks[d]

    def peak_iteration(self, d: int) -> int:
        """The iteration the requested peak falls in (−1: before the first, e.g. construction)."""
        pk = self.peak(d)
        if pk.event_index < 0:
            return -1
        return int(self.event_iterations(d)[pk.event_index])

    def iteration_peaks(self, d: int) -> list[dict]:
        """Per reported iteration: peak requested, allocated and reserved bytes and when the
        requested peak is reached (events belong to the iteration of the action making them;
        static state and construction to none)."""
        ev = self._events[d]
        if not len(ev.t_us):
            return []
        requested = np.cumsum(ev.sign.astype(np.int64) * ev.size)
        allocated = np.cumsum(self.memory[d].block_bytes)
        return iteration_peaks_of(ev, requested, allocated, self.memory[d].reserved, self.meta.warmup_iterations)

    def iteration_starts(self, d: int) -> list[float]:
        """When each reported iteration begins on device ``d`` (µs): its first action's start —
        the boundaries a plot of memory over time draws."""
        first = self.meta.warmup_iterations
        starts: dict[int, float] = {}
        for sp in self.spans[d]:
            if sp.kind != "init" and sp.iteration >= first:
                starts[sp.iteration] = min(starts.get(sp.iteration, sp.start_us), sp.start_us)
        return [starts[k] for k in sorted(starts)]

    def iteration_at(self, d: int, t_us: np.ndarray) -> np.ndarray:
        """The reported iteration each time of device ``d`` falls in: the last iteration start at
        or before it (−1 before the first, e.g. construction and warm-up)."""
        starts = np.asarray(self.iteration_starts(d), dtype=np.float64)
        if not len(starts):
            return np.full(len(t_us), -1, dtype=np.int32)
        first = self.meta.warmup_iterations
        k = np.searchsorted(starts, np.asarray(t_us, dtype=np.float64), side="right") - 1
        return np.where(k >= 0, k + first, -1).astype(np.int32)

    def event_iterations(self, d: int) -> np.ndarray:
        """The iteration of each event of device ``d``: its action's (−1: static state, construction)."""
        return self._events[d].iteration

    def alloc_ids(self, d: int) -> np.ndarray:
        """An id per event, the same on an alloc and the free that ends it and unique per device:
        the alloc's event index (a free without its alloc keeps its own index). A replayed
        snapshot has no tensor identities: its frees pair with the live block at their address."""
        if self.meta.replayed:
            ev, addr = self._events[d], self.memory[d].address
            ids = np.arange(len(ev.t_us), dtype=np.int64)
            live: dict[int, int] = {}
            for i, (s, a) in enumerate(zip(ev.sign.tolist(), addr.tolist(), strict=True)):
                if s > 0:
                    live[a] = i
                elif a in live:
                    ids[i] = live.pop(a)
            return ids
        fi = self.free_index(d)
        ids = np.arange(len(fi), dtype=np.int64)
        has = np.flatnonzero(fi >= 0)
        ids[fi[has]] = has
        return ids

    def free_index(self, d: int) -> np.ndarray:
        """For each event, the index of the free that ends its tensor (allocs only; −1 if never
        freed or not an alloc)."""
        if d in self._pairs:
            return self._pairs[d]
        ev = self._events[d]
        out = np.full(len(ev.t_us), -1, dtype=np.int64)
        pair = self.memory[d].pair if self.memory[d].pair is not None else pair_index(ev)
        if pair is not None:  # the same pairing, found by sorting (allocs and frees alternate per key)
            frees = np.flatnonzero(pair >= 0)
            out[pair[frees]] = frees
            self._pairs[d] = out
            self.memory[d].pair = None  # ``out`` says the same; a 128-device run need not hold both
            return out
        open_: dict[tuple[int, int, int], int] = {}
        for i, (s, tensor, mb, st) in enumerate(zip(ev.sign.tolist(), ev.tensor.tolist(), ev.microbatch.tolist(),
                                                    ev.stage.tolist(), strict=True)):
            key = (tensor, mb, st)
            if s > 0:
                open_[key] = i
            else:
                out[open_.pop(key)] = i
        self._pairs[d] = out
        return out

    def live_at(self, d: int, index: int) -> np.ndarray:
        """Indices of alloc events whose tensors are live just after event ``index``."""
        ev = self._events[d]
        fi = self.free_index(d)
        allocs = np.flatnonzero(ev.sign[: index + 1] > 0)
        ends = fi[allocs]
        return allocs[(ends < 0) | (ends > index)]

    def top_tensors(self, d: int, index: int, n: int = 10) -> list[dict]:
        ev = self._events[d]
        names = self.names
        live = self.live_at(d, index)
        order = live[np.argsort(-ev.size[live], kind="stable")][:n]
        return [{"tensor": names[ev.tensor[i]], "bytes": int(ev.size[i]), "category": CATEGORIES[ev.cat[i]],
                 "op": names[ev.op[i]] if ev.op[i] >= 0 else None,
                 "microbatch": int(ev.microbatch[i]), "stage": int(ev.stage[i]),
                 "t_alloc_us": float(ev.t_us[i])} for i in order]

    def peak_context(self, d: int) -> dict:
        """Why device ``d`` peaks: the action running at its requested peak (e.g. ``"1F14"``, or
        ``"static"`` / ``"step"``) and the (stage, micro-batch) pairs whose saved activations are
        live then, in order of stage then micro-batch."""
        pk = self.peak(d)
        if pk.event_index < 0:
            return {"action": None, "in_flight": []}
        ev = self._events[d]
        a = int(ev.action[pk.event_index])
        if a < 0:
            action = "static"
        else:
            sp = self.spans[d][a]
            action = sp.kind if sp.kind in ("step", "init") else f"{sp.stage}{sp.kind}{sp.microbatch}"
        live = self.live_at(d, pk.event_index)
        act = CATEGORIES.index("activations")
        held = live[(ev.cat[live] == act) & (ev.microbatch[live] >= 0)]
        pairs = set(zip(ev.stage[held].tolist(), ev.microbatch[held].tolist(), strict=True))
        return {"action": action, "in_flight": sorted(pairs)}

    def at(self, d: int, t_us: float) -> dict:
        """Memory of device ``d`` just after every event at or before ``t_us``."""
        s = self.series(d)
        i = int(np.searchsorted(s.t_us, t_us, side="right")) - 1
        if i < 0:
            return {"requested_bytes": 0, "allocated_bytes": 0, "reserved_bytes": 0,
                    **dict.fromkeys(CATEGORIES, 0)}
        return {"requested_bytes": int(s.requested[i]), "allocated_bytes": int(s.allocated[i]),
                "reserved_bytes": int(s.reserved[i]), **{k: int(v[i]) for k, v in s.by_category.items()}}
