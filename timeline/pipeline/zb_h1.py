"""ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): 1F1B with the backward split.

``pp`` is the number of pipeline ranks and a chunk is one rank's contiguous share of the model:
rank ``r`` holds chunk ``r``. Each backward is split into ``I`` (input gradient, which the
previous rank waits for) and ``W`` (weight gradient, which nobody waits for). The ``F``/``I``
order is exactly 1F1B's: ``min(pp − r − 1, m)`` warm-up forwards, then one forward and one
``I``. Rank ``r`` holds back its first ``r`` weight gradients, so its ``I`` reach upstream
sooner, and runs each held ``W`` later in a slot that 1F1B leaves idle (the last ``r`` fill the
cool-down). Activations therefore never outnumber 1F1B's: at most ``pp − r`` micro-batches wait
for their ``I`` and at most ``pp`` (1F1B's rank 0) for their ``W``, which keeps only some
inputs. This is PyTorch's ``ScheduleInterleavedZeroBubble`` with one chunk per rank; with
``F = I = W`` its bubble is ``(pp − 1)·(F + I − W)``, a third of 1F1B's.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from collections import deque

from timeline.pipeline.actions import Action, Schedule, require_positive
from timeline.pipeline.placement import stage_placement


def _row(pp: int, m: int, rank: int) -> tuple[Action, ...]:
    """Rank ``rank``'s actions."""
    row: list[Action] = []
    owed: deque[int] = deque()  # micro-batches whose W is still owed, oldest first

    def input_grad(k: int) -> None:
        row.append(Action(stage=rank, kind="I", microbatch=k))
        owed.append(k)
        if k >= rank:  # the first `rank` weight gradients wait for the cool-down
            row.append(Action(stage=rank, kind="W", microbatch=owed.popleft()))

    warmup = min(pp - rank - 1, m)
    # warm-up: as 1F1B
    row += [Action(stage=rank, kind="F", microbatch=k) for k in range(warmup)]
    # steady: F, I and, once `rank` are held back, the oldest owed W
    for k in range(m - warmup):
        row.append(Action(stage=rank, kind="F", microbatch=warmup + k))
        input_grad(k)
    # cool-down: the remaining I, then the held-back W fill the tail
    for k in range(m - warmup, m):
        input_grad(k)
    row += [Action(stage=rank, kind="W", microbatch=k) for k in owed]
    return tuple(row)


def zb_h1(*, pp: int, num_microbatches: int) -> Schedule:
    """ZB-H1 order for ``pp`` ranks and ``num_microbatches`` micro-batches."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    m = num_microbatches
    rows = [_row(pp, m, rank) for rank in range(pp)]
    return Schedule(
        kind="zb-h1",
        pp=pp,
        num_chunks=pp,
        num_microbatches=m,
        stages_of_rank=stage_placement("zb-h1", pp, 1),
        actions=tuple(rows),
    )
