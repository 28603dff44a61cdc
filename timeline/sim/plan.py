"""Stage 1 of a simulation, the plan: everything known before any time passes — the schedule,
the devices and the chunks they hold, each chunk's op templates compiled per phase, the cost
model and the fixed durations (P2P transfer, optimizer step). Frozen; ``fit`` and ``schedule``
reuse its parts instead of rebuilding them. No simpy, no file I/O.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace

from timeline.graph.cuda_graphs import GraphedTemplates, split
from timeline.graph.ops import ChunkTemplate
from timeline.graph.signature import OPS_ONLY_POLICIES
from timeline.graph.source import ModelSource
from timeline.graph.tensors import DTYPE_BYTES
from timeline.pipeline import build_schedule
from timeline.pipeline.actions import Schedule
from timeline.placement.devices import StaticDevice, chunk_holders, ep_devices, static_devices
from timeline.profiles.megatron_cuda_graphs import graph_holds
from timeline.sim.compiled import CompiledPhase, compile_phase, offloaded_groups
from timeline.sim.cost import CostModel
from timeline.sim.graph_capture import CaptureRules
from timeline.sim.static_state import DeviceState, StateRules, ddp_of, device_state, step_us
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import (
    NO_OFFLOAD,
    HardwareSpec,
    OffloadSpec,
    ParallelSpec,
    RecomputeSpec,
    ScheduleSpec,
    TrainingSpec,
)

Compiled = dict[tuple[int, str], CompiledPhase]


def run_schedule_of(sched: ScheduleSpec, par: ParallelSpec, num_microbatches: int,
                    csv_rows: Sequence[Sequence[str]] | None = None) -> Schedule:
    """The run's validated pipeline schedule (``csv_rows``: the rows of a ``csv`` kind)."""
    return build_schedule(sched.kind, pp=par.pp, vpp=par.vpp, num_microbatches=num_microbatches,
                          microbatch_group_size=sched.microbatch_group_size, csv_rows=csv_rows,
                          combined_1f1b=sched.combined_1f1b)


def compile_templates(templates: dict[int, ChunkTemplate], cost: CostModel) -> Compiled:
    out = {}
    for chunk, t in templates.items():
        sizes: dict[str, tuple[int, int]] = {}
        out[(chunk, "F")] = compile_phase(t.forward, cost, sizes)
        if t.offload:
            out[(chunk, "F")] = replace(out[(chunk, "F")], offload=offloaded_groups(t.offload, t.forward,
                                                                                  out[(chunk, "F")]))
        after_i = dict(sizes)
        out[(chunk, "I")] = compile_phase(t.backward_i, cost, after_i)
        out[(chunk, "W")] = compile_phase(t.backward_w, cost, after_i)  # W frees what I kept for it
        # a full backward runs each op's weight gradient right after its input gradient
        out[(chunk, "B")] = compile_phase(t.backward or t.backward_i + t.backward_w, cost, dict(sizes))
    return out


def boundary_bytes(tr: TrainingSpec, par: ParallelSpec, hidden_size: int) -> int:
    """Bytes of the hidden states passed between chunks (SP- and CP-sharded)."""
    sp = par.sp and par.tp > 1  # RunSpec.sp_enabled
    tokens = tr.micro_batch_size * tr.seq_len // par.cp // (par.tp if sp else 1)
    return tokens * hidden_size * DTYPE_BYTES[tr.dtype]


def capture_rules_of(graphed: dict[int, GraphedTemplates], tr: TrainingSpec, par: ParallelSpec,
                     model: ModelSpec, fw: FrameworkSpec, sm: int, eager: Compiled | None = None) -> CaptureRules:
    """What the graphs of each chunk hold (:mod:`timeline.sim.graph_capture`,
    :mod:`timeline.profiles.megatron_cuda_graphs`); at pp = 1 Megatron captures one micro-batch
    (``cuda_graphs.py: TECudaGraphHelper._get_cuda_graph_input_data``@11debfa7b4). ``eager``: the phases the
    warm-up iterations run (``[framework] cuda_graph_warmup_steps``)."""
    return CaptureRules(layers={c: g.layers for c, g in graphed.items()},
                        outputs={c: g.outputs for c, g in graphed.items()},
                        grad_inputs={c: g.grad_inputs for c, g in graphed.items()},
                        grad_outputs={c: g.grad_outputs for c, g in graphed.items()},
                        holds=graph_holds(fw, model, tr, par, sm), one_microbatch=par.pp == 1,
                        warmup_steps=fw.cuda_graph_warmup_steps, eager=eager if fw.cuda_graph_warmup_steps else None,
                        moe_layers=frozenset(layer for g in graphed.values() for layer in g.layers
                                             if model.is_moe_layer(layer)))


