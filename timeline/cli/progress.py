"""Progress on stderr for the long commands (simulate, compare, fit): a rich bar on a terminal,
plain lines otherwise — a CI log or ``2> log`` should still show that work goes on (``fit`` of
the shipped run takes over a minute). ``--no-progress`` silences both.

A callback ``progress(stage, done, total)`` is what the core's ``progress=`` parameters take.
Plain lines are printed when a stage starts, when it ends, and at most every
:data:`PLAIN_INTERVAL_S` in between, so a log gets a handful of lines, not thousands — and only
once the command has worked :data:`PLAIN_DELAY_S`: a quick run (or a quick error, which stays
one ``error:`` line) prints none.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

ProgressFn = Callable[[str, int, int], None]
#: least seconds between two plain lines of one stage (its start and end always print)
PLAIN_INTERVAL_S = 5.0
#: seconds of work before the first plain line
PLAIN_DELAY_S = 2.0


class PlainProgress:
    """``simulate: allocator 3/16 (2.1 s)`` lines on ``stream``."""

    def __init__(self, command: str, stream: TextIO | None = None, interval_s: float = PLAIN_INTERVAL_S,
                 delay_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.command, self.stream, self.interval_s, self.clock = command, stream, interval_s, clock
        self.delay_s = PLAIN_DELAY_S if delay_s is None else delay_s
        self.start = clock()
        self.last: dict[str, float] = {}
        self.ended: set[str] = set()

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        if now - self.start < self.delay_s:
            return
        first = stage not in self.last
        end = total > 0 and done >= total
        if stage in self.ended or not (first or end or now - self.last[stage] >= self.interval_s):
            return
        self.last[stage] = now
        if end:
            self.ended.add(stage)
        stream = self.stream or sys.stderr
        count = f"{done:,}/{total:,}" if total > 0 else f"{done:,}"  # total 0: not known in advance
        print(f"{self.command}: {stage} {count} ({now - self.start:,.1f} s)", file=stream, flush=True)


@contextlib.contextmanager
def progress_reporter(command: str, enabled: bool = True) -> Iterator[ProgressFn]:
    """A progress callback for ``command``: a transient rich bar when stderr is a terminal, plain
    lines when it is not, nothing when not ``enabled``."""
    if not enabled:
        yield lambda stage, done, total: None
        return
    if not sys.stderr.isatty():
        yield PlainProgress(command)
        return
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), transient=True) as bar:
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield update
