"""Build a :class:`Timeline` from a run: simulate, then run every device's allocator.

:func:`build_timeline` is the simulation's door (``tests/test_layering.py``): the one place
below the CLI where a whole run enters the simulator; it hands each stage its slice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from timeline.graph.source import SourceFn, model_source
from timeline.profiles import profile
from timeline.result.timeline import DeviceMemory, Timeline
from timeline.sim.cost import CostModel
from timeline.sim.memory import run_allocator
from timeline.sim.plan import plan, plan_pipeline
from timeline.sim.simulate import simulate
from timeline.sim.static_state import StateRules
from timeline.spec.run import RunSpec

Progress = Callable[[str, int, int], None]


def build_timeline(run: RunSpec, source_fn: SourceFn = model_source, *,
                   progress: Progress | None = None) -> Timeline:
    """Simulate ``run`` with the model source ``source_fn(run)`` and run every device's allocator."""
    par, tr = run.parallel, run.training
    if run.trace is not None and run.trace.is_step:
        from timeline.sim.step_sim import simulate_steps

        sim = simulate_steps(run.trace, tr, CostModel.of(run.hardware, par))
    else:
        pipe = plan_pipeline(run.schedule, par, tr.num_microbatches, run.hardware, run.csv_rows)
        rules = StateRules(profile=run.profile, framework=run.framework, sm=run.hardware.sm,
                           traced=run.trace is not None,
                           expert_state_group=profile(run.profile).params.expert_state_group)
        p = plan(source_fn(run), pipe, model=run.model, training=tr, parallel=par, rules=rules)
        sim = simulate(p, progress=progress)
    sim = replace(sim, run=run)
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
