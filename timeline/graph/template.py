"""``chunk_template(run, chunk)``: the forward and backward op templates of one virtual stage.

Builds the chunk's forward ops with the layer-family builders (``timeline.graph.ops_layers``),
which read every local width off the chunk's parameter graph (``timeline.graph.build``), orders
them topologically on their dataflow graph (networkx), applies the profile's saved-tensor table
and the recompute policy (``timeline.graph.analysis``), and derives the backward
(``timeline.graph.backward``). Forward tensors are ``activations`` when kept for backward,
``comm`` for collective buffers, else ``temporary`` (freed by their last forward consumer).
The template covers one micro-batch; the simulator shifts and renames it. It does not know
which rank runs the chunk, except for ``pp_rank`` (full recompute's per-rank ``num_layers``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import networkx as nx

from timeline.graph.analysis import Analysis, analyse, op_graph
from timeline.graph.backward import backward_units, to_op
from timeline.graph.build import chunk_layers, chunk_nodes
from timeline.graph.context import BuildCtx
from timeline.graph.ir import Builder, FOp
from timeline.graph.ops import ChunkTemplate, Op, SavedTensor
from timeline.graph.ops_layers.attention import rope_cache
from timeline.graph.ops_layers.embedding import embedding
from timeline.graph.ops_layers.head import head
from timeline.graph.ops_layers.layer import decoder_layer
from timeline.graph.ops_layers.mtp import mtp
from timeline.graph.ops_layers.sinks import attention_masks
from timeline.graph.recompute import recompute_regions
from timeline.graph.tensors import Category
from timeline.spec.run import RecomputeSpec, RunSpec


def forward_ops(run: RunSpec, chunk: int, ctx: BuildCtx | None = None) -> list[FOp]:
    """The forward ops of virtual stage ``chunk`` for one micro-batch, in dataflow order; ``ctx``
    defaults to the run's."""
    ctx = ctx or BuildCtx.from_run(run)
    ranges = chunk_layers(run)
    nodes = chunk_nodes(ctx, ranges, chunk)
    b = Builder(run, ctx, (t for n in nodes for t in n.params))
    m, d = run.model, b.dims
    if chunk == 0:
        x = embedding(b, "embedding", None)
    else:
        x = b.tensor("input", (d.t_sp, m.hidden_size))
        b.op("recv_forward", "comm", None, {}, {"y": x}, kind="p2p", stream="pp")
    if b.table.rope_cache and m.position_embedding == "rope":
        rope_cache(b)
    if m.attention_sinks and b.table.sink_attention == "eager":
        attention_masks(b)
    for i in ranges[chunk]:
        x = decoder_layer(b, i, f"layers.{i}", x, moe=m.is_moe_layer(i))
    if chunk == len(ranges) - 1:
        head(b, "output", "final_norm", x, None)
        for node in nodes:  # the MTP modules the parameter graph holds
            if node.kind == "mtp" and node.layer is not None:
                mtp(b, node.layer - m.num_hidden_layers, x)
    else:
        b.op("send_forward", "comm", None, {"x": x}, {}, kind="p2p", stream="pp")
    g = op_graph(b.ops)
    order = list(nx.lexicographical_topological_sort(g, key=lambda n: n))
    return [b.ops[i] for i in order]


def _forward(a: Analysis) -> list[Op]:
    kept = set(a.kept)
    last_use: dict[str, int] = {}
    for s, cs in a.consumers.items():
        if cs:
            last_use[s] = max(cs)
    frees: dict[int, list[str]] = {}
    out: list[Op] = []
    for i, op in enumerate(a.ops):
        allocs = []
        for t in (*op.outputs.values(), *op.extras.values()):
            if t in op.extras.values() and t.storage not in a.savers:
                continue  # a side tensor this profile does not keep is never made
            cat = Category.ACTIVATIONS if t.storage in kept else (
                Category.COMM if t.category == Category.COMM else Category.TEMPORARY)
            allocs.append(replace(t, category=cat))
            if t.storage not in kept:
                frees.setdefault(last_use.get(t.storage, i), []).append(t.storage)
        moved = sum(t.size_bytes for t in allocs) + sum(t.size_bytes for t in op.dataflow_inputs())
        out.append(Op(name=op.name, module=op.module, layer=op.layer, kind=op.kind, stream=op.stream,
                      flops=op.flops, bytes_moved=float(moved), allocs=tuple(allocs)))
    return [replace(o, frees=tuple(frees.get(i, ()))) for i, o in enumerate(out)]


def _saved(a: Analysis) -> tuple[SavedTensor, ...]:
    out = []
    for s in a.kept:
        sv = a.savers[s][0]
        op = a.ops[sv.op]
        name = op.name if sv.region is None else f"checkpoint:{a.regions[sv.region].name}"
        layer = op.layer if op.layer is not None else -1
        out.append(SavedTensor(tensor=replace(a.tensors[s], category=Category.ACTIVATIONS), op=name,
                               layer=layer, source=sv.source))
    return tuple(out)


@lru_cache(maxsize=512)
def _forward_ops_cached(run: RunSpec, chunk: int) -> tuple[FOp, ...]:
    """Forward ops do not depend on the recompute policy: ``run`` comes with it reset, so every
    policy of a search (``timeline fit``, ``compare``) shares one build per chunk."""
    return tuple(forward_ops(run, chunk))


@lru_cache(maxsize=256)
def chunk_template(run: RunSpec, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
    """Op templates of virtual stage ``chunk`` for one micro-batch.

    ``pp_rank`` (default ``chunk % pp``) picks the entry of a per-rank ``recompute.num_layers``.
    The run's profile (:mod:`timeline.profiles`) is looked up once, here.
    A captured model (``model_source`` "trace:…") lowers its trace instead; the trace decides
    what is saved, whatever the profile.
    """
    if run.model_source.startswith("trace:"):
        from timeline.graph.trace_lowering import trace_chunk_template

        return trace_chunk_template(run, chunk, chunk_layers(run), pp_rank=pp_rank)
    ctx = BuildCtx.from_run(run)
    structure = ctx.structure
    ops = list(_forward_ops_cached(replace(run, recompute=RecomputeSpec()), chunk))
    rank = chunk % run.parallel.pp if pp_rank is None else pp_rank
    regions = recompute_regions(run.recompute, ops, list(chunk_layers(run)[chunk]), rank,
                                moe_split=structure.full_recompute_moe_split)
    a = analyse(ops, ctx.saved, regions)
    side_i, side_w = backward_units(a, "split", structure.wgrad_transient)
    fused, _ = backward_units(a, "fused", structure.wgrad_transient)
    saved = _saved(a)
    per_layer: dict[int, int] = {}
    for st in saved:
        per_layer[st.layer] = per_layer.get(st.layer, 0) + st.tensor.size_bytes
    return ChunkTemplate(chunk=chunk, forward=tuple(_forward(a)), backward_i=tuple(to_op(u) for u in side_i),
                         backward_w=tuple(to_op(u) for u in side_w), layer_activation_bytes=per_layer,
                         backward=tuple(to_op(u) for u in fused), saved=saved)
