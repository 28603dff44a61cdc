"""The staged simulation: the plan's devices follow the schedule's own placement, the stages
compose to ``simulate``, and the event log carries each action's iteration."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from helpers_run import tiny_run
from sources import plan_of

from timeline.graph.source import model_source
from timeline.io.csv_schedule import parse_csv, write_csv
from timeline.pipeline import build_schedule
from timeline.placement import chunk_holders
from timeline.sim.plan import plan_pipeline
from timeline.sim.simulate import expand_plan, simulate
from timeline.sim.timing import time_plan


def test_a_csv_schedule_places_the_devices_as_its_rows_do():
    """A V-shaped schedule written as CSV holds on each rank the chunks its rows run, not the
    looped default (``pipeline.placement``); its devices equal the V schedule's own."""
    zbv = tiny_run(schedule="zbv", pp=2, vpp=2, layers=4, num_microbatches=4)
    rows = parse_csv(write_csv(build_schedule("zbv", pp=2, vpp=2, num_microbatches=4)), source="v.csv")
    csv = replace(tiny_run(schedule="csv", pp=2, vpp=2, layers=4, num_microbatches=4),
                  csv_rows=tuple(tuple(r) for r in rows))
    ours, theirs = plan_of(zbv), plan_of(csv)
    assert [d.stages for d in theirs.devices] == [(0, 3), (1, 2)] == [d.stages for d in ours.devices]
    assert [(d.weights_bytes, d.optimizer_bytes, d.layers) for d in theirs.devices] == [
        (d.weights_bytes, d.optimizer_bytes, d.layers) for d in ours.devices]


def test_dualpipe_chunks_are_timed_by_their_first_holder():
    run = tiny_run(schedule="dualpipe", pp=2, layers=2, num_microbatches=4)
    pipe = plan_pipeline(run.schedule, run.parallel, run.training.num_microbatches, run.hardware)
    assert pipe.schedule.stages_of_rank == ((0, 1), (1, 0))
    assert pipe.holders == chunk_holders(pipe.schedule.stages_of_rank) == {0: 0, 1: 0}


def test_the_stages_compose_to_simulate_and_events_carry_their_iteration():
    run = tiny_run(pp=2, layers=2, num_microbatches=3, iterations=2, warmup_iterations=1)
    sim = simulate(plan_of(run, model_source))
    p = plan_of(run)
    again = expand_plan(p, time_plan(p, run.training.warmup_iterations))
    assert again.names == sim.names and again.iteration_time_us == sim.iteration_time_us
    for d, ev in enumerate(sim.events):
        np.testing.assert_array_equal(ev.t_us, again.events[d].t_us)
        spans = sim.spans[d]
        expected = np.array([spans[a].iteration if a >= 0 else -1 for a in ev.action], dtype=np.int32)
        np.testing.assert_array_equal(ev.iteration, expected)
        assert set(ev.iteration.tolist()) == {-1, 0, 1, 2}  # static state, one warm-up, two reported
        assert ev.microbatch.min() == -1 and ev.microbatch.max() == run.training.num_microbatches - 1
