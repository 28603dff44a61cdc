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

from collections import deque

from timeline.errors import UserError
from timeline.pipeline.actions import Action, Schedule, require_positive
from timeline.pipeline.placement import stage_placement


def _row(pp: int, m: int, rank: int) -> tuple[tuple[Action, ...], tuple[int, ...]]:
    """Rank ``rank``'s actions, DualPipeV's steps 1–8, and where its overlapped F&B pairs start."""
    stage_of = (rank, 2 * pp - 1 - rank)  # by phase
    done = {"F": [0, 0], "B": [0, 0]}  # per phase, micro-batches started
    owed: deque[tuple[int, int]] = deque()
    row: list[Action] = []
    pairs: list[int] = []

    def run(kind: str, phase: int, zero_bubble: bool = False) -> None:
        slot = "F" if kind == "F" else "B"
        mb = done[slot][phase]
        done[slot][phase] += 1
        stage = stage_of[phase]
        if kind == "B" and zero_bubble:
            kind = "I"
            owed.append((stage, mb))
        row.append(Action(stage=stage, kind=kind, microbatch=mb))

    def overlap(forward_phase: int) -> None:
        pairs.append(len(row))
        run("F", forward_phase)
        run("B", 1 - forward_phase)

    def weight() -> None:
        stage, mb = owed.popleft()
        row.append(Action(stage=stage, kind="W", microbatch=mb))

    # warm-up: step 1 (F0), step 2 (F0 F1), step 3 (I1 W F1)
    for _ in range(2 * (pp - rank - 1)):
        run("F", 0)
    for _ in range(rank + 1):
        run("F", 0)
        run("F", 1)
    for _ in range(pp - rank - 1):
        run("B", 1, zero_bubble=True)
        weight()
        run("F", 1)
    # steady: step 4, overlapped F0&B1 then F1&B0
    for i in range(m - 2 * pp + rank + 1):
        if i == 0 and rank == pp - 1:  # DualPipe does not overlap the middle rank's first pair
            run("F", 0)
            run("B", 1)
        else:
            overlap(0)
        overlap(1)
    # cool-down: step 5 (B1, F1&B0), step 6 (B1 B0, half zero-bubble), step 7 (W I0), step 8 (W)
    for _ in range(pp - rank - 1):
        run("B", 1)
        overlap(1)
    zero_bubble = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            zero_bubble = True
        run("B", 1, zero_bubble)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            zero_bubble = True
        run("B", 0, zero_bubble)
    for _ in range(pp - rank - 1):
        weight()
        run("B", 0, zero_bubble=True)
    for _ in range(rank + 1):
        weight()
    if owed:
        raise AssertionError(f"dualpipev left weight gradients unscheduled on rank {rank}: {owed}")
    return tuple(row), tuple(pairs)


def dualpipev(*, pp: int, num_microbatches: int) -> Schedule:
    """DualPipeV's order for ``pp`` ranks (``2·pp`` chunks) and ``num_microbatches`` micro-batches."""
    require_positive(pp=pp, num_microbatches=num_microbatches)
    m = num_microbatches
    if m < 2 * pp:
        raise UserError(
            f"dualpipev needs at least 2·pp = {2 * pp} micro-batches (one per chunk), not {m}; "
            f"raise training.num_microbatches to {2 * pp}"
        )
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
