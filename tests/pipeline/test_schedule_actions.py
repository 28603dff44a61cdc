"""Actions, schedules and validate(): the notation and what every schedule must satisfy."""

from __future__ import annotations

import dataclasses

import pytest

from timeline.errors import UserError
from timeline.pipeline.actions import Action, Schedule, ScheduleError, in_flight, validate


def schedule(
    *rows: str, stages: tuple[tuple[int, ...], ...] | None = None, chunks: int | None = None, m: int = 1
):
    actions = tuple(tuple(Action.parse(cell) for cell in row.split()) for row in rows)
    held = stages or tuple((rank,) for rank in range(len(rows)))
    return Schedule(
        kind="csv",
        pp=len(rows),
        num_chunks=chunks or len(rows),
        num_microbatches=m,
        stages_of_rank=held,
        actions=actions,
    )


def test_action_text_round_trip() -> None:
    for text in ("0F0", "3I2", "5W2", "12B31"):
        assert str(Action.parse(text)) == text
    assert Action.parse(" 1F4 ") == Action(stage=1, kind="F", microbatch=4)


def test_action_is_frozen_and_checked() -> None:
    action = Action(stage=0, kind="F", microbatch=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        action.stage = 1  # type: ignore[misc]
    with pytest.raises(ValueError):
        Action(stage=0, kind="X", microbatch=0)
    with pytest.raises(UserError, match="unknown action '0Q1'"):
        Action.parse("0Q1")


def test_valid_schedule_passes() -> None:
    validate(schedule("0F0 0F1 0B0 0B1", "1F0 1I0 1F1 1I1 1W0 1W1", m=2))


@pytest.mark.parametrize(
    ("rows", "rank", "position", "words"),
    [
        (("0F0 0B0", "1F0 1F0 1B0"), 1, 1, "1F0 runs twice (first at rank 1, position 0)"),
        (("0F0 0B0", "1B0 1F0"), 1, 0, "1B0 runs before its 1F0 (position 1)"),
        (("0F0 0B0", "1F0 1W0 1I0"), 1, 1, "1W0 runs before its 1I0"),
        (("0F0 0B0", "1F0 1B0 1I0"), 1, 2, "already has 1B0"),
        (("0F0 0B0", "1F0 1I0"), 1, None, "has 1I0 but no 1W0"),
        (("0F0 0B0", "1F0"), 1, None, "never runs backward"),
        (("0F0 0B0", "1F0 1B0 2F0"), 1, 2, "stage 2 does not exist"),
        (("0F0 0B0", "1F0 1B0 1F3"), 1, 2, "micro-batch 3 does not exist"),
        (("0F0 0B0 1F0", "1B0"), 0, 2, "stage 1 is not on this rank"),
    ],
)
def test_problems_name_rank_position_and_reason(
    rows: tuple[str, ...], rank: int, position: int | None, words: str
) -> None:
    with pytest.raises(ScheduleError) as error:
        validate(schedule(*rows))
    assert (error.value.rank, error.value.position) == (rank, position)
    assert words in error.value.reason


def test_deadlock_names_the_stuck_rank() -> None:
    # rank 1 wants 1F1 first, which needs 0F1; rank 0 runs 0F1 only after 0B0, which needs 1B0
    with pytest.raises(ScheduleError) as error:
        validate(schedule("0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1", m=2))
    assert error.value.rank == 0 and error.value.position == 1
    assert "deadlock: 0B0 waits for 1B0 or 1I0" in error.value.reason


def test_overlapped_pair_must_be_forward_then_backward() -> None:
    good = schedule("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1", m=2)
    validate(dataclasses.replace(good, overlapped=((1,), ())))  # 0F1 & 0B0
    with pytest.raises(ScheduleError, match="overlapped pair") as error:
        validate(dataclasses.replace(good, overlapped=((), (1,))))  # 1B0 & 1F1
    assert (error.value.rank, error.value.position) == (1, 1)


def test_in_flight_counts_until_input_or_weight_gradient() -> None:
    row = [Action.parse(t) for t in "0F0 0F1 0I0 0F2 0W0 0B1 0I2 0W2".split()]
    assert in_flight(row) == [1, 2, 1, 2, 2, 1, 0, 0]
    assert in_flight(row, held_until="W") == [1, 2, 2, 3, 2, 1, 1, 0]