def ep_loads(par: ParallelSpec, tr: TrainingSpec, is_moe: bool) -> list[float]:
    """Token load of each simulated EP rank relative to the mean: ``[1.0]`` under balanced
    routing (EP ranks are symmetric, one stands for all); under ``routing = "skew"`` a linear
    ramp from ``routing_skew`` (the busiest rank) down to ``2 − routing_skew``, mean 1."""
    ep, skew = par.ep, tr.routing_skew
    if tr.routing != "skew" or not is_moe or ep == 1:
        return [1.0]
    return [skew - (skew - 1) * 2 * e / (ep - 1) for e in range(ep)]


def chunk_classes(source: ModelSource, num_chunks: int) -> dict[int, int]:
    """Chunk → the first chunk with its signature (``ModelSource.signature``: forward ops equal
    up to decoder-layer numbers; under an ops-only recompute policy so are their templates)."""
    first: dict[Hashable, int] = {}
    return {c: first.setdefault(source.signature(c), c) for c in range(num_chunks)}


def load_templates(source: ModelSource, holder: dict[int, int], num_chunks: int, cost: CostModel,
                   first: tuple[dict[int, ChunkTemplate], Compiled, dict[int, int]] | None,
                   classes: dict[int, int] | None = None) -> tuple[dict[int, ChunkTemplate], Compiled]:
    """The templates built and every chunk's compiled phases under one EP load (``source``).

    ``first`` — the first load's templates and compiled phases with the chunk classes
    (:func:`chunk_classes`), under an ops-only policy — lets a load build one template per
    class: a chunk's phases are its class's first chunk's (bytes, times, order) under the chunk's
    own names (op, stream and tensor names, decoder layers: the first load's phases of that
    chunk). Sound because a load scales the routed rows of every MoE layer of a device alike
    (``ceil(rows · routing_skew)``, :func:`timeline.graph.families.router.expert_rows`), so
    chunks equal up to layer numbers under one load are under every load; names do not depend on
    the load (checked per class; a class whose names moved is built chunk by chunk).

    Without ``first``, ``classes`` (under an ops-only policy) lets the first load build one
    template per class too: a chunk's phases are its class's first chunk's with every decoder-layer
    number moved by the distance between the two chunks' first layers (:func:`shifted_phase`) — the
    names the chunk's own build gives, since the classes' signatures are equal exactly up to that
    renumbering (:meth:`~timeline.graph.source.ModelSource.signature`). Without either, every chunk
    is built."""
    if first is None:
        reps = sorted(set(classes.values())) if classes else list(range(num_chunks))
        t = {c: source.template(c, pp_rank=holder[c]) for c in reps}
        out = compile_templates(t, cost)
        for c, (rep, delta) in class_shifts(source, classes or {}, t).items():
            memo: dict[str, str] = {}  # shared by the chunk's phases
            for k in PHASES:
                out[(c, k)] = shifted_phase(out[(rep, k)], delta, memo)
        return t, {(c, k): out[(c, k)] for c in range(num_chunks) for k in PHASES}
    _, compiled0, classes0 = first
    reps = sorted(set(classes0.values()))
    t = {c: source.template(c, pp_rank=holder[c]) for c in reps}
    out = compile_templates(t, cost)
    phases = sorted({k for _, k in compiled0})
    for c in range(num_chunks):
        rep = classes0[c]
        if c == rep:
            continue
        if all(_same_names(out[(rep, k)], compiled0[(rep, k)]) for k in phases):
            for k in phases:
                ph0 = compiled0[(c, k)]
                out[(c, k)] = replace(out[(rep, k)], op_names=ph0.op_names, op_streams=ph0.op_streams,
                                      op_layers=ph0.op_layers, tensor_names=ph0.tensor_names)
        else:  # the names moved with the load: build this chunk itself
            t[c] = source.template(c, pp_rank=holder[c])
            out.update(compile_templates({c: t[c]}, cost))
    return t, {k: out[k] for k in compiled0}


#: the phases :func:`compile_templates` compiles per chunk, in its order
PHASES = ("F", "I", "W", "B")
#: a decoder-layer number in a name, as :func:`timeline.graph.analytic.ops_signature` renumbers it
_LAYER = re.compile(r"layers\.(\d+)")


