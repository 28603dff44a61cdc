"""Parameters of a traced model, placed per virtual stage: the static memory of a captured trace.

The capture lists every parameter and buffer with the decoder layer it belongs to. Run layer
``k`` holds the parameters of captured layer ``min(k, L − 1)`` (renamed ``layers.k``); parameters
outside the layers go to the chunk whose ops first use them — the embedding to the first chunk,
final norm and head to the last; one used by both (tied embeddings) is held by both when they
differ, as pipeline frameworks keep a copy on each end. Module tags for the static report are
read from parameter names. Under TP/EP each parameter keeps the share one device holds
(:func:`~timeline.spec.trace_shard.local_shape`: column/row/vocabulary-parallel, ``E / ep`` routed
experts); a per-expert module another EP rank holds is left out.
"""

from __future__ import annotations

import re

from timeline.graph.build import Node
from timeline.graph.tensors import DTYPE_BYTES, Category, TensorDef
from timeline.graph.trace.lowering import DTYPES, regions
from timeline.spec.trace import CapturedTrace, TraceParam
from timeline.spec.trace_shard import TraceShard, local_shape, param_role

_TAGS = (("embed", "embedding"), ("wte", "embedding"), ("wpe", "embedding"), ("lm_head", "head"),
         ("expert", "moe"), ("router", "moe"), ("mlp.gate.", "moe"), ("norm", "norm"), ("ln_", "norm"),
         ("attn", "attention"), ("attention", "attention"), ("mlp", "mlp"))


def module_tag(name: str, layer: int, post: bool) -> str:
    """The static-report module (one of ``MODULES``) of a parameter, from its name."""
    for key, tag in _TAGS:
        if key in name:
            return tag
    return "mlp" if layer >= 0 else ("head" if post else "embedding")


def _tensor(p: TraceParam, name: str, post: bool, dtype: str, shard: TraceShard | None = None) -> TensorDef:
    tag = module_tag(p.name, p.layer, post)
    routed = "experts" in p.name and "shared" not in p.name
    d = DTYPES.get(p.dtype, "uint8")
    shape = p.shape if d != "uint8" else (p.nbytes,)
    split = 1
    if shard is not None and shard.sharded and d != "uint8":
        shape = local_shape(p, shard) or shape
        split = shard.tp if param_role(p, shard.experts) in ("column", "row", "vocab") else 1
    if p.trainable:
        d = dtype  # static memory counts trainable weights in the run's dtype
    return TensorDef(name=name, shape=tuple(shape), dtype=d if d in DTYPE_BYTES else "uint8",
                     category=Category.WEIGHTS, split=split,
                     module=tag, storage=name, expert=routed, trainable=p.trainable, in_moe=tag == "moe")


def _edge_params(trace: CapturedTrace) -> tuple[set[int], set[int]]:
    """Storages of non-layer parameters the pre region uses, and those the post region uses."""
    r = regions(trace)
    pre = {s for o in r.pre_f + r.pre_b for s in o.inputs}
    post = {s for o in r.post_f + r.post_b for s in o.inputs}
    return pre, post


def trace_nodes(trace: CapturedTrace, chunk: int, ranges: list[range], dtype: str,
                shard: TraceShard | None = None) -> list[Node]:
    """Module nodes (one per parameter) of virtual stage ``chunk``; trainable weights count in ``dtype``;
    ``shard``: the TP/EP ranks (one device's share of each parameter)."""
    held = (lambda p: True) if shard is None or not shard.sharded else (lambda p: local_shape(p, shard) is not None)
    cap = len(trace.layers)
    pre, post = _edge_params(trace)
    first, last = chunk == 0, chunk == len(ranges) - 1
    nodes: list[Node] = []
    by_layer: dict[int, list[TraceParam]] = {}
    for p in trace.params:
        if p.layer >= 0:
            by_layer.setdefault(p.layer, []).append(p)
    for p in trace.params:
        if p.layer >= 0:
            continue
        in_post = p.storage in post
        in_pre = p.storage in pre or not in_post
        if (first and in_pre) or (last and in_post and not (first and in_pre)):
            nodes.append(Node(p.name, module_tag(p.name, -1, in_post and not in_pre), None,
                              (_tensor(p, p.name, in_post and not in_pre, dtype, shard),)))
    for k in ranges[chunk]:
        c = min(k, cap - 1)
        for p in filter(held, by_layer.get(c, ())):
            name = re.sub(rf"(^|\.)(layers|h|blocks|block)\.{c}\.", rf"\g<1>\g<2>.{k}.", p.name)
            nodes.append(Node(name, module_tag(p.name, c, False), k, (_tensor(p, name, False, dtype, shard),)))
    return nodes


def trace_total_params(trace: CapturedTrace, num_layers: int) -> int:
    """Trainable parameters of the traced model with ``num_layers`` decoder layers."""
    cap = len(trace.layers)
    n = 0
    for p in trace.params:
        if not p.trainable:
            continue
        numel = 1
        for d in p.shape:
            numel *= d
        if p.layer < 0:
            n += numel
        else:
            n += numel * (1 if p.layer < cap - 1 else num_layers - cap + 1)
    return n
