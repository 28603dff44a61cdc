"""What the simulation hands on: plain numpy columns per device (events, ops) and the run's
spans and devices, which the ``result`` layer wraps in a :class:`~timeline.result.Timeline`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from timeline.graph.ops import ChunkTemplate
from timeline.pipeline.actions import Schedule
from timeline.placement.devices import StaticDevice
from timeline.sim.compiled import CompiledPhase
from timeline.sim.engine import Span
from timeline.spec.run import RunSpec


@dataclass(slots=True)
class DeviceEvents:
    """One device's memory events in time order (columns of equal length)."""

    t_us: np.ndarray  # float64
    sign: np.ndarray  # int8 (+1 alloc, −1 free)
    size: np.ndarray  # int64 requested bytes
    cat: np.ndarray  # int8 category code
    tensor: np.ndarray  # int32 index into SimOutput.names
    op: np.ndarray  # int32 index into SimOutput.names (−1: none)
    microbatch: np.ndarray  # int32 (−1: none)
    stage: np.ndarray  # int16 (−1: none)
    action: np.ndarray  # int32 index into the device's spans (−1: static)
    stream: np.ndarray  # int8 allocator stream
    iteration: np.ndarray  # int32 the iteration of the event's action (−1: static state, construction)


@dataclass(slots=True)
class DeviceOps:
    name: np.ndarray  # int32 into names
    stream: np.ndarray  # int32 into names
    t_start_us: np.ndarray
    t_end_us: np.ndarray
    phase: np.ndarray  # int32 into names ("F", "B", "I", "W", "R" recompute, "step")
    microbatch: np.ndarray
    stage: np.ndarray
    layer: np.ndarray
    flops: np.ndarray


@dataclass(slots=True)
class SimOutput:
    schedule: Schedule
    devices: list[StaticDevice]
    spans: list[list[Span]]  # per device
    events: list[DeviceEvents]
    ops: list[DeviceOps]
    names: list[str]
    iteration_time_us: float
    activation_bytes_per_microbatch: list[int]
    templates: dict[int, ChunkTemplate] = field(default_factory=dict)
    #: the chunks without a template of their own: chunk → (the chunk whose template it shares, decoder
    #: layers between them; :attr:`timeline.sim.plan.SimPlan.shifts`)
    template_shifts: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: reported peaks start here: the end of ``warmup_iterations`` (0: everything is reported)
    report_start_us: float = 0.0
    #: the run simulated, set by the simulation's door (:func:`timeline.result.build.build_timeline`)
    run: RunSpec | None = None


class Names:
    """The run's interned strings (tensor, op, stream and phase names), in first-use order."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}
        self._arrays: dict[tuple, np.ndarray] = {}

    def ids(self, ph: CompiledPhase, field: str) -> np.ndarray:
        """Name ids of one of a compiled phase's name tuples, computed once per phase."""
        key = (id(ph), field)
        arr = self._arrays.get(key)
        if arr is None:
            arr = self._arrays[key] = np.array([self(n) for n in getattr(ph, field)], dtype=np.int32)
        return arr

    def cached(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """An array made once per key (per compiled phase): the names it interns on first use
        are interned in the same order as without the cache."""
        arr = self._arrays.get(key)
        if arr is None:
            arr = self._arrays[key] = make()
        return arr

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i