def shift_layers(names: Sequence[str], delta: int, memo: dict | None = None, *,
                 keep_identity: bool = False) -> tuple[str, ...]:
    """``names`` with every ``layers.N`` made ``layers.{N + delta}``; ``memo`` caches the shifted
    strings across calls. ``keep_identity``: one string object shifted is one object and two are
    two, as the chunk's own build makes them (a pickled output writes a shared string once); else
    equal strings may come back as one object (names the simulation interns by value)."""
    if not delta:
        return tuple(names)
    memo = {} if memo is None else memo

    def one(m: re.Match[str]) -> str:
        return f"layers.{int(m.group(1)) + delta}"

    out = []
    for n in names:
        key = id(n) if keep_identity else n
        got = memo.get(key)
        if got is None:
            got = memo[key] = _LAYER.sub(one, n) if "layers." in n else n
        out.append(got)
    return tuple(out)


def shifted_phase(ph: CompiledPhase, delta: int, memo: dict[str, str] | None = None) -> CompiledPhase:
    """Phase ``ph`` of a class's first chunk as the chunk ``delta`` decoder layers further on
    compiles it: the same arrays and streams (the signature compares streams as they are), op and
    tensor names and op layers renumbered. ``memo``: :func:`shift_layers`'s, shared by a chunk's phases."""
    if not delta:
        return ph
    memo = {} if memo is None else memo
    return replace(ph, op_names=shift_layers(ph.op_names, delta, memo),
                   op_layers=tuple(x if x < 0 else x + delta for x in ph.op_layers),
                   tensor_names=shift_layers(ph.tensor_names, delta, memo))


def class_shifts(source: ModelSource, classes: dict[int, int], built: dict[int, ChunkTemplate]
                 ) -> dict[int, tuple[int, int]]:
    """Each chunk without a template in ``built``: (its class's first chunk, the decoder layers between the
    two chunks' first layers)."""
    return {c: (rep, source.layer_base(c) - source.layer_base(rep)) for c, rep in classes.items() if c not in built}


def _same_names(a: CompiledPhase, b: CompiledPhase) -> bool:
    return (a.op_names == b.op_names and a.op_streams == b.op_streams and a.op_layers == b.op_layers
            and a.tensor_names == b.tensor_names)


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    """The part of a plan that no op template changes: the schedule, which rank's templates
    stand for each chunk, and the cost model. ``fit`` prices every recompute policy on one."""

    schedule: Schedule
    holders: dict[int, int]  # chunk → the pipeline rank whose templates stand for it
    cost: CostModel


def plan_pipeline(sched: ScheduleSpec, par: ParallelSpec, num_microbatches: int, hw: HardwareSpec,
                  csv_rows: Sequence[Sequence[str]] | None = None) -> PipelinePlan:
    """The run's schedule (``csv_rows``: a CSV schedule's rows, which ride on the run), its chunk
    holders and cost model."""
    schedule = run_schedule_of(sched, par, num_microbatches, csv_rows)
    return PipelinePlan(schedule=schedule, holders=chunk_holders(schedule.stages_of_rank),
                        cost=CostModel.of(hw, par))


@dataclass(frozen=True, slots=True)
class SimPlan:
    """What the later stages read. ``templates[e]`` / ``compiled[e]`` are the chunk templates
    and compiled phases under simulated EP load ``loads[e]``; device ``i`` runs load
    ``i % len(loads)``; the busiest (first) load times the pipeline, since every EP rank waits
    for the slowest at each all-to-all."""

    training: TrainingSpec
    schedule: Schedule
    cost: CostModel
    loads: tuple[float, ...]
    #: per load, the chunk templates built (under an ops-only policy one chunk per class of chunks
    #: that share a template up to layer names, :func:`load_templates`; else every chunk)
    templates: tuple[dict[int, ChunkTemplate], ...]
    compiled: tuple[Compiled, ...]
    #: per load, each chunk's activation bytes per micro-batch
    activation_bytes: tuple[dict[int, int], ...]
    devices: tuple[StaticDevice, ...]
    states: tuple[DeviceState, ...]  # per device: how its static state comes into being
    p2p_us: float
    step_us: tuple[float, ...]  # per pipeline rank
    iterations: int  # warm-up iterations first, reported ones after
    #: per load, the CUDA graphs' capture phases and what the graphs hold (:mod:`timeline.sim.graph_capture`);
    #: empty without CUDA graphs
    capture: tuple[Compiled, ...] = ()
    capture_rules: tuple[CaptureRules, ...] = ()
    #: combined 1F1B: the backward's attention nodes run before the forward's mlp
    #: (``[framework] ep_overlap_early_attn_memory_release``, :mod:`timeline.sim.combined`)
    early_attn_release: bool = False
    #: combined 1F1B: each node's weight gradients at its backward_dw (``[framework] delay_wgrad_compute``)
    delay_wgrad: bool = False
    #: the chunks the first load built no template for: chunk → (the chunk whose template it shares,
    #: decoder layers between their first layers; :func:`shifted_phase`)
    shifts: dict[int, tuple[int, int]] = field(default_factory=dict)
    #: fine-grained activation offloading (``[offload]``: its post-warm-up rules, :mod:`timeline.sim.offload`)
    offload: OffloadSpec = NO_OFFLOAD

    def load_of(self, device_index: int) -> int:
        return device_index % len(self.loads)


