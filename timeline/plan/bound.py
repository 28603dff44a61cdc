"""The static bound of a plan candidate: lower bounds on its peak memory and its iteration time,
in milliseconds, from a two-layer probe and the schedule's own action order — never a simulation.

Memory, per pipeline rank: the static state alive in the last iteration (weights; gradients and
optimizer states when the profile keeps them by then; ZeRO shards rounded down) plus, at the
worst boundary between two of the rank's actions, every micro-batch whose forward has run and
whose backward (``B`` or ``I``) has not, times the decoder-layer (and MTP) bytes it saved in each
of the rank's chunks. Whatever else is alive (embedding and head activations, transients, comm
buffers, workspaces, fragmentation) only adds, so ``bound ≤ peak requested ≤ peak reserved``: a
candidate whose bound exceeds capacity cannot fit, and no fitting candidate is ever pruned.

Time, per rank: a rank runs its actions one after another, each for the sum of its ops (an
overlapped F&B pair for the longer of its computation and its communication), so the sum of its
decoder-layer ops — and, on the ranks that hold them, the embedding's and the head's (output layer
and loss) — over one iteration is a lower bound on the iteration time.

Per-layer numbers come from a probe (the run cut to one dense and one MoE decoder layer, one
pipeline rank, one micro-batch), built once per distinct (tp, sp, cp, ep, etp, micro-batch,
recompute) and reused by every layout that shares them. This module does not simulate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from timeline.graph.analytic import AnalyticSource, analytic_costs, analytic_layer_bytes
from timeline.graph.build import Node, chunk_layers
from timeline.graph.ops import OpCost
from timeline.graph.optim_state import state_bytes_lower_bound
from timeline.graph.source import ModelSource
from timeline.graph.static import is_expert_state, zero_groups
from timeline.graph.tensors import DTYPE_BYTES
from timeline.plan.frame import frame
from timeline.profiles import Lifecycle, lifecycle
from timeline.sim.cost import CostModel
from timeline.sim.estimate import probe_model
from timeline.sim.static_state import StateRules
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import HardwareSpec, ParallelSpec, RecomputeSpec, ScheduleSpec, TrainingSpec

PHASES = ("F", "B", "I", "W")


@dataclass(frozen=True, slots=True)
class LayerStats:
    """One decoder layer kind's (or the MTP block's) numbers on one device, for one micro-batch."""

    act_bytes: int
    compute_us: dict[str, float]  # per action kind F / B / I / W
    comm_us: dict[str, float]
    dense_params: int = 0  # trainable elements, not expert states
    expert_params: int = 0
    buffer_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ProbeStats:
    dense: LayerStats | None
    moe: LayerStats | None
    mtp: LayerStats  # everything of the MTP layers (zero without them)
    embedding: LayerStats  # parameters of the first virtual stage's embedding
    head: LayerStats  # parameters of the last virtual stage's final norm, head and MTP embedding


@dataclass(frozen=True, slots=True)
class Bound:
    memory_bytes: int  # max over pipeline ranks of the lower bound on peak requested bytes
    memory_rank: int  # the pipeline rank it is reached on
    time_us: float  # lower bound on the iteration time
    per_rank_bytes: tuple[int, ...] = ()  # the memory bound of each pipeline rank


@dataclass(frozen=True, slots=True)
class Probe:
    """The slices a run's probe edits: its model cut to one decoder layer of each kind it has (two
    layers), pp = vpp = 1, one micro-batch, dp = ep·etp (per-layer numbers do not depend on dp;
    this keeps it valid); ``kind``: which kind each probe layer stands for. The probe run is
    ``replace(run, **probe.edits())``."""

    model: ModelSpec
    recompute: RecomputeSpec
    parallel: ParallelSpec
    training: TrainingSpec
    kind: dict[int, str]

    @classmethod
    def of(cls, model: ModelSpec, rc: RecomputeSpec, par: ParallelSpec, tr: TrainingSpec) -> Probe:
        cut, kind = probe_model(model)
        if rc.policy == "full" and not (rc.method == "uniform" and rc.num_layers == 1):
            rc = RecomputeSpec()  # per-layer bytes of other groupings are not a layer's own: see act_bytes below
        return cls(model=cut, recompute=rc, parallel=replace(par, pp=1, vpp=1, layout=None, mtp_stage=None,
                                                                   dp=par.ep * par.etp),
                   training=replace(tr, num_microbatches=1, iterations=1, warmup_iterations=0, optimizer_instances=1),
                   kind=kind)

    def edits(self) -> dict[str, Any]:
        return {"model": self.model, "recompute": self.recompute, "parallel": self.parallel,
                "training": self.training, "schedule": ScheduleSpec(kind="1f1b")}

    @property
    def kinds(self) -> tuple[tuple[int, str], ...]:
        return tuple(sorted(self.kind.items()))


def zero_acts(rc: RecomputeSpec) -> bool:
    """A full-recompute grouping the probe cannot stand for: its saved bytes count as none."""
    return rc.policy == "full" and not (rc.method == "uniform" and rc.num_layers == 1)


@lru_cache(maxsize=4096)
def probe_stats(source: ModelSource, hw: HardwareSpec, par: ParallelSpec, rule: str,
                kinds: tuple[tuple[int, str], ...], zero_acts: bool) -> ProbeStats:
    """Per-layer numbers of a probe's model source (:class:`Probe`; ``par``: the probe's
    parallel slice, ``rule``: the profile's ``expert_state_group``); ``zero_acts``: count no saved
    bytes (a full-recompute grouping the probe cannot stand for)."""
    kind = dict(kinds)
    if isinstance(source, AnalyticSource):  # its costs and saved bytes without the template's tensors
        phases, per_layer = analytic_costs(source, 0)
    else:
        tpl = source.template(0)
        phases = {ph: [OpCost.of(op) for op in ops] for ph, ops in (
            ("F", tpl.forward), ("B", tpl.backward or tpl.backward_i + tpl.backward_w), ("I", tpl.backward_i),
            ("W", tpl.backward_w))}
        per_layer = tpl.layer_activation_bytes
    cost = CostModel.of(hw, par)

    acts = _acts(per_layer, kinds, zero_acts)
    comp: dict[str, dict[str, float]] = {}
    comm: dict[str, dict[str, float]] = {}
    for ph, ops in phases.items():
        for op, g in zip(ops, _op_groups(ops, kind, forward=ph == "F"), strict=True):
            if g is None:
                continue
            table = comp if op.kind == "compute" else comm
            row = table.setdefault(g, dict.fromkeys(PHASES, 0.0))
            row[ph] += cost.op_us(op)
    if isinstance(source, AnalyticSource):  # its parameters read neither the micro-batch nor recompute
        params = _analytic_params(source.param_slice(), rule, kinds)
    else:
        params = _params(source.nodes(0), rule, kinds)

    def stats(g: str) -> LayerStats:
        p = params.get(g, [0, 0, 0])
        return LayerStats(act_bytes=acts.get(g, 0), compute_us=comp.get(g, dict.fromkeys(PHASES, 0.0)),
                          comm_us=comm.get(g, dict.fromkeys(PHASES, 0.0)), dense_params=p[0],
                          expert_params=p[1], buffer_bytes=p[2])

    have = set(kind.values())
    return ProbeStats(dense=stats("dense") if "dense" in have else None, moe=stats("moe") if "moe" in have else None,
                      mtp=stats("mtp"), embedding=stats("embedding"), head=stats("head"))


def _op_groups(ops: list[OpCost], kind: dict[int, str], *, forward: bool) -> list[str | None]:
    """The probe group of each op of one phase: a decoder layer's kind, "mtp" past the decoder
    layers, and for the ops outside layers (``layer`` None) the part of the model they run in —
    before the first decoder layer's op the forward runs the embedding and a backward the head (the
    output layer and its loss, a backward's first ops), after the last decoder layer's op the other
    way round (the MTP block's layers may come after the head: they do not move the line). An op
    between decoder layers that belongs to no layer counts nowhere (only a lower bound loses). The
    embedding's part sits on the first virtual stage and the head's on the last
    (:mod:`timeline.plan.frame`), so every rank's time bound adds the ops it runs."""
    at = [i for i, op in enumerate(ops) if op.layer is not None and op.layer < len(kind)]
    first, last = (at[0], at[-1]) if at else (len(ops), -1)
    before, after = ("embedding", "head") if forward else ("head", "embedding")
    out: list[str | None] = []
    for i, op in enumerate(ops):
        if op.layer is not None:
            out.append(kind[op.layer] if op.layer < len(kind) else "mtp")
        else:
            out.append(before if i < first else after if i > last else None)
    return out


def _acts(per_layer: dict[int, int], kinds: tuple[tuple[int, str], ...], zero_acts: bool) -> dict[str, int]:
    """Saved bytes per probe group (dense, moe, mtp) from a probe template's per-layer bytes."""
    kind = dict(kinds)
    acts: dict[str, int] = {}
    for layer, b in per_layer.items():
        g = (kind[layer] if layer < len(kind) else "mtp") if layer >= 0 else None
        if g is not None and not zero_acts:
            acts[g] = acts.get(g, 0) + b
    return acts


@lru_cache(maxsize=4096)
def probe_act_bytes(source: ModelSource, kinds: tuple[tuple[int, str], ...], zero_acts: bool) -> dict[str, int]:
    """The saved bytes per probe group that :func:`probe_stats` of the same probe gives
    (``LayerStats.act_bytes``, 0 where a group saves none), without its backward, costs or
    parameters: all a coarse bound reads of its full-recompute probe (:func:`coarse_stats`)."""
    per_layer = analytic_layer_bytes(source, 0) if isinstance(source, AnalyticSource) \
        else source.template(0).layer_activation_bytes
    return _acts(per_layer, kinds, zero_acts)


@lru_cache(maxsize=4096)
def _analytic_params(source: AnalyticSource, rule: str, kinds: tuple[tuple[int, str], ...]) -> dict[str, list[int]]:
    """:func:`_params` of an analytic probe's nodes (``source``: its :meth:`~AnalyticSource.param_slice`),
    shared by its micro-batch sizes, CP degrees and recompute policies."""
    return _params(source.nodes(0), rule, kinds)


def _params(nodes: list[Node], rule: str, kinds: tuple[tuple[int, str], ...]) -> dict[str, list[int]]:
    """Per probe group (dense, moe, embedding, head): trainable dense and expert elements and
    non-trainable bytes of a probe's nodes."""
    kind = dict(kinds)
    params: dict[str, list[int]] = {}
    for node in nodes:
        layer = node.layer
        pg = (kind[layer] if layer < len(kind) else "mtp") if layer is not None else None
        pg = pg or ("embedding" if node.name == "embedding" else "head")
        if pg == "mtp":
            pg = "head"  # the MTP block's parameters sit with the head on the last virtual stage
        counted = params.setdefault(pg, [0, 0, 0])
        for t in node.params:
            if not t.trainable:
                counted[2] += t.size_bytes
            elif is_expert_state(t, rule):
                counted[1] += t.numel
            else:
                counted[0] += t.numel
    return params


def coarse_stats(none: ProbeStats, full: dict[str, int], *, zero: bool) -> ProbeStats:
    """Per-layer numbers below those of every recompute policy of one layout, from its probes with no
    recompute (``none``) and with every layer fully recomputed (``full``, ``full:uniform:1``: its
    saved bytes per probe group, :func:`probe_act_bytes`):

    - time: recomputation only adds ops to a backward, so ``none``'s per-phase costs are the least;
    - memory: a fully recomputed decoder layer keeps only its checkpointed input, and every policy
      keeps at least that (a recomputed region keeps its input; a norm left alone saves its input),
      so a layer's least saved bytes are ``full``'s (``min`` with ``none``'s, which can only help);
      the MTP block is not one of the layers ``full:uniform:1`` recomputes, so it counts as none;
      ``zero``: the candidate's policy is a full-recompute grouping whose bytes count as none.

    ``tests/plan/test_bound.py`` holds the claim on every policy of a small model, and the planner
    checks it on every candidate whose exact bound it computes."""

    def low(a: LayerStats | None, group: str, keep: bool) -> LayerStats | None:
        if a is None:  # the model has no layer of this kind
            return a
        return replace(a, act_bytes=min(a.act_bytes, full.get(group, 0)) if keep and not zero else 0)

    dense, moe, mtp = low(none.dense, "dense", True), low(none.moe, "moe", True), low(none.mtp, "mtp", False)
    assert mtp is not None
    return replace(none, dense=dense, moe=moe, mtp=mtp)


@lru_cache(maxsize=4096)
def coarse_probe_stats(none: ModelSource, full: ModelSource, hw: HardwareSpec, par: ParallelSpec, rule: str,
                       kinds: tuple[tuple[int, str], ...], zero: bool) -> ProbeStats:
    """:func:`coarse_stats` of a layout's probes: ``none`` (no recompute) and ``full``
    (``full:uniform:1``) sources of one probe (``par``: its parallel slice, ``rule``: the profile's
    ``expert_state_group``); ``zero``: the candidate's policy is a full-recompute grouping whose
    bytes count as none. Cached: a plan asks once per layout group, about 110,000 times for 8,000 probes."""
    return coarse_stats(probe_stats(none, hw, par, rule, kinds, False), probe_act_bytes(full, kinds, False), zero=zero)


def _alive_state(tr: TrainingSpec, par: ParallelSpec, life: Lifecycle, dense_n: int, expert_n: int,
                 buffers: int) -> int:
    """Static bytes alive in the last iteration, ZeRO shards rounded down (see module docstring)."""
    dense_g, expert_g = zero_groups(tr, par)

    def sharded(level: int) -> int:
        return dense_n // dense_g + expert_n // expert_g if tr.zero >= level else dense_n + expert_n

    after_step = tr.optimizer_step and tr.iterations + tr.warmup_iterations >= 2
    total = sharded(3) * DTYPE_BYTES[tr.dtype] + buffers
    if life.grads_at == "start":
        total += sharded(2) * DTYPE_BYTES[tr.grad_dtype]
    master, states = state_bytes_lower_bound(tr)
    if (life.master_at == "start" and not tr.precision_aware) or after_step:
        total += sharded(1) * master
    if life.moments_at == "start" or after_step:
        total += sharded(1) * states
    return total


@lru_cache(maxsize=4096)
def _workspaces(life: Lifecycle, framework: FrameworkSpec, sm: int, model: ModelSpec, tr: TrainingSpec,
                par: ParallelSpec, holds_head: bool, has_moe: bool) -> int:
    """The profile's persistent library workspaces (allocated at the start, never freed); a rank
    counts as holding MoE layers only for its decoder layers (the MTP block can only add)."""
    if life.workspaces is None:
        return 0
    # without the rank's tensors the cached dummy wgrads are left out: the bound stays a lower bound
    return sum(w[1] for w in life.workspaces(framework, model, tr, par, sm, holds_head=holds_head, has_moe=has_moe))


@lru_cache(maxsize=64)
def _moe_layers(model: ModelSpec) -> tuple[bool, ...]:
    return tuple(model.is_moe_layer(i) for i in range(model.num_hidden_layers))


def _part_stats(st: ProbeStats, part: str) -> LayerStats:
    stats = {"dense": st.dense, "moe": st.moe, "embedding": st.embedding, "head": st.head, "mtp": st.mtp}[part]
    assert stats is not None  # the probe holds one layer of each kind the model has
    return stats


def bound(st: ProbeStats, *, model: ModelSpec, parallel: ParallelSpec, training: TrainingSpec,
          schedule: ScheduleSpec, rules: StateRules) -> Bound:
    """The static bound of one valid candidate run (module docstring), from its probe's numbers,
    summed over its layout's frame (:mod:`timeline.plan.frame`): per chunk composition its parts'
    sums, each in the parts' order; per rank its chunks' and its actions'."""
    par, tr = parallel, training
    life = lifecycle(rules.profile)
    split = tuple(len(rg) for rg in chunk_layers(par, model.num_hidden_layers))
    fr = frame(schedule.kind, par.pp, par.vpp, tr.num_microbatches, schedule.microbatch_group_size, split,
               _moe_layers(model))
    sums = []
    for comp in fr.parts:
        parts = [_part_stats(st, p) for p in comp]
        sums.append((sum(p.dense_params for p in parts), sum(p.expert_params for p in parts),
                     sum(p.buffer_bytes for p in parts), sum(p.act_bytes for p in parts),
                     {k: sum(p.compute_us[k] for p in parts) for k in PHASES},
                     {k: sum(p.comm_us[k] for p in parts) for k in PHASES}))
    static = [_alive_state(tr, par, life, sum(sums[c][0] for c in cls.comps), sum(sums[c][1] for c in cls.comps),
                           sum(sums[c][2] for c in cls.comps))
              + _workspaces(life, rules.framework, rules.sm, model, tr, par, cls.holds_head, cls.has_moe)
              for cls in fr.statics]
    per_rank = [static[s] + max((sum(v * sums[c][3] for c, v in vec) for vec in vectors), default=0)
                for s, vectors in zip(fr.rank_static, fr.rank_vectors, strict=True)]
    best = max(((mem, -r) for r, mem in enumerate(per_rank)), default=(-1, 0))
    time_us = 0.0
    for items in fr.times:
        compute = comm = 0.0
        for c, k, n in items:
            compute += n * sums[c][4][k]
            comm += n * sums[c][5][k]
        time_us = max(time_us, max(compute, comm) if fr.overlapped else compute + comm)
    return Bound(memory_bytes=best[0], memory_rank=-best[1], time_us=time_us, per_rank_bytes=tuple(per_rank))
