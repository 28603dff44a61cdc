"""``fit``: the recompute policy with the least recompute time whose peak reserved memory fits
every device.

Search space (stated to the user, enumerated exhaustively by the tests):

- ``none``;
- ``selective:S`` for every non-empty set S of the modules the model has (``mla_up_proj`` needs
  MLA, ``moe``/``moe_act``/``shared_experts`` a MoE model), less the *dominated* sets — those that
  on no pipeline rank save more bytes per micro-batch, yet cost at least as much recompute time,
  as ``none`` or a smaller set — ordered by bytes saved per recomputed FLOP;
- ``full:uniform:N`` for N = 1 … layers per chunk (the same N on every rank);
- ``full:block:N_0,…,N_{p−1}``, each N_r = 0 … layers in rank r's chunks.

Cost is (max over ranks, sum over ranks) of recompute time per iteration, known statically from
the op templates and the schedule's action counts. Candidates are simulated cheapest first
until one fits, then for the runner-ups. Two rules skip simulations: a static lower bound —
the baseline's peak minus, for every micro-batch in flight at most, what the candidate saves
per micro-batch — above capacity on some rank; and, for ``block``, that a rank's memory depends
only on its own N_r, so the least fitting N_r per rank is found by raising only failing ranks.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from timeline.compare.metrics import MAX_WORKERS, VariantResult, worker_pool
from timeline.compare.variants import recompute_name
from timeline.graph.signature import OPS_ONLY_POLICIES
from timeline.graph.source import ModelSource
from timeline.sim.plan import PipelinePlan
from timeline.spec.model import ModelSpec
from timeline.spec.run import RECOMPUTE_MODULES, RecomputeSpec

Cost = tuple[float, float]

#: template builds above which the selective search uses worker processes
PARALLEL_TEMPLATES = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A policy with its static per-rank numbers (from templates, before any simulation)."""

    name: str
    spec: RecomputeSpec
    activation_bytes: tuple[int, ...]  # per rank: saved bytes per micro-batch
    recompute_flops: tuple[float, ...]  # per rank, per iteration
    recompute_time_us: tuple[float, ...]  # per rank, per iteration

    @property
    def cost(self) -> Cost:
        return (max(self.recompute_time_us, default=0.0), sum(self.recompute_time_us))


STATUSES = ("fits", "short", "pruned")


@dataclass(slots=True, kw_only=True)
class Outcome:
    """A candidate's fate: simulated and fits, simulated and short, or pruned by the static bound."""

    candidate: Candidate
    result: VariantResult | None  # None: pruned without simulating
    status: str  # one of STATUSES
    short_bytes: int = 0  # short: what the worst device lacks; pruned: a lower bound on it
    device: int | None = None  # the device short of memory (short, pruned)
    bound_bytes: int | None = None  # pruned: the static lower bound on that device's peak requested bytes

    @property
    def fits(self) -> bool:
        return self.status == "fits"

    @property
    def note(self) -> str:
        """One line for people: "fits", "short of 1.23 GiB on device 3" or "pruned: short of ≥ … (static bound)"."""
        gib = f"{self.short_bytes / 2**30:,.2f} GiB on device {self.device}"
        if self.status == "short":
            return f"short of {gib}"
        if self.status == "pruned":
            return f"pruned: short of ≥ {gib} (static bound)"
        return "fits"


@dataclass(slots=True, kw_only=True)
class FitResult:
    capacity_bytes: int
    space: dict[str, int]  # how many candidates of each family
    best: Outcome | None = None
    alternatives: list[Outcome] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)  # in the order considered
    shortfall: tuple[str, int, int] | None = None  # (policy, device, bytes over) when nothing fits


