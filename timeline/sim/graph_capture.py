"""The capture of Megatron's per-layer CUDA graphs as memory events, before iteration 1.

``TECudaGraphHelper.create_cudagraphs`` (``megatron/core/transformer/cuda_graphs.py@268fda0859``; with
``--cuda-graph-warmup-steps 0`` at iteration 0, before the first step) first makes every graph's sample
inputs (``_get_cuda_graph_input_data``: per chunk, micro-batch and layer ``get_layer_static_inputs`` — the
hidden states ``[s/(tp·cp), b, h]`` and, for a layer with self-attention, the boolean causal mask
``[b, 1, s/cp, s]``), then calls TE's ``make_graphed_callables`` with the schedule's ``_order``
(``transformer_engine/pytorch/graph.py: _make_graphed_callables``@release_v2.6): forward graphs and
backward graphs captured in that order into one pool; each backward capture first makes its static
grad outputs (``torch.empty_like`` of the outputs). The graphs then hold their static inputs, outputs,
grad outputs and grad inputs.

With ``_reuse_graph_input_output_buffers`` (passed by Megatron from TE 2.6 on:
``megatron/training/training.py@2b6b46b796``, ``is_te_min_version("2.6.0")``; ``cuda_graphs.py@268fda0859``
from 2.7) a forward whose sample inputs match (shape, dtype) those of a graph whose backward was already
captured takes that graph's sample inputs (its own are dropped: freed before any capture), one static grad
output per shape is shared, and static outputs and grad inputs become weak references after their backward
capture (freed into the pool: reserved, not allocated). Without it every graph holds all four for good.

The capture runs in no time here: its events are pushed at the first action's start, in capture order
(the stable sort keeps push order). This module does not decide which ops are graphed
(:mod:`timeline.graph.cuda_graphs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from timeline.graph.tensors import Category
from timeline.sim.compiled import CAT_CODE, CompiledPhase
from timeline.sim.engine import Span

Compiled = dict[tuple[int, str], CompiledPhase]


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureRules:
    layers: dict[int, tuple[int, ...]]  # chunk → decoder layers graphed in it (on this device)
    boundary: dict[int, frozenset[str]]  # chunk → storages of the graphs' static outputs / grad inputs
    hidden_bytes: int  # one graph's hidden-state input, output, grad output or grad input
    mask_bytes: int  # one graph's attention-mask sample input (0: no self-attention graphed)
    reuse_buffers: bool  # TE ≥ 2.6: _reuse_graph_input_output_buffers


def _order(spans: list[Span]) -> list[Span]:
    """The first iteration's forward and backward actions: the schedule order the graphs are captured in."""
    first = min((s.iteration for s in spans if s.kind in ("F", "B")), default=0)
    return [s for s in spans if s.iteration == first and s.kind in ("F", "B")]


def capture_events(push: Callable[..., None], spans: list[Span], capture: Compiled, rules: CaptureRules,
                   names: Callable[[str], int]) -> None:
    """Push the capture's events through ``push`` (``_Log.push``'s signature)."""
    order = _order(spans)
    if not order:
        return
    t0 = min(s.start_us for s in spans if s.kind in ("F", "B"))
    it = order[0].iteration
    act = CAT_CODE[Category.ACTIVATIONS]
    tmp = CAT_CODE[Category.TEMPORARY]
    mbs = sorted({s.microbatch for s in order})

    def one(sign: int, size: int, cat: int, name: str, mb: int, stage: int) -> None:
        if size:
            push([t0], sign, size, cat, names(name), -1, mb, stage, -1, it)

    held = {s.stage for s in order}  # the device's chunks
    samples = [(c, m, layer) for c, ls in sorted(rules.layers.items()) if c in held for m in mbs for layer in ls]
    for c, m, layer in samples:  # _get_cuda_graph_input_data: every sample made before make_graphed_callables
        one(1, rules.hidden_bytes, act, f"cuda_graph.sample.layers.{layer}.hidden_states", m, c)
        one(1, rules.mask_bytes, act, f"cuda_graph.sample.layers.{layer}.attention_mask", m, c)
    if rules.reuse_buffers:  # graph.py: the sample queues of _reuse_graph_input_output_buffers
        fwd_q: dict[int, list[tuple[int, int]]] = {}
        consumed: list[tuple[int, int, int]] = []
        for sp in order:
            ls = rules.layers.get(sp.stage, ())
            if sp.kind == "F":
                for layer in ls:
                    fwd_q.setdefault(sp.stage, []).append((sp.microbatch, layer))
                    if consumed:
                        consumed.pop(0)
                        one(-1, rules.hidden_bytes, act, f"cuda_graph.sample.layers.{layer}.hidden_states",
                            sp.microbatch, sp.stage)
                        one(-1, rules.mask_bytes, act, f"cuda_graph.sample.layers.{layer}.attention_mask",
                            sp.microbatch, sp.stage)
            else:
                q = fwd_q.get(sp.stage, [])
                n = min(len(q), len(ls))
                consumed += [(sp.stage, m, layer) for m, layer in q[:n]]
                fwd_q[sp.stage] = q[n:]
    shared_grad_output = False
    for sp in order:
        ph = capture.get((sp.stage, sp.kind))
        ls = rules.layers.get(sp.stage, ())
        if ph is None or not ls:
            continue
        if sp.kind == "B":
            for layer in ls:  # static grad outputs, made before each backward capture
                if rules.reuse_buffers and shared_grad_output:
                    continue
                shared_grad_output = True
                one(1, rules.hidden_bytes, tmp, f"cuda_graph.static_grad_output.layers.{layer}", sp.microbatch,
                    sp.stage)
        if len(ph.ev_offset):
            tensors = [names(f"cuda_graph:{ph.tensor_names[k]}") for k in ph.ev_tensor.tolist()]
            push(np.full(len(ph.ev_offset), t0), ph.ev_sign, ph.ev_size, ph.ev_cat, tensors, -1,
                 sp.microbatch, sp.stage, -1, it)
        if sp.kind == "B" and rules.reuse_buffers:  # make_weak_ref: the pool keeps them, allocated no more
            made = _boundary_allocs(capture, sp.stage, rules.boundary.get(sp.stage, frozenset()))
            for name, size, cat in made:
                push([t0], -1, size, cat, names(f"cuda_graph:{name}"), -1, sp.microbatch, sp.stage, -1, it)


def _boundary_allocs(capture: Compiled, chunk: int, boundary: frozenset[str]) -> list[tuple[str, int, int]]:
    out = []
    for kind in ("F", "B"):
        ph = capture.get((chunk, kind))
        if ph is None:
            continue
        for k in np.flatnonzero(ph.ev_sign > 0).tolist():
            name = ph.tensor_names[ph.ev_tensor[k]]
            if name in boundary:
                out.append((name, int(ph.ev_size[k]), int(ph.ev_cat[k])))
    return out
