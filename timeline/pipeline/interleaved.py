"""Interleaved 1F1B (Narayanan et al. 2021), in Megatron-LM's form with micro-batch groups.

``pp`` is the number of pipeline ranks; the model is cut into ``pp·vpp`` chunks and rank ``r``
holds chunks ``r, r + pp, …, r + (vpp − 1)·pp`` (a chunk is one virtual stage). Forwards walk
Megatron's schedule table: micro-batches go in groups of ``microbatch_group_size`` (``N``;
0 means ``pp``), each group through chunk 0, then chunk 1, … of the rank, and the last group
takes the remainder. Backwards walk the same table with the chunk order reversed.

Rank ``r`` runs ``min((pp − r − 1)·2 + (vpp − 1)·N, m·vpp)`` warm-up forwards (Megatron's
``get_pp_rank_microbatches``; when that is all of them, every forward precedes every backward),
then alternates one forward and one backward, then drains. Megatron's rules apply: ``vpp ≥ 2``,
``pp ≤ N ≤ m``, and ``m mod N`` is 0 or at least ``pp``. With ``N = pp`` and ``m`` a multiple
of ``pp`` this is exactly PyTorch's ``ScheduleInterleaved1F1B`` order.

Combined 1F1B (Megatron's ``--overlap-moe-expert-parallel-comm``): one more warm-up forward
(``schedules.py: get_pp_rank_microbatches``, "we schedule one extra micro-batch forward step before
the 1f1b stages", core_v0.14.0 … d98e8a64dd), then each steady-state forward and backward run as
one pair (``combined_1f1b_schedule_for_interleaved_pipelining`` with both virtual micro-batch ids);
warm-up forwards and cool-down backwards run alone.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from timeline.pipeline.actions import Action, Schedule, require_positive, require_rules
from timeline.pipeline.placement import stage_placement


def schedule_table(num_microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """Megatron's table: for each virtual micro-batch, its (micro-batch, local chunk)."""
    table = []
    for first in range(0, num_microbatches, group):
        # the last group absorbs the remainder
        last = num_microbatches if first + group >= num_microbatches else first + group
        table += [(mb, chunk) for chunk in range(vpp) for mb in range(first, last)]
    return table


def warmup_forwards(*, pp: int, rank: int, vpp: int, num_microbatches: int, group: int,
                    combined: bool = False) -> int:
    """Megatron's warm-up count for ``rank`` (one more under combined 1F1B), capped at the rank's
    ``m·vpp`` forwards."""
    return min((pp - rank - 1) * 2 + (vpp - 1) * group + int(combined), num_microbatches * vpp)


def interleaved(*, pp: int, vpp: int, num_microbatches: int, microbatch_group_size: int = 0,
                combined: bool = False) -> Schedule:
    """Megatron's interleaved 1F1B order; ``microbatch_group_size`` 0 means ``pp``; ``combined``: its
    combined 1F1B (each steady-state forward and backward as one overlapped pair)."""
    require_positive(pp=pp, vpp=vpp, num_microbatches=num_microbatches)
    m = num_microbatches
    group = microbatch_group_size or pp
    require_rules("interleaved", pp=pp, vpp=vpp, num_microbatches=m, microbatch_group_size=group)
    table = schedule_table(m, vpp, group)
    total = m * vpp
    rows: list[tuple[Action, ...]] = []
    pairs: list[tuple[int, ...]] = []
    for rank in range(pp):

        def forward(k: int, rank: int = rank) -> Action:
            mb, chunk = table[k]
            return Action(stage=chunk * pp + rank, kind="F", microbatch=mb)

        def backward(k: int, rank: int = rank) -> Action:
            mb, chunk = table[k]
            return Action(stage=(vpp - 1 - chunk) * pp + rank, kind="B", microbatch=mb)

        warmup = warmup_forwards(pp=pp, rank=rank, vpp=vpp, num_microbatches=m, group=group, combined=combined)
        # warm-up
        row = [forward(k) for k in range(warmup)]
        # steady: forward k + warmup, then backward k (one pair under combined 1F1B)
        steady: list[int] = []
        for k in range(total - warmup):
            steady.append(len(row))
            row += [forward(k + warmup), backward(k)]
        # cool-down
        row += [backward(k) for k in range(total - warmup, total)]
        rows.append(tuple(row))
        pairs.append(tuple(steady) if combined else ())
    return Schedule(
        kind="interleaved",
        pp=pp,
        num_chunks=pp * vpp,
        num_microbatches=m,
        stages_of_rank=stage_placement("interleaved", pp, vpp),
        actions=tuple(rows),
        overlapped=tuple(pairs) if combined else (),
        combined=combined,
    )
