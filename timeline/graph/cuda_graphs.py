"""A chunk's op templates under Megatron-LM's per-layer CUDA graphs (TE ``make_graphed_callables``).

Megatron's ``TECudaGraphHelper`` (``megatron/core/transformer/cuda_graphs.py@268fda0859``; before it
``megatron/training/training.py@2b6b46b796``, ``--external-cuda-graph``) captures every decoder layer of a
chunk once per micro-batch — a forward and a backward graph each — into **one private memory pool**
(TE ``transformer_engine/pytorch/graph.py: _make_graphed_callables``@release_v2.6…v2.9:
``mempool = graph_pool_handle()`` shared by every ``torch.cuda.graph(..., pool=mempool)``), in the
pipeline schedule's order (``_order``); from c173615753 each MTP block's ``mtp_model_layer`` after its chunk's
decoder layers (``callables_is_mtp``). The graphed part (:func:`in_graph`) is the whole layer under scope
``full``; per module (Megatron-Core 0.16 on) the input norm, self-attention and its residual add under
``attn``, a dense layer's MLP part under ``mlp``, an MoE layer's pre-MLP norm, router and shared experts under
``moe_router`` and the dispatcher's preprocess with ``moe_preprocess`` — the dispatch, experts and combine then
run eagerly from the graph's outputs (``TransformerLayer._te_cuda_graph_capture`` / ``_te_cuda_graph_replay`` /
``_get_submodules_under_cudagraphs``, ``MoELayer.forward``'s partial-capture early return, 4e85d74ae9).

What that does to PyTorch's *allocated* bytes (``c10/cuda/CUDACachingAllocator.cpp``: a private pool's
blocks stay reserved for the graphs' life and are never handed to the general pool; a block counts as
allocated only while a live tensor holds it):

- during the capture every captured op allocates as it would eagerly, in the pool; saved activations live
  from a graph's forward capture to its backward capture; at the capture's end they are all freed into
  the pool — reserved, no longer allocated;
- in training a replay allocates nothing: the graphed ops' tensors are the pool's memory, so they leave the
  eager event stream, and so do the frees of the eager tensors the graph copied in (the layer input is
  copied into the graph's static input and dropped after the forward, not kept for the backward).

:func:`split` derives both templates from the eager one; the bytes the graphs hold
(``timeline.profiles.megatron_cuda_graphs``) are decided elsewhere, but for each graph's static grad outputs
(:func:`_grad_outputs`). Not modelled: recompute inside a graph, a whole MoE layer in a graph (drop-and-pad
routing), the shared experts on their own stream (``--moe-shared-expert-overlap``), the local
(``CudaGraphManager``) implementation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from timeline.graph.ops import ChunkTemplate, Op
from timeline.spec.cuda_graph_rules import scope_modules

#: a decoder layer's ops, and the MTP layer's (``callables_is_mtp``: the MTP block's ``mtp_model_layer``)
_LAYER = re.compile(r"(?:layers\.\d+|mtp\.\d+\.layer)\.(.+)")
#: an MoE layer's ops inside its ``moe_router`` graph (``TransformerLayer._get_submodules_under_cudagraphs``:
#: ``pre_mlp_layernorm``, ``mlp.router`` and, not overlapped, ``mlp.shared_experts`` with its gate)
_ROUTER = ("pre_mlp_layernorm", "post_attention_layernorm", "mlp.router", "mlp.shared_experts",
           "mlp.shared_expert_gate")
#: the pre-MLP norm, as the layer builders name it (dense and MoE layers)
_MLP_NORMS = ("pre_mlp_layernorm", "post_attention_layernorm")
#: and inside it with ``moe_preprocess`` (``MoELayer.preprocess``: the latent projection, then the dispatcher's
#: ``dispatch_preprocess``): the alltoall dispatcher's first permutation, the flex dispatcher's metadata
_PREPROCESS = {"alltoall": ("mlp.fc1_latent_proj", "mlp.dispatch.permute"),
               "allgather": ("mlp.fc1_latent_proj",),
               "flex": ("mlp.fc1_latent_proj", "mlp.dispatch.expand", "mlp.dispatch.topk")}


def _part(op: Op) -> str | None:
    """The op's name within its decoder (or MTP) layer, None outside any."""
    if op.layer is None:
        return None
    hit = _LAYER.fullmatch(op.name)
    return hit.group(1) if hit else None


