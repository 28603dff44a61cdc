"""ZB-V: V placement, 1F1B's activation bytes, torch's order."""

from __future__ import annotations

import pytest

from timeline.pipeline import unit_time
from timeline.pipeline.actions import in_flight
from timeline.pipeline.zbv import zbv

CASES = [(1, 1), (1, 3), (2, 2), (2, 4), (4, 3), (4, 7), (4, 8), (4, 16), (8, 16)]


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_v_placement(pp: int, m: int) -> None:
    schedule = zbv(pp=pp, num_microbatches=m)
    assert schedule.num_chunks == 2 * pp
    for rank, row in enumerate(schedule.actions):
        assert schedule.stages_of_rank[rank] == (rank, 2 * pp - 1 - rank)
        assert {a.stage for a in row} == {rank, 2 * pp - 1 - rank}


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_activations_stay_within_1f1b(pp: int, m: int) -> None:
    # a ZB-V chunk is half a 1F1B stage, so 1F1B's pp micro-batches are 2·pp chunk-micro-batches
    schedule = zbv(pp=pp, num_microbatches=m)
    for row in schedule.actions:
        assert max(in_flight(row, held_until="I")) <= 2 * pp
        assert max(in_flight(row, held_until="W")) <= 2 * pp
    if m >= 2 * pp:
        assert max(in_flight(schedule.actions[0])) == 2 * pp


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 16), (8, 16)])
def test_every_rank_works_6m(pp: int, m: int) -> None:
    execution = unit_time.execute(zbv(pp=pp, num_microbatches=m).actions, num_chunks=2 * pp)
    assert all(execution.busy(rank) == 6 * m for rank in range(pp))


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (2, 4), (4, 3), (4, 8), (4, 10), (8, 16)])
def test_order_matches_torch_zbv(torch_order, pp: int, m: int) -> None:
    theirs, _ = torch_order("ScheduleZBVZeroBubble", pp=pp, chunks_per_rank=2, num_microbatches=m)
    assert [[str(a) for a in row] for row in zbv(pp=pp, num_microbatches=m).actions] == theirs
