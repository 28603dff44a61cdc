"""Stage 2 of a simulation, time: the plan's schedule run through the discrete-event engine
(:mod:`timeline.sim.engine`) for every iteration, with each action's duration read off
its compiled phase. The result is each pipeline rank's spans in time order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from timeline.sim.combined import backward_nodes, forward_nodes, pair_shifts
from timeline.sim.compiled import CompiledPhase
from timeline.sim.engine import Span, run_schedule
from timeline.sim.plan import Compiled, SimPlan


@dataclass(frozen=True, slots=True)
class Timing:
    per_rank: list[list[Span]]  # each pipeline rank's spans, by (start, end)
    iteration_time_us: float
    #: reported peaks start here: the first reported iteration's first action (0: all reported)
    report_start_us: float


def overlapped_us(f: CompiledPhase, b: CompiledPhase) -> float:
    """An overlapped F&B pair (DualPipe): one chunk's communication hides behind the other's
    computation, so the pair takes the longer of all computation and all communication; both
    halves are stretched over it, so the forward's allocations and the backward's frees
    interleave in time."""
    def split(ph: CompiledPhase) -> tuple[float, float]:
        compute = float(sum(e - s for e, s, st in zip(ph.op_end, ph.op_start, ph.op_streams, strict=True)
                            if st == "compute"))
        return compute, ph.duration_us - compute

    (cf, mf), (cb, mb) = split(f), split(b)
    return max(cf + cb, mf + mb)


def combined_shifts(compiled: Compiled, pair_us: Callable[[int, str, int, str], float], early_attn_release: bool,
                    delay_wgrad: bool = False
                    ) -> Callable[[int, str, int, str], tuple[float, tuple[float, ...], tuple[float, ...]] | None]:
    """A combined-1F1B pair's (scale, forward shifts, backward shifts), each distinct pair laid out once
    (:func:`timeline.sim.combined.pair_shifts`)."""
    cache: dict[tuple[int, str, int, str], tuple[float, tuple[float, ...], tuple[float, ...]] | None] = {}

    def shifts(fs: int, fk: str, bs: int, bk: str) -> tuple[float, tuple[float, ...], tuple[float, ...]] | None:
        key = (fs, fk, bs, bk)
        if key not in cache:
            f, b = compiled[(fs, fk)], compiled[(bs, bk)]
            fmap = forward_nodes(f)
            bmap = backward_nodes(b, compiled[(bs, "F")], forward_nodes(compiled[(bs, "F")]), delay_wgrad=delay_wgrad)
            out = pair_shifts(f, fmap, b, bmap, pair_us(fs, fk, bs, bk), early_attn_release=early_attn_release,
                              delay_wgrad=delay_wgrad)
            cache[key] = None if out is None else (out[0], tuple(out[1].tolist()), tuple(out[2].tolist()))
        return cache[key]

    return shifts


def time_plan(p: SimPlan, warmup_iterations: int) -> Timing:
    """Every action's span over ``p.iterations`` iterations, timed by the busiest EP load."""
    compiled, step = p.compiled[0], p.step_us
    pairs: dict[tuple[int, str, int, str], float] = {}

    def pair_us(fs: int, fk: str, bs: int, bk: str) -> float:  # each distinct pair summed once
        key = (fs, fk, bs, bk)
        if key not in pairs:
            pairs[key] = overlapped_us(compiled[(fs, fk)], compiled[(bs, bk)])
        return pairs[key]

    spans_all = run_schedule(p.schedule, iterations=p.iterations,
                             duration_us=lambda s, k: compiled[(s, k)].duration_us, p2p_us=p.p2p_us,
                             step_us=lambda r: step[r], pair_us=pair_us,
                             pair_shifts=combined_shifts(compiled, pair_us, p.early_attn_release, p.delay_wgrad)
                             if p.schedule.combined else None)
    per_rank: list[list[Span]] = [[] for _ in range(p.schedule.pp)]
    for sp in spans_all:
        per_rank[sp.rank].append(sp)
    for row in per_rank:
        row.sort(key=lambda s: (s.start_us, s.end_us))
    iteration_time = max(s.end_us for s in spans_all) / p.iterations
    report_start = min((s.start_us for s in spans_all if s.iteration == warmup_iterations), default=0.0) \
        if warmup_iterations else 0.0
    return Timing(per_rank=per_rank, iteration_time_us=iteration_time, report_start_us=report_start)


def microbatch_map(a: Sequence[Span], b: Sequence[Span]) -> dict[int, int] | None:
    """The micro-batch renaming under which spans ``a`` are spans ``b`` — the same actions (stage,
    kind, iteration, position), at the same times and stretch, each on its own micro-batch — or
    None. DualPipe's ranks ``r`` and ``pp − 1 − r`` hold the same two chunks and run them as mirror
    images, on the micro-batches of the other direction: their event streams are then one stream
    under that renaming."""
    if len(a) != len(b):
        return None
    out: dict[int, int] = {-1: -1}  # no micro-batch (static state, the step) stays none
    for x, y in zip(a, b, strict=True):
        if (x.stage, x.kind, x.iteration, x.position, x.start_us, x.end_us, x.scale, x.overlapped, x.shift) != (
                y.stage, y.kind, y.iteration, y.position, y.start_us, y.end_us, y.scale, y.overlapped, y.shift):
            return None
        if out.setdefault(x.microbatch, y.microbatch) != y.microbatch:
            return None
    return out if len(set(out.values())) == len(out) and out[-1] == -1 else None