def plan(source: ModelSource, pipe: PipelinePlan, *, model: ModelSpec, training: TrainingSpec,
         parallel: ParallelSpec, rules: StateRules, recompute: RecomputeSpec | None = None,
         offload: OffloadSpec = NO_OFFLOAD) -> SimPlan:
    """The plan: ``pipe``'s schedule, the devices, ``source``'s templates compiled per EP load, fixed
    durations. ``recompute``: the source's policy; under one that reads only the ops
    (:data:`~timeline.graph.signature.OPS_ONLY_POLICIES`) the loads after the first build one
    template per class of chunks (:func:`load_templates`)."""
    shared = recompute is not None and recompute.policy in OPS_ONLY_POLICIES
    par, tr = parallel, training
    schedule, cost, holder = pipe.schedule, pipe.cost, pipe.holders
    loads = ep_loads(par, tr, model.is_moe)
    templates: list[dict[int, ChunkTemplate]] = []
    compiled: list[Compiled] = []
    act: list[dict[int, int]] = []
    fw = rules.framework
    graphs = fw.cuda_graph_impl != "none"
    classes = chunk_classes(source, schedule.num_chunks) if shared and not graphs else {}
    capture: list[Compiled] = []
    capture_rules: list[CaptureRules] = []
    for e, load in enumerate(loads):
        source_e = source if len(loads) == 1 else source.under(routing_skew=load)
        t, c = load_templates(source_e, holder, schedule.num_chunks, cost,
                              (templates[0], compiled[0], classes) if e and classes else None, classes)
        if graphs:
            split_t = {ch: split(tc, fw.cuda_graph_scope, fw.moe_token_dispatcher) for ch, tc in t.items()}
            eager = c  # the warm-up iterations' phases, before the capture
            c = compile_templates({ch: g.train for ch, g in split_t.items()}, cost)
            capture.append(compile_templates({ch: g.capture for ch, g in split_t.items()}, cost))
            capture_rules.append(capture_rules_of(split_t, tr, par, model, fw, rules.sm, eager))
        templates.append(t)
        compiled.append(c)
        act.append({ch: t[ch if ch in t else classes[ch]].activation_bytes for ch in range(schedule.num_chunks)})
    static = static_devices(source, schedule.stages_of_rank, parallel=par, training=tr,
                            num_layers=model.num_hidden_layers, expert_state_group=rules.expert_state_group,
                            ddp=ddp_of(rules.profile, rules.framework, model, tr, par, traced=rules.traced))
    devices = ep_devices(static, par, len(loads))
    shifts = class_shifts(source, classes, templates[0])
    return SimPlan(training=tr, schedule=schedule, cost=cost, loads=tuple(loads), templates=tuple(templates),
                   compiled=tuple(compiled), activation_bytes=tuple(act), devices=tuple(devices),
                   states=tuple(device_state(d, model, tr, par, rules) for d in devices),
                   p2p_us=cost.comm_us(boundary_bytes(tr, par, model.hidden_size), "pp"),
                   step_us=tuple(step_us(tr, par, d, cost) for d in devices[::len(loads)]),
                   iterations=tr.warmup_iterations + tr.iterations,
                   capture=tuple(capture), capture_rules=tuple(capture_rules),
                   early_attn_release=rules.framework.ep_overlap_early_attn_memory_release,
                   delay_wgrad=rules.framework.delay_wgrad_compute, shifts=shifts,
                   offload=offload)
