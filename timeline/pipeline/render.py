"""Draw a schedule as text for a terminal: ranks as rows, unit time steps as columns.

Each action starts where the unit-time executor (``unit_time``) places it: ``F``, ``I`` and
``W`` take one step and a full backward ``B`` two, unless ``durations`` says otherwise
(whole numbers only). A cell shows the action (``0F3``) in its first step, ``-`` in the steps
it continues into, and ``.`` when the rank is idle. This is a pure function of the schedule; it
does not print, and it shows order and dependencies, not the simulator's measured times.
"""

from __future__ import annotations

from collections.abc import Mapping

from timeline.pipeline import unit_time
from timeline.pipeline.actions import Schedule


def render(schedule: Schedule, *, durations: Mapping[str, float] | None = None,
           steps: tuple[int, int | None] | None = None) -> str:
    """The schedule as lines of fixed-width cells, ending with a newline; ``steps = (a, b)`` draws
    only steps ``a`` … ``b − 1`` (0-based, half-open; ``b`` None: to the end), so a long row fits
    a terminal. An action that starts before the window shows as ``-`` where it continues."""
    cost = {**unit_time.DEFAULT_DURATIONS, **(durations or {})}
    if any(float(v) != int(v) or v < 1 for v in cost.values()):
        raise ValueError(f"render needs whole durations of at least 1, not {dict(cost)}")
    execution = unit_time.execute(
        schedule.actions, num_chunks=schedule.num_chunks, durations=cost, overlapped=schedule.overlapped
    )
    total = int(execution.makespan)
    width = max([3, len(str(total - 1)), *(len(str(a)) for row in schedule.actions for a in row)])
    label = max(len(f"rank {schedule.pp - 1}"), len("step"))
    grid = [["."] * total for _ in range(schedule.pp)]
    for rank, row in enumerate(execution.rows):
        for timed in row:
            start, end = int(timed.start), int(timed.end)
            grid[rank][start] = str(timed.action)
            for t in range(start + 1, end):
                grid[rank][t] = "-"
    legend = " ".join(f"{kind}={int(cost[kind])}" for kind in ("F", "B", "I", "W"))
    lo, hi = 0, total
    if steps is not None:
        lo, hi = max(0, steps[0]), min(total, total if steps[1] is None else steps[1])
    shown = f" [{lo}:{hi}]" if (lo, hi) != (0, total) else ""
    lines = [
        f"{schedule.kind}: pp={schedule.pp} chunks={schedule.num_chunks} "
        f"micro-batches={schedule.num_microbatches} steps={total}{shown} ({legend}; '.' idle, '-' continues)",
        f"{'step':<{label}} | " + " ".join(f"{t:>{width}}" for t in range(lo, hi)),
    ]
    for rank, cells in enumerate(grid):
        lines.append(f"{f'rank {rank}':<{label}} | " + " ".join(f"{c:>{width}}" for c in cells[lo:hi]))
    return "\n".join(line.rstrip() for line in lines) + "\n"
