"""DualPipeV: V placement, the README's activation and bubble columns, torch's order."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.pipeline import unit_time
from timeline.pipeline.actions import in_flight
from timeline.pipeline.dualpipev import dualpipev

CASES = [(1, 2), (1, 5), (2, 4), (2, 7), (3, 7), (4, 8), (4, 10), (8, 16), (8, 20)]


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_activations_match_readme(pp: int, m: int) -> None:
    # README "Activation Per Device": PP + 1 where PP counts pipeline *stages*; DualPipeV puts
    # PP = 2·pp stages on PP/2 = pp devices, so in our chunk-micro-batch units that is 2·pp + 1
    schedule = dualpipev(pp=pp, num_microbatches=m)
    for rank, row in enumerate(schedule.actions):
        assert {a.stage for a in row} == {rank, 2 * pp - 1 - rank}
        assert max(in_flight(row)) == 2 * pp + 1


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_bubble_matches_readme(pp: int, m: int) -> None:
    # README "Bubble": (PP/2 − 1)(F&B + B − 3W) with PP = 2·pp stages; unit time F = 1, B = 2,
    # W = 1, F&B = 3; each rank works 6m (two chunks); pp = 4, m = 10 gives the figure's 66
    schedule = dualpipev(pp=pp, num_microbatches=m)
    execution = unit_time.execute(schedule.actions, num_chunks=2 * pp, overlapped=schedule.overlapped)
    assert all(execution.busy(rank) == 6 * m for rank in range(pp))
    assert execution.makespan == 6 * m + (pp - 1) * (3 + 2 - 3 * 1)


def test_needs_2pp_microbatches() -> None:
    with pytest.raises(UserError, match="at least 2·pp = 8"):
        dualpipev(pp=4, num_microbatches=7)


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (2, 5), (4, 8), (4, 10), (4, 13), (8, 16)])
def test_order_and_overlapped_pairs_match_torch_dualpipev(torch_order, pp: int, m: int) -> None:
    theirs, their_pairs = torch_order("ScheduleDualPipeV", pp=pp, chunks_per_rank=2, num_microbatches=m)
    ours = dualpipev(pp=pp, num_microbatches=m)
    assert [[str(a) for a in row] for row in ours.actions] == theirs
    assert [list(pairs) for pairs in ours.overlapped] == their_pairs
