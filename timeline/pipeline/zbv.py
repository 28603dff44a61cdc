"""ZB-V (Qi et al. 2023, section 6): zero-bubble with a V-shaped placement.

``pp`` is the number of pipeline ranks; the model is cut into ``2·pp`` chunks and rank ``r``
holds chunks ``r`` and ``2·pp − 1 − r``: the forward runs down the ranks through chunks
``0..pp−1`` and back up through ``pp..2·pp−1``, so rank 0 holds both the first chunk and the
last (head and loss) and the turn at rank ``pp − 1`` needs no communication. Backwards are split
into ``I`` and ``W``. The order is PyTorch's ``ScheduleZBVZeroBubble``: on rank ``r``,
``2·(pp − r) − 1`` warm-up forwards of the first chunk, ``r`` pairs of forwards (second chunk,
first chunk), ``pp − r`` triples ``F I W`` of the second chunk, a steady state of
``F I W`` on both chunks, and a cool-down of ``I`` pairs and ``I W`` pairs followed by the owed
``W``. It is laid out for ``max(2·pp − 1, m)`` micro-batches and the actions of micro-batches
``≥ m`` are dropped, as torch does. Peak activations: ``2·pp`` chunk-micro-batches on rank 0,
the same bytes as 1F1B's ``pp`` micro-batches of a twice-as-large stage.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from timeline.pipeline.actions import Action, Schedule, require_positive
from timeline.pipeline.placement import stage_placement


def _row(pp: int, n: int, rank: int) -> list[Action]:
    """Rank ``rank``'s actions for ``n`` micro-batches."""
    down, up = rank, 2 * pp - 1 - rank
    row: list[Action] = []
    count = {(kind, stage): 0 for kind in "FIW" for stage in (down, up)}

    def run(kind: str, stage: int) -> None:
        row.append(Action(stage=stage, kind=kind, microbatch=count[(kind, stage)]))
        count[(kind, stage)] += 1

    # warm-up: fill the down leg, then interleave the up leg, then start its backward
    for _ in range(2 * (pp - rank) - 1):
        run("F", down)
    for _ in range(rank):
        run("F", up)
        run("F", down)
    for _ in range(pp - rank):
        for kind in "FIW":
            run(kind, up)
    # steady: F I W on the down chunk, then on the up chunk
    while count[("F", up)] < count[("F", down)] or count[("F", down)] < n:
        if count[("F", down)] < n:
            run("F", down)
        run("I", down)
        run("W", down)
        for kind in "FIW":
            run(kind, up)
    # cool-down: input gradients first, the owed weight gradients last
    for _ in range(rank):
        run("I", down)
        run("I", up)
    for _ in range(pp - rank):
        run("I", down)
        run("W", down)
    while count[("W", up)] < count[("I", up)]:
        run("W", up)
    while count[("W", down)] < count[("I", down)]:
        run("W", down)
    return row


def zbv(*, pp: int, num_microbatches: int) -> Schedule:
    """ZB-V order for ``pp`` ranks (``2·pp`` chunks) and ``num_microbatches`` micro-batches."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    m = num_microbatches
    n = max(2 * pp - 1, m)  # enough micro-batches to fill the V; extras are dropped
    rows = [tuple(a for a in _row(pp, n, rank) if a.microbatch < m) for rank in range(pp)]
    return Schedule(
        kind="zbv",
        pp=pp,
        num_chunks=2 * pp,
        num_microbatches=m,
        stages_of_rank=stage_placement("zbv", pp, 2),
        actions=tuple(rows),
    )
