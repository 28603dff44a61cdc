"""Simulate a whole-step trace: construction, then ``warmup_iterations + iterations`` steps on one
device, every captured storage through the allocator in captured order.

Nothing is invented: weights, gradients, moments and every optimizer temporary are the
captured storages, one tensor each, born and freed where the user's script made and dropped
them (:mod:`timeline.graph.trace.steps`). Each phase run (init, forward, backward, optimizer
step) is a span; ops take the roofline time of their FLOPs and bytes. Warm-up iterations run
first, so the state and the allocator's cache they leave behind shape the reported ones; the
reported peaks start where the first reported iteration starts (``SimOutput.report_start_us``).
No file I/O.
"""

from __future__ import annotations

import numpy as np

from timeline.graph.tensors import MODULES
from timeline.graph.trace.params import module_tag
from timeline.graph.trace.steps import carry_map, iteration_runs
from timeline.pipeline.actions import Schedule
from timeline.placement.devices import StaticDevice
from timeline.sim.compiled import CompiledPhase, compile_phase
from timeline.sim.cost import CostModel
from timeline.sim.engine import Span
from timeline.sim.output import DeviceEvents, DeviceOps, Names, SimOutput
from timeline.spec.run import TrainingSpec
from timeline.spec.trace import CapturedTrace


def step_device(trace: CapturedTrace) -> StaticDevice:
    """The one device of a whole-step run; its static bytes are the captured parameters and buffers
    (frozen parameters are recorded as buffers: the ``weights`` category either way), the gradients and
    the optimizer state each parameter ever had (one tensor per role)."""
    by_role: dict[str, int] = {}
    for st in trace.storages.values():
        if st.role:
            by_role[st.role] = st.nbytes
    kinds = {k: sum(n for r, n in by_role.items() if r.startswith(k + ":"))
             for k in ("param", "buffer", "grad", "state")}
    by_module = dict.fromkeys(MODULES, 0)
    for p in trace.params:
        if p.trainable:
            by_module[module_tag(p.name, p.layer, "head" in p.name)] += int(np.prod(p.shape)) if p.shape else 1
    return StaticDevice(device=0, pp_rank=0, stages=(0,), represents=1, layers=(), params_by_module=by_module,
                        weights_bytes=kinds["param"] + kinds["buffer"], grads_bytes=kinds["grad"], optimizer_bytes=kinds["state"])


def simulate_steps(trace: CapturedTrace, tr: TrainingSpec, cost: CostModel) -> SimOutput:
    """Events, ops and spans of the whole run (allocator not yet applied)."""
    assert trace.is_step
    carry = carry_map(trace) if tr.warmup_iterations + tr.iterations > trace.num_steps else {}
    names = Names()
    spans: list[Span] = []
    compiled: list[CompiledPhase] = []
    cols: dict[str, list[np.ndarray]] = {k: [] for k in DeviceEvents.__slots__}
    t = 0.0
    report_start = 0.0
    sizes: dict[str, tuple[int, int]] = {}
    born: dict[int, int] = {}  # tensor id → the micro-batch tag of its allocation
    for it in range(-1, tr.warmup_iterations + tr.iterations):
        if it == tr.warmup_iterations and tr.warmup_iterations:
            report_start = t
        for run_ in iteration_runs(trace, it, carry):
            ph = compile_phase(run_.ops, cost, sizes)
            a = len(spans)
            spans.append(Span(rank=0, position=a, iteration=max(it, 0), stage=0, kind=run_.kind, microbatch=0,
                              start_us=t, end_us=t + ph.duration_us))
            compiled.append(ph)
            n = len(ph.ev_offset)
            if n:
                tensors = names.ids(ph, "tensor_names")[ph.ev_tensor]
                cols["t_us"].append(ph.ev_offset + t)
                cols["sign"].append(ph.ev_sign)
                cols["size"].append(ph.ev_size)
                cols["cat"].append(ph.ev_cat)
                cols["tensor"].append(tensors)
                cols["op"].append(names.ids(ph, "op_names")[ph.ev_op])
                cols["microbatch"].append(_microbatches(tensors, ph.ev_sign, -1 if it < 0 else 0, born))
                cols["stage"].append(np.zeros(n, dtype=np.int16))
                cols["action"].append(np.full(n, a, dtype=np.int32))
                cols["stream"].append(np.zeros(n, dtype=np.int8))
                cols["iteration"].append(np.full(n, -1 if run_.kind == "init" else max(it, 0), dtype=np.int32))
            t += ph.duration_us
    merged = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
    ev = DeviceEvents(**{k: np.ascontiguousarray(v) for k, v in merged.items()})
    ops = _ops(spans, compiled, names)
    reported = [sp for sp in spans if sp.kind != "init"]
    iters = max(tr.iterations, 1)
    iteration_us = (sum(sp.end_us - sp.start_us for sp in reported if sp.start_us >= report_start) / iters)
    schedule = Schedule(kind="step", pp=1, num_chunks=1, num_microbatches=1, stages_of_rank=((0,),), actions=((),))
    act = sum(s.nbytes for s in trace.storages.values() if s.alloc_op >= 0 and trace.ops[s.alloc_op].phase == "F"
              and s.free_op >= 0 and trace.ops[s.free_op].phase == "B"
              and trace.ops[s.alloc_op].step == trace.num_steps)
    return SimOutput(schedule=schedule, devices=[step_device(trace)], spans=[spans], events=[ev], ops=[ops],
                     names=names.items, iteration_time_us=iteration_us, activation_bytes_per_microbatch=[act],
                     report_start_us=report_start)


def _microbatches(tensors: np.ndarray, signs: np.ndarray, tag: int, born: dict[int, int]) -> np.ndarray:
    """Each event's micro-batch tag: construction's events −1, a step's 0, and a free the tag of its
    allocation (the allocator pairs a free with its allocation by tensor, micro-batch and stage; a batch
    or scaler state built with the model and dropped by a step is freed under construction's tag)."""
    out = np.full(len(tensors), tag, dtype=np.int32)
    for i, (tensor, sign) in enumerate(zip(tensors.tolist(), signs.tolist(), strict=True)):
        if sign > 0:
            born[tensor] = tag
        else:
            out[i] = born.pop(tensor, tag)
    return out


def _ops(spans: list[Span], compiled: list[CompiledPhase], names: Names) -> DeviceOps:
    """Every op span, phase named by its run (init, F, B, step)."""
    cols: dict[str, list[np.ndarray]] = {k: [] for k in DeviceOps.__slots__}
    for sp, ph in zip(spans, compiled, strict=True):
        n = len(ph.op_names)
        if not n:
            continue
        cols["name"].append(names.ids(ph, "op_names"))
        cols["stream"].append(names.ids(ph, "op_streams"))
        cols["t_start_us"].append(ph.op_start + sp.start_us)
        cols["t_end_us"].append(ph.op_end + sp.start_us)
        cols["phase"].append(np.full(n, names(sp.kind), dtype=np.int32))
        cols["microbatch"].append(np.full(n, sp.microbatch, dtype=np.int32))
        cols["stage"].append(np.zeros(n, dtype=np.int16))
        cols["layer"].append(np.array(ph.op_layers, dtype=np.int32))
        cols["flops"].append(ph.op_flops)
    return DeviceOps(**{k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()})
