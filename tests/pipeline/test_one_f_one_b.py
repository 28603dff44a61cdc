"""1F1B: Megatron's warm-up count, the activation bound pp − r, the makespan, torch's order."""

from __future__ import annotations

import pytest

from timeline.pipeline import unit_time
from timeline.pipeline.actions import in_flight
from timeline.pipeline.one_f_one_b import one_f_one_b

CASES = [(1, 1), (1, 5), (2, 1), (2, 2), (4, 2), (4, 4), (4, 9), (8, 8), (8, 32), (16, 32)]


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_in_flight_never_exceeds_pp_minus_rank_and_reaches_it(pp: int, m: int) -> None:
    schedule = one_f_one_b(pp=pp, num_microbatches=m)
    for rank, row in enumerate(schedule.actions):
        peak = max(in_flight(row))
        assert peak <= pp - rank
        # with at least pp micro-batches every rank fills up to exactly pp - r
        assert peak == min(pp - rank, m)


@pytest.mark.parametrize(("pp", "m"), CASES)
def test_warmup_is_megatrons_count(pp: int, m: int) -> None:
    schedule = one_f_one_b(pp=pp, num_microbatches=m)
    for rank, row in enumerate(schedule.actions):
        kinds = "".join(a.kind for a in row)
        warmup = min(pp - rank - 1, m)
        # warm-up forwards, then strict F B alternation, then the remaining backwards
        assert kinds == "F" * warmup + "FB" * (m - warmup) + "B" * warmup
        assert [a.microbatch for a in row if a.kind == "F"] == list(range(m))
        assert [a.microbatch for a in row if a.kind == "B"] == list(range(m))


@pytest.mark.parametrize(("pp", "m"), CASES)
@pytest.mark.parametrize(("t_f", "t_b"), [(1, 2), (2, 3), (1, 1)])
def test_makespan_is_m_plus_pp_minus_one_times_f_plus_b(pp: int, m: int, t_f: int, t_b: int) -> None:
    schedule = one_f_one_b(pp=pp, num_microbatches=m)
    execution = unit_time.execute(schedule.actions, num_chunks=pp, durations={"F": t_f, "B": t_b})
    assert execution.makespan == (m + pp - 1) * (t_f + t_b)


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (4, 4), (4, 8), (4, 9), (8, 16)])
def test_order_matches_torch_schedule_1f1b(torch_order, pp: int, m: int) -> None:
    theirs, _ = torch_order("Schedule1F1B", pp=pp, chunks_per_rank=1, num_microbatches=m)
    ours = [[str(a) for a in row] for row in one_f_one_b(pp=pp, num_microbatches=m).actions]
    assert ours[:-1] == theirs[:-1]
    # Schedule1F1B's listing (torch 2.13) numbers the last rank's forwards from 1, to m: with no
    # warm-up its counter is bumped before first use. Its runtime counts from 0, as we do.
    last = pp - 1
    assert theirs[-1] == [
        f"{last}F{k + 1}" if i % 2 == 0 else f"{last}B{k}" for k in range(m) for i in (0, 1)
    ]
    assert ours[-1] == [f"{last}F{k}" if i % 2 == 0 else f"{last}B{k}" for k in range(m) for i in (0, 1)]


def test_combined_1f1b_without_pipelining_pairs_each_forward_with_the_previous_backward() -> None:
    """combined_1f1b.py: combined_1f1b_schedule_for_no_pipelining: F0 alone, F(k+1)&B(k), B(m−1) alone."""
    s = one_f_one_b(pp=1, num_microbatches=4, combined=True)
    assert " ".join(map(str, s.actions[0])) == "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3"
    assert s.overlapped == ((1, 3, 5),) and s.combined
    assert max(in_flight(s.actions[0])) == 2  # plain 1F1B at pp = 1 holds one
    assert max(in_flight(one_f_one_b(pp=1, num_microbatches=4).actions[0])) == 1