class Statics:
    """Static per-rank numbers of any policy on one model source (templates only, cached):
    ``pipe`` is the simulation's own plan stage (schedule, holders, cost), ``ranges`` the
    decoder layers of each chunk."""

    def __init__(self, source: ModelSource, pipe: PipelinePlan, model: ModelSpec, ranges: list[range]) -> None:
        self.source, self.model, self.cost = source, model, pipe.cost
        sched = pipe.schedule
        self.holders = pipe.holders
        self.counts = [{(a.stage, a.kind): 0 for a in row} for row in sched.actions]
        for r, row in enumerate(sched.actions):
            for a in row:
                self.counts[r][(a.stage, a.kind)] += 1
        self.stages = sched.stages_of_rank
        self.layers = tuple(max(len(ranges[c]) for c in st) for st in self.stages)
        # chunks whose templates match up to layer names under none/selective share one build
        self.same_as = {c: c for st in self.stages for c in st}
        first: dict = {}
        for c in sorted(self.same_as):
            self.same_as[c] = first.setdefault(source.signature(c), c)
        self._per_chunk: dict[tuple[RecomputeSpec, int], tuple[int, list[tuple[str, float, float]]]] = {}

    def _chunk(self, spec: RecomputeSpec, c: int, pp_rank: int) -> tuple[int, list]:
        """(activation bytes, [(kind, recompute FLOPs, recompute µs)]) of chunk ``c`` per action."""
        shared = spec.policy in OPS_ONLY_POLICIES
        key = (spec, self.same_as[c] if shared else c)
        if shared and key in self._per_chunk:
            return self._per_chunk[key]
        tpl = self.source.under(recompute=spec).template(key[1], pp_rank=pp_rank)
        per = {k: [o for o in ops if o.recompute] for k, ops in (
            ("I", tpl.backward_i), ("W", tpl.backward_w), ("B", tpl.backward or tpl.backward_i + tpl.backward_w))}
        out = (tpl.activation_bytes, [(kind, sum(o.flops for o in ops), sum(self.cost.op_us(o) for o in ops))
                                      for kind, ops in per.items()])
        if shared:
            self._per_chunk[key] = out
        return out

    def candidate(self, spec: RecomputeSpec) -> Candidate:
        act, flops, time = [], [], []
        holder = self.holders
        for r, stages in enumerate(self.stages):
            a = f = t = 0.0
            for c in stages:
                act_bytes, per = self._chunk(spec, c, holder[c])
                a += act_bytes
                for kind, flops_sum, us_sum in per:
                    n = self.counts[r].get((c, kind), 0)
                    f += n * flops_sum
                    t += n * us_sum
            act.append(int(a))
            flops.append(f)
            time.append(t)
        return Candidate(name=recompute_name(spec), spec=spec, activation_bytes=tuple(act),
                         recompute_flops=tuple(flops), recompute_time_us=tuple(time))

    def block(self, n: tuple[int, ...]) -> RecomputeSpec:
        return RecomputeSpec(policy="full", method="block", num_layers=n if len(n) > 1 else n[0])


def selective_modules(m: ModelSpec) -> tuple[str, ...]:
    skip = ({"mla_up_proj"} if not m.is_mla else set()) | (
        {"moe", "moe_act", "shared_experts"} if not m.is_moe else set()) | (
        {"gdn_norm_out"} if not m.has_linear_attention else set())
    return tuple(x for x in RECOMPUTE_MODULES if x not in skip)


def _dominated(b: Candidate, a: Candidate) -> bool:
    """``b`` saves nowhere more than ``a`` and costs everywhere at least as much."""
    return all(x <= y for x, y in zip(a.activation_bytes, b.activation_bytes, strict=True)) and all(
        x <= y for x, y in zip(a.recompute_time_us, b.recompute_time_us, strict=True))


