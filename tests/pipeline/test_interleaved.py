"""Interleaved 1F1B: Megatron's warm-up, schedule table and rules; torch's order."""

from __future__ import annotations

import pytest

from timeline.errors import UserError
from timeline.pipeline import unit_time
from timeline.pipeline.actions import in_flight
from timeline.pipeline.interleaved import interleaved, schedule_table

# (pp, vpp, m, microbatch_group_size); 0 means pp
CASES = [
    (2, 2, 2, 0),
    (2, 2, 4, 0),
    (4, 2, 4, 0),
    (4, 2, 8, 0),
    (4, 3, 12, 0),
    (4, 2, 10, 5),
    (4, 2, 9, 5),
    (4, 4, 16, 8),
]
CASES += [(8, 2, 16, 0), (8, 2, 32, 0), (3, 2, 7, 7), (4, 2, 8, 4)]


@pytest.mark.parametrize(("pp", "vpp", "m", "group"), CASES)
def test_warmup_matches_megatron_on_every_rank(pp: int, vpp: int, m: int, group: int) -> None:
    schedule = interleaved(pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    n = group or pp
    for rank, row in enumerate(schedule.actions):
        first_backward = next(i for i, a in enumerate(row) if a.kind == "B")
        expected = min((pp - rank - 1) * 2 + (vpp - 1) * n, m * vpp)
        # warm-up forwards, then one F before the first B in the steady state (unless all warm-up)
        assert first_backward == (expected if expected == m * vpp else expected + 1)
        assert max(in_flight(row)) == (expected if expected == m * vpp else expected + 1)


@pytest.mark.parametrize(("pp", "vpp", "m", "group"), CASES)
def test_forwards_follow_megatrons_table_and_backwards_reverse_the_chunks(
    pp: int, vpp: int, m: int, group: int
) -> None:
    schedule = interleaved(pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    table = schedule_table(m, vpp, group or pp)
    for rank, row in enumerate(schedule.actions):
        forwards = [(a.microbatch, a.stage) for a in row if a.kind == "F"]
        backwards = [(a.microbatch, a.stage) for a in row if a.kind == "B"]
        assert forwards == [(mb, chunk * pp + rank) for mb, chunk in table]
        assert backwards == [(mb, (vpp - 1 - chunk) * pp + rank) for mb, chunk in table]


def test_schedule_table_example_from_megatron() -> None:
    # Megatron's comment: PP2 N3 M5 VP2 -> micro-batch 0 1 2 0 1 2 3 4 3 4, chunk 0 0 0 1 1 1 0 0 1 1
    assert schedule_table(5, 2, 3) == [
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 1),
        (1, 1),
        (2, 1),
        (3, 0),
        (4, 0),
        (3, 1),
        (4, 1),
    ]


@pytest.mark.parametrize(("pp", "vpp", "m"), [(4, 2, 8), (4, 4, 16), (8, 2, 32)])
def test_bubble_shrinks_by_vpp(pp: int, vpp: int, m: int) -> None:
    # with F = 1, B = 2 per chunk a rank works 3·m·vpp and waits (pp - 1)·3 (1F1B's bubble / vpp)
    schedule = interleaved(pp=pp, vpp=vpp, num_microbatches=m)
    assert unit_time.execute(schedule.actions, num_chunks=pp * vpp).makespan == 3 * m * vpp + (pp - 1) * 3


@pytest.mark.parametrize(
    ("pp", "vpp", "m", "group", "words"),
    [
        (4, 1, 8, 0, "1f1b"),
        (4, 2, 3, 0, "at least pp"),
        (4, 2, 8, 3, "[pp, num_microbatches]"),
        (4, 2, 8, 9, "[pp, num_microbatches]"),
        (4, 2, 10, 4, "last group of 2"),
    ],
)
def test_megatrons_rules_are_user_errors(pp: int, vpp: int, m: int, group: int, words: str) -> None:
    with pytest.raises(UserError) as error:
        interleaved(pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    assert words in str(error.value)


@pytest.mark.parametrize(
    ("pp", "vpp", "m"), [(2, 2, 2), (2, 2, 4), (4, 2, 8), (4, 2, 10), (4, 3, 6), (4, 2, 16)]
)
def test_order_matches_torch_interleaved_1f1b(torch_order, pp: int, vpp: int, m: int) -> None:
    # torch groups micro-batches in rounds of m // max(1, m // pp); Megatron's group size is that
    group = m // max(1, m // pp)
    theirs, _ = torch_order("ScheduleInterleaved1F1B", pp=pp, chunks_per_rank=vpp, num_microbatches=m)
    ours = interleaved(pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    assert [[str(a) for a in row] for row in ours.actions] == theirs


@pytest.mark.parametrize(("pp", "vpp", "m"), [(2, 2, 4), (4, 2, 8), (2, 3, 6)])
def test_combined_1f1b_adds_one_warmup_forward_and_pairs_the_steady_state(pp: int, vpp: int, m: int) -> None:
    """schedules.py: get_pp_rank_microbatches schedules one extra warm-up forward under
    overlap_moe_expert_parallel_comm; the steady state calls combined_1f1b_schedule_for_interleaved_pipelining
    with both ids (a pair), warm-up and cool-down one side alone."""
    plain = interleaved(pp=pp, vpp=vpp, num_microbatches=m)
    combined = interleaved(pp=pp, vpp=vpp, num_microbatches=m, combined=True)
    assert combined.combined and not plain.combined and plain.overlapped == ()
    for rank in range(pp):
        row = combined.actions[rank]
        warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
        assert all(a.kind == "F" for a in row[:warmup]) and row[warmup].kind == "F"
        assert row[warmup - 1].kind == "F" and (warmup == m * vpp or row[warmup + 1].kind == "B")
        assert combined.overlapped[rank] == tuple(range(warmup, warmup + 2 * (m * vpp - warmup), 2))
        # the same forwards and backwards, in Megatron's table order on each side
        assert [a for a in row if a.kind == "F"] == [a for a in plain.actions[rank] if a.kind == "F"]
        assert [a for a in row if a.kind == "B"] == [a for a in plain.actions[rank] if a.kind == "B"]
