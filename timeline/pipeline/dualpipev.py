"""DualPipeV: DualPipe "cut in half" into a V (Sea AI Lab 2025; github.com/deepseek-ai/DualPipe).

``pp`` is the number of pipeline ranks; the model is cut into ``2·pp`` chunks and rank ``r``
holds chunks ``r`` and ``2·pp − 1 − r`` (the V of ZB-V: down the ranks through chunks
``0..pp−1``, back up through ``pp..2·pp−1``). Every micro-batch ``0..m−1`` goes down and back
up, so unlike DualPipe no chunk is stored twice. "Phase 0" below is the down chunk ``r``,
"phase 1" the up chunk ``2·pp − 1 − r``.

The order on rank ``r`` is DualPipeV's eight steps, as PyTorch's ``ScheduleDualPipeV`` lists
them: ``2·(pp − r − 1)`` forwards of phase 0; ``r + 1`` pairs ``F0 F1``; ``pp − r − 1`` triples
``I1 W F1``; ``m − 2·pp + r + 1`` overlapped pairs ``F0&B1, F1&B0`` (run here as ``F`` then
``B``); ``pp − r − 1`` of ``B1, F1&B0``; ``r + 1`` pairs ``B1 B0`` whose second half run as
``I``; ``pp − r − 1`` of ``W I0``; ``r + 1`` owed ``W``, always the oldest. Peak activations:
``2·pp + 1`` chunk-micro-batches on every rank (the README's "PP + 1" with PP = ``2·pp``
stages on ``PP/2`` devices). Needs ``m ≥ 2·pp``.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from timeline.pipeline.actions import Action, Schedule, require_positive, require_rules
from timeline.pipeline.dualpipe_steps import RowBuilder, eight_steps
from timeline.pipeline.placement import stage_placement


def _row(pp: int, m: int, rank: int) -> tuple[tuple[Action, ...], tuple[int, ...]]:
    """Rank ``rank``'s actions, DualPipeV's steps 1–8, and where its overlapped F&B pairs start."""
    b = RowBuilder(stage_of=(rank, 2 * pp - 1 - rank))  # by phase
    return eight_steps(b, half_ranks=pp, h=rank, steady=m - 2 * pp + rank + 1)


def dualpipev(*, pp: int, num_microbatches: int) -> Schedule:
    """DualPipeV's order for ``pp`` ranks (``2·pp`` chunks) and ``num_microbatches`` micro-batches."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    m = num_microbatches
    require_rules("dualpipev", pp=pp, vpp=2, num_microbatches=m)
    rows, pairs = zip(*(_row(pp, m, rank) for rank in range(pp)), strict=True)
    return Schedule(
        kind="dualpipev",
        pp=pp,
        num_chunks=2 * pp,
        num_microbatches=m,
        stages_of_rank=stage_placement("dualpipev", pp, 2),
        actions=tuple(rows),
        overlapped=tuple(pairs),
    )
