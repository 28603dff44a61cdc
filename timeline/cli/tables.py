"""Terminal tables that fit 100 columns: each subcommand names its columns once, marks the
ones only ``--wide`` shows, and adds full rows; this module drops the hidden cells.

Why a helper: an engineer reads these tables in an 80–100-column terminal or a CI log, where
rich would otherwise squeeze or wrap a 150-column table into something unreadable. Headers
may break over two lines (``"peak\\nalloc"``) so that the numbers, not the labels, set each
column's width. This module formats only; it computes nothing.
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

#: the width every default table fits, whatever the terminal
TABLE_WIDTH = 100
#: a console wide enough that ``--wide`` tables are never squeezed, even when piped
WIDE_WIDTH = 400


@dataclass(frozen=True, slots=True)
class Column:
    """One column: its header, alignment, and whether only ``--wide`` shows it."""

    header: str
    justify: str = "right"
    wide: bool = False
    no_wrap: bool = True  # False: the one column rich may fold when the others need the room


class View:
    """A rich table of ``columns`` under ``title``; :meth:`row` takes every column's cell and keeps
    those the view shows."""

    def __init__(self, title: str, columns: Sequence[Column], *, wide: bool = False) -> None:
        self.keep = [wide or not c.wide for c in columns]
        self.title = title  # printed above the table, not as its title: rich would wrap it to the table's width
        self.table = Table(box=box.SIMPLE_HEAVY, show_edge=False, pad_edge=False, collapse_padding=True)
        for col, keep in zip(columns, self.keep, strict=True):
            if keep:
                self.table.add_column(col.header, justify=col.justify, no_wrap=col.no_wrap,  # type: ignore[arg-type]
                                      overflow="ellipsis" if col.no_wrap else "fold")

    def row(self, *cells: str, **kwargs: Any) -> None:
        if len(cells) != len(self.keep):
            raise ValueError(f"a row needs {len(self.keep)} cells, got {len(cells)}")
        self.table.add_row(*[c for c, k in zip(cells, self.keep, strict=True) if k], **kwargs)


    def print(self, console: Console) -> None:
        for line in self.title.splitlines():
            console.print(line, markup=False, highlight=False, overflow="fold")
        console.print(self.table)


def add_wide(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wide", action="store_true",
                        help=f"show every column (the default table fits {TABLE_WIDTH} columns)")


def table_console(wide: bool = False) -> Console:
    """A console for tables: :data:`TABLE_WIDTH` wide (or the terminal, if narrower is not asked
    for), or wide enough for every ``--wide`` column."""
    if wide:
        return Console(width=max(WIDE_WIDTH, shutil.get_terminal_size((WIDE_WIDTH, 40)).columns))
    return Console(width=TABLE_WIDTH)
