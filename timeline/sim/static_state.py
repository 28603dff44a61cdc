"""The static state of one simulated device as its profile creates it: weights, gradients,
master weights and moments (as flat buffers, or — ``megatron`` — in Megatron's param/grad buffers
and per parameter or shard, :mod:`timeline.sim.megatron_state`), ZeRO buckets and gathered
layers, persistent library workspaces, and the optimizer step's duration. The bytes are the device's (:class:`StaticDevice`, computed once
in ``placement``); the per-element rule is :func:`timeline.graph.static.optimizer_element_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.graph.dp_buffers import DdpRules, ddp_rules
from timeline.graph.static import optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category
from timeline.placement.devices import StaticDevice
from timeline.profiles import LIMITS, lifecycle
from timeline.profiles.base import FirstCall
from timeline.profiles.megatron import MASK_ROUTING
from timeline.profiles.megatron_workspaces import version_tuple
from timeline.sim.compiled import CAT_CODE
from timeline.sim.cost import CostModel
from timeline.sim.megatron_fsdp import FsdpPlan, fsdp_plan
from timeline.sim.megatron_state import main_grad_copies, megatron_events
from timeline.sim.optimizer_step import StepAlloc, step_transients
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, TrainingSpec


def step_us(tr: TrainingSpec, par: ParallelSpec, dev: StaticDevice, cost: CostModel) -> float:
    """Gradient reduce-scatter + optimizer step + parameter all-gather, bandwidth-bound (0 without a step)."""
    if not tr.optimizer_step:
        return 0.0
    g = par.dp * par.cp
    comm = 0.0
    if g > 1:
        comm = cost.comm_us((dev.grads_bytes + dev.weights_bytes) * (g - 1) / g, "dp")
    return comm + cost.compute_us(0.0, dev.weights_bytes + dev.grads_bytes + 2 * dev.optimizer_bytes)


def largest_layer_bytes(dev: StaticDevice, dtype: str) -> int:
    """Weight bytes of the device's largest decoder layer (or non-layer group), ZeRO-unsharded."""
    groups: dict[str, int] = {}
    for t in dev.tensors:
        parts = t.name.split(".")
        key = ".".join(parts[:2]) if parts[0] in ("layers", "mtp") else parts[0]
        groups[key] = groups.get(key, 0) + t.numel
    return max(groups.values(), default=0) * DTYPE_BYTES[dtype]


def gathered_bytes(profile: str, tr: TrainingSpec, dev: StaticDevice) -> int:
    """Bytes each action gathers under ZeRO-3 (its largest layer plus the prefetch), else 0."""
    life = lifecycle(profile)
    if tr.zero != 3 or not life.prefetch_bucket_elems:
        return 0
    layer = largest_layer_bytes(dev, tr.dtype)
    return layer + min(life.prefetch_bucket_elems * DTYPE_BYTES[tr.dtype], layer)


#: (created at: "start" | "first_backward" | "first_step", name, bytes, category code, +1 alloc / −1 free)
StaticAlloc = tuple[str, str, int, int, int]