def moe_layers(t: ChunkTemplate) -> frozenset[int]:
    """The layers of ``t`` with an MoE block (a router op)."""
    return frozenset(op.layer for op in t.forward if op.layer is not None and (_part(op) or "").startswith("mlp.router"))


def in_graph(op: Op, scope: str, *, moe: bool = False, dispatcher: str = "alltoall") -> bool:
    """Whether ``op`` runs inside its layer's graph under ``scope`` (``[framework] cuda_graph_scope``); ``moe``:
    its layer is an MoE layer. Megatron ``transformer_layer.py: _te_cuda_graph_capture`` (read at fee7a6e3e5 and
    4e85d74ae9): the attention part under attn; under mlp a dense layer's pre-MLP norm, MLP and residual add
    (``_forward_mlp``); under moe_router an MoE layer's router prefix, the rest of the block eager after replay."""
    rest = _part(op)
    if rest is None:
        return False
    mods = scope_modules(scope)
    if not mods:
        return True
    if "attn" in mods and (rest in ("input_layernorm", "attn_residual") or rest.startswith("self_attn")):
        return True
    if not moe:
        return "mlp" in mods and (rest in (*_MLP_NORMS, "mlp_residual") or rest.startswith("mlp."))
    if "moe_router" not in mods:
        return False
    inside = _ROUTER + (_PREPROCESS.get(dispatcher, ()) if "moe_preprocess" in mods else ())
    return any(rest == p or rest.startswith(p + ".") for p in inside)


@dataclass(frozen=True, slots=True, kw_only=True)
class GraphedTemplates:
    train: ChunkTemplate  # replayed: the graphed ops allocate nothing
    capture: ChunkTemplate  # captured: the graphed ops alone, allocating in the pool
    layers: tuple[int, ...]  # decoder layers graphed in this chunk
    #: per graphed layer, its graph's static outputs: storages a graphed forward op makes and an eager op frees
    outputs: dict[int, frozenset[str]]
    #: per graphed layer, its graph's static grad inputs: storages a graphed backward op makes and an eager op
    #: frees (the gradient of the graph's input)
    grad_inputs: dict[int, frozenset[str]]
    #: per graphed layer, the bytes of each of its static grad outputs (:func:`_grad_outputs`)
    grad_outputs: dict[int, tuple[int, ...]]


