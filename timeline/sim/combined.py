"""Megatron's combined 1F1B pair (``--overlap-moe-expert-parallel-comm``): how one micro-batch's
forward and another's backward interleave inside the pair, and what the backward's layer nodes
keep until the pair ends.

Megatron splits each transformer layer into schedule-plan nodes (``models/common/
model_chunk_schedule_plan.py: TransformerLayerSchedulePlan``, ``models/gpt/fine_grained_callables.py:
build_transformer_layer_callables``, core_v0.14.0 … d98e8a64dd): ``attn`` (input norm, attention,
residual), ``post_attn`` (pre-MLP norm, router, dispatch preprocess), ``moe_dispatch`` (the EP
all-to-all, on the communication stream), ``mlp`` (dispatch postprocess, experts, combine
preprocess) and ``moe_combine`` (the all-to-all back, unpermute, bias-dropout-add); a dense layer
has ``attn`` and ``mlp`` only. ``TransformerModelChunkSchedulePlan.run`` orders a pair as: the
forward's pre-process (embedding), the backward's post-process (loss, output layer, final norm),
then forward layer ``i`` with backward layer ``L − 1 − i`` in ``TransformerLayerSchedulePlan.run``'s
order — combine.bwd, attn.fwd, post_attn.fwd, mlp.bwd, dispatch.fwd, dispatch.bwd, mlp.fwd,
combine.fwd, post_attn.bwd, attn.bwd (with ``--ep-overlap-early-attn-memory-release``, from
a56a0b001d, post_attn.bwd and attn.bwd move before mlp.fwd) — then the layers one side has left,
the forward's post-process and the backward's pre-process.

:func:`pair_shifts` lays the two halves' nodes end to end in that order and scales the whole to
the pair's duration: each half gets one time scale and a shift per op, so its events keep their
own order and interleave with the other half's node by node. :func:`kept_node_io` names the frees
that Megatron before a56a0b001d (2026-01-06, first released in core_v0.16.0) moved to the pair's
end. This module times and masks; it does not run a schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from timeline.graph.plan_nodes import dw_group, node_keys
from timeline.sim.compiled import CompiledPhase

_BACKWARD_SUFFIXES = (".wgrad",)


@dataclass(frozen=True, slots=True)
class NodeMap:
    """Per op of a phase, the (decoder layer, node) it belongs to; layer −1 with node ``pre`` or
    ``post`` outside the decoder layers."""

    keys: tuple[tuple[int, str], ...]


def forward_nodes(ph: CompiledPhase) -> NodeMap:
    """Each forward op's schedule-plan node (:func:`timeline.graph.plan_nodes.node_keys`)."""
    return NodeMap(keys=tuple(node_keys(ph.op_names, ph.op_streams, ph.op_layers)))


def backward_nodes(ph: CompiledPhase, forward: CompiledPhase, fmap: NodeMap, *, delay_wgrad: bool = False) -> NodeMap:
    """Each backward op's node: the node of the forward op it differentiates (by name, less a
    ``.wgrad`` suffix); an op no forward op names takes its predecessor's. Under ``delay_wgrad``
    (``--delay-wgrad-compute``) a deferred weight gradient belongs to its ``mlp_dw`` / ``attn_dw`` node
    (:func:`timeline.graph.plan_nodes.dw_group`)."""
    by_name = dict(zip(forward.op_names, fmap.keys, strict=True))
    keys: list[tuple[int, str]] = []
    for name, layer in zip(ph.op_names, ph.op_layers, strict=True):
        base = name
        for suffix in _BACKWARD_SUFFIXES:
            base = base.removesuffix(suffix)
        key = by_name.get(base)
        if key is None:
            key = keys[-1] if keys else (layer, "post" if layer < 0 else "attn")
        elif delay_wgrad and base != name:
            group = dw_group(base, key[0], key[1])
            key = (key[0], group) if group else key
        keys.append(key)
    return NodeMap(keys=tuple(keys))


def _blocks(nodes: NodeMap) -> list[tuple[tuple[int, str], int, int]]:
    """Runs of consecutive ops with one node: (node, first op, end op)."""
    out: list[tuple[tuple[int, str], int, int]] = []
    for i, key in enumerate(nodes.keys):
        if out and out[-1][0] == key:
            out[-1] = (key, out[-1][1], i + 1)
        else:
            out.append((key, i, i + 1))
    return out


#: ``TransformerLayerSchedulePlan.run``: (half, node) in order; ``early`` moves the backward's
#: post_attn and attn before the forward's mlp (``--ep-overlap-early-attn-memory-release``)
_LAYER_ORDER = (("B", "combine"), ("F", "attn"), ("F", "post_attn"), ("B", "mlp"), ("F", "dispatch"),
                ("B", "dispatch"), ("F", "mlp"), ("F", "combine"), ("B", "post_attn"), ("B", "attn"))


