"""A chunk's op templates under Megatron-LM's per-layer CUDA graphs (TE ``make_graphed_callables``).

Megatron's ``TECudaGraphHelper`` (``megatron/core/transformer/cuda_graphs.py@268fda0859``; before it
``megatron/training/training.py@2b6b46b796``, ``--external-cuda-graph``) captures every decoder layer of a
chunk once per micro-batch — a forward and a backward graph each — into **one private memory pool**
(TE ``transformer_engine/pytorch/graph.py: _make_graphed_callables``@release_v2.6…v2.9:
``mempool = graph_pool_handle()`` shared by every ``torch.cuda.graph(..., pool=mempool)``), in the
pipeline schedule's order (``_order``). The graphed part is the whole layer under scope ``full``, the
input norm, self-attention and its residual add under ``attn``
(``TransformerLayer._te_cuda_graph_capture`` / ``_get_submodules_under_cudagraphs``).

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
(``timeline.profiles.megatron_cuda_graphs``) are decided elsewhere. Not modelled: MTP layers' graphs
(``callables_is_mtp``), recompute inside a graph, the local (``CudaGraphManager``) implementation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from timeline.graph.ops import ChunkTemplate, Op


def graphed(op: Op, scope: str) -> bool:
    """Whether ``op`` runs inside its decoder layer's graph under ``scope`` (attn | full)."""
    if op.layer is None:
        return False
    prefix = f"layers.{op.layer}."
    if not op.name.startswith(prefix):
        return False  # MTP layers and anything outside the decoder
    if scope == "full":
        return True
    rest = op.name[len(prefix):]
    return rest in ("input_layernorm", "attn_residual") or rest.startswith("self_attn")


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


def split(t: ChunkTemplate, scope: str) -> GraphedTemplates:
    """The replayed and the captured templates of chunk template ``t`` under ``scope``."""
    phases = (t.forward, t.backward_i, t.backward_w, t.backward)
    pool = {a.storage for ops in phases for op in ops if graphed(op, scope) for a in op.allocs}
    # eager storages a graphed backward op frees: the graph copied them in; dropped after its forward — but
    # for the chunk's received input, which the schedule holds to its backward (schedules.py:
    # forward_backward_pipelining_with_interleaving, input_tensors[chunk] popped by backward_step_helper)
    made_fwd = {a.storage for op in t.forward if op.name != "recv_forward" for a in op.allocs}
    copied = {f for ops in phases[1:] for op in ops if graphed(op, scope) for f in op.frees
              if f not in pool and f in made_fwd}
    freed_by_eager = {f for ops in phases for op in ops if not graphed(op, scope) for f in op.frees}
    last_fwd = {op.layer: i for i, op in enumerate(t.forward) if graphed(op, scope)}
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
                            grad_inputs=made_by(t.backward))
