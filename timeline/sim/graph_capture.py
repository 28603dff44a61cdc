"""The capture of Megatron's per-layer CUDA graphs as memory events, before the first step (or the warm-up
steps' end).

``TECudaGraphHelper.create_cudagraphs`` (``megatron/core/transformer/cuda_graphs.py@11debfa7b4``; before
c173615753 ``megatron/training/training.py: cuda_graph_capture``) makes every graph's sample inputs, then TE's
``make_graphed_callables`` (``transformer_engine/pytorch/graph.py: _make_graphed_callables``@v2.9) runs each
callable eagerly on a side stream a few times (its warm-up), then captures the forward and backward graphs
in the pipeline schedule's order (``_order``: ``schedules.py: convert_schedule_table_to_order``) into one
private pool; each backward capture first makes its static grad outputs (``torch.empty_like`` of the
outputs). Under pipeline parallelism every micro-batch of the iteration gets its graphs; without it one
micro-batch's graphs serve them all (``_get_cuda_graph_input_data``: ``num_microbatches = 1`` at pp = 1).

What stays allocated (:mod:`timeline.profiles.megatron_cuda_graphs` sizes it): the samples (shared between
graphs whose lives do not overlap, as Megatron or TE reorganise them), under ``_reuse_graph_input_output_
buffers`` one static grad output per signature and the last backward graph's static grad inputs (each
backward capture weak-refs its graph's static outputs, the previous layer's grad inputs and, at a chunk's
first layer, the previous chunk's: ``make_weak_ref``), else every graph's outputs, grad outputs and grad
inputs; the PyTorch cuBLAS workspaces the graphed GEMMs make on the warm-up and capture streams. Everything
else a captured op allocated is freed into the pool by the capture's end.

The capture runs in no time here: its events are pushed at the first action's start, in capture order (the
stable sort keeps push order). With warm-up steps (Megatron-Core 0.15.0rc6 on: ``training.py: train`` captures when
``iteration - start_iteration == args.cuda_graph_warmup_steps``) the first iterations run eagerly — every action
on the eager templates — and the capture comes at the first action of the capturing iteration, whose actions (in
schedule order) it follows. The captured ops allocate in the graphs' private pool (allocator stream
:data:`GRAPH_POOL`, never released while the graphs live: ``CUDACachingAllocator.cpp`` keeps a private pool
until its graphs are gone, and eager allocations never take its blocks), the warm-up's workspaces on their side
stream (:data:`TE_WARMUP`), the samples and grad outputs on the compute stream. Not modelled: the warm-up's
own transients (one callable's forward and backward at a time, on the side stream, released with the compute
stream's cached blocks by ``_finish_capturing``'s ``empty_cache``, which is not modelled either).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from timeline.graph.tensors import Category
from timeline.profiles.megatron_cuda_graphs import GRAPH_WORKSPACES, GraphHolds
from timeline.sim.compiled import CAT_CODE, CompiledPhase
from timeline.sim.engine import Span

Compiled = dict[tuple[int, str], CompiledPhase]
#: allocator streams: the graphs' private pool (``graph_pool_handle``) and TE's warm-up side stream
GRAPH_POOL = 1
TE_WARMUP = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class CaptureRules:
    layers: dict[int, tuple[int, ...]]  # chunk → decoder layers graphed in it
    outputs: dict[int, dict[int, frozenset[str]]]  # chunk → layer → its graph's static outputs
    grad_inputs: dict[int, dict[int, frozenset[str]]]  # chunk → layer → its graph's static grad inputs
    grad_outputs: dict[int, dict[int, tuple[int, ...]]]  # chunk → layer → its static grad outputs' bytes
    holds: GraphHolds
    one_microbatch: bool  # pp = 1: micro-batch 0's graphs serve every micro-batch
    #: iterations run eagerly before the capture (``[framework] cuda_graph_warmup_steps``), on ``eager``'s phases
    warmup_steps: int = 0
    eager: Compiled | None = None
    moe_layers: frozenset[int] = frozenset()  # the graphed layers with an MoE block


def capture_iteration(spans: list[Span], rules: CaptureRules) -> int:
    """The iteration whose step the capture precedes: the first simulated one plus the warm-up steps (Megatron
    ``training.py: train``: ``iteration - start_iteration == args.cuda_graph_warmup_steps``)."""
    return min((s.iteration for s in spans if s.kind in ("F", "B")), default=0) + rules.warmup_steps


def capture_order(spans: list[Span], one_microbatch: bool, iteration: int) -> list[Span]:
    """The forward and backward actions of the capturing iteration (:func:`capture_iteration`): the schedule
    order the graphs are captured in (micro-batch 0's alone under ``one_microbatch``)."""
    return [s for s in spans if s.iteration == iteration and s.kind in ("F", "B")
            and not (one_microbatch and s.microbatch)]


class _Push:
    """One-event pushes at the capture's instant."""

    def __init__(self, push: Callable[..., None], names: Callable[[str], int], t0: float, it: int) -> None:
        self.push, self.names, self.t0, self.it = push, names, t0, it

    def one(self, sign: int, size: int, cat: int, name: str, mb: int, stage: int, stream: int = 0) -> None:
        if size:
            self.push([self.t0], sign, size, cat, self.names(name), -1, mb, stage, -1, self.it, stream)


def capture_events(push: Callable[..., None], spans: list[Span], capture: Compiled, rules: CaptureRules,
                   names: Callable[[str], int]) -> None:
    """Push the capture's events through ``push`` (``_Log.push``'s signature)."""
    at = capture_iteration(spans, rules)
    order = [s for s in capture_order(spans, rules.one_microbatch, at) if rules.layers.get(s.stage)]
    if not order:
        return  # no capture within the simulated iterations (they are all warm-up)
    t0 = min(s.start_us for s in spans if s.kind in ("F", "B") and s.iteration == at)
    p = _Push(push, names, t0, order[0].iteration)
    h = rules.holds
    _samples(p, order, rules)
    ws = CAT_CODE[Category.TEMPORARY]
    blas = h.torch_workspace_bytes
    if h.torch_gemms_moe_only and not any(layer in rules.moe_layers for sp in order for layer in rules.layers[sp.stage]):
        blas = 0  # the router's GEMMs are the only PyTorch ones, and this device graphs no MoE layer
    for name in GRAPH_WORKSPACES[:2]:  # the warm-up's forward and backward, on TE's side stream
        p.one(1, blas, ws, f"workspace.torch_cublas_graph_{name}", -1, -1, TE_WARMUP)
    on_capture_stream: set[str] = set()  # F / B: the capture stream's workspace of that thread is made
    signatures: set[tuple[int, ...]] = set()  # under reuse_buffers: one set of static grad outputs a signature
    last_first: tuple[int, int, frozenset[str]] | None = None  # (mb, chunk, grad inputs) of the last chunk-first layer
    for sp in order:
        ph = capture.get((sp.stage, sp.kind))
        if sp.kind == "B":
            for layer in reversed(rules.layers[sp.stage]):  # static grad outputs, made before each backward
                sizes = rules.grad_outputs.get(sp.stage, {}).get(layer, ())
                if h.reuse_buffers and sizes in signatures:
                    continue
                signatures.add(sizes)
                for j, size in enumerate(sizes):
                    p.one(1, size, ws, f"cuda_graph.static_grad_output.layers.{layer}" + (f".{j}" if j else ""),
                          sp.microbatch, sp.stage)
        if sp.kind not in on_capture_stream:  # the first forward (main thread) and backward (autograd thread)
            on_capture_stream.add(sp.kind)
            name = GRAPH_WORKSPACES[2 if sp.kind == "F" else 3]
            p.one(1, blas, ws, f"workspace.torch_cublas_graph_{name}", -1, -1, GRAPH_POOL)
        if ph is not None and len(ph.ev_offset):
            tensors = [names(f"cuda_graph:{ph.tensor_names[k]}") for k in ph.ev_tensor.tolist()]
            push(np.full(len(ph.ev_offset), t0), ph.ev_sign, ph.ev_size, ph.ev_cat, tensors, -1,
                 sp.microbatch, sp.stage, -1, p.it, GRAPH_POOL)
        if sp.kind == "B" and h.reuse_buffers:  # make_weak_ref: the pool keeps them, allocated no more
            layers = rules.layers[sp.stage]
            weak = set().union(*rules.outputs.get(sp.stage, {}).values())
            weak |= set().union(*(rules.grad_inputs.get(sp.stage, {}).get(layer, frozenset())
                                  for layer in layers[1:]))
            _free_made(p, capture, sp.stage, sp.microbatch, weak)
            if last_first is not None:
                _free_made(p, capture, last_first[1], last_first[0], last_first[2])
            last_first = (sp.microbatch, sp.stage, rules.grad_inputs.get(sp.stage, {}).get(layers[0], frozenset()))


def _samples(p: _Push, order: list[Span], rules: CaptureRules) -> None:
    """The sample inputs, made before the warm-up: Megatron's own reuse (``_get_sample_arguments``) or one per
    graph with TE's reorganisation dropping the duplicates (``_make_graphed_callables``); the queues are the
    same (a finished backward's samples serve the next forwards of any chunk, first come first served)."""
    h = rules.holds
    act = CAT_CODE[Category.ACTIVATIONS]

    def sample(sign: int, layer: int, mb: int, chunk: int) -> None:
        p.one(sign, h.hidden_bytes, act, f"cuda_graph.sample.layers.{layer}.hidden_states", mb, chunk)
        p.one(sign, h.mask_bytes, act, f"cuda_graph.sample.layers.{layer}.attention_mask", mb, chunk)

    forwards = [(sp.stage, sp.microbatch) for sp in order if sp.kind == "F"]
    if not h.megatron_samples:  # one per (chunk, micro-batch, layer), chunk-major (get_cuda_graph_input_data)
        for chunk, mb in sorted(forwards):
            for layer in rules.layers[chunk]:
                sample(1, layer, mb, chunk)
    if not (h.megatron_samples or h.reuse_buffers):
        return
    queue: dict[int, list[tuple[int, int]]] = {}  # chunk → (mb, layer) whose backward is still to come
    free: list[tuple[int, int, int]] = []  # (chunk, mb, layer) samples a finished backward lends
    for sp in order:
        layers = rules.layers[sp.stage]
        if sp.kind == "F":
            for layer in layers:
                queue.setdefault(sp.stage, []).append((sp.microbatch, layer))
                if free:
                    free.pop(0)
                    if not h.megatron_samples:  # TE drops the one Megatron made for this graph
                        sample(-1, layer, sp.microbatch, sp.stage)
                elif h.megatron_samples:
                    sample(1, layer, sp.microbatch, sp.stage)
        else:
            q = queue.get(sp.stage, [])
            free += [(sp.stage, mb, layer) for mb, layer in q[:len(layers)]]
            queue[sp.stage] = q[len(layers):]


def _free_made(p: _Push, capture: Compiled, chunk: int, mb: int, storages: frozenset[str] | set[str]) -> None:
    """Free the allocations of ``storages`` the capture of (``chunk``, ``mb``) made."""
    if not storages:
        return
    for kind in ("F", "B"):
        ph = capture.get((chunk, kind))
        if ph is None:
            continue
        for k in np.flatnonzero(ph.ev_sign > 0).tolist():
            name = ph.tensor_names[ph.ev_tensor[k]]
            if name in storages:
                p.push([p.t0], -1, int(ph.ev_size[k]), int(ph.ev_cat[k]), p.names(f"cuda_graph:{name}"), -1, mb,
                       chunk, -1, p.it, GRAPH_POOL)
