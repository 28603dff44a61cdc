"""DualPipe: two directions, 2× parameters, the README's activation and bubble columns."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.pipeline import unit_time
from timeline.pipeline.actions import in_flight
from timeline.pipeline.dualpipe import dualpipe

CASES = [(2, 4), (2, 6), (4, 8), (4, 10), (6, 12), (6, 14), (8, 16), (8, 20), (8, 32)]


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_each_rank_holds_two_chunks_so_twice_the_parameters(pp: int, m: int) -> None:
    schedule = dualpipe(pp=pp, num_microbatches=m)
    assert schedule.num_chunks == pp
    held = [stage for stages in schedule.stages_of_rank for stage in stages]
    assert sorted(held) == sorted(list(range(pp)) * 2)  # every chunk on two ranks
    for rank, row in enumerate(schedule.actions):
        assert schedule.stages_of_rank[rank] == (rank, pp - 1 - rank)
        # direction 0 (micro-batches 0..m/2-1) runs chunk r here, direction 1 chunk pp-1-r
        assert {a.stage for a in row if a.microbatch < m // 2} == {rank}
        assert {a.stage for a in row if a.microbatch >= m // 2} == {pp - 1 - rank}


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_activations_match_readme(pp: int, m: int) -> None:
    # README "Activation Per Device": PP + 1, in units of one micro-batch through one of the PP
    # stages, which is our chunk; the +1 is the forward of an overlapped F&B pair allocating
    # before its backward frees
    schedule = dualpipe(pp=pp, num_microbatches=m)
    for row in schedule.actions:
        assert max(in_flight(row)) == pp + 1


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_bubble_matches_readme(pp: int, m: int) -> None:
    # README "Bubble": (PP/2 − 1)(F&B + B − 3W). Unit time F = 1, B = 2, W = 1, an overlapped
    # F&B = 3: each rank works 3m (m forwards and m backwards of one chunk-micro-batch) and
    # waits 2(pp/2 − 1); for pp = 8, m = 20 that is the README figure's 66 steps per row
    schedule = dualpipe(pp=pp, num_microbatches=m)
    execution = unit_time.execute(schedule.actions, num_chunks=pp, overlapped=schedule.overlapped)
    assert all(execution.busy(rank) == 3 * m for rank in range(pp))
    assert execution.makespan == 3 * m + (pp // 2 - 1) * (3 + 2 - 3 * 1)


@pytest.mark.parametrize(
    ("pp", "m", "words"),
    [(3, 12, "even pp"), (4, 9, "even num_microbatches"), (4, 6, "at least 2·pp = 8")],
)
def test_impossible_combinations_are_user_errors(pp: int, m: int, words: str) -> None:
    with pytest.raises(UserError) as error:
        dualpipe(pp=pp, num_microbatches=m)
    assert words in str(error.value)
