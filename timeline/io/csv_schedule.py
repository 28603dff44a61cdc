"""Read and write pipeline schedules as CSV, in PyTorch pipelining's compute-only format.

One row per pipeline rank, one cell per step: an action ``[stage][F|B|I|W][micro-batch]``
(``0F0``, ``3I2``) or an empty cell for an idle step. This is what torch's ``_dump_csv``
writes (``csv.writer``, no header) and ``_load_csv`` reads. Also accepted: torch's communication
cells (``2SEND_F1``, ``1UNSHARD``, ``0REDUCE_GRAD``), which the schedule skips; overlapped pairs
``(0F1;7B0)OVERLAP_F_B`` as torch's ``ScheduleDualPipeV`` writes them; and one header row
(a first row in which no cell is an action, such as ``Rank 0,Step 0,…``).

Only the text is checked here: each cell's syntax, with the file, rank (row after any header)
and 0-based column. Whether the actions form a runnable schedule is
``timeline.pipeline.build_schedule("csv", csv_rows=...)``'s job; it reports the same rank and
column. This module imports nothing from the core.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from timeline.errors import UserError

_COMPUTE = r"\d+[FBIW]\d+"
_COMM = r"\d+(?:SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD)\d*"
_CELL = re.compile(rf"|{_COMPUTE}|{_COMM}|\((?:{_COMPUTE};)+{_COMPUTE}\)OVERLAP_F_B")
_SYNTAX = "expected [stage][F|B|I|W][micro-batch] such as 0F3, or an empty cell for an idle step"


class CsvScheduleError(UserError):
    """A cell that is not an action: names the file, the rank (row) and the 0-based column."""

    def __init__(self, source: str, rank: int, position: int, reason: str) -> None:
        self.source, self.rank, self.position, self.reason = source, rank, position, reason
        super().__init__(f"{source}: rank {rank}, position {position}: {reason}")


class _HasActions(Protocol):
    @property
    def actions(self) -> Sequence[Sequence[object]]: ...
    @property
    def overlapped(self) -> Sequence[Sequence[int]]: ...


def _is_header(row: Sequence[str]) -> bool:
    cells = [cell.strip() for cell in row if cell.strip()]
    return bool(cells) and not any(_CELL.fullmatch(cell) for cell in cells)


def parse_csv(text: str, *, source: str = "<csv>") -> list[list[str]]:
    """The cells of each rank, stripped; raises :class:`CsvScheduleError` for unknown cells."""
    rows = [list(row) for row in csv.reader(io.StringIO(text))]
    while rows and not any(cell.strip() for cell in rows[-1]):
        rows.pop()  # trailing blank lines are not ranks
    if rows and _is_header(rows[0]):
        rows = rows[1:]
    result = []
    for rank, row in enumerate(rows):
        cells = [cell.strip() for cell in row]
        for position, cell in enumerate(cells):
            if not _CELL.fullmatch(cell):
                raise CsvScheduleError(source, rank, position, f"unknown action {cell!r}: {_SYNTAX}")
        result.append(cells)
    if not result:
        raise UserError(f"{source}: no schedule rows; write one row of actions per pipeline rank")
    return result


def read_csv(path: str | Path) -> list[list[str]]:
    """:func:`parse_csv` of the file at ``path`` (UTF-8)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UserError(f"{path}: cannot read the schedule: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a text file, expected a CSV schedule") from None
    return parse_csv(text, source=str(path))


def write_csv(schedule: _HasActions) -> str:
    """The schedule's actions, one row per rank, in execution order without idle cells.

    Overlapped F&B pairs are written as torch writes them, ``(0F1;7B0)OVERLAP_F_B``. Lines end
    with ``\\n`` so the same schedule always gives the same bytes.
    """
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for rank, row in enumerate(schedule.actions):
        pairs = set(schedule.overlapped[rank]) if rank < len(schedule.overlapped) else set()
        cells: list[str] = []
        index = 0
        while index < len(row):
            if index in pairs:
                cells.append(f"({row[index]};{row[index + 1]})OVERLAP_F_B")
                index += 2
            else:
                cells.append(str(row[index]))
                index += 1
        writer.writerow(cells)
    return out.getvalue()
