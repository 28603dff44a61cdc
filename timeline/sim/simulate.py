"""Simulate a run: schedule → timed actions → per-device memory events → allocator.

For each pipeline rank's representative device, the static state (weights, gradients,
master weights, moments) is allocated when its profile creates it, every action's compiled
template is shifted to the action's start, P2P boundary tensors connect chunks, and the
device's events run through its allocator model. The output is :class:`SimOutput`: plain
numpy columns the ``result`` layer wraps in a :class:`~timeline.result.Timeline`. No file
I/O, no printing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from timeline.graph.ops import ChunkTemplate
from timeline.graph.static import state_bytes
from timeline.graph.tensors import CATEGORIES, DTYPE_BYTES, Category
from timeline.pipeline import build_schedule
from timeline.pipeline.actions import Schedule
from timeline.pipeline.devices import StaticDevice, static_devices
from timeline.profiles import lifecycle
from timeline.sim.compiled import CAT_CODE, CompiledPhase, compile_phase
from timeline.sim.cost import CostModel
from timeline.sim.engine import Span, run_schedule
from timeline.sim.hf_state import hf_state_events
from timeline.spec.run import RunSpec

PHASES = ("F", "I", "W", "B")


@dataclass(slots=True)
class DeviceEvents:
    """One device's memory events in time order (columns of equal length)."""

    t_us: np.ndarray  # float64
    sign: np.ndarray  # int8 (+1 alloc, −1 free)
    size: np.ndarray  # int64 requested bytes
    cat: np.ndarray  # int8 category code
    tensor: np.ndarray  # int32 index into SimOutput.names
    op: np.ndarray  # int32 index into SimOutput.names (−1: none)
    microbatch: np.ndarray  # int32 (−1: none)
    stage: np.ndarray  # int16 (−1: none)
    action: np.ndarray  # int32 index into the device's spans (−1: static)
    stream: np.ndarray  # int8 allocator stream


@dataclass(slots=True)
class DeviceOps:
    name: np.ndarray  # int32 into names
    stream: np.ndarray  # int32 into names
    t_start_us: np.ndarray
    t_end_us: np.ndarray
    phase: np.ndarray  # int32 into names ("F", "B", "I", "W", "R" recompute, "step")
    microbatch: np.ndarray
    stage: np.ndarray
    layer: np.ndarray
    flops: np.ndarray


@dataclass(slots=True)
class SimOutput:
    run: RunSpec
    schedule: Schedule
    devices: list[StaticDevice]
    spans: list[list[Span]]  # per device
    events: list[DeviceEvents]
    ops: list[DeviceOps]
    names: list[str]
    iteration_time_us: float
    activation_bytes_per_microbatch: list[int]
    templates: dict[int, ChunkTemplate] = field(default_factory=dict)
    #: reported peaks start here: the end of ``warmup_iterations`` (0: everything is reported)
    report_start_us: float = 0.0


class _Names:
    def __init__(self) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}
        self._arrays: dict[tuple[int, str], np.ndarray] = {}

    def ids(self, ph: CompiledPhase, field: str) -> np.ndarray:
        """Name ids of one of a compiled phase's name tuples, computed once per phase."""
        key = (id(ph), field)
        arr = self._arrays.get(key)
        if arr is None:
            arr = self._arrays[key] = np.array([self(n) for n in getattr(ph, field)], dtype=np.int32)
        return arr

    def cached(self, key: tuple, make: Callable[[], np.ndarray]) -> np.ndarray:
        """An array made once per key (per compiled phase): the names it interns on first use
        are interned in the same order as without the cache."""
        arr = self._arrays.get(key)
        if arr is None:
            arr = self._arrays[key] = make()
        return arr

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i


def compile_templates(templates: dict[int, ChunkTemplate], cost: CostModel) -> dict[tuple[int, str], CompiledPhase]:
    out = {}
    for chunk, t in templates.items():
        sizes: dict[str, tuple[int, int]] = {}
        out[(chunk, "F")] = compile_phase(t.forward, cost, sizes)
        after_i = dict(sizes)
        out[(chunk, "I")] = compile_phase(t.backward_i, cost, after_i)
        out[(chunk, "W")] = compile_phase(t.backward_w, cost, after_i)  # W frees what I kept for it
        # a full backward runs each op's weight gradient right after its input gradient
        out[(chunk, "B")] = compile_phase(t.backward or t.backward_i + t.backward_w, cost, dict(sizes))
    return out


def boundary_bytes(run: RunSpec) -> int:
    """Bytes of the hidden states passed between chunks (SP- and CP-sharded)."""
    tr, par = run.training, run.parallel
    tokens = tr.micro_batch_size * tr.seq_len // par.cp // (par.tp if run.sp_enabled else 1)
    return tokens * run.model.hidden_size * DTYPE_BYTES[tr.dtype]


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


