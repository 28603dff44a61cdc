"""DualPipe's eight steps on one rank, shared by DualPipe and DualPipeV.

Both schedules order a rank's work the same way (github.com/deepseek-ai/DualPipe, and PyTorch's
``ScheduleDualPipeV``); they differ only in which chunk and micro-batch a "phase" names, which
:class:`RowBuilder` maps, and in three counts: ``half_ranks`` (``P``), the rank's distance ``h``
from the nearer end, and the number of steady-state overlapped pairs. This module only orders
actions.
"""

from __future__ import annotations

from collections import deque

from timeline.pipeline.actions import Action


class RowBuilder:
    """One rank's growing action row. ``phase`` 0/1 maps to a direction (``flip`` swaps them);
    a direction has a chunk (``stage_of``) and a first micro-batch number (``mb_base``)."""

    def __init__(self, stage_of: tuple[int, int], mb_base: tuple[int, int] = (0, 0), flip: bool = False) -> None:
        self.stage_of, self.mb_base, self.flip = stage_of, mb_base, flip
        self.done = {"F": [0, 0], "B": [0, 0]}  # per direction, micro-batches started
        self.owed: deque[tuple[int, int]] = deque()
        self.row: list[Action] = []
        self.pairs: list[int] = []

    def run(self, kind: str, phase: int, zero_bubble: bool = False) -> None:
        direction = phase ^ self.flip
        slot = "F" if kind == "F" else "B"
        mb = self.mb_base[direction] + self.done[slot][direction]
        self.done[slot][direction] += 1
        stage = self.stage_of[direction]
        if kind == "B" and zero_bubble:
            kind = "I"
            self.owed.append((stage, mb))
        self.row.append(Action(stage=stage, kind=kind, microbatch=mb))

    def overlap(self, forward_phase: int) -> None:
        """An overlapped F&B pair: forward of one phase with backward of the other."""
        self.pairs.append(len(self.row))
        self.run("F", forward_phase)
        self.run("B", 1 - forward_phase)

    def weight(self) -> None:
        """The oldest owed weight gradient."""
        stage, mb = self.owed.popleft()
        self.row.append(Action(stage=stage, kind="W", microbatch=mb))


def eight_steps(b: RowBuilder, *, half_ranks: int, h: int, steady: int) -> tuple[tuple[Action, ...], tuple[int, ...]]:
    """DualPipe's steps 1–8 for a rank at distance ``h`` from its end: the row and where its
    overlapped F&B pairs start."""
    # warm-up: step 1 (F0), step 2 (F0 F1), step 3 (I1 W F1)
    for _ in range(2 * (half_ranks - h - 1)):
        b.run("F", 0)
    for _ in range(h + 1):
        b.run("F", 0)
        b.run("F", 1)
    for _ in range(half_ranks - h - 1):
        b.run("B", 1, zero_bubble=True)
        b.weight()
        b.run("F", 1)
    # steady: step 4, overlapped F0&B1 then F1&B0
    for i in range(steady):
        if i == 0 and h == half_ranks - 1:  # DualPipe does not overlap the middle rank's first pair
            b.run("F", 0)
            b.run("B", 1)
        else:
            b.overlap(0)
        b.overlap(1)
    # cool-down: step 5 (B1, F1&B0), step 6 (B1 B0, half zero-bubble), step 7 (W I0), step 8 (W)
    for _ in range(half_ranks - h - 1):
        b.run("B", 1)
        b.overlap(1)
    zero_bubble = False
    for i in range(h + 1):
        if i == (h + 1) // 2 and h % 2 == 1:
            zero_bubble = True
        b.run("B", 1, zero_bubble)
        if i == (h + 1) // 2 and h % 2 == 0:
            zero_bubble = True
        b.run("B", 0, zero_bubble)
    for _ in range(half_ranks - h - 1):
        b.weight()
        b.run("B", 0, zero_bubble=True)
    for _ in range(h + 1):
        b.weight()
    if b.owed:
        raise AssertionError(f"weight gradients left unscheduled: {list(b.owed)}")
    return tuple(b.row), tuple(b.pairs)