@dataclass(frozen=True, slots=True)
class DeviceState:
    """How one device's static state comes into being, known before any time passes: the
    allocations (times as lifecycle points, resolved against the device's spans), or — ``hf``
    without ZeRO, ``per_parameter`` — one tensor per parameter as torch.optim makes them
    (:mod:`timeline.sim.hf_state`), the allocations then holding only the persistent workspaces; the bytes each action gathers under ZeRO-3; and the (name,
    bytes) every optimizer step allocates until the next iteration starts (Megatron's fp32 copies
    of the main grads, :func:`timeline.sim.megatron_state.main_grad_copies`)."""

    allocs: tuple[StaticAlloc, ...]
    per_parameter: bool
    gathered_bytes: int
    #: Megatron-FSDP's all-gathers and gradient buckets (:func:`timeline.sim.megatron_fsdp.fsdp_plan`, their
    #: events :mod:`timeline.sim.fsdp_windows`); None: not Megatron-FSDP
    fsdp: FsdpPlan | None = None
    step_copies: tuple[tuple[str, int], ...] = ()
    #: each chunk keeps its last received input and that input's gradient until its next forward
    #: (the profile's ``Lifecycle.chunk_keeps_input``; :func:`timeline.sim.expand.kept_inputs`)
    keeps_input: bool = False
    #: combined 1F1B's backward layer nodes keep their I/O until the pair ends
    #: (``[framework] combined_1f1b_keeps_node_io``; :func:`timeline.sim.expand.combined_kept`)
    combined_keeps_node_io: bool = False
    #: combined 1F1B with the alltoall dispatcher: each MoE layer's dispatcher keeps the router's input and its
    #: gradient (through ``self.probs``'s autograd graph) until the layer's next forward
    #: (:func:`timeline.sim.expand.router_graph_kept`)
    router_graph_kept: bool = False
    #: the MoE token dispatcher whose per-layer references outlive the layer's backward
    #: (:func:`timeline.sim.expand.dispatcher_kept`): "alltoall", "alltoall_indices" (before mask-based routing),
    #: "hybridep" (the flex dispatcher's backend), or ""
    dispatcher_keeps: str = ""
    #: what each optimizer step allocates and frees, in order, the first step's states marked
    #: (:func:`timeline.sim.optimizer_step.step_transients`)
    step_transients: tuple[StepAlloc, ...] = ()
    #: the output layer's weight gradients wait for the pipeline flush (``[framework] defer_embedding_wgrad``):
    #: how many of an iteration's micro-batches defer (0: all; −1: none; :func:`timeline.sim.expand.head_wgrad_kept`)
    deferred_head_wgrad: int = -1
    #: the PyTorch version whose torch.optim steps a per-parameter state (``[framework] pytorch``)
    pytorch: str = FrameworkSpec().pytorch
    #: what compiled steps' and autotuned kernels' first calls add (the profile's ``Lifecycle.first_call``;
    #: placed by :func:`timeline.sim.expand.first_call_events`); empty: nothing
    first_call: tuple[FirstCall, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StateRules:
    """What, besides the model, training and parallel slices, decides how a device's static state
    comes into being: the profile, the ``[framework]`` its workspaces read, the GPU generation
    (``hardware.sm``), whether the model is a captured trace, and the profile's rule for which
    states shard over EDP. Made once by the simulation's door."""

    profile: str
    framework: FrameworkSpec
    sm: int
    traced: bool
    expert_state_group: str
    #: Megatron's combined 1F1B (``schedule.combined_1f1b``)
    combined_1f1b: bool = False


def device_state(dev: StaticDevice, model: ModelSpec, tr: TrainingSpec, par: ParallelSpec,
                 rules: StateRules) -> DeviceState:
    """The static state plan of one device under its profile and ZeRO level."""
    # hf: one tensor per parameter, as torch.optim holds them; a forward+backward capture recorded
    # its backward into gradients that already exist (zeros), so its runs keep that lifecycle
    per_param = rules.profile == "hf" and tr.zero == 0 and not rules.traced
    life = lifecycle(rules.profile)
    workspaces: list[StaticAlloc] = []
    if life.workspaces is not None:
        holds_head = max(dev.stages) == par.pp * par.vpp - 1
        has_moe = any(t.in_moe for t in dev.tensors)
        workspaces = [(w_at, name, size, CAT_CODE[Category.TEMPORARY], 1) for name, size, _, w_at
                      in life.workspaces(rules.framework, model, tr, par, rules.sm, holds_head=holds_head,
                                         has_moe=has_moe, tensors=dev.tensors)]
    copies: tuple[tuple[str, int], ...] = ()
    transients: tuple[StepAlloc, ...] = ()
    if life.dp_buffers and dev.dp_buffers and not rules.traced:
        allocs = tuple(a for a in megatron_events(tr, dev, rules.expert_state_group, rules.framework) + workspaces
                       if a[2] > 0)
        copies = main_grad_copies(tr, dev, rules.expert_state_group)
        transients = step_transients(tr, dev, rules.expert_state_group, rules.framework)
    else:
        # per parameter, the workspaces alone: hf_state makes the rest (expand.device_events)
        allocs = tuple(a for a in workspaces if a[2] > 0) if per_param else \
            tuple(static_allocs(rules.profile, tr, dev, workspaces))
    plan = None
    if dev.dp_buffers and dev.dp_buffers[0].fsdp and not rules.traced:
        bucket = ddp_rules(rules.framework, tr, par, tied=model.tie_word_embeddings).bucket_size
        plan = fsdp_plan(tr, dev, rules.framework, bucket)
    return DeviceState(allocs=allocs, per_parameter=per_param,
                       gathered_bytes=0 if plan is not None else gathered_bytes(rules.profile, tr, dev), fsdp=plan,
                       step_copies=copies, step_transients=transients, keeps_input=bool(life.chunk_keeps_input),
                       combined_keeps_node_io=rules.framework.combined_1f1b_keeps_node_io,
                       router_graph_kept=rules.combined_1f1b and rules.framework.moe_token_dispatcher == "alltoall",
                       dispatcher_keeps=_dispatcher_keeps(rules) if LIMITS[rules.profile].reads_framework else "",
                       deferred_head_wgrad=(rules.framework.wgrad_deferral_limit if rules.framework.defer_embedding_wgrad
                                            and not rules.traced else -1), pytorch=rules.framework.pytorch,
                       first_call=life.first_call(rules.framework) if life.first_call is not None else ())


def _dispatcher_keeps(rules: StateRules) -> str:
    """:attr:`DeviceState.dispatcher_keeps` of Megatron's ``[framework]``: the alltoall dispatcher, the flex
    dispatcher's HybridEP manager; "" for the allgather dispatcher and DeepEP's manager (not modelled)."""
    fw = rules.framework
    if fw.moe_token_dispatcher == "alltoall":  # before mask-based routing: [tokens, k] probs (not modelled)
        return "alltoall" if version_tuple(fw.megatron_core) >= MASK_ROUTING else "alltoall_indices"
    return "hybridep" if fw.moe_token_dispatcher == "flex" and fw.moe_flex_backend == "hybridep" else ""


def ddp_of(profile: str, framework: FrameworkSpec, model: ModelSpec, tr: TrainingSpec, par: ParallelSpec, *,
           traced: bool) -> DdpRules | None:
    """Megatron's buffer layout rules where ``profile`` lays its state out in them (not for a
    captured trace), else None (flat ZeRO blocks)."""
    if not lifecycle(profile).dp_buffers or traced:
        return None
    return ddp_rules(framework, tr, par, tied=model.tie_word_embeddings)


def resolve(allocs: tuple[StaticAlloc, ...], first_backward_us: float, first_step_us: float,
            at_op: dict[str, float] | None = None) -> list[tuple[float, str, int, int, int]]:
    """(time, name, bytes, category code, sign) of the allocations and frees, at the device's first
    backward and step (``at_op``: the time of each ``first_backward_op:`` pattern)."""
    when = {"start": 0.0, "first_backward": first_backward_us, "first_step": first_step_us, **(at_op or {})}
    return [(when[a], n, b, c, sign) for a, n, b, c, sign in allocs]


def static_allocs(profile: str, tr: TrainingSpec, dev: StaticDevice, workspaces: list[StaticAlloc]) -> list[StaticAlloc]:
    """The static state as flat blocks, one per kind, in creation order (empty ones left out), with
    the device's persistent ``workspaces`` last (Megatron's own layout is
    :mod:`timeline.sim.megatron_state`)."""
    life = lifecycle(profile)
    extra: list[StaticAlloc] = []
    if tr.zero >= 2 and life.reduce_bucket_elems:
        n = min(life.reduce_bucket_elems, sum(t.numel for t in dev.tensors if t.trainable))
        extra.append(("first_backward", "dp.reduce_bucket", n * DTYPE_BYTES[tr.grad_dtype], CAT_CODE[Category.COMM], 1))
    w, g, o = dev.weights_bytes, dev.grads_bytes, dev.optimizer_bytes
    master, moment = optimizer_element_bytes(tr)
    per_opt = master + 2 * moment
    master_b = o * master // per_opt if per_opt else 0
    opt = CAT_CODE[Category.OPTIMIZER]
    # (created at, name, bytes, category, sign); "first_step" states never exist without an optimizer step
    out: list[StaticAlloc] = [("start", "static.weights", w, CAT_CODE[Category.WEIGHTS], 1),
                              (life.grads_at, "static.grads", g, CAT_CODE[Category.GRADS], 1)]
    moments_at = "start" if tr.resumed else life.moments_at  # a resumed run loads them with the checkpoint
    master_at = "start" if tr.resumed else life.master_at
    out += [(master_at, "static.master", master_b, opt, 1), (moments_at, "static.moments", o - master_b, opt, 1)]
    if not tr.optimizer_step:
        out = [x for x in out if x[0] != "first_step"]
    return [x for x in out + extra + workspaces if x[2] > 0]

