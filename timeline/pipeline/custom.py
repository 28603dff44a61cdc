"""The ``csv`` schedule kind: a user's own schedule, one row of cells per pipeline rank.

Cells are PyTorch pipelining's compute actions (``0F0``, ``3I2``, ``5W2``, ``1B4``); an empty
cell is an idle step. Cells of torch's communication format (``2SEND_F1``, ``0RECV_B3``,
``1UNSHARD``, ``1RESHARD``, ``0REDUCE_GRAD``) are skipped: the simulator derives transfers and
gradient reduction itself. An overlapped pair as torch's ``ScheduleDualPipeV`` writes it,
``(0F1;7B0)OVERLAP_F_B``, runs its actions in order. ``pp`` is the number of rows; a chunk is
whatever the actions name, and each rank holds the chunks its row uses, in order of first use
(so V-shaped, looped and DualPipe's doubled placements all work). There must be ``pp·vpp``
chunks.

This module turns rows of text into a validated :class:`Schedule`; it does not read files
(``timeline.io.csv_schedule`` does) and reports positions as 0-based columns of the rows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from timeline.errors import UserError
from timeline.pipeline.actions import Action, Schedule, ScheduleError, require_positive, validate

_COMM = re.compile(r"\d+(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)\d*")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")


def parse_cell(text: str) -> tuple[Action, ...]:
    """The compute actions of one cell: none for idle or communication cells, two for a pair."""
    text = text.strip()
    if not text or _COMM.fullmatch(text):
        return ()
    overlap = _OVERLAP.fullmatch(text)
    if overlap:
        return tuple(a for part in overlap.group(1).split(";") for a in parse_cell(part))
    return (Action.parse(text),)


def from_rows(rows: Sequence[Sequence[str]], *, pp: int, vpp: int, num_microbatches: int) -> Schedule:
    """A validated schedule from one row of cells per rank; errors name rank and column."""
    require_positive(pp=pp, vpp=vpp, num_microbatches=num_microbatches)
    if len(rows) != pp:
        raise UserError(f"the schedule has {len(rows)} rows but pp = {pp}: write one row per pipeline rank")
    actions: list[tuple[Action, ...]] = []
    overlapped: list[tuple[int, ...]] = []
    columns: list[list[int]] = []
    for rank, row in enumerate(rows):
        parsed: list[Action] = []
        pairs: list[int] = []
        where: list[int] = []
        for column, cell in enumerate(row):
            try:
                cell_actions = parse_cell(cell)
            except UserError as error:
                raise ScheduleError(rank, column, str(error)) from None
            if len(cell_actions) > 2:
                raise ScheduleError(
                    rank, column, f"{cell.strip()!r}: an overlapped cell holds one F and one B or I"
                )
            if len(cell_actions) == 2:
                pairs.append(len(parsed))
            parsed += cell_actions
            where += [column] * len(cell_actions)
        actions.append(tuple(parsed))
        overlapped.append(tuple(pairs))
        columns.append(where)
    stages_of_rank = tuple(tuple(dict.fromkeys(a.stage for a in row)) for row in actions)
    schedule = Schedule(
        kind="csv",
        pp=pp,
        num_chunks=pp * vpp,
        num_microbatches=num_microbatches,
        stages_of_rank=stages_of_rank,
        actions=tuple(actions),
        overlapped=tuple(overlapped) if any(overlapped) else (),
    )
    validate(schedule, columns=columns)
    return schedule
