"""Plan a job: bound every candidate of a space, simulate the ones the bound cannot rule out,
cheapest first, and rank the ones that fit.

1. **Bound**: the space becomes columns (:mod:`timeline.plan.table`, rows in name order). In the
   engine's workers, in blocks of *layout groups* (the candidates that differ only in their
   recompute policy) that share probes, each group becomes one run (its
   :func:`~timeline.plan.space.candidate_edits` of the base run), validated once outside the
   recompute section and once per policy inside it (an invalid candidate keeps its first
   problem, as :func:`derive` gives it), and a valid candidate gets its layout's *coarse*
   static bound (:func:`timeline.plan.bound.coarse_stats`: below the bound of every recompute
   policy, from two probes per layout and micro-batch size instead of one per policy). A memory
   bound over capacity prunes it (``static_bound``). The parent spreads the answers over the rows
   (:class:`~timeline.plan.columns.Columns`).
2. **Time, then simulate** the rest. Exact bounds are computed lazily: the survivors are taken in
   order of their coarse time bound, a fixed chunk at a time, until every candidate not yet bounded
   exactly has a coarse time above the best exact one waiting — so the order is exactly that of all
   exact time bounds. An exact memory bound over capacity prunes (``static_bound``). Candidates are
   then *timed* in order of their exact bounds, a batch at a time (the schedule simulated without
   its memory events, :func:`time_summary`, about a sixth of a simulation: the memory never moves
   time), until the fastest one timed is at or below every bound still untimed; it is the fastest
   of all not yet simulated, and is *simulated* next (summary level: peaks per device), a batch at
   a time, so candidates are simulated in order of their iteration times (then name). Once
   ``keep`` candidates fit and the next one's time exceeds the slowest of the best ``keep``,
   nothing left can enter them: the rest are ``time_bound`` (not simulated; those timed keep their
   iteration time, those never bounded exactly their coarse bound, ``bound_exact`` false). A
   simulated candidate short of memory on some device is ``oom``.
3. **Rank** the fitting ones by iteration time, then max peak reserved, then name.

Chunks, batches and the stopping rule depend only on the candidates' order, never on timing or
the worker count, so every engine and worker count gives the same rows. This module prints
nothing; ``progress`` hears (stage, done, total).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import numpy as np

from timeline.errors import UserError
from timeline.graph.source import ModelSource, model_source
from timeline.plan.bound import (
    Bound,
    Probe,
    bound,
    coarse_probe_stats,
    probe_stats,
    zero_acts,
)
from timeline.plan.columns import PRUNED_NAMES, Columns, GroupResult, Row
from timeline.plan.engines import Engine
from timeline.plan.space import Candidate, Space, candidate_edits
from timeline.plan.table import Table, build_table
from timeline.profiles import LIMITS, profile
from timeline.result.build import build_timeline
from timeline.result.metrics import device_fits
from timeline.sim.estimate import estimate_work
from timeline.sim.static_state import StateRules
from timeline.spec.recompute import parse_recompute
from timeline.spec.run import RecomputeSpec, RunSpec
from timeline.spec.validate import (
    offload_problems,
    run_recompute_problems,
    validate_all_but_recompute,
    validate_run,
)

T = TypeVar("T")
#: what other modules take from here (the exporter reads the fates' names through this module)
__all__ = ["PRUNED_NAMES", "PlanResult", "Row", "derive", "known", "plan", "run_bound", "simulate_summary",
           "time_summary"]


@dataclass(frozen=True, slots=True)
class SimSummary:
    """What a plan keeps of one simulation (small, so it travels back from workers cheaply)."""

    peak_requested_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    worst_device: int
    short_bytes: int
    fits: bool
    iteration_time_us: float
    per_device_reserved: tuple[tuple[int, int], ...]  # (device, peak reserved bytes)


@dataclass(slots=True)
class PlanResult:
    space: Space
    capacity_bytes: int
    columns: Columns  # every candidate, in name order
    rows: dict[int, Row] = field(default_factory=dict)  # those bounded exactly (and simulated), by table index
    ranked: list[Row] = field(default_factory=list)  # fitting, best first
    counts: dict[str, int] = field(default_factory=dict)
    runs: dict[str, RunSpec] = field(default_factory=dict)  # the ranked candidates' runs, by name


def time_summary(run: RunSpec) -> float:
    """The iteration time (µs) of ``run``'s simulation, without its memory: the schedule timed, no
    device's events made or allocated (``build_timeline(timing_only=True)``; equal to
    :func:`simulate_summary`'s, which the search asserts)."""
    return build_timeline(run, model_source, timing_only=True).meta.iteration_time_us


