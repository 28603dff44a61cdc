"""ZB-H1: backward split into I and W, never more activations than 1F1B, a third of its bubble."""

from __future__ import annotations

import pytest

from timeline.pipeline import unit_time
from timeline.pipeline.actions import in_flight
from timeline.pipeline.one_f_one_b import one_f_one_b
from timeline.pipeline.zb_h1 import zb_h1

CASES = [(1, 1), (2, 2), (4, 3), (4, 4), (4, 8), (8, 8), (8, 24)]


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_never_holds_more_than_1f1b(pp: int, m: int) -> None:
    ours = zb_h1(pp=pp, num_microbatches=m)
    baseline = one_f_one_b(pp=pp, num_microbatches=m)
    peak_1f1b = max(max(in_flight(row)) for row in baseline.actions)  # rank 0's pp (or m)
    for rank, (row, base) in enumerate(zip(ours.actions, baseline.actions, strict=True)):
        # what waits for its input gradient: exactly 1F1B's count on the same rank
        assert max(in_flight(row, held_until="I")) == max(in_flight(base)) == min(pp - rank, m)
        # what still waits for its weight gradient (some inputs only): never above 1F1B's peak
        assert max(in_flight(row, held_until="W")) <= peak_1f1b


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_f_and_i_follow_1f1b_and_w_is_delayed_by_rank(pp: int, m: int) -> None:
    schedule = zb_h1(pp=pp, num_microbatches=m)
    baseline = one_f_one_b(pp=pp, num_microbatches=m)
    for rank, (row, base) in enumerate(zip(schedule.actions, baseline.actions, strict=True)):
        assert [(a.kind.replace("I", "B"), a.microbatch) for a in row if a.kind != "W"] == [
            (a.kind, a.microbatch) for a in base
        ]
        assert [a.microbatch for a in row if a.kind == "W"] == list(range(m))
        inputs_before_first_w = sum(1 for a in row[: [a.kind for a in row].index("W")] if a.kind == "I")
        assert inputs_before_first_w == min(rank + 1, m)


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (4, 4), (4, 8), (8, 8), (8, 24)])
def test_bubble_is_a_third_of_1f1b(pp: int, m: int) -> None:
    # DualPipe README, ZB1P row: bubble (PP − 1)(F + B − 2W); with F = I = W = 1 and B = I + W
    # that is pp − 1, against 1F1B's 3(pp − 1)
    schedule = zb_h1(pp=pp, num_microbatches=m)
    assert unit_time.execute(schedule.actions, num_chunks=pp).makespan == 3 * m + (pp - 1) * (1 + 2 - 2 * 1)


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (4, 4), (4, 8), (4, 12), (8, 16)])
def test_order_matches_torch_zero_bubble_with_one_chunk_per_rank(torch_order, pp: int, m: int) -> None:
    theirs, _ = torch_order("ScheduleInterleavedZeroBubble", pp=pp, chunks_per_rank=1, num_microbatches=m)
    assert [[str(a) for a in row] for row in zb_h1(pp=pp, num_microbatches=m).actions] == theirs
