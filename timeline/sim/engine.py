"""The discrete-event run of a pipeline schedule, at action granularity.

One process per pipeline rank walks its actions in order. A forward waits for the previous
chunk's forward of the same micro-batch, a backward (``B`` or ``I``) for the next chunk's
backward, plus a P2P transfer when the two chunks sit on different ranks; a ``W`` follows its
``I`` on the same rank. Each iteration ends with a barrier (Megatron's global gradient-norm
all-reduce) and the optimizer step. The result is a list of action spans; what happens inside
an action is the compiled template's business.

The run was a simpy process per rank with one event per transfer; it is now a walk that gives the
same spans without simpy's event objects (16 ranks, 240–480 micro-batches, two iterations: 0.05–0.32
s CPU where simpy took 0.14–0.67 s, on the shared 2-core machine): each rank goes as far as its
inputs allow and is woken when the input it waits for arrives. The times are the same float
additions simpy made — an action starts at the later of its rank's clock and its input's arrival
(``end + p2p_us`` across ranks) and ends its duration later; the step starts at the last rank's
arrival at the barrier — so the spans are equal, and each rank's spans come in the order simpy gave
them; only ranks interleave differently in the list (:func:`timeline.sim.timing.time_plan` splits it
by rank). ``tests/sim/test_engine_walk.py`` holds the walk equal to that simpy run on every schedule
kind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from timeline.errors import UserError
from timeline.pipeline.actions import Action, Schedule

#: (stage F, kind F, stage B, kind B) → (scale, per-op shifts of F, per-op shifts of B), or None
PairShifts = Callable[[int, str, int, str], "tuple[float, tuple[float, ...], tuple[float, ...]] | None"]
#: a transfer between chunks: ("act" | "grad", the sending stage, micro-batch)
Key = tuple[str, int, int]


class Span(NamedTuple):
    """One action's (or optimizer step's) time on a rank. A named tuple, not a frozen dataclass: a
    2,048-GPU DualPipe run makes hundreds of thousands, and a tuple is built several times faster."""

    rank: int
    position: int  # index in the rank's action list (−1: optimizer step)
    iteration: int
    stage: int
    kind: str  # F | B | I | W | step
    microbatch: int
    start_us: float
    end_us: float
    #: how the action's template is stretched in time to fill its span (an overlapped F&B pair
    #: runs both halves across the pair's whole span); 1 for an action run on its own
    scale: float = 1.0
    #: the backward half of an overlapped F&B pair (it runs beside the forward half)
    overlapped: bool = False
    #: per op of the action's phase, µs added to ``offset · scale`` (a combined-1F1B pair's halves
    #: interleave node by node, :mod:`timeline.sim.combined`); () where none
    shift: tuple[float, ...] = ()


def span_offsets(sp: Span, offsets: np.ndarray, ops: np.ndarray) -> np.ndarray:
    """Offsets (µs from the action's start) of a phase's events or ops in span ``sp``: stretched by its
    scale and, in a combined-1F1B pair, moved by its op's shift (``ops``: each offset's op index)."""
    out = offsets if sp.scale == 1.0 else offsets * sp.scale
    if sp.shift:
        out = out + np.asarray(sp.shift)[ops]
    return out


def run_schedule(schedule: Schedule, *, iterations: int, duration_us: Callable[[int, str], float],
                 p2p_us: float, step_us: Callable[[int], float],
                 pair_us: Callable[[int, str, int, str], float] | None = None,
                 pair_shifts: PairShifts | None = None) -> list[Span]:
    """Time every action of ``iterations`` back-to-back runs of ``schedule``.

    An overlapped F&B pair (``schedule.overlapped``, DualPipe's) starts when both halves can and
    takes ``pair_us(stage_f, kind_f, stage_b, kind_b)``; both halves span that whole time, each
    stretched to fill it, so their ops and memory events interleave; where ``pair_shifts`` gives
    (scale, forward shifts, backward shifts) for the pair, both halves take that scale and those
    per-op shifts instead. Without ``pair_us`` pairs run one after the other."""
    n = schedule.pp
    groups = _rank_groups(schedule, p2p_us != 0, pair_us is not None)
    spans: list[Span] = []
    pair_memo: dict[tuple[int, str, int, str], PairTiming] = {}
    clock: list[float] = [0] * n  # simpy's clock starts at int 0: a first span's start is written as 0, not 0.0
    for it in range(iterations):
        arrived: dict[Key, float] = {}
        waiting: dict[Key, list[int]] = {}  # an input not yet sent → the ranks stopped for it
        pos = [0] * n
        todo = list(range(n - 1, -1, -1))
        while todo:
            r = todo.pop()
            mine, g, now = groups[r], pos[r], clock[r]
            while g < len(mine):
                p, acts, needs, sends = mine[g]
                start, missing = now, None
                for key in needs:
                    t = arrived.get(key)
                    if t is None:
                        missing = key
                        break
                    if t >= start:  # simpy resumes a rank that waited at its input's time (0.0 over 0)
                        start = t
                if missing is not None:
                    waiting.setdefault(missing, []).append(r)
                    break
                if len(acts) == 1:
                    a = acts[0]
                    now = start + duration_us(a.stage, a.kind)
                    spans.append(Span(r, p, it, a.stage, a.kind, a.microbatch, start, now))
                else:
                    now = start + _pair(spans, r, p, it, acts, start, duration_us, pair_us, pair_shifts, pair_memo)
                for key, remote in sends:
                    arrived[key] = now + p2p_us if remote else now
                    todo += waiting.pop(key, ())
                g += 1
            pos[r], clock[r] = g, now
        if any(pos[r] < len(groups[r]) for r in range(n)):
            expected = iterations * (sum(len(row) for row in schedule.actions) + n)
            raise UserError(f"the {schedule.kind} schedule deadlocked after {len(spans)} of {expected} actions: "
                            "an action waits for one that never runs")
        barrier = max(clock)  # the last rank's arrival releases every rank
        for r in range(n):
            clock[r] = barrier + step_us(r)
            spans.append(Span(r, -1, it, -1, "step", -1, barrier, clock[r]))
    return spans


#: a rank's group: its first position, its actions, the inputs it waits for, and what it sends
#: (the transfer, and whether it crosses to another rank: then it arrives ``p2p_us`` later)
Group = tuple[int, tuple[Action, ...], tuple[Key, ...], tuple[tuple[Key, bool], ...]]


#: the last schedules' groups, by (id, remote transfers take time, pairs overlap); each entry holds its
#: schedule, so an id is never another's (schedules are cached and shared: a plan times many runs of one)
_GROUPS: dict[tuple[int, bool, bool], tuple[Schedule, list[list[Group]]]] = {}
_GROUPS_KEPT = 8


def _rank_groups(schedule: Schedule, remote_delay: bool, paired: bool) -> list[list[Group]]:
    """Per rank, its groups (one action, or an overlapped pair) with what each waits for and sends: the
    same for every iteration, and for every run of the same schedule object (read-only)."""
    key = (id(schedule), remote_delay, paired)
    hit = _GROUPS.get(key)
    if hit is not None and hit[0] is schedule:
        return hit[1]
    owner: dict[tuple[int, int], int] = {}
    for r, row in enumerate(schedule.actions):
        for a in row:
            if a.kind == "F":
                owner[(a.stage, a.microbatch)] = r
    last_stage = schedule.num_chunks - 1
    groups = [_groups(schedule, r, last_stage, owner, remote_delay, paired) for r in range(schedule.pp)]
    if len(_GROUPS) >= _GROUPS_KEPT:
        del _GROUPS[next(iter(_GROUPS))]
    _GROUPS[key] = (schedule, groups)
    return groups


def _groups(schedule: Schedule, r: int, last_stage: int, owner: dict[tuple[int, int], int], remote_delay: bool,
            paired: bool) -> list[Group]:
    row = schedule.actions[r]
    pairs = set(schedule.overlapped[r]) if paired and r < len(schedule.overlapped) else set()
    out: list[Group] = []
    p = 0
    while p < len(row):
        acts = row[p:p + 2] if p in pairs else row[p:p + 1]
        needs: list[Key] = []
        sends: list[tuple[Key, bool]] = []
        for a in acts:
            s, m = a.stage, a.microbatch
            if a.kind == "F" and s > 0:
                needs.append(("act", s - 1, m))
            elif a.kind in ("B", "I") and s < last_stage:
                needs.append(("grad", s + 1, m))
        for a in acts:
            s, m = a.stage, a.microbatch
            dst = None
            if a.kind == "F" and s < last_stage:
                key, dst = ("act", s, m), owner.get((s + 1, m))
            elif a.kind in ("B", "I") and s > 0:
                key, dst = ("grad", s, m), owner.get((s - 1, m))
            else:
                continue
            sends.append((key, dst is not None and dst != r and remote_delay))
        out.append((p, acts, tuple(needs), tuple(sends)))
        p += len(acts)
    return out


#: an overlapped pair's timing, the same for every pair of the same two phases: (duration, the forward
#: half's scale, the backward half's, the forward half's shifts, the backward half's)
PairTiming = tuple[float, float, float, tuple[float, ...], tuple[float, ...]]


def _pair(spans: list[Span], r: int, p: int, it: int, acts: tuple[Action, ...], start: float,
          duration_us: Callable[[int, str], float], pair_us: Callable[[int, str, int, str], float] | None,
          pair_shifts: PairShifts | None, memo: dict[tuple[int, str, int, str], PairTiming]) -> float:
    """Append an overlapped F&B pair's two spans; return its duration. ``memo`` keeps each pair of
    phases' timing (the callables' answers depend on the phases alone)."""
    f, b = acts
    key = (f.stage, f.kind, b.stage, b.kind)
    timing = memo.get(key)
    if timing is None:
        df, db = duration_us(f.stage, f.kind), duration_us(b.stage, b.kind)
        assert pair_us is not None  # pairs are only formed with pair_us
        total = pair_us(*key)
        warp = pair_shifts(*key) if pair_shifts else None
        if warp is None:
            timing = (total, total / df if df > 0 else 1.0, total / db if db > 0 else 1.0, (), ())
        else:
            timing = (total, warp[0], warp[0], warp[1], warp[2])
        memo[key] = timing
    total, kf, kb, sf, sb = timing
    end = start + total
    spans.append(Span(r, p, it, f.stage, f.kind, f.microbatch, start, end, kf, shift=sf))
    spans.append(Span(r, p + 1, it, b.stage, b.kind, b.microbatch, start, end, kb, overlapped=True, shift=sb))
    return total