def simulate_summary(run: RunSpec) -> SimSummary:
    """Simulate ``run`` (allocator included, no exports; the summary-level build, one device at a
    time) and keep its peaks and iteration time."""
    tl = build_timeline(run, model_source, summary_only=True)
    devs = device_fits(tl)
    worst = min(devs, key=lambda d: (-d.over_bytes, -d.peak_reserved_bytes, d.device))
    return SimSummary(peak_requested_bytes=max(d.peak_requested_bytes for d in devs),
                      peak_allocated_bytes=max(d.peak_allocated_bytes for d in devs),
                      peak_reserved_bytes=max(d.peak_reserved_bytes for d in devs), worst_device=worst.device,
                      short_bytes=worst.over_bytes, fits=all(d.fits for d in devs),
                      iteration_time_us=tl.meta.iteration_time_us,
                      per_device_reserved=tuple((d.device, d.peak_reserved_bytes) for d in devs))


#: a block of layout groups (each as its candidate with the space's first recompute value) with
#: what derives their runs: the base run and the space
BoundJob = tuple[RunSpec, Space, tuple[Candidate, ...]]
#: blocks of layout groups per worker, handed out ROUND_BLOCKS per worker between progress reports
#: (several per round, so that a slow block does not hold its round's other worker idle)
BLOCKS_PER_WORKER, ROUND_BLOCKS = 32, 4
#: chunks of survivors bounded exactly at a time (fixed: the rows must not depend on the workers)
EXACT_CHUNK = 64
#: candidates simulated between two checks of the stopping rule; a constant, so that the worker count
#: (which only spreads a batch over processes) never changes which candidates are simulated
SIM_BATCH = 4
#: candidates timed at a time (a timing costs about a sixth of a simulation; fixed, like SIM_BATCH)
TIME_BATCH = 8
FULL = parse_recompute("full:uniform:1")


def run_bound(run: RunSpec, *, coarse: bool) -> Bound:
    """The static bound of ``run``: of its own recompute policy, or (``coarse``) its layout's coarse
    bound, below every policy's (:func:`timeline.plan.bound.coarse_stats`). Probes are cached. The
    coarse bound reads ``run.recompute`` only through :func:`timeline.plan.bound.zero_acts`."""
    rule = profile(run.profile).params.expert_state_group

    def probe_of(rc: RecomputeSpec) -> tuple[Probe, ModelSource]:
        probe = Probe.of(run.model, rc, run.parallel, run.training)
        return probe, model_source(replace(run, **probe.edits()))

    if coarse:
        probe, none = probe_of(RecomputeSpec())
        st = coarse_probe_stats(none, probe_of(FULL)[1], run.hardware, probe.parallel, rule, probe.kinds,
                                zero_acts(run.recompute))
    else:
        probe, source = probe_of(run.recompute)
        st = probe_stats(source, run.hardware, probe.parallel, rule, probe.kinds, zero_acts(run.recompute))
    rules = StateRules(profile=run.profile, framework=run.framework, sm=run.hardware.sm, traced=run.trace is not None,
                       expert_state_group=rule, combined_1f1b=run.schedule.combined_1f1b)
    return bound(st, model=run.model, parallel=run.parallel, training=run.training, schedule=run.schedule, rules=rules)


