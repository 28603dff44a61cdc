"""Simulate a run: the stages *plan* → *time* → *expand*, each in its own module.

- :mod:`timeline.sim.plan`: the schedule, the devices and their chunks, compiled templates,
  the cost model;
- :mod:`timeline.sim.timing`: the schedule run through the engine → spans per rank;
- :mod:`timeline.sim.expand`: static state and templates shifted to the spans → per-device
  event and op logs.

The fourth stage, *allocate* (:mod:`timeline.sim.memory`), runs each device's events through
its allocator model; :func:`timeline.result.build.build_timeline` calls it. The output here is
:class:`SimOutput`: plain numpy columns the ``result`` layer wraps in a
:class:`~timeline.result.Timeline`. No file I/O, no printing.
"""

from __future__ import annotations

from collections.abc import Callable

from timeline.graph.tensors import CATEGORIES
from timeline.sim.expand import device_events, device_ops
from timeline.sim.output import DeviceEvents, DeviceOps, Names, SimOutput
from timeline.sim.plan import SimPlan
from timeline.sim.timing import Timing, time_plan

PHASES = ("F", "I", "W", "B")

__all__ = ["CATEGORIES", "PHASES", "DeviceEvents", "DeviceOps", "SimOutput", "expand_plan", "simulate"]


def simulate(p: SimPlan, *, progress: Callable[[str, int, int], None] | None = None) -> SimOutput:
    """Run the schedule of plan ``p`` and return every device's events (allocator not yet applied)."""
    return expand_plan(p, time_plan(p, p.training.warmup_iterations), progress=progress)


def expand_plan(p: SimPlan, timing: Timing, *,
                progress: Callable[[str, int, int], None] | None = None) -> SimOutput:
    """Every simulated device's event and op log from a plan and its timing."""
    names = Names()
    events, ops, spans, act = [], [], [], []
    for i, dev in enumerate(p.devices):
        if progress:
            progress("devices", i, len(p.devices))
        e = p.load_of(i)
        rank_spans = timing.per_rank[dev.pp_rank]
        events.append(device_events(p.training, dev, p.states[i], rank_spans, p.compiled[e], names,
                                    (p.capture[e], p.capture_rules[e]) if p.capture else None,
                                    offload=p.offload))
        ops.append(device_ops(rank_spans, p.compiled[e], names))
        spans.append(rank_spans)
        act.append(sum(p.activation_bytes[e][c] for c in dev.stages))
    return SimOutput(schedule=p.schedule, devices=list(p.devices), spans=spans, events=events, ops=ops,
                     names=names.items, iteration_time_us=timing.iteration_time_us,
                     activation_bytes_per_microbatch=act, templates=p.templates[0], template_shifts=p.shifts,
                     report_start_us=timing.report_start_us)
