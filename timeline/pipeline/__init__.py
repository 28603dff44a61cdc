"""Pipeline schedules: per pipeline rank, the ordered actions (F / B / I / W of a chunk and a
micro-batch) that the simulator executes.

One module per schedule, each a pure function; :data:`GENERATORS` maps a ``[schedule] kind``
to its function and :func:`build_schedule` picks one, checks the combination and validates the
result. Placement of chunks on ranks is in ``placement``, the notation in ``actions``, a
unit-time executor in ``unit_time`` and a text view in ``render``. This package does not
simulate time or memory and does not read files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from timeline.errors import UserError
from timeline.pipeline.actions import (
    Action,
    Schedule,
    ScheduleError,
    require_positive,
    require_rules,
    validate,
)
from timeline.pipeline.custom import from_rows
from timeline.pipeline.dualpipe import dualpipe
from timeline.pipeline.dualpipev import dualpipev
from timeline.pipeline.gpipe import gpipe
from timeline.pipeline.interleaved import interleaved
from timeline.pipeline.one_f_one_b import one_f_one_b
from timeline.pipeline.placement import KINDS
from timeline.pipeline.render import render
from timeline.pipeline.zb_h1 import zb_h1
from timeline.pipeline.zbv import zbv

__all__ = ["GENERATORS", "Action", "Schedule", "ScheduleError", "build_schedule", "generate", "render",
           "validate"]

#: ``[schedule] kind`` → the function that orders its actions
GENERATORS: dict[str, Callable[..., Schedule]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb-h1": zb_h1,
    "zbv": zbv,
    "dualpipe": dualpipe,
    "dualpipev": dualpipev,
    "csv": from_rows,
}
assert set(GENERATORS) == set(KINDS), "placement.KINDS and GENERATORS must list the same kinds"


def build_schedule(
    kind: str,
    *,
    pp: int,
    vpp: int,
    num_microbatches: int,
    microbatch_group_size: int = 0,
    csv_rows: Sequence[Sequence[str]] | None = None,
    combined_1f1b: bool = False,
) -> Schedule:
    """The validated schedule of ``kind``; :class:`UserError` says why a combination cannot run.

    ``vpp`` is the number of chunks per rank (``[parallel] vpp``); kinds that fix it (every kind
    but ``interleaved`` and ``csv``) reject any other value. ``microbatch_group_size`` applies
    to ``interleaved`` only; ``csv_rows`` (required for ``csv``) holds the cells of each rank.
    ``combined_1f1b``: Megatron's combined 1F1B pairs (``1f1b`` at pp = 1, ``interleaved``).
    """
    _check(kind, pp, vpp, num_microbatches, microbatch_group_size, combined_1f1b)
    if (csv_rows is None) == (kind == "csv"):
        raise ValueError("csv_rows must be given for kind 'csv' and only for it")
    if kind == "csv":
        assert csv_rows is not None
        return from_rows(csv_rows, pp=pp, vpp=vpp, num_microbatches=num_microbatches)
    return _validated(kind, pp, vpp, num_microbatches, microbatch_group_size, combined_1f1b)


def generate(kind: str, *, pp: int, vpp: int, num_microbatches: int, microbatch_group_size: int = 0,
             combined_1f1b: bool = False) -> Schedule:
    """:func:`build_schedule` of a generated ``kind`` without :func:`validate` — for a reader that only
    counts actions (a plan reads the profiles of hundreds of schedules: validating them was three
    quarters of their cost). A generator's output is valid by construction; ``tests/pipeline`` holds
    it so for every kind, and a schedule that is simulated goes through :func:`build_schedule`."""
    if kind == "csv":
        raise ValueError("generate() builds generated kinds; csv rows go through build_schedule")
    _check(kind, pp, vpp, num_microbatches, microbatch_group_size, combined_1f1b)
    return _generated(kind, pp, vpp, num_microbatches, microbatch_group_size, combined_1f1b)


def _check(kind: str, pp: int, vpp: int, num_microbatches: int, microbatch_group_size: int,
           combined_1f1b: bool) -> None:
    if kind not in GENERATORS:
        raise UserError(f"unknown schedule kind {kind!r}; choose one of {', '.join(KINDS)}")
    require_positive(pp=pp, vpp=vpp, num_microbatches=num_microbatches)
    require_rules(kind, pp=pp, vpp=vpp, num_microbatches=num_microbatches,
                  microbatch_group_size=microbatch_group_size, combined_1f1b=combined_1f1b)


@lru_cache(maxsize=8)
def _validated(kind: str, pp: int, vpp: int, num_microbatches: int, microbatch_group_size: int,
               combined_1f1b: bool) -> Schedule:
    """A generated schedule, validated; cached (a :class:`Schedule` is frozen, its rows tuples): a plan
    simulates many candidates of one layout, and 16 ranks × 480 micro-batches take 0.1–0.2 s CPU to build."""
    schedule = _generated(kind, pp, vpp, num_microbatches, microbatch_group_size, combined_1f1b)
    validate(schedule)
    return schedule


def _generated(kind: str, pp: int, vpp: int, num_microbatches: int, microbatch_group_size: int,
               combined_1f1b: bool) -> Schedule:
    if kind == "interleaved":
        return interleaved(pp=pp, vpp=vpp, num_microbatches=num_microbatches,
                           microbatch_group_size=microbatch_group_size, combined=combined_1f1b)
    if kind == "1f1b":
        return one_f_one_b(pp=pp, num_microbatches=num_microbatches, combined=combined_1f1b)
    return GENERATORS[kind](pp=pp, num_microbatches=num_microbatches)