def split(t: ChunkTemplate, scope: str, dispatcher: str = "alltoall") -> GraphedTemplates:
    """The replayed and the captured templates of chunk template ``t`` under ``scope`` (the MoE layers' token
    dispatcher: ``dispatcher``)."""
    phases = (t.forward, t.backward_i, t.backward_w, t.backward)
    moes = moe_layers(t)

    def graphed(op: Op, scope: str) -> bool:  # in_graph with this chunk's MoE layers
        return in_graph(op, scope, moe=op.layer in moes, dispatcher=dispatcher)
    pool = {a.storage for ops in phases for op in ops if graphed(op, scope) for a in op.allocs}
    # eager storages a graphed backward op frees: the graph copied them in; dropped after its forward — but
    # for the chunk's received input, which the schedule holds to its backward (schedules.py:
    # forward_backward_pipelining_with_interleaving, input_tensors[chunk] popped by backward_step_helper)
    made_fwd = {a.storage for op in t.forward if op.name != "recv_forward" for a in op.allocs}
    copied = {f for ops in phases[1:] for op in ops if graphed(op, scope) for f in op.frees
              if f not in pool and f in made_fwd}
    freed_by_eager = {f for ops in phases for op in ops if not graphed(op, scope) for f in op.frees}
    # where each layer's graph returns: the end of its first run of graphed forward ops (a replay runs the whole
    # graph at once; the shared experts an MoE layer's graph holds come after its eager experts in these templates)
    last_fwd: dict[int | None, int] = {}
    done: set[int | None] = set()
    for i, op in enumerate(t.forward):
        if graphed(op, scope) and op.layer not in done:
            last_fwd[op.layer] = i
        elif op.layer in last_fwd:
            done.add(op.layer)
    per_layer_copied: dict[int | None, list[str]] = {}
    for op in (o for ops in phases[1:] for o in ops):
        if graphed(op, scope):
            per_layer_copied.setdefault(op.layer, []).extend(f for f in op.frees if f in copied)

    def made_by(ops: tuple[Op, ...]) -> dict[int, frozenset[str]]:
        out: dict[int, set[str]] = {}
        for op in ops:
            if graphed(op, scope) and op.layer is not None:
                out.setdefault(op.layer, set()).update(a.storage for a in op.allocs if a.storage in freed_by_eager)
        return {layer: frozenset(v) for layer, v in out.items()}

    def train_op(op: Op, i: int | None) -> Op:
        if not graphed(op, scope):
            return replace(op, frees=tuple(f for f in op.frees if f not in pool))
        extra = tuple(dict.fromkeys(per_layer_copied.get(op.layer, []))) if i is not None and \
            last_fwd.get(op.layer) == i else ()
        keep = tuple(f for f in op.frees if f not in pool and f not in copied)
        return replace(op, allocs=(), frees=keep + extra)

    def capture_op(op: Op) -> Op:
        return replace(op, frees=tuple(f for f in op.frees if f in pool))

    train = replace(t, forward=tuple(train_op(op, i) for i, op in enumerate(t.forward)),
                    backward_i=tuple(train_op(op, None) for op in t.backward_i),
                    backward_w=tuple(train_op(op, None) for op in t.backward_w),
                    backward=tuple(train_op(op, None) for op in t.backward))
    capture = replace(t, forward=tuple(capture_op(op) for op in t.forward if graphed(op, scope)),
                      backward_i=tuple(capture_op(op) for op in t.backward_i if graphed(op, scope)),
                      backward_w=tuple(capture_op(op) for op in t.backward_w if graphed(op, scope)),
                      backward=tuple(capture_op(op) for op in t.backward if graphed(op, scope)))
    layers = tuple(sorted({op.layer for op in t.forward if graphed(op, scope) and op.layer is not None}))
    return GraphedTemplates(train=train, capture=capture, layers=layers, outputs=made_by(t.forward),
                            grad_inputs=made_by(t.backward),
                            grad_outputs=_grad_outputs(t, graphed, scope, layers, moes, per_layer_copied))


def _grad_outputs(t: ChunkTemplate, graphed: Callable[[Op, str], bool], scope: str, layers: tuple[int, ...],
                  moes: frozenset[int], copied: dict[int | None, list[str]]) -> dict[int, tuple[int, ...]]:
    """Per graphed layer, the bytes of each static grad output its backward capture makes (TE ``graph.py:
    _make_graphed_callables``: ``torch.empty_like(o)`` of every static output that requires grad): the
    gradients a graphed backward op of the layer frees that none of its graphed ops made — from the eager ops
    after the graph, the next layer's graph or the next stage. A router graph without the attention also
    returns its input as the residual (``TransformerLayer._forward_mlp``: ``return list(mlp_output_with_bias) +
    [residual]``), whose gradient has the input's bytes."""
    backward = t.backward or t.backward_i + t.backward_w
    made: dict[int | None, set[str]] = {}
    for op in backward:
        if graphed(op, scope):
            made.setdefault(op.layer, set()).update(a.storage for a in op.allocs)
    made_any = {a.storage: a.size_bytes for op in (*t.forward, *backward) for a in op.allocs}
    out: dict[int, list[int]] = {layer: [] for layer in layers}
    for op in backward:
        if op.layer in out and graphed(op, scope):
            out[op.layer] += [made_any[f] for f in op.frees if f.startswith("grad:") and f in made_any
                              and f not in made.get(op.layer, ())]
    if "attn" not in scope_modules(scope) and "moe_router" in scope_modules(scope):
        for layer in layers:
            if layer in moes:
                out[layer] += [made_any[f] for f in dict.fromkeys(copied.get(layer, [])) if f in made_any][:1]
    return {layer: tuple(v) for layer, v in out.items()}
