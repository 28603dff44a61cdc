"""The unit-time executor: start times from rank order and dependencies; deadlocks detected."""

from __future__ import annotations

import pytest

from timeline.pipeline.actions import Action
from timeline.pipeline.unit_time import Deadlock, execute


def rows(*texts: str) -> list[list[Action]]:
    return [[Action.parse(t) for t in text.split()] for text in texts]


def test_two_ranks_one_microbatch() -> None:
    execution = execute(rows("0F0 0B0", "1F0 1B0"), num_chunks=2)
    assert [(t.start, t.end) for t in execution.rows[0]] == [(0, 1), (4, 6)]
    assert [(t.start, t.end) for t in execution.rows[1]] == [(1, 2), (2, 4)]
    assert execution.makespan == 6
    assert execution.busy(0) == 3


def test_weight_gradient_waits_for_nothing_but_its_input_gradient() -> None:
    execution = execute(rows("0F0 0I0 0W0", "1F0 1I0 1W0"), num_chunks=2, durations={"W": 5})
    assert [(t.start, t.end) for t in execution.rows[1]] == [(1, 2), (2, 3), (3, 8)]
    assert [(t.start, t.end) for t in execution.rows[0]] == [(0, 1), (3, 4), (4, 9)]


def test_overlapped_pair_starts_when_both_halves_can() -> None:
    # rank 0's 0F1 could start at 1, but paired with 0B0 it waits for 1B0 (ends at 4)
    paired = execute(rows("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"), num_chunks=2, overlapped=[(1,), ()])
    assert [t.start for t in paired.rows[0]] == [0, 4, 5, 8]
    free = execute(rows("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"), num_chunks=2)
    assert [t.start for t in free.rows[0]] == [0, 1, 4, 7]


def test_deadlock_reports_every_stuck_rank() -> None:
    with pytest.raises(Deadlock) as error:
        execute(rows("0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"), num_chunks=2)
    assert error.value.stuck == ((0, 1, "0B0", "1B0 or 1I0"), (1, 0, "1F1", "0F1"))