def pair_order(f: NodeMap, b: NodeMap, *, early_attn_release: bool = False,
               delay_wgrad: bool = False) -> list[tuple[str, tuple[int, str]]]:
    """The pair's nodes in Megatron's order, as (half, node) (module docstring). Under ``delay_wgrad`` the
    backward's ``mlp_dw`` follows the forward's dispatch, its ``attn_dw`` the backward's attention, and the last
    backward layer's ``attn_dw`` comes after every layer (``TransformerModelChunkSchedulePlan.run``)."""
    order = list(_LAYER_ORDER)
    if early_attn_release:
        order.remove(("B", "post_attn"))
        order.remove(("B", "attn"))
        order[order.index(("F", "mlp")):order.index(("F", "mlp"))] = [("B", "post_attn"), ("B", "attn")]
    if delay_wgrad:
        order.insert(order.index(("F", "dispatch")) + 1, ("B", "mlp_dw"))
        order.append(("B", "attn_dw"))
    f_layers = list(dict.fromkeys(layer for layer, _ in f.keys if layer >= 0))
    b_layers = list(dict.fromkeys(layer for layer, _ in b.keys if layer >= 0))
    last_b = b_layers[-1] if b_layers else None
    out: list[tuple[str, tuple[int, str]]] = [("F", (-1, "pre")), ("B", (-1, "post"))]
    n = min(len(f_layers), len(b_layers))
    for fl, bl in zip(f_layers[:n], b_layers[:n], strict=True):
        out += [(half, (fl if half == "F" else bl, node)) for half, node in order
                if not (delay_wgrad and half == "B" and node == "attn_dw" and bl == last_b)]
    nodes = ("combine", "mlp", "mlp_dw", "dispatch", "post_attn", "attn", "attn_dw") if delay_wgrad else \
        ("combine", "mlp", "dispatch", "post_attn", "attn")
    out += [("B", (bl, node)) for bl in b_layers[n:] for node in nodes
            if not (node == "attn_dw" and bl == last_b)]
    f_nodes = tuple(node for node in reversed(nodes) if not node.endswith("_dw"))
    out += [("F", (fl, node)) for fl in f_layers[n:] for node in f_nodes]
    if delay_wgrad and last_b is not None:
        out.append(("B", (last_b, "attn_dw")))
    out += [("F", (-1, "post")), ("B", (-1, "pre"))]
    return out


def pair_shifts(f: CompiledPhase, fmap: NodeMap, b: CompiledPhase, bmap: NodeMap, total_us: float, *,
                early_attn_release: bool = False, delay_wgrad: bool = False
                ) -> tuple[float, np.ndarray, np.ndarray] | None:
    """(scale, per-op shift of the forward half, per-op shift of the backward half): an op at offset
    ``t`` of its own phase runs at ``t·scale + shift[op]`` in the pair, which lasts ``total_us``. None
    where a half's nodes do not follow Megatron's order (the caller then stretches both halves
    proportionally, as DualPipe's pairs)."""
    halves = {"F": (f, _blocks(fmap)), "B": (b, _blocks(bmap))}
    placed: dict[str, list[tuple[int, int, float]]] = {"F": [], "B": []}  # (first op, end op, start)
    cursor: dict[str, int] = {"F": 0, "B": 0}  # next block of each half
    t = 0.0
    for half, key in pair_order(fmap, bmap, early_attn_release=early_attn_release, delay_wgrad=delay_wgrad):
        ph, blocks = halves[half]
        while cursor[half] < len(blocks) and blocks[cursor[half]][0] == key:
            _, first, end = blocks[cursor[half]]
            placed[half].append((first, end, t))
            t += float(ph.op_end[end - 1] - ph.op_start[first])
            cursor[half] += 1
    if cursor["F"] != len(halves["F"][1]) or cursor["B"] != len(halves["B"][1]) or t <= 0:
        return None
    scale = total_us / t
    shifts = []
    for half in ("F", "B"):
        ph = halves[half][0]
        shift = np.zeros(len(ph.op_names))
        for first, end, start in placed[half]:
            shift[first:end] = (start - ph.op_start[first]) * scale
        shifts.append(shift)
    return scale, shifts[0], shifts[1]


