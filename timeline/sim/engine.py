"""The discrete-event run of a pipeline schedule (simpy, at action granularity).

One simpy process per pipeline rank walks its actions in order. A forward waits for the
previous chunk's forward of the same micro-batch, a backward (``B`` or ``I``) for the next
chunk's backward, plus a P2P transfer when the two chunks sit on different ranks; a ``W``
follows its ``I`` on the same rank. Each iteration ends with a barrier (Megatron's global
gradient-norm all-reduce) and the optimizer step. The result is a list of action spans; what
happens inside an action is the compiled template's business. Ties are broken by process and
event creation order, which simpy keeps deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np
import simpy

from timeline.errors import UserError
from timeline.pipeline.actions import Action, Schedule

#: (stage F, kind F, stage B, kind B) → (scale, per-op shifts of F, per-op shifts of B), or None
PairShifts = Callable[[int, str, int, str], "tuple[float, tuple[float, ...], tuple[float, ...]] | None"]


@dataclass(frozen=True, slots=True)
class Span:
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
    env = simpy.Environment()
    last_stage = schedule.num_chunks - 1
    owner: dict[tuple[int, int], int] = {}
    for r, row in enumerate(schedule.actions):
        for a in row:
            if a.kind == "F":
                owner[(a.stage, a.microbatch)] = r
    events: dict[tuple, simpy.Event] = {}
    spans: list[Span] = []

    def event(key: tuple) -> simpy.Event:
        ev = events.get(key)
        if ev is None:
            ev = events[key] = env.event()
        return ev

    def deliver(ev: simpy.Event, delay: float) -> Generator[simpy.Event, None, None]:
        yield env.timeout(delay)
        ev.succeed()

    def signal(key: tuple, src: int, dst: int | None) -> None:
        ev = event(key)
        if dst is None or dst == src or p2p_us == 0:
            ev.succeed()
        else:
            env.process(deliver(ev, p2p_us))

    barrier_count = [0] * iterations
    barriers = [env.event() for _ in range(iterations)]
    n = schedule.pp

    def wait(a: Action, it: int) -> simpy.Event | None:
        if a.kind == "F" and a.stage > 0:
            return event(("act", it, a.stage - 1, a.microbatch))
        if a.kind in ("B", "I") and a.stage < last_stage:
            return event(("grad", it, a.stage + 1, a.microbatch))
        return None

    def finish(a: Action, r: int, it: int) -> None:
        s, m = a.stage, a.microbatch
        if a.kind == "F" and s < last_stage:
            signal(("act", it, s, m), r, owner.get((s + 1, m)))
        elif a.kind in ("B", "I") and s > 0:
            signal(("grad", it, s, m), r, owner.get((s - 1, m)))

    def rank(r: int) -> Generator[simpy.Event, None, None]:
        row = schedule.actions[r]
        pairs = set(schedule.overlapped[r]) if pair_us and r < len(schedule.overlapped) else set()
        for it in range(iterations):
            pos = 0
            while pos < len(row):
                group = row[pos:pos + 2] if pos in pairs else row[pos:pos + 1]
                for a in group:
                    ev = wait(a, it)
                    if ev is not None:
                        yield ev
                start = env.now
                if len(group) == 1:
                    a = group[0]
                    yield env.timeout(duration_us(a.stage, a.kind))
                    spans.append(Span(r, pos, it, a.stage, a.kind, a.microbatch, start, env.now))
                else:
                    f, b = group
                    df, db = duration_us(f.stage, f.kind), duration_us(b.stage, b.kind)
                    assert pair_us is not None  # pairs are only formed with pair_us
                    total = pair_us(f.stage, f.kind, b.stage, b.kind)
                    yield env.timeout(total)
                    warp = pair_shifts(f.stage, f.kind, b.stage, b.kind) if pair_shifts else None
                    if warp is None:
                        spans.append(Span(r, pos, it, f.stage, f.kind, f.microbatch, start, env.now,
                                          total / df if df > 0 else 1.0))
                        spans.append(Span(r, pos + 1, it, b.stage, b.kind, b.microbatch, start, env.now,
                                          total / db if db > 0 else 1.0, overlapped=True))
                    else:
                        k, sf, sb = warp
                        spans.append(Span(r, pos, it, f.stage, f.kind, f.microbatch, start, env.now, k, shift=sf))
                        spans.append(Span(r, pos + 1, it, b.stage, b.kind, b.microbatch, start, env.now, k,
                                          overlapped=True, shift=sb))
                for a in group:
                    finish(a, r, it)
                pos += len(group)
            barrier_count[it] += 1
            if barrier_count[it] == n:
                barriers[it].succeed()
            yield barriers[it]
            start = env.now
            yield env.timeout(step_us(r))
            spans.append(Span(r, -1, it, -1, "step", -1, start, env.now))

    for r in range(n):
        env.process(rank(r))
    env.run()
    expected = iterations * (sum(len(row) for row in schedule.actions) + n)
    if len(spans) != expected:
        raise UserError(f"the {schedule.kind} schedule deadlocked after {len(spans)} of {expected} actions: "
                        "an action waits for one that never runs")
    return spans
