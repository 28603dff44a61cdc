"""GPipe: every rank holds all m micro-batches; order and makespan; torch's order."""

from __future__ import annotations

import pytest

from timeline.pipeline import unit_time
from timeline.pipeline.actions import in_flight
from timeline.pipeline.gpipe import gpipe


@pytest.mark.parametrize(("pp", "m"), [(1, 1), (2, 3), (4, 8), (8, 4)])
def test_every_rank_holds_all_microbatches(pp: int, m: int) -> None:
    schedule = gpipe(pp=pp, num_microbatches=m)
    for rank, row in enumerate(schedule.actions):
        assert max(in_flight(row)) == m
        assert [str(a) for a in row] == [f"{rank}F{k}" for k in range(m)] + [f"{rank}B{k}" for k in range(m)]


@pytest.mark.parametrize(("pp", "m"), [(1, 1), (2, 3), (4, 8), (8, 4)])
def test_makespan_matches_1f1b_formula(pp: int, m: int) -> None:
    # fill-drain has the same bubble as 1F1B: (pp - 1)(F + B)
    schedule = gpipe(pp=pp, num_microbatches=m)
    assert unit_time.execute(schedule.actions, num_chunks=pp).makespan == (m + pp - 1) * 3


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (4, 3), (4, 8)])
def test_order_matches_torch_schedule_gpipe(torch_order, pp: int, m: int) -> None:
    theirs, _ = torch_order("ScheduleGPipe", pp=pp, chunks_per_rank=1, num_microbatches=m)
    assert [[str(a) for a in row] for row in gpipe(pp=pp, num_microbatches=m).actions] == theirs
