"""The engine's walk (:func:`timeline.sim.engine.run_schedule`) against the simpy run it replaced:
the same spans on every rank, in the same order, on every generated schedule kind — with and
without P2P time, overlapped pairs, combined-1F1B shifts and several iterations — and the same
deadlock error. The simpy run below is the engine as it stood before the walk (this repository,
``timeline/sim/engine.py: run_schedule`` at 8350be1), kept here as the reference."""

from __future__ import annotations

from collections.abc import Callable, Generator

import pytest
import simpy

from timeline.errors import UserError
from timeline.pipeline import build_schedule
from timeline.pipeline.actions import Action, Schedule
from timeline.sim.engine import PairShifts, Span, run_schedule


def simpy_run(schedule: Schedule, *, iterations: int, duration_us: Callable[[int, str], float], p2p_us: float,
              step_us: Callable[[int], float], pair_us: Callable[[int, str, int, str], float] | None = None,
              pair_shifts: PairShifts | None = None) -> list[Span]:
    env = simpy.Environment()
    last_stage = schedule.num_chunks - 1
    owner = {(a.stage, a.microbatch): r for r, row in enumerate(schedule.actions) for a in row if a.kind == "F"}
    events: dict[tuple, simpy.Event] = {}
    spans: list[Span] = []

    def event(key: tuple) -> simpy.Event:
        if key not in events:
            events[key] = env.event()
        return events[key]

    def deliver(ev: simpy.Event) -> Generator[simpy.Event, None, None]:
        yield env.timeout(p2p_us)
        ev.succeed()

    def signal(key: tuple, src: int, dst: int | None) -> None:
        if dst is None or dst == src or p2p_us == 0:
            event(key).succeed()
        else:
            env.process(deliver(event(key)))

    n = schedule.pp
    arrived = [0] * iterations
    barriers = [env.event() for _ in range(iterations)]

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
                    assert pair_us is not None
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
            arrived[it] += 1
            if arrived[it] == n:
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


def _by_rank(spans: list[Span], n: int) -> list[list[Span]]:
    return [[s for s in spans if s.rank == r] for r in range(n)]


# durations that differ by stage and kind, none a round number, so that a span taking the wrong
# input or clock shows in its float times
def _duration(s: int, k: str) -> float:
    return {"F": 1.37, "B": 2.91, "I": 1.53, "W": 1.21}[k] * (1 + 0.173 * s)


def _pair(fs: int, fk: str, bs: int, bk: str) -> float:
    return max(_duration(fs, fk), _duration(bs, bk)) * 1.09


def _shifts(fs: int, fk: str, bs: int, bk: str) -> tuple[float, tuple[float, ...], tuple[float, ...]] | None:
    return None if fs % 2 else (1.25, (0.0, 0.5 + fs), (0.25 * bs, 1.0))


CASES = [("gpipe", 4, 1, 6, False), ("1f1b", 4, 1, 8, False), ("1f1b", 1, 1, 3, True),
         ("interleaved", 4, 2, 8, False), ("interleaved", 2, 3, 6, True), ("zb-h1", 4, 1, 8, False),
         ("zbv", 4, 2, 8, False), ("dualpipe", 4, 1, 8, False), ("dualpipev", 4, 2, 8, False)]


@pytest.mark.parametrize(("kind", "pp", "vpp", "m", "combined"), CASES)
@pytest.mark.parametrize("p2p_us", [0.0, 0.77])
def test_walk_gives_simpys_spans(kind, pp, vpp, m, combined, p2p_us):
    schedule = build_schedule(kind, pp=pp, vpp=vpp, num_microbatches=m, combined_1f1b=combined)
    kw = dict(iterations=3, duration_us=_duration, p2p_us=p2p_us, step_us=lambda r: 0.41 + 0.1 * r)
    pairs = [{}]
    if schedule.overlapped and any(schedule.overlapped):
        pairs.append({"pair_us": _pair})
        pairs.append({"pair_us": _pair, "pair_shifts": _shifts})
    for extra in pairs:
        walk, ref = run_schedule(schedule, **kw, **extra), simpy_run(schedule, **kw, **extra)
        assert len(walk) == len(ref) == 3 * (sum(map(len, schedule.actions)) + pp)
        # repr: the times' types too (simpy's clock starts at int 0, and summary.json writes 0, not 0.0)
        assert [list(map(repr, row)) for row in _by_rank(walk, pp)] == [list(map(repr, row)) for row in _by_rank(ref, pp)]
    if "pair_us" in pairs[-1]:  # the pairs ran overlapped: some span was stretched or shifted
        assert any(s.scale != 1.0 for s in walk)


def test_walk_reports_simpys_deadlock():
    # rank 0 waits for the gradient of micro-batch 0 before it sends that micro-batch's activation
    one = build_schedule("1f1b", pp=2, vpp=1, num_microbatches=1)
    stuck = Schedule(kind="csv", pp=2, num_chunks=2, num_microbatches=1, stages_of_rank=one.stages_of_rank,
                     actions=((Action(stage=0, kind="B", microbatch=0), Action(stage=0, kind="F", microbatch=0)),
                              one.actions[1]))
    kw = dict(iterations=1, duration_us=_duration, p2p_us=0.5, step_us=lambda r: 1.0)
    with pytest.raises(UserError) as walk:
        run_schedule(stuck, **kw)
    with pytest.raises(UserError) as ref:
        simpy_run(stuck, **kw)
    assert str(walk.value) == str(ref.value) != ""
    assert "deadlocked after 0 of 6 actions" in str(walk.value)


@pytest.mark.parametrize("kind", ["1f1b", "dualpipe"])
def test_walk_gives_simpys_zero_times(kind):
    # zero durations at time 0: simpy resumes a waiting rank at its input's time, 0.0 over its own int 0
    schedule = build_schedule(kind, pp=4, vpp=1, num_microbatches=8)
    kw = dict(iterations=2, duration_us=lambda s, k: 0.0 if s < 2 else 1.5, p2p_us=0.0, step_us=lambda r: 0.0)
    walk, ref = run_schedule(schedule, **kw), simpy_run(schedule, **kw)
    assert [list(map(repr, row)) for row in _by_rank(walk, 4)] == [list(map(repr, row)) for row in _by_rank(ref, 4)]
    assert {type(s.start_us) for s in walk} == {int, float}
