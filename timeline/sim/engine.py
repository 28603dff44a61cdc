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

from collections.abc import Callable
from dataclasses import dataclass

import simpy

from timeline.errors import UserError
from timeline.pipeline.actions import Schedule


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


def run_schedule(schedule: Schedule, *, iterations: int, duration_us: Callable[[int, str], float],
                 p2p_us: float, step_us: Callable[[int], float]) -> list[Span]:
    """Time every action of ``iterations`` back-to-back runs of ``schedule``."""
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

    def deliver(ev: simpy.Event, delay: float):
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

    def rank(r: int):
        for it in range(iterations):
            for pos, a in enumerate(schedule.actions[r]):
                s, m = a.stage, a.microbatch
                if a.kind == "F" and s > 0:
                    yield event(("act", it, s - 1, m))
                elif a.kind in ("B", "I") and s < last_stage:
                    yield event(("grad", it, s + 1, m))
                start = env.now
                yield env.timeout(duration_us(s, a.kind))
                spans.append(Span(r, pos, it, s, a.kind, m, start, env.now))
                if a.kind == "F" and s < last_stage:
                    signal(("act", it, s, m), r, owner.get((s + 1, m)))
                elif a.kind in ("B", "I") and s > 0:
                    signal(("grad", it, s, m), r, owner.get((s - 1, m)))
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