def derive(base: RunSpec, space: Space, cand: Candidate) -> tuple[RunSpec | None, str]:
    """The candidate's edits applied to ``base``, validated as a whole run: (run, "") or (None, "key:
    problem"). The planner's door to whole runs; deterministic, so workers and the parent agree."""
    edits, key, problem = candidate_edits(cand, space, base.model.num_hidden_layers)
    if edits is None:
        return None, f"{key}: {problem}"
    run = replace(base, recompute=edits.recompute,
                  **{sec: replace(getattr(base, sec), **vals) for sec, vals in edits.sections.items() if vals})
    problems = validate_run(run, LIMITS)
    if problems:
        return None, f"{problems[0][0]}: {problems[0][1]}"
    return run, ""


def bound_block(job: BoundJob) -> list[GroupResult]:
    """Derive, validate and coarse-bound a block of layout groups (run in a worker; the probes are
    cached there). Per group one run is built and validated outside its recompute section; each
    recompute value adds only that section (:func:`timeline.spec.validate.validate_run` is the
    concatenation), and the coarse bound is computed once per :func:`zero_acts` class of the
    group's valid policies — the same values :func:`derive` and :func:`run_bound` give each
    candidate (``tests/plan/test_table.py`` compares them on whole spaces)."""
    base, space, groups = job
    policies = [parse_recompute(text) for text in dict(space.values)["recompute"]]
    # run_recompute_problems reads, besides the policy and the model (the base's, for every group), the
    # layout's pp, vpp and split only, and of the problems before it whether one is the layout's
    recompute_problems: dict[tuple[int, int, int, tuple[int, ...] | None, bool], list[tuple[str, str]]] = {}
    out = []
    for cand in groups:
        edits, key, problem = candidate_edits(cand, space, base.model.num_hidden_layers)
        if edits is None:
            out.append(GroupResult(0, 0, None, (f"{key}: {problem}",) * len(policies), (None,) * len(policies)))
            continue
        run = replace(base, recompute=RecomputeSpec(),
                      **{sec: replace(getattr(base, sec), **vals) for sec, vals in edits.sections.items() if vals})
        before, after = validate_all_but_recompute(run, LIMITS)
        invalid: list[str] = []
        bounds: list[tuple[int, int, float, bool] | str | None] = []
        by_zero: dict[bool, tuple[int, int, float, bool] | str] = {}
        par = run.parallel
        layout_problem = any(k == "parallel.layout" for k, _ in before)
        for p, rc in enumerate(policies):
            split = (p, par.pp, par.vpp, par.layout, layout_problem)
            if split not in recompute_problems:
                recompute_problems[split] = run_recompute_problems(rc, par, run.model, before)
            problems = before + recompute_problems[split] + after + offload_problems(
                run.offload, run.model, run.framework, rc, run.schedule, profile=run.profile,
                traced=run.trace is not None)
            if problems:
                invalid.append(f"{problems[0][0]}: {problems[0][1]}")
                bounds.append(None)
                continue
            zero = zero_acts(rc)
            if zero not in by_zero:
                try:
                    b = run_bound(replace(run, recompute=rc), coarse=True)
                    by_zero[zero] = (b.memory_bytes, b.memory_rank, b.time_us,
                                     b.memory_bytes > run.hardware.capacity_bytes)
                except UserError as exc:  # e.g. a schedule its generator refuses for these counts
                    by_zero[zero] = f"schedule.kind: {exc}"
            invalid.append("")
            bounds.append(by_zero[zero])
        out.append(GroupResult(run.parallel.dp, run.training.num_microbatches, run.parallel.layout, tuple(invalid),
                               tuple(bounds)))
    return out


def exact_block(job: tuple[RunSpec, ...]) -> list[Bound]:
    """The bound of each run's own recompute policy (run in a worker)."""
    return [run_bound(run, coarse=False) for run in job]


def _blocks(table: Table, order: np.ndarray, workers: int) -> list[tuple[Candidate, ...]]:
    """The space's layout groups in blocks that share probes (``order``: by (tp, cp, ep, etp,
    micro-batch), :func:`_group_order`), :data:`BLOCKS_PER_WORKER` per worker, in a fixed order."""
    cands = [table.group_candidate(int(g)) for g in order]
    n = max(1, min(len(cands), BLOCKS_PER_WORKER * workers))
    size = math.ceil(len(cands) / n) if cands else 1
    return [tuple(cands[i:i + size]) for i in range(0, len(cands), size)]


