"""GPipe (Huang et al. 2019): every rank runs all forwards, then all backwards ("fill-drain").

``pp`` is the number of pipeline ranks and a chunk is one rank's contiguous share of the model:
rank ``r`` holds chunk ``r`` (``pp`` chunks in all). Backwards run in the same micro-batch order
as the forwards, as PyTorch's ``ScheduleGPipe`` lists them. Every rank holds the activations of
all ``m`` micro-batches at the end of the forward phase, which is why 1F1B replaced it.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from timeline.pipeline.actions import Action, Schedule, require_positive
from timeline.pipeline.placement import stage_placement


def gpipe(*, pp: int, num_microbatches: int) -> Schedule:
    """All ``F`` of rank ``r``'s chunk for micro-batches ``0..m−1``, then all ``B`` in order."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    rows = []
    for rank in range(pp):
        # forward: no warm-up limit, every micro-batch
        row = [Action(stage=rank, kind="F", microbatch=k) for k in range(num_microbatches)]
        # backward: drain in the same order
        row += [Action(stage=rank, kind="B", microbatch=k) for k in range(num_microbatches)]
        rows.append(tuple(row))
    return Schedule(
        kind="gpipe",
        pp=pp,
        num_chunks=pp,
        num_microbatches=num_microbatches,
        stages_of_rank=stage_placement("gpipe", pp, 1),
        actions=tuple(rows),
    )
