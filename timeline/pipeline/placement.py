"""Which model chunks (virtual stages) each pipeline rank holds, per schedule kind.

A *virtual stage* (model chunk) is a contiguous run of layers; there are ``pp * vpp`` of them
and ``[parallel] layout`` gives one layer count per chunk, in model order. Where a chunk lives
depends on the schedule: 1F1B and GPipe put chunk ``r`` on rank ``r``; interleaved 1F1B loops
(rank ``r`` holds ``r, r + pp, …``); the V-shaped schedules (ZBV, DualPipeV) fold the model
back so rank 0 holds the first and the last chunk; DualPipe runs two copies of a ``pp``-chunk
model in opposite directions, so rank ``r`` holds chunks ``r`` and ``pp − 1 − r`` (in that
order: the chunk it runs for direction 0, then for direction 1; every chunk lives on two ranks).
For ``csv`` the rows decide: the looped placement below is only the default, and the
:class:`~timeline.pipeline.actions.Schedule` built from the rows carries the real one in
``stages_of_rank``.

This module does not order actions; the schedule generators do.
"""

from __future__ import annotations

from timeline.spec.schedule_rules import SCHEDULE_KINDS

#: the schedule kinds, as the one table (:data:`timeline.spec.schedule_rules.SCHEDULES`) lists them
KINDS = tuple(SCHEDULE_KINDS)


def num_chunks(kind: str, pp: int, vpp: int) -> int:
    """Number of distinct model chunks (length of ``layout``)."""
    return pp * vpp


def stage_placement(kind: str, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    """Per pipeline rank, the model chunks it holds (global chunk indices, ascending order of use)."""
    if kind not in SCHEDULE_KINDS:
        raise ValueError(f"unknown schedule kind {kind!r}")
    shape = SCHEDULE_KINDS[kind].placement
    if shape == "one":
        return tuple((r,) for r in range(pp))
    if shape == "looped":
        return tuple(tuple(r + i * pp for i in range(vpp)) for r in range(pp))
    if shape == "v":
        return tuple((r, 2 * pp - 1 - r) for r in range(pp))
    assert shape == "dualpipe", shape
    return tuple((r, pp - 1 - r) for r in range(pp))