def _group_order(table: Table) -> np.ndarray:
    """The layout groups in the order :func:`_blocks` hands them out."""
    keys = [k for k, _ in table.space.values]
    probe_cols = [keys.index(k) for k in ("parallel.tp", "parallel.cp", "parallel.ep", "parallel.etp",
                                          "training.micro_batch_size")]
    return np.lexsort(tuple(table.groups[:, j] for j in reversed(probe_cols)))


def plan(base: RunSpec, space: Space, engine: Engine, *, keep: int = 10, max_events: int = 50_000_000,
         max_simulations: int = 0, progress: Callable[[str, int, int], None] | None = None) -> PlanResult:
    """Bound, simulate and rank ``space`` around ``base`` (the run file's fixed settings).

    ``max_simulations`` (0: no limit) stops simulating after that many; the survivors left are
    ``budget`` — the ranking is then the best among those simulated, not a proof."""
    say = progress or (lambda *_: None)
    cap = base.hardware.capacity_bytes
    table = build_table(space)
    order = _group_order(table)
    jobs: list[BoundJob] = [(base, space, b) for b in _blocks(table, order, engine.workers)]
    results: list[GroupResult | None] = [None] * len(table.groups)
    policies = len(dict(space.values)["recompute"])
    done_groups = 0
    per_round = ROUND_BLOCKS * engine.workers
    for i in range(0, len(jobs), per_round):
        for part in engine.map(bound_block, jobs[i:i + per_round]):
            for res in part:
                results[int(order[done_groups])] = res
                done_groups += 1
        say("bounded", done_groups * policies, table.size)
    cols = Columns.of(table, results)
    rows: dict[int, Row] = {}  # the candidates bounded exactly (and simulated), by table index
    runs_of: dict[int, RunSpec] = {}  # their runs, derived again here

    def run_of(r: Row) -> RunSpec:
        if r.index not in runs_of:
            run, _ = derive(base, space, r.candidate)
            assert run is not None  # the worker derived the same run
            runs_of[r.index] = run
        return runs_of[r.index]

    survivors = cols.survivors()  # table indices, by (coarse time bound, name)
    waiting: list[tuple[float, int, int]] = []  # (exact time bound, table index: name order, survivor position)
    taken = 0  # survivors[:taken] are bounded exactly

    def take_chunk() -> None:
        nonlocal taken
        part = [cols.row(int(i)) for i in survivors[taken:taken + EXACT_CHUNK]]
        size = math.ceil(len(part) / engine.workers)
        jobs = [tuple(run_of(r) for r in part[i:i + size]) for i in range(0, len(part), size)]
        exact = [b for block in engine.map(exact_block, jobs) for b in block]
        for i, (r, b) in enumerate(zip(part, exact, strict=True)):
            # the coarse bound lies below the exact one (bound.coarse_stats): checked on every candidate
            assert known(r.bound_bytes) <= b.memory_bytes and known(r.bound_time_us) <= b.time_us * (1 + 1e-9), \
                (r.name, r.bound_bytes, b.memory_bytes, r.bound_time_us, b.time_us)
            r.bound_bytes, r.bound_rank, r.bound_time_us, r.bound_exact = b.memory_bytes, b.memory_rank, \
                b.time_us, True
            rows[r.index] = r
            if b.memory_bytes > cap:
                r.pruned_by = "static_bound"
            else:
                heapq.heappush(waiting, (b.time_us, r.index, taken + i))
        taken += len(part)

    def ready() -> bool:
        """Bound exactly until the best waiting candidate is the best of all; False when none is left."""
        while taken < len(survivors) and (not waiting or cols.bound_time[survivors[taken]] <= waiting[0][0]):
            take_chunk()
        return bool(waiting)

    timed: list[tuple[float, int]] = []  # (simulated iteration time, table index): timed, not yet simulated

    def time_batch() -> None:
        """Time the next :data:`TIME_BATCH` candidates in order of their exact bounds."""
        todo: list[Row] = []
        runs: list[RunSpec] = []
        while len(todo) < TIME_BATCH and ready():
            r = rows[heapq.heappop(waiting)[1]]
            run = run_of(r)
            est = estimate_work(model_source(run), model=run.model, parallel=run.parallel, training=run.training,
                                recompute=run.recompute, schedule_kind=run.schedule.kind, hardware=run.hardware,
                                traced=run.trace is not None)
            if est.memory_events > max_events:
                r.pruned_by = "too_large"
                continue
            todo.append(r)
            runs.append(run)
        for r, t in zip(todo, engine.map(time_summary, runs), strict=True):
            # the bound lies below the simulated time: checked on every candidate timed
            assert known(r.bound_time_us) <= t * (1 + 1e-9), (r.name, r.bound_time_us, t)
            _timed(r, t, space, base.training.seq_len)
            heapq.heappush(timed, (t, r.index))

    def next_ready() -> bool:
        """Time candidates until the fastest one timed is the fastest of all not yet simulated (no
        candidate still untimed has a bound at or below its time); False when none is left."""
        while ready() and (not timed or waiting[0][0] <= timed[0][0]):
            time_batch()
        return bool(timed)

    def leave(reason: str) -> None:
        for _, i, _ in waiting:
            rows[i].pruned_by = reason
        for _, i in timed:
            rows[i].pruned_by = reason
        cols.prune(survivors[taken:], reason)
        waiting.clear()
        timed.clear()

    fitting: list[Row] = []
    batch = SIM_BATCH  # never the worker count: which candidates are simulated must not depend on it
    done = 0
    while next_ready():
        if len(fitting) >= keep and timed[0][0] > _kth_time(fitting, keep):
            leave("time_bound")
            break
        if max_simulations and done >= max_simulations:
            leave("budget")
            break
        todo, runs = [], []
        for _ in range(min(batch, max_simulations - done) if max_simulations else batch):
            if not next_ready():
                break
            r = rows[heapq.heappop(timed)[1]]
            todo.append(r)
            runs.append(run_of(r))
        for r, s in zip(todo, engine.map(simulate_summary, runs), strict=True):
            assert s.iteration_time_us == r.iteration_time_us, (r.name, s.iteration_time_us, r.iteration_time_us)
            _record(r, s, space, base.training.seq_len)
            if r.fits:
                fitting.append(r)
        done += len(todo)
        say("simulated", done, len(survivors))
        say("fitting", len(fitting), len(fitting))
    ranked = sorted(fitting, key=lambda r: (r.iteration_time_us, r.peak_reserved_bytes, r.index))
    for i, r in enumerate(ranked, 1):
        r.rank = i
    for r in rows.values():
        cols.absorb(r)
    counts = cols.counts(simulated=sum(r.simulated for r in rows.values()), fit=len(ranked))
    return PlanResult(space=space, capacity_bytes=cap, columns=cols, rows=rows, ranked=ranked, counts=counts,
                      runs={r.name: runs_of[r.index] for r in ranked})


def known(value: T | None) -> T:
    """A row's field that its stage has set (the bound's time on survivors, the simulation's peak
    and time on simulated rows)."""
    assert value is not None
    return value


def _kth_time(fitting: Sequence[Row], k: int) -> float:
    return sorted(known(r.iteration_time_us) for r in fitting)[k - 1]


def _timed(r: Row, time_us: float, space: Space, seq_len: int) -> None:
    r.iteration_time_us = time_us
    tokens = space.global_batch * seq_len
    r.tokens_per_s_per_gpu = tokens / (time_us / 1e6 * space.world_size) if time_us else None


def _record(r: Row, s: SimSummary, space: Space, seq_len: int) -> None:
    r.simulated = True
    r.peak_requested_bytes, r.peak_allocated_bytes = s.peak_requested_bytes, s.peak_allocated_bytes
    r.peak_reserved_bytes, r.worst_device, r.short_bytes = s.peak_reserved_bytes, s.worst_device, s.short_bytes
    r.fits = s.fits
    _timed(r, s.iteration_time_us, space, seq_len)
    if not s.fits:
        r.pruned_by = "oom"
