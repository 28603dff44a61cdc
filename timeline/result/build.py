"""Build a :class:`Timeline` from a run: simulate, then run every device's allocator."""

from __future__ import annotations

from collections.abc import Callable

from timeline.graph.ops import ChunkTemplate
from timeline.result.timeline import DeviceMemory, Timeline
from timeline.sim.memory import run_allocator
from timeline.sim.simulate import simulate
from timeline.spec.run import RunSpec

Progress = Callable[[str, int, int], None]


def build_timeline(run: RunSpec, template_fn: Callable[..., ChunkTemplate], *,
                   progress: Progress | None = None) -> Timeline:
    if run.trace is not None and run.trace.is_step:
        from timeline.sim.step_sim import simulate_steps

        sim = simulate_steps(run)
    else:
        sim = simulate(run, template_fn, progress=progress)
    memory = []
    for d, ev in enumerate(sim.events):
        if progress:
            progress("allocator", d, len(sim.events))
        res = run_allocator(run.allocator, run.hardware.capacity_bytes, ev, sim.names)
        memory.append(DeviceMemory(block_bytes=res.block, reserved=res.reserved, address=res.address,
                                   segment=res.segment, oom=res.ooms, segment_events=res.segment_events,
                                   end_segments=res.end_segments, pair=res.pair))
    if progress:
        progress("allocator", len(sim.events), len(sim.events))
    return Timeline.from_simulation(sim, memory)
