"""1F1B (PipeDream-Flush, Narayanan et al. 2021): one forward, one backward in the steady state.

``pp`` is the number of pipeline ranks and a chunk is one rank's contiguous share of the model:
rank ``r`` holds chunk ``r``. Rank ``r`` first runs ``min(pp − r − 1, m)`` warm-up forwards
(as Megatron-LM's ``forward_backward_pipelining_without_interleaving`` and PyTorch's
``Schedule1F1B``), then alternates forward and backward, then drains the remaining backwards.
So rank ``r`` never holds more than ``pp − r`` micro-batches of activations, and exactly that
many once ``m ≥ pp``.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from timeline.pipeline.actions import Action, Schedule, require_positive
from timeline.pipeline.placement import stage_placement


def one_f_one_b(*, pp: int, num_microbatches: int) -> Schedule:
    """Megatron's non-interleaved 1F1B order for ``pp`` ranks and ``num_microbatches`` micro-batches."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    m = num_microbatches
    rows = []
    for rank in range(pp):
        row: list[Action] = []
        warmup = min(pp - rank - 1, m)
        # warm-up: forwards that fill the pipeline below this rank
        row += [Action(stage=rank, kind="F", microbatch=k) for k in range(warmup)]
        # steady: one forward, then the backward of the oldest micro-batch in flight
        for k in range(m - warmup):
            row.append(Action(stage=rank, kind="F", microbatch=warmup + k))
            row.append(Action(stage=rank, kind="B", microbatch=k))
        # cool-down: the backwards still owed for the warm-up forwards
        row += [Action(stage=rank, kind="B", microbatch=k) for k in range(m - warmup, m)]
        rows.append(tuple(row))
    return Schedule(
        kind="1f1b",
        pp=pp,
        num_chunks=pp,
        num_microbatches=m,
        stages_of_rank=stage_placement("1f1b", pp, 1),
        actions=tuple(rows),
    )