def ep_loads(run: RunSpec) -> list[float]:
    """Token load of each simulated EP rank relative to the mean: ``[1.0]`` under balanced
    routing (EP ranks are symmetric, one stands for all); under ``routing = "skew"`` a linear
    ramp from ``routing_skew`` (the busiest rank) down to ``2 − routing_skew``, mean 1."""
    ep, skew = run.parallel.ep, run.training.routing_skew
    if run.training.routing != "skew" or not run.model.is_moe or ep == 1:
        return [1.0]
    return [skew - (skew - 1) * 2 * e / (ep - 1) for e in range(ep)]


def simulate(run: RunSpec, template_fn: Callable[..., ChunkTemplate], *,
             csv_rows: Sequence[Sequence[str]] | None = None,
             progress: Callable[[str, int, int], None] | None = None) -> SimOutput:
    """Run the schedule of ``run`` and return every device's events (allocator not yet applied)."""
    par, tr = run.parallel, run.training
    schedule = build_schedule(run.schedule.kind, pp=par.pp, vpp=par.vpp, num_microbatches=tr.num_microbatches,
                              microbatch_group_size=run.schedule.microbatch_group_size, csv_rows=csv_rows)
    cost = CostModel.from_run(run)
    holder = {c: r for r in reversed(range(par.pp)) for c in schedule.stages_of_rank[r]}
    loads = ep_loads(run)
    # one template set per simulated EP load; the busiest (first) one times the pipeline, since
    # every EP rank waits for the slowest at each all-to-all
    variants = []
    for load in loads:
        run_e = run if len(loads) == 1 else replace(run, training=replace(tr, routing_skew=load))
        t = {c: template_fn(run_e, c, pp_rank=holder[c]) for c in range(schedule.num_chunks)}
        variants.append((t, compile_templates(t, cost)))
    templates, compiled = variants[0]
    stride = par.tp * par.cp * par.dp
    devices = []
    for dev in static_devices(run):
        for e in range(len(loads)):
            devices.append(dev if len(loads) == 1 else
                           replace(dev, device=dev.device + e * (stride // par.ep), represents=stride // par.ep))
    p2p_bytes = boundary_bytes(run)
    p2p_us = cost.comm_us(p2p_bytes, "pp")
    step_us = [_step_us(run, d, cost) for d in devices[::len(loads)]]
    total = tr.warmup_iterations + tr.iterations  # warm-up iterations run first, reported ones after
    spans_all = run_schedule(schedule, iterations=total,
                             duration_us=lambda s, k: compiled[(s, k)].duration_us, p2p_us=p2p_us,
                             step_us=lambda r: step_us[r],
                             pair_us=lambda fs, fk, bs, bk: overlapped_us(compiled[(fs, fk)], compiled[(bs, bk)]))
    per_rank: list[list[Span]] = [[] for _ in range(par.pp)]
    for sp in spans_all:
        per_rank[sp.rank].append(sp)
    for row in per_rank:
        row.sort(key=lambda s: (s.start_us, s.end_us))
    names = _Names()
    events, ops, spans, act = [], [], [], []
    for i, dev in enumerate(devices):
        if progress:
            progress("devices", i, len(devices))
        r, (t_e, c_e) = dev.pp_rank, variants[i % len(loads)]
        events.append(_device_events(run, dev, per_rank[r], c_e, names))
        ops.append(_device_ops(per_rank[r], c_e, names))
        spans.append(per_rank[r])
        act.append(sum(t_e[c].activation_bytes for c in dev.stages))
    iteration_time = max(s.end_us for s in spans_all) / total
    report_start = min((s.start_us for s in spans_all if s.iteration == tr.warmup_iterations), default=0.0) \
        if tr.warmup_iterations else 0.0
    return SimOutput(run=run, schedule=schedule, devices=devices, spans=spans, events=events, ops=ops,
                     names=names.items, iteration_time_us=iteration_time,
                     activation_bytes_per_microbatch=act, templates=templates, report_start_us=report_start)


def _step_us(run: RunSpec, dev: StaticDevice, cost: CostModel) -> float:
    """Gradient reduce-scatter + optimizer step + parameter all-gather, bandwidth-bound (0 without a step)."""
    if not run.training.optimizer_step:
        return 0.0
    g = run.parallel.dp * run.parallel.cp
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


def _static_allocs(run: RunSpec, dev: StaticDevice, first_backward_us: float,
                   first_step_us: float) -> list[tuple[float, str, int, int]]:
    """(time, name, bytes, category code) of the static state, as the profile creates it."""
    life = lifecycle(run.profile)
    tr = run.training
    extra = []
    if tr.zero >= 2 and life.reduce_bucket_elems:
        n = min(life.reduce_bucket_elems, sum(t.numel for t in dev.tensors if t.trainable))
        extra.append((first_backward_us, "dp.reduce_bucket", n * DTYPE_BYTES[tr.grad_dtype], CAT_CODE[Category.COMM]))
    w, g, o = state_bytes(run, dev.tensors)
    master = DTYPE_BYTES[tr.master_dtype] if tr.master_dtype != tr.dtype else 0
    per_opt = master + 2 * DTYPE_BYTES[tr.moment_dtype]
    master_b = o * master // per_opt if per_opt else 0
    when = {"start": 0.0, "first_backward": first_backward_us, "first_step": first_step_us}
    opt = CAT_CODE[Category.OPTIMIZER]
    # (created at, name, bytes, category); "first_step" states never exist without an optimizer step
    out = [("start", "static.weights", w, CAT_CODE[Category.WEIGHTS]),
           (life.grads_at, "static.grads", g, CAT_CODE[Category.GRADS])]
    if life.per_param_states and tr.zero == 0 and per_opt and run.trace is None:
        out += _per_param_states(run, dev, life.master_at, life.moments_at, master)
    else:
        out += [(life.master_at, "static.master", master_b, opt), (life.moments_at, "static.moments", o - master_b, opt)]
    if not tr.optimizer_step:
        out = [x for x in out if x[0] != "first_step"]
    if life.workspaces is not None:
        holds_head = max(dev.stages) == run.parallel.pp * run.parallel.vpp - 1
        has_moe = any(t.in_moe for t in dev.tensors)
        at = {"start": 0.0, "first_backward": first_backward_us}
        extra += [(at[w_at], name, size, CAT_CODE[Category.TEMPORARY]) for name, size, _, w_at
                  in life.workspaces(run, holds_head=holds_head, has_moe=has_moe, tensors=dev.tensors)]
    return [x for x in [(when[a], n, b, c) for a, n, b, c in out] + extra if x[2] > 0]


def _per_param_states(run: RunSpec, dev: StaticDevice, master_at: str, moments_at: str,
                      master_bytes: int) -> list[tuple[str, str, int, int]]:
    """Master weights, then ``exp_avg`` and ``exp_avg_sq``, one tensor per parameter in the
    optimizer's order: weight-decayed matrices first, then biases and 1-D parameters (Megatron
    ``_get_param_groups``), each group in model order."""
    opt = CAT_CODE[Category.OPTIMIZER]
    moment = DTYPE_BYTES[run.training.moment_dtype]
    params = [t for t in dev.tensors if t.trainable]
    decayed = [t for t in params if len(t.shape) > 1 and not t.name.endswith(".bias")]
    ordered = decayed + [t for t in params if t not in decayed]
    out = [(master_at, f"static.master.{t.name}", t.numel * master_bytes, opt) for t in ordered] if master_bytes else []
    for t in ordered:
        out += [(moments_at, f"static.moments.{t.name}.exp_avg", t.numel * moment, opt),
                (moments_at, f"static.moments.{t.name}.exp_avg_sq", t.numel * moment, opt)]
    return out


def _device_events(run: RunSpec, dev: StaticDevice, spans: list[Span],
                   compiled: dict[tuple[int, str], CompiledPhase], names: _Names) -> DeviceEvents:
    """Static state, then every action's template shifted to its start (the templates carry the
    P2P receive/send buffers that connect chunks)."""
    stride = max(run.training.num_microbatches, 1 + max((s.microbatch for s in spans), default=0))
    first_bwd = min((s.start_us for s in spans if s.kind in ("B", "I")), default=0.0)
    first_step = min((s.start_us for s in spans if s.kind == "step"), default=0.0)
    # one chunk per push: the per-event columns as arrays (a template's own, shared), the
    # per-action ones as (value, length), expanded once at the end with np.repeat
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in ("t_us", "sign", "size", "cat", "tensor", "op")}
    scalars: list[tuple[int, int, int]] = []
    lengths: list[int] = []

    def push(t, sign, size, cat, tensor, op, mb, stage, action):
        n = len(t)
        for k, v, dt in (("t_us", t, np.float64), ("sign", sign, np.int8), ("size", size, np.int64),
                         ("cat", cat, np.int8), ("tensor", tensor, np.int32), ("op", op, np.int32)):
            v = np.asarray(v, dtype=dt)
            arrays[k].append(v if v.ndim else np.full(n, v, dtype=dt))
        scalars.append((mb, stage, action))
        lengths.append(n)

    # hf: one tensor per parameter, as torch.optim holds them; a forward+backward capture recorded
    # its backward into gradients that already exist (zeros), so its runs keep that lifecycle
    if run.profile == "hf" and run.training.zero == 0 and run.trace is None:
        for t, sign, name, size, cat, a in hf_state_events(
                run, dev, spans, lambda sp: compiled.get((sp.stage, sp.kind))):
            push([t], sign, size, cat, names(name), -1, -1, -1, a)
    else:
        for t, name, size, cat in _static_allocs(run, dev, first_bwd, first_step):
            push([t], 1, size, cat, names(name), -1, -1, -1, -1)
    life = lifecycle(run.profile)
    gather = 0
    if run.training.zero == 3 and life.prefetch_bucket_elems:
        layer = largest_layer_bytes(dev, run.training.dtype)
        gather = layer + min(life.prefetch_bucket_elems * DTYPE_BYTES[run.training.dtype], layer)
    for i, sp in enumerate(spans):
        if sp.kind == "step":
            continue
        ph = compiled[(sp.stage, sp.kind)]
        # iterations apart, so one tensor's alloc and free pair up in the allocator pass
        m, s = sp.microbatch + sp.iteration * stride, sp.stage
        if gather:
            push([sp.start_us], 1, gather, CAT_CODE[Category.COMM], names("zero3.gathered_params"), -1, m, s, i)
        if len(ph.ev_offset):
            tensor_ids = names.cached((id(ph), "ev_tensor"), lambda ph=ph: names.ids(ph, "tensor_names")[ph.ev_tensor])
            op_ids = names.cached((id(ph), "ev_op"), lambda ph=ph: names.ids(ph, "op_names")[ph.ev_op])
            offsets = ph.ev_offset if sp.scale == 1.0 else ph.ev_offset * sp.scale
            push(offsets + sp.start_us, ph.ev_sign, ph.ev_size, ph.ev_cat, tensor_ids, op_ids, m, s, i)
        if gather:
            push([sp.end_us], -1, gather, CAT_CODE[Category.COMM], names("zero3.gathered_params"), -1, m, s, i)
    if lengths:
        merged = {k: np.concatenate(v) for k, v in arrays.items()}
        per = np.array(scalars, dtype=np.int64).reshape(-1, 3)
        counts = np.array(lengths, dtype=np.int64)
        for j, (k, dt) in enumerate((("microbatch", np.int32), ("stage", np.int16), ("action", np.int32))):
            merged[k] = np.repeat(per[:, j].astype(dt), counts)
        merged["stream"] = np.zeros(int(counts.sum()), dtype=np.int8)
    else:
        merged = {k: np.zeros(0) for k in DeviceEvents.__slots__}
    order = np.argsort(merged["t_us"], kind="stable")
    ev = DeviceEvents(**{k: np.ascontiguousarray(v[order]) for k, v in merged.items()})
    ev.microbatch = np.where(ev.microbatch >= 0, ev.microbatch % stride, -1).astype(np.int32)
    return ev


def _device_ops(spans: list[Span], compiled: dict[tuple[int, str], CompiledPhase], names: _Names) -> DeviceOps:
    cols: dict[str, list] = {k: [] for k in DeviceOps.__slots__}
    for sp in spans:
        if sp.kind == "step":
            for k, v in (("name", names("optimizer.step")), ("stream", names("compute")),
                         ("t_start_us", sp.start_us), ("t_end_us", sp.end_us), ("phase", names("step")),
                         ("microbatch", -1), ("stage", -1), ("layer", -1), ("flops", 0.0)):
                cols[k].append(np.array([v]))
            continue
        ph = compiled[(sp.stage, sp.kind)]
        n = len(ph.op_names)
        if not n:
            continue
        phase = names.cached((id(ph), "phase", sp.kind), lambda ph=ph, kind=sp.kind: np.array(
            [names("R" if rc else kind) for rc in ph.op_recompute], dtype=np.int32))
        cols["name"].append(names.ids(ph, "op_names"))
        if sp.overlapped:  # beside the forward half: its own threads, so slices stay nested
            cols["stream"].append(names.cached((id(ph), "overlapped"), lambda ph=ph: np.array(
                [names(f"{x} (overlapped)") for x in ph.op_streams], dtype=np.int32)))
        else:
            cols["stream"].append(names.ids(ph, "op_streams"))
        k = sp.scale
        cols["t_start_us"].append((ph.op_start if k == 1.0 else ph.op_start * k) + sp.start_us)
        cols["t_end_us"].append((ph.op_end if k == 1.0 else ph.op_end * k) + sp.start_us)
        cols["phase"].append(phase)
        cols["microbatch"].append(np.full(n, sp.microbatch, dtype=np.int32))
        cols["stage"].append(np.full(n, sp.stage, dtype=np.int16))
        cols["layer"].append(names.cached((id(ph), "layers"), lambda ph=ph: np.array(ph.op_layers, dtype=np.int32)))
        cols["flops"].append(ph.op_flops)
    return DeviceOps(**{k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()})


__all__ = ["PHASES", "CATEGORIES", "SimOutput", "simulate"]
