"""Serving with data-parallel ranks (DESIGN §12): one :class:`~timeline.sim.batching.Engine` per DP
rank, each with its own pool and queue, fed by a router, in one simpy clock.

Routing (the engine's rule, :mod:`timeline.serve.dp`): ``round_robin`` gives the i-th arriving
request to rank ``i mod dp``; ``least_loaded`` gives it to the rank of least
``waiting_weight · waiting + running`` as the router last saw them (a snapshot of every rank's
counts taken every ``refresh_us`` — one due at a request's arrival instant is taken first — the
chosen rank's waiting count raised by one at once), ranks
scanned from 0, the first minimum winning. A request is rejected by the rank it lands on.

``lockstep``: every rank's step starts together and lasts as long as the slowest rank's (a MoE
layer's collectives span the ranks); the ranks step while any of them has work. ``gather(tokens)``
gives, from every rank's scheduled tokens, each rank's forward tokens (padded) and the MoE layer's
gathered tokens for the memory model and for the step time; a rank with nothing scheduled records a
dummy step when its forward runs tokens or the MoE layers gather some.
Otherwise each rank steps on its own clock.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

import simpy

from timeline.sim.batching import Engine, ReqState, SchedulerConfig, SchedulerResult, Step
from timeline.spec.serving import Request

Batch = list[tuple[ReqState, int]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Routing:
    rule: str  # "round_robin" | "least_loaded"
    refresh_us: float = 0.0  # least_loaded: how often the router's counts are refreshed
    waiting_weight: int = 1


@dataclass(slots=True)
class DPResult:
    ranks: list[SchedulerResult]
    rank_of: list[int]  # each request's DP rank, by request order


def _step(t0: float, now: float, batch: Batch, preempted: int, eng: Engine) -> Step:
    return Step(t_start_us=t0, t_end_us=now, num_tokens=sum(n for _, n in batch), num_reqs=len(batch),
                decode_only=all(n == 1 and st.computed > st.req.prompt_tokens for st, n in batch),
                context_tokens=sum(st.computed for st, _ in batch), blocks_used=eng.used_blocks,
                running=len(eng.running), waiting=len(eng.waiting), preempted=preempted)


def simulate_dp(cfg: SchedulerConfig, requests: tuple[Request, ...], dp: int, routing: Routing, lockstep: bool,
                step_us: Callable[[int, Batch, int, int], float],
                on_step: Callable[[int, Step], None] | None = None,
                gather: Callable[[list[int]], tuple[list[int], int, int]] | None = None) -> DPResult:
    """Run the load to completion over ``dp`` ranks; ``step_us(rank, batch, padded, moe)`` is a rank's
    step time (``padded`` and ``moe`` from ``gather`` in lockstep, else 0)."""
    env = simpy.Environment()
    engines = [Engine(cfg, ()) for _ in range(dp)]
    results = [SchedulerResult(states=e.states) for e in engines]
    rank_of = [0] * len(requests)
    wake = [env.event() for _ in range(dp)]
    seen = [[0, 0] for _ in range(dp)]  # the router's (waiting, running) per rank
    arrived = {"n": 0}

    def finished() -> bool:
        return arrived["n"] == len(requests) and all(e.done == len(e.states) for e in engines)

    def ring(r: int) -> None:
        if not wake[r].triggered:
            wake[r].succeed()

    def refresh() -> Generator[simpy.Event, None, None]:
        while arrived["n"] < len(requests):
            for r, e in enumerate(engines):
                seen[r] = [len(e.waiting), len(e.running)]
            yield env.timeout(routing.refresh_us)

    def choose(i: int) -> int:
        if routing.rule == "round_robin":
            return i % dp
        scores = [routing.waiting_weight * w + run for w, run in seen]
        r = scores.index(min(scores))
        seen[r][0] += 1
        return r

    def arrivals() -> Generator[simpy.Event, None, None]:
        for i, req in enumerate(requests):
            if req.arrival_us > env.now:
                yield env.timeout(req.arrival_us - env.now)
                if routing.rule == "least_loaded":  # a refresh due at this instant comes first
                    yield env.timeout(0)
            r = rank_of[i] = choose(i)
            st = ReqState(req)
            engines[r].states.append(st)
            engines[r].arrive(st)
            arrived["n"] += 1
            ring(0 if lockstep else r)
        for r in range(dp):  # the ranks waiting for work see that no more comes
            ring(r)

    def record(r: int, t0: float, batch: Batch, preempted: int, padded: int = 0, moe: int = 0) -> None:
        eng, res = engines[r], results[r]
        step = _step(t0, env.now, batch, preempted, eng)
        step.padded_tokens, step.moe_tokens, step.dummy = padded, moe, not batch
        assert 0 <= eng.free_blocks <= cfg.num_blocks, "blocks in use exceed the pool"
        res.max_blocks_used = max(res.max_blocks_used, eng.used_blocks)
        res.steps.append(step)
        if on_step is not None:
            on_step(r, step)

    def rank_loop(r: int) -> Generator[simpy.Event, None, None]:
        eng = engines[r]
        while not finished():
            batch, preempted = eng.schedule()
            if not batch:
                if finished():
                    break
                wake[r] = env.event()
                yield wake[r]
                continue
            t0 = env.now
            yield env.timeout(step_us(r, batch, 0, 0))
            eng.finish_step(batch, env.now)
            record(r, t0, batch, preempted)

    def lockstep_loop() -> Generator[simpy.Event, None, None]:
        while not finished():
            scheduled: Sequence[tuple[Batch, int]] = [e.schedule() for e in engines]
            if not any(b for b, _ in scheduled):
                if finished():
                    break
                wake[0] = env.event()
                yield wake[0]
                continue
            t0 = env.now
            own = [sum(n for _, n in b) for b, _ in scheduled]
            padded, moe, moe_cost = gather(own) if gather is not None else (own, 0, 0)
            yield env.timeout(max(step_us(r, b, padded[r] if gather is not None else 0, moe_cost)
                                  for r, (b, _) in enumerate(scheduled) if b))
            for r, (batch, preempted) in enumerate(scheduled):
                if batch:
                    engines[r].finish_step(batch, env.now)
                if batch or padded[r] or moe:  # an idle rank's forward: padded tokens, or the gathered MoE
                    record(r, t0, batch, preempted, padded[r] if gather is not None else 0, moe)

    if routing.rule == "least_loaded":
        env.process(refresh())
    env.process(arrivals())
    if lockstep:
        env.process(lockstep_loop())
    else:
        for r in range(dp):
            env.process(rank_loop(r))
    env.run()
    return DPResult(ranks=results, rank_of=rank_of)