def selective_space(st: Statics, none: Candidate) -> tuple[list[Candidate], int]:
    """Undominated selective sets by bytes saved per FLOP (best first), and how many were pruned."""
    mods = selective_modules(st.model)
    sets = [s for k in range(1, len(mods) + 1) for s in itertools.combinations(mods, k)]
    specs = [RecomputeSpec(policy="selective", modules=s) for s in sets]
    work = len(specs) * len(set(st.same_as.values()))  # templates to build
    if work < PARALLEL_TEMPLATES:
        cands = [st.candidate(spec) for spec in specs]
    else:  # each set needs its own templates: share them out over the worker processes, in order
        with worker_pool(MAX_WORKERS) as pool:
            cands = list(pool.map(st.candidate, specs, chunksize=max(1, len(specs) // (4 * MAX_WORKERS))))
    def prunes(a: Candidate, b: Candidate, a_first: bool) -> bool:  # equal numbers: the first wins
        return _dominated(b, a) and (a_first or not _dominated(a, b))

    kept = [b for i, b in enumerate(cands)
            if not prunes(none, b, True) and not any(prunes(a, b, j < i) for j, a in enumerate(cands) if j != i)]
    saved = {c.name: sum(none.activation_bytes) - sum(c.activation_bytes) for c in kept}
    kept.sort(key=lambda c: -saved[c.name] / max(sum(c.recompute_flops), 1.0))
    return kept, len(cands) - len(kept)


def fit(st: Statics, capacity_bytes: int, simulate_policy: Callable[[str, RecomputeSpec], VariantResult], *,
        alternatives: int = 3, max_simulations: int = 24) -> FitResult:
    """The cheapest fitting policy, up to ``alternatives`` runner-ups, and every candidate's fate:
    ``st`` gives every policy's static numbers, ``simulate_policy(name, spec)`` simulates the run
    under one (the command line's :func:`timeline.cli.fit.fit_run` makes both from a run)."""
    cap = capacity_bytes
    none = st.candidate(RecomputeSpec(policy="none"))
    selective, pruned = selective_space(st, none)
    uniform = [st.candidate(RecomputeSpec(policy="full", method="uniform", num_layers=n))
               for n in range(1, max(st.layers) + 1)]
    block_table = [none] + [st.candidate(st.block(tuple(min(n, L) for L in st.layers)))
                            for n in range(1, max(st.layers) + 1)]
    out = FitResult(capacity_bytes=cap, space={"selective": len(selective), "selective_dominated": pruned,
                                               "uniform": len(uniform),
                                               "block": math.prod(L + 1 for L in st.layers) - 1})
    sims: dict[str, VariantResult] = {}

    def simulate(c: Candidate) -> Outcome:
        if c.name not in sims:
            sims[c.name] = simulate_policy(c.name, c.spec)
        res = sims[c.name]
        if res.fits:
            return Outcome(candidate=c, result=res, status="fits")
        worst = res.worst_device()
        return Outcome(candidate=c, result=res, status="short", short_bytes=worst.over_bytes, device=worst.device)

    base = simulate(none).result
    assert base is not None
    inflight = [math.ceil(d.peak_activation_bytes / a) if a else 0
                for d, a in zip(base.devices, none.activation_bytes, strict=True)]

    def bound(c: Candidate, r: int) -> int:
        """A lower bound on rank r's peak requested bytes under ``c``."""
        saved = max(0, none.activation_bytes[r] - c.activation_bytes[r])
        return base.devices[r].peak_requested_bytes - inflight[r] * saved

    def compose(n: tuple[int, ...]) -> Candidate:
        rows = [block_table[min(x, max(st.layers))] for x in n]
        return replace(block_table[0], name=recompute_name(st.block(n)), spec=st.block(n),
                       activation_bytes=tuple(c.activation_bytes[r] for r, c in enumerate(rows)),
                       recompute_flops=tuple(c.recompute_flops[r] for r, c in enumerate(rows)),
                       recompute_time_us=tuple(c.recompute_time_us[r] for r, c in enumerate(rows)))

    # block: start each rank at the least N_r the base run and the static bound allow
    fails0 = {r for r, d in enumerate(base.devices) if not d.fits}
    start = []
    for r, L in enumerate(st.layers):
        ok = [n for n in range(1 if r in fails0 else 0, L + 1) if bound(block_table[n], r) <= cap]
        start.append(ok[0] if ok else L)
    seq = itertools.count()
    heap: list[tuple[tuple[float, float], int, Candidate, str | None]] = [
        (c.cost, next(seq), c, None) for c in [none, *selective, *uniform]]
    if any(start):  # all zeros is ``none``
        heap.append((compose(tuple(start)).cost, next(seq), compose(tuple(start)), "block"))
    heapq.heapify(heap)
    fitting: list[Outcome] = []
    while heap and len(fitting) <= alternatives and (not fitting or len(sims) < max_simulations):
        _, _, cand, tag = heapq.heappop(heap)
        over = [(bound(cand, r) - cap, r) for r in range(len(st.layers))]
        worst = max(over)
        if worst[0] > 0 and cand.name not in sims:
            out.outcomes.append(Outcome(candidate=cand, result=None, status="pruned", short_bytes=worst[0],
                                        device=base.devices[worst[1]].device, bound_bytes=worst[0] + cap))
            continue
        oc = simulate(cand)
        out.outcomes.append(oc)
        if tag == "block" and not oc.fits:  # raise N_r only where rank r does not fit
            n = list(cand.spec.num_layers) if isinstance(cand.spec.num_layers, tuple) else [cand.spec.num_layers]
            assert oc.result is not None  # a simulated outcome
            failing = [r for r, d in enumerate(oc.result.devices) if not d.fits]
            if all(n[r] < st.layers[r] for r in failing):
                for r in failing:
                    n[r] += 1
                nxt = compose(tuple(n))
                heapq.heappush(heap, (nxt.cost, next(seq), nxt, "block"))
        if oc.fits:
            fitting.append(oc)
            if cand.cost == (0.0, 0.0):
                break  # nothing recomputes less than nothing: runner-ups would cost more for no gain
    if fitting:
        out.best, out.alternatives = fitting[0], fitting[1:]
        return out
    # nothing fits: say by how much, at best — simulating the policy that saves the most if need be
    most = min([*uniform, compose(st.layers), *selective, none], key=lambda c: (sum(c.activation_bytes), c.cost))
    if most.name not in sims:
        out.outcomes.append(simulate(most))
    name, res = min(sims.items(), key=lambda kv: (kv[1].worst_device().over_bytes, kv[0]))
    w = res.worst_device()
    out.shortfall = (name, w.device, w.over_bytes)
    return out