def kept_node_io(f: CompiledPhase, fmap: NodeMap, b: CompiledPhase) -> np.ndarray:
    """Mask over the backward phase ``b``'s events: the frees that Megatron-Core before a56a0b001d
    defers to the end of the combined step. There ``TransformerLayerNode._release_state`` overrides
    ``ScheduleNode._release_state`` (``fine_grained_callables.py`` / ``pipeline_parallel/utils.py``
    at 23a1dcaf74), so a layer node's backward drops its detached tensors but keeps ``self.inputs``
    — with the gradients autograd accumulated into them — and ``self.output`` until the chunk's
    schedule plan dies when ``combined_forward_backward_step`` returns. Kept per layer: the layer's
    input, its attention output and its output (``attn`` and ``moe_combine``/``mlp`` outputs; the
    other nodes' inputs were freed in the forward by ``free_input``'s ``resize_(0)``), and the
    gradient of every node input: the layer input, the attention output, the dispatch inputs (the
    permuted tokens and probabilities, both returned by ``post_attn``), the dispatched tokens
    (``moe_dispatch`` returns them alone) and the combine input (``mlp`` returns the expert output
    alone)."""
    kept: set[str] = set()
    blocks = _blocks(fmap)
    allocs = _allocs_by_op(f)
    for k, (key, first, _end) in enumerate(blocks):
        layer, node = key
        if layer < 0:
            continue
        last = blocks[k][2] - 1
        outs = allocs.get(last, [])
        if node == "attn" and first > 0:
            before = allocs.get(first - 1, [])
            if before:
                kept.update((before[0], "grad:" + before[0]))  # the layer's input: attn's input
        if node == "attn" and outs:
            kept.update((outs[0], "grad:" + outs[0]))  # attn's output: post_attn's (or mlp's) input
        elif node == "post_attn":
            kept.update("grad:" + name for name in outs)  # the dispatch node's inputs
        elif node in ("dispatch", "mlp") and outs and _next_node(blocks, k) in ("mlp", "combine"):
            kept.add("grad:" + outs[0])  # the next node's input
        if node in ("combine", "mlp") and _next_node(blocks, k) != "combine" and outs:
            kept.add(outs[0])  # the layer's output
    names = np.array([name in kept for name in b.tensor_names], dtype=bool)
    return (b.ev_sign < 0) & names[b.ev_tensor]


def router_inputs(f: CompiledPhase, fmap: NodeMap) -> dict[int, tuple[str, int]]:
    """Per MoE decoder layer of the forward phase ``f``: (the ``post_attn`` node's input — the tensor the
    layer's ``attn`` node makes last, its output —, the forward op at which the alltoall dispatcher takes the
    router's new probabilities: the node's first ``mlp.dispatch.*`` op; a layer without one, a dense layer, has no
    router and is left out).

    ``MoEAlltoAllTokenDispatcher.dispatch_preprocess`` stores ``self.probs = probs`` (token_dispatcher.py at
    1f6a0a305d … e79110c67b), the router's output with its autograd graph. Under combined 1F1B the ``post_attn``
    node runs the pre-MLP norm and the router on a detached copy of its input that requires grad
    (``ScheduleNode._forward``: ``make_viewless(e).detach()``), a leaf: the graph's ``AccumulateGrad`` holds that
    leaf, and the leaf its ``.grad`` once the node's backward ran. Nothing else in the graph survives its
    backward (saved tensors are freed), so what ``self.probs`` keeps is the node's input and its gradient, until
    the layer's next forward stores new probabilities. From 1501c0f33a (2026-01-16) the router runs in the
    ``attn`` node and the leaf is the layer's input instead: the same [s·b/(tp·cp), h] activation."""
    out: dict[int, tuple[str, int]] = {}
    blocks = _blocks(fmap)
    allocs = _allocs_by_op(f)
    for k, (key, first, end) in enumerate(blocks):
        layer, node = key
        if layer < 0 or node != "post_attn" or k == 0 or blocks[k - 1][0] != (layer, "attn"):
            continue
        outs = allocs.get(blocks[k - 1][2] - 1, [])
        if not outs:
            continue
        at = next((o for o in range(first, end) if f.op_names[o].startswith(f"layers.{layer}.mlp.dispatch.")), -1)
        if at >= 0:  # a dense layer has no router, so no probabilities to keep
            out[layer] = (outs[0], at)
    return out


def _next_node(blocks: list[tuple[tuple[int, str], int, int]], k: int) -> str:
    return blocks[k + 1][0][1] if k + 1 < len(blocks) and blocks[k + 1][0][0] == blocks[k][0][0] else ""


def _allocs_by_op(ph: CompiledPhase) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for op, sign, tensor in zip(ph.ev_op.tolist(), ph.ev_sign.tolist(), ph.ev_tensor.tolist(), strict=True):
        if sign > 0:
            out.setdefault(op, []).append(ph.tensor_names[tensor])
    return out
