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
from timeline.sim.expand import device_events
from timeline.sim.memory import AllocatorPass, run_allocator
from timeline.sim.output import DeviceEvents, Names, SimOutput
from timeline.sim.plan import SimPlan, plan, plan_pipeline
from timeline.sim.simulate import simulate
from timeline.sim.static_state import StateRules
from timeline.sim.timing import microbatch_map, time_plan
from timeline.spec.run import AllocatorSpec, RunSpec

Progress = Callable[[str, int, int], None]


#: outputs that read a Timeline's per-device summaries only (``summary_only`` builds suffice)
SUMMARY_LEVEL = frozenset({"summary", "devices"})


def build_timeline(run: RunSpec, source_fn: SourceFn = model_source, *,
                   progress: Progress | None = None, summary_only: bool = False, timing_only: bool = False) -> Timeline:
    """Simulate ``run`` with the model source ``source_fn(run)`` and run every device's allocator.
    ``summary_only``: a :class:`~timeline.result.summary_level.SummaryTimeline` (enough for the
    outputs of :data:`SUMMARY_LEVEL`), made one device at a time, each reduced to its summaries
    before the next is simulated, so memory holds one device's events, not the run's.
    ``timing_only``: the run's facts, devices and action spans without any memory event (its
    ``meta.iteration_time_us`` is the one the full build reports: the memory events never move
    time); what a planner reads to order candidates before it simulates their memory."""
    par, tr = run.parallel, run.training
    if run.trace is not None and run.trace.is_step:
        from timeline.sim.step_sim import simulate_steps

        sim = simulate_steps(run.trace, tr, CostModel.of(run.hardware, par))
    else:
        pipe = plan_pipeline(run.schedule, par, tr.num_microbatches, run.hardware, run.csv_rows)
        rules = StateRules(profile=run.profile, framework=run.framework, sm=run.hardware.sm,
                           traced=run.trace is not None,
                           expert_state_group=profile(run.profile).params.expert_state_group,
                           combined_1f1b=run.schedule.combined_1f1b)
        p = plan(source_fn(run), pipe, model=run.model, training=tr, parallel=par, rules=rules,
                 recompute=run.recompute, offload=run.offload)
        if summary_only or timing_only:
            timing = time_plan(p, tr.warmup_iterations)
            act = [sum(p.activation_bytes[p.load_of(i)][c] for c in dev.stages) for i, dev in enumerate(p.devices)]
            base = Timeline.from_simulation(SimOutput(  # the run's facts and devices, no events yet
                schedule=p.schedule, devices=list(p.devices), spans=[timing.per_rank[d.pp_rank] for d in p.devices],
                events=[], ops=[], names=[], iteration_time_us=timing.iteration_time_us,
                activation_bytes_per_microbatch=act, templates=p.templates[0], template_shifts=p.shifts,
                report_start_us=timing.report_start_us, run=run), [])
            if timing_only:
                return base
            return _summary(p, base, run.allocator, run.hardware.capacity_bytes, progress)
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


def _summary(p: SimPlan, base: Timeline, allocator: AllocatorSpec, capacity_bytes: int,
             progress: Progress | None) -> Timeline:
    """The summary-level Timeline of plan ``p`` (``base``: its facts, devices and spans; see
    :func:`build_timeline`)."""
    from timeline.result.summary_level import summary_timeline

    names = Names()
    spans = base.spans

    def run_device(i: int) -> tuple[DeviceEvents, AllocatorPass]:
        if progress:
            progress("allocator", i, len(p.devices))
        ev = device_events(p.training, p.devices[i], p.states[i], spans[i], p.compiled[p.load_of(i)], names,
                           (p.capture[p.load_of(i)], p.capture_rules[p.load_of(i)]) if p.capture else None,
                           offload=p.offload)
        return ev, run_allocator(allocator, capacity_bytes, ev, names.items)

    first: dict[tuple, int] = {}
    maps: dict[tuple[int, int], dict[int, int] | None] = {}

    def same_as(i: int) -> tuple[int, dict[int, int]] | None:
        """An earlier device with the same chunks, EP load and static state whose rank's spans are
        this one's under a micro-batch renaming (DualPipe's mirrored ranks), and the renaming."""
        dev = p.devices[i]
        if p.states[i].per_parameter:
            return None
        j = first.setdefault((tuple(sorted(dev.stages)), p.load_of(i), p.states[i]), i)
        if j == i:
            return None
        pair = (p.devices[j].pp_rank, dev.pp_rank)
        if pair not in maps:
            maps[pair] = microbatch_map(spans[j], spans[i])
        rename = maps[pair]
        return None if rename is None else (j, rename)

    tl = summary_timeline(base, spans, names.items, run_device, same_as)
    if progress:
        progress("allocator", len(p.devices), len(p.devices))
    return tl
