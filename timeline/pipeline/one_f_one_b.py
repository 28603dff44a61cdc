"""1F1B (PipeDream-Flush, Narayanan et al. 2021): one forward, one backward in the steady state.

``pp`` is the number of pipeline ranks and a chunk is one rank's contiguous share of the model:
rank ``r`` holds chunk ``r``. Rank ``r`` first runs ``min(pp − r − 1, m)`` warm-up forwards
(as Megatron-LM's ``forward_backward_pipelining_without_interleaving`` and PyTorch's
``Schedule1F1B``), then alternates forward and backward, then drains the remaining backwards.
So rank ``r`` never holds more than ``pp − r`` micro-batches of activations, and exactly that
many once ``m ≥ pp``.

Combined 1F1B (Megatron's ``--overlap-moe-expert-parallel-comm``), which Megatron runs without
pipelining only (pp = 1; ``pipeline_parallel/combined_1f1b.py:
combined_1f1b_schedule_for_no_pipelining`` at core_v0.14.0 … d98e8a64dd): the first micro-batch's
forward alone, then each next forward paired with the previous micro-batch's backward
(``F1&B0, F2&B1, …``), then the last backward alone; so two micro-batches are in flight during a
pair where plain 1F1B at pp = 1 holds one.

This module only orders actions; it does not time or validate them.
"""

from __future__ import annotations

from timeline.pipeline.actions import Action, Schedule, require_positive, require_rules
from timeline.pipeline.placement import stage_placement


def one_f_one_b(*, pp: int, num_microbatches: int, combined: bool = False) -> Schedule:
    """Megatron's non-interleaved 1F1B order for ``pp`` ranks and ``num_microbatches`` micro-batches
    (``combined``: its combined 1F1B at pp = 1)."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    m = num_microbatches
    if combined:
        require_rules("1f1b", pp=pp, vpp=1, num_microbatches=m, combined_1f1b=True)
        # F0 alone; F(k+1) & B(k) as one pair; B(m-1) alone
        only = [Action(stage=0, kind="F", microbatch=0)]
        pairs = []
        for k in range(m - 1):
            pairs.append(len(only))
            only += [Action(stage=0, kind="F", microbatch=k + 1), Action(stage=0, kind="B", microbatch=k)]
        only.append(Action(stage=0, kind="B", microbatch=m - 1))
        return Schedule(kind="1f1b", pp=1, num_chunks=1, num_microbatches=m,
                        stages_of_rank=stage_placement("1f1b", 1, 1), actions=(tuple(only),),
                        overlapped=(tuple(pairs),), combined=True)
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
