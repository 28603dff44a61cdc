"""The static state of one simulated device as its profile creates it: weights, gradients,
master weights and moments (as flat buffers, or one tensor per parameter where the profile's
optimizer holds them so), ZeRO buckets and gathered layers, persistent library workspaces, and
the optimizer step's duration. The bytes are the device's (:class:`StaticDevice`, computed once
in ``placement``); the per-element rule is :func:`timeline.graph.static.optimizer_element_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from timeline.graph.static import optimizer_element_bytes
from timeline.graph.tensors import DTYPE_BYTES, Category
from timeline.placement.devices import StaticDevice
from timeline.profiles import lifecycle
from timeline.sim.compiled import CAT_CODE
from timeline.sim.cost import CostModel
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


#: (created at: "start" | "first_backward" | "first_step", name, bytes, category code)
StaticAlloc = tuple[str, str, int, int]


@dataclass(frozen=True, slots=True)
class DeviceState:
    """How one device's static state comes into being, known before any time passes: the
    allocations (times as lifecycle points, resolved against the device's spans), or — ``hf``
    without ZeRO, ``per_parameter`` — one tensor per parameter as torch.optim makes them
    (:mod:`timeline.sim.hf_state`); and the bytes each action gathers under ZeRO-3."""

    allocs: tuple[StaticAlloc, ...]
    per_parameter: bool
    gathered_bytes: int


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


def device_state(dev: StaticDevice, model: ModelSpec, tr: TrainingSpec, par: ParallelSpec,
                 rules: StateRules) -> DeviceState:
    """The static state plan of one device under its profile and ZeRO level."""
    # hf: one tensor per parameter, as torch.optim holds them; a forward+backward capture recorded
    # its backward into gradients that already exist (zeros), so its runs keep that lifecycle
    per_param = rules.profile == "hf" and tr.zero == 0 and not rules.traced
    life = lifecycle(rules.profile)
    workspaces: list[StaticAlloc] = []
    if life.workspaces is not None and not per_param:
        holds_head = max(dev.stages) == par.pp * par.vpp - 1
        has_moe = any(t.in_moe for t in dev.tensors)
        workspaces = [(w_at, name, size, CAT_CODE[Category.TEMPORARY]) for name, size, _, w_at
                      in life.workspaces(rules.framework, model, tr, par, rules.sm, holds_head=holds_head,
                                         has_moe=has_moe, tensors=dev.tensors)]
    allocs = () if per_param else tuple(static_allocs(rules.profile, tr, dev, workspaces, traced=rules.traced))
    return DeviceState(allocs=allocs, per_parameter=per_param, gathered_bytes=gathered_bytes(rules.profile, tr, dev))


def resolve(allocs: tuple[StaticAlloc, ...], first_backward_us: float,
            first_step_us: float) -> list[tuple[float, str, int, int]]:
    """(time, name, bytes, category code) of the allocations, at the device's first backward and step."""
    when = {"start": 0.0, "first_backward": first_backward_us, "first_step": first_step_us}
    return [(when[a], n, b, c) for a, n, b, c in allocs]


def static_allocs(profile: str, tr: TrainingSpec, dev: StaticDevice, workspaces: list[StaticAlloc], *,
                  traced: bool) -> list[StaticAlloc]:
    """The static state as ``profile`` creates it, in creation order (empty ones left out), with
    the device's persistent ``workspaces`` last; ``traced``: the model is a captured trace."""
    life = lifecycle(profile)
    extra: list[StaticAlloc] = []
    if tr.zero >= 2 and life.reduce_bucket_elems:
        n = min(life.reduce_bucket_elems, sum(t.numel for t in dev.tensors if t.trainable))
        extra.append(("first_backward", "dp.reduce_bucket", n * DTYPE_BYTES[tr.grad_dtype], CAT_CODE[Category.COMM]))
    w, g, o = dev.weights_bytes, dev.grads_bytes, dev.optimizer_bytes
    master, moment = optimizer_element_bytes(tr)
    per_opt = master + 2 * moment
    master_b = o * master // per_opt if per_opt else 0
    opt = CAT_CODE[Category.OPTIMIZER]
    # (created at, name, bytes, category); "first_step" states never exist without an optimizer step
    out = [("start", "static.weights", w, CAT_CODE[Category.WEIGHTS]),
           (life.grads_at, "static.grads", g, CAT_CODE[Category.GRADS])]
    if life.per_param_states and tr.zero == 0 and per_opt and not traced:
        out += per_param_states(dev, life.master_at, life.moments_at, master, moment)
    else:
        out += [(life.master_at, "static.master", master_b, opt), (life.moments_at, "static.moments", o - master_b, opt)]
    if not tr.optimizer_step:
        out = [x for x in out if x[0] != "first_step"]
    return [x for x in out + extra + workspaces if x[2] > 0]


def per_param_states(dev: StaticDevice, master_at: str, moments_at: str, master_bytes: int,
                     moment_bytes: int) -> list[tuple[str, str, int, int]]:
    """Master weights, then ``exp_avg`` and ``exp_avg_sq``, one tensor per parameter in the
    optimizer's order: weight-decayed matrices first, then biases and 1-D parameters (Megatron
    ``_get_param_groups``), each group in model order."""
    opt = CAT_CODE[Category.OPTIMIZER]
    params = [t for t in dev.tensors if t.trainable]
    decayed = [t for t in params if len(t.shape) > 1 and not t.name.endswith(".bias")]
    ordered = decayed + [t for t in params if t not in decayed]
    out = [(master_at, f"static.master.{t.name}", t.numel * master_bytes, opt) for t in ordered] if master_bytes else []
    for t in ordered:
        out += [(moments_at, f"static.moments.{t.name}.exp_avg", t.numel * moment_bytes, opt),
                (moments_at, f"static.moments.{t.name}.exp_avg_sq", t.numel * moment_bytes, opt)]
    return out
