"""DualPipe (DeepSeek-V3 report; github.com/deepseek-ai/DualPipe): bidirectional 1F1B.

``pp`` (even) is the number of pipeline ranks and a chunk is ``1/pp`` of the model: chunks
``0..pp−1`` in model order, as in 1F1B. DualPipe feeds half of the ``m`` micro-batches (``m``
even) from each end. Direction 0 runs micro-batches ``0..m/2−1`` from rank 0 down to rank
``pp − 1`` (chunk ``s`` on rank ``s``); direction 1 runs micro-batches ``m/2..m−1`` from rank
``pp − 1`` up to rank 0 (chunk ``s`` on rank ``pp − 1 − s``). Actions use these model chunk
indices and these global micro-batch numbers, so every rank holds two chunks, ``r`` and
``pp − 1 − r`` (twice 1F1B's parameters), the dependencies are 1F1B's, and a micro-batch's
number says which copy of a chunk runs it.

The order on rank ``r`` is DualPipe's eight steps, with ``h = min(r, pp − 1 − r)`` and
``P = pp/2``; "phase 0" is direction 0 on the first half of the ranks and direction 1 on the
second half. Steps: ``2·(P − h − 1)`` forwards of phase 0; ``h + 1`` pairs ``F0 F1``;
``P − h − 1`` triples ``I1 W F1``; ``m/2 − pp + h + 1`` overlapped pairs ``F0&B1, F1&B0``
(run here as ``F`` then ``B``); ``P − h − 1`` of ``B1, F1&B0``; ``h + 1`` pairs ``B1 B0`` whose
second half run as ``I`` (zero bubble); ``P − h − 1`` of ``W I0``; ``h + 1`` owed ``W``. ``W``
always takes the oldest owed weight gradient. Peak activations: ``pp + 1`` chunk-micro-batches
on every rank (the README's "PP + 1"). Needs ``m ≥ 2·pp``.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from timeline.pipeline.actions import Action, Schedule, require_positive, require_rules
from timeline.pipeline.dualpipe_steps import RowBuilder, eight_steps
from timeline.pipeline.placement import stage_placement


def _row(pp: int, m: int, rank: int) -> tuple[tuple[Action, ...], tuple[int, ...]]:
    """Rank ``rank``'s actions, DualPipe's steps 1–8, and where its overlapped F&B pairs start."""
    half_ranks, half_m = pp // 2, m // 2
    h = min(rank, pp - 1 - rank)
    b = RowBuilder(stage_of=(rank, pp - 1 - rank), mb_base=(0, half_m), flip=rank >= half_ranks)
    return eight_steps(b, half_ranks=half_ranks, h=h, steady=half_m - pp + h + 1)


def dualpipe(*, pp: int, num_microbatches: int) -> Schedule:
    """DualPipe's order for ``pp`` ranks and ``num_microbatches`` micro-batches (both directions)."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    m = num_microbatches
    require_rules("dualpipe", pp=pp, vpp=1, num_microbatches=m)
    rows, pairs = zip(*(_row(pp, m, rank) for rank in range(pp)), strict=True)
    return Schedule(
        kind="dualpipe",
        pp=pp,
        num_chunks=pp,
        num_microbatches=m,
        stages_of_rank=stage_placement("dualpipe", pp, 1),
        actions=tuple(rows),
        overlapped=tuple(pairs),
    )
