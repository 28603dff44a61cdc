"""How much work a run is, before any of it is done: actions, memory events, ops, output bytes.

A run's cost grows with micro-batches × iterations × layers; a typo (``num_microbatches =
10**9``) would otherwise grow memory for minutes before anything fails. The estimate builds
the op templates of a *probe*: the same run cut to two decoder layers (one of each kind the
model has: dense and mixture-of-experts), one pipeline rank, one micro-batch. Each layer's
events and ops are counted from the probe and multiplied out over the real model, micro-batches,
iterations and simulated EP ranks — every micro-batch passes through every layer once, forward
and backward, whatever the schedule. Built in well under a second for any model size; within
2× of the real counts on the shipped runs (tested). A captured trace is counted from its own
templates (its size is the file's). This module only counts; it simulates nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from timeline.errors import UserError
from timeline.graph.ops import ChunkTemplate
from timeline.graph.source import ModelSource
from timeline.sim.cost import CostModel
from timeline.sim.plan import compile_templates, ep_loads
from timeline.spec.model import ModelSpec
from timeline.spec.run import HardwareSpec, ParallelSpec, RecomputeSpec, TrainingSpec
from timeline.spec.schedule_rules import SCHEDULE_KINDS
from timeline.spec.trace import CapturedTrace

#: bytes each exporter writes per memory event + op, measured on the shipped DeepSeek-V3 run
#: (735,552 events, 335,000 ops; README "Outputs"): a size estimate, not a simulated quantity
BYTES_PER_ROW = {"summary": 0, "memory": 8, "events": 12, "ops": 6, "trace": 140, "perfetto": 52,
                 "snapshot": 64}
#: memory the simulation holds per memory event (columns, allocator results, exporters' buffers),
#: measured as peak RSS / events at 64 micro-batches (1,509 MiB / 1,471,040; CHANGELOG)
RSS_BYTES_PER_EVENT = 1075
#: the most bytes one tensor may take: the allocator models a 48-bit device address space, and
#: no device holds a single tensor past a quarter of it
MAX_TENSOR_BYTES = 2**46

DEFAULT_MAX_EVENTS = 50_000_000


@dataclass(frozen=True, slots=True)
class WorkEstimate:
    actions: int
    memory_events: int
    ops: int  # simulated op spans, all devices
    ops_per_microbatch: int  # forward + backward ops of the whole model for one micro-batch
    devices: int

    def output_bytes(self, formats: list[str] | tuple[str, ...]) -> int:
        return sum(BYTES_PER_ROW.get(f, 0) * (self.memory_events + self.ops) for f in formats)

    @property
    def rss_bytes(self) -> int:
        return self.memory_events * RSS_BYTES_PER_EVENT

    @property
    def device_events(self) -> int:
        """Memory events of one simulated device (the run's, shared evenly): what a summary-level
        build (:func:`timeline.result.build.build_timeline` ``summary_only``) holds at once."""
        return -(-self.memory_events // max(self.devices, 1))


def probe_model(m: ModelSpec) -> tuple[ModelSpec, dict[int, str]]:
    """``m`` cut to two decoder layers, one of each kind it has (dense, MoE), and which kind each
    probe layer stands for; per-layer counts of the real model are read off them."""
    cut, kinds = _probe_cut(m)
    return cut, dict(kinds)


@lru_cache(maxsize=64)
def _probe_cut(m: ModelSpec) -> tuple[ModelSpec, tuple[tuple[int, str], ...]]:
    """:func:`probe_model`, cached (a plan cuts one model once per layout group)."""
    kinds = {"moe" if m.is_moe_layer(i) else "dense" for i in range(m.num_hidden_layers)}
    if kinds == {"dense", "moe"}:
        return m.with_(num_hidden_layers=2, first_k_dense_replace=1, moe_layer_freq=1, mlp_layer_types=()), \
            ((0, "dense"), (1, "moe"))
    if kinds == {"moe"}:
        return m.with_(num_hidden_layers=2, first_k_dense_replace=0, moe_layer_freq=1, mlp_layer_types=()), \
            ((0, "moe"), (1, "moe"))
    return m.with_(num_hidden_layers=2, first_k_dense_replace=2 if m.is_moe else min(m.first_k_dense_replace, 2),
                   mlp_layer_types=()), ((0, "dense"), (1, "dense"))


def probe_source(source: ModelSource, model: ModelSpec, rc: RecomputeSpec, par: ParallelSpec,
                 tr: TrainingSpec) -> tuple[ModelSource, ParallelSpec, dict[int, str]]:
    """``source`` cut to :func:`probe_model`, one pipeline rank and one micro-batch; its parallel
    slice and which kind each probe layer stands for."""
    cut, kind = probe_model(model)
    if rc.policy == "full":  # an upper bound: every layer recomputed
        rc = RecomputeSpec(policy="full", method="block", num_layers=2)
    probe_par = replace(par, pp=1, vpp=1, layout=None)
    probe_tr = replace(tr, num_microbatches=1, iterations=1, warmup_iterations=0)
    return source.cut(cut, probe_par, probe_tr, rc), probe_par, kind


def _largest_tensor(template: ChunkTemplate) -> tuple[int, str]:
    best = (0, "")
    for ops in (template.forward, template.backward_i, template.backward_w):
        for op in ops:
            for t in op.allocs:
                if t.size_bytes > best[0]:
                    best = (t.size_bytes, t.name)
    return best


def _counts(templates: dict[int, ChunkTemplate], cost: CostModel) -> tuple[dict[int, int], dict[int, int]]:
    """(events, ops) of one micro-batch's forward + backward, by decoder layer (−1: the rest)."""
    compiled = compile_templates(templates, cost)
    events: dict[int, int] = {}
    ops: dict[int, int] = {}
    for (_, phase), ph in compiled.items():
        if phase not in ("F", "B"):
            continue
        for layer in ph.op_layers:
            ops[layer] = ops.get(layer, 0) + 1
        for op_index in ph.ev_op.tolist():
            layer = ph.op_layers[op_index] if op_index >= 0 else -1
            events[layer] = events.get(layer, 0) + 1
    return events, ops


def estimate_work(source: ModelSource, *, model: ModelSpec, parallel: ParallelSpec, training: TrainingSpec,
                  recompute: RecomputeSpec, schedule_kind: str, hardware: HardwareSpec, traced: bool) -> WorkEstimate:
    """Actions, memory events and ops a run would make (see the module docstring): ``source`` is
    its model source, ``traced`` whether that is a captured trace. Raises a UserError when one
    tensor alone would exceed what a device can address."""
    tr, par = training, parallel
    if traced:
        from timeline.graph.build import chunk_layers

        chunks = len(chunk_layers(par, model.num_hidden_layers))
        templates = {c: source.template(c) for c in range(chunks)}
        events, ops = _counts(templates, CostModel.of(hardware, par))
        per_mb_events, per_mb_ops = sum(events.values()), sum(ops.values())
    else:
        probe, probe_par, kind = probe_source(source, model, recompute, par, tr)
        template = probe.template(0)
        size, name = _largest_tensor(template)
        if size > MAX_TENSOR_BYTES:
            raise UserError(f"{name} alone would take {size / 2**40:,.0f} TiB on one device, more than any "
                            "device can address; lower training.seq_len or training.micro_batch_size, "
                            "or shard it (parallel.tp, cp)")
        events, ops = _counts({0: template}, CostModel.of(hardware, probe_par))
        n = {"dense": 0, "moe": 0}
        for i in range(model.num_hidden_layers):
            n["moe" if model.is_moe_layer(i) else "dense"] += 1

        def total(counts: dict[int, int]) -> int:
            per_kind = {k: max((counts.get(i, 0) for i, kk in kind.items() if kk == k), default=0)
                        for k in ("dense", "moe")}
            fixed = sum(v for layer, v in counts.items() if layer not in kind)
            return fixed + sum(per_kind[k] * n[k] for k in n)

        per_mb_events, per_mb_ops = total(events), total(ops)
    variants = len(ep_loads(par, tr, model.is_moe))
    kind_of = SCHEDULE_KINDS[schedule_kind]
    chunks = par.pp * par.vpp * (2 if kind_of.placement == "dualpipe" else 1)  # DualPipe: two model copies
    phases = 3 if kind_of.split_backward else 2
    microbatches = tr.num_microbatches * (tr.iterations + tr.warmup_iterations)
    return WorkEstimate(actions=microbatches * chunks * phases * variants,
                        memory_events=microbatches * per_mb_events * variants,
                        ops=microbatches * per_mb_ops * variants, ops_per_microbatch=per_mb_ops,
                        devices=par.pp * variants)


def estimate_steps(trace: CapturedTrace, training: TrainingSpec) -> WorkEstimate:
    """A whole-step trace's work, read off the trace (no templates: it runs as captured, one device).
    The construction runs once and iteration ``i`` runs captured step ``min(i + 1, K)``, as
    :func:`timeline.graph.trace.steps.iteration_runs` plays them; each captured storage is one alloc
    and one free event, each recorded op one op span."""
    events: dict[int, int] = {}
    ops: dict[int, int] = {}
    phases: dict[int, set[str]] = {}
    for o in trace.ops:
        ops[o.step] = ops.get(o.step, 0) + 1
        events[o.step] = events.get(o.step, 0) + 2 * sum(1 for s in o.allocs if trace.storages[s].nbytes)
        phases.setdefault(o.step, set()).add(o.phase)
    steps = [0] + [min(i + 1, max(trace.num_steps, 1)) for i in range(training.warmup_iterations + training.iterations)]
    return WorkEstimate(actions=sum(len(phases.get(k, ())) for k in steps),
                        memory_events=sum(events.get(k, 0) for k in steps), ops=sum(ops.get(k, 0) for k in steps),
                        ops_per_microbatch=ops.get(steps[-1], 0), devices=1)


def check_bound(est: WorkEstimate, max_events: int, *, flag: str = "--max-events", per_device: bool = False) -> None:
    """A one-line UserError when ``est`` exceeds ``max_events`` memory events; ``per_device``:
    those of one device, all a summary-level build holds at once."""
    if per_device:
        if est.device_events <= max_events:
            return
        raise UserError(f"one device of this run would make about {est.device_events:,} memory events "
                        f"(≈ {est.device_events * RSS_BYTES_PER_EVENT / 2**30:,.0f} GiB of memory to simulate it), "
                        f"over {flag} {max_events:,}; lower training.num_microbatches or training.iterations, "
                        f"or raise {flag} if this machine has the memory")
    if est.memory_events <= max_events:
        return
    raise UserError(f"this run would make about {est.memory_events:,} memory events ({est.actions:,} actions on "
                    f"{est.devices} devices, ≈ {est.rss_bytes / 2**30:,.0f} GiB of memory to simulate), over "
                    f"{flag} {max_events:,}; lower training.num_microbatches or training.iterations, write "
                    "summary-level outputs only (--format summary,devices: one device in memory at a time), "
                    f"or raise {flag} if this machine has the memory")
