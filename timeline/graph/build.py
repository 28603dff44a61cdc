"""Build the operator graph of each virtual stage (model chunk) with networkx.

Nodes are module instances in dataflow order (``embedding → layers.0.input_layernorm →
layers.0.self_attn → … → output_layer``), each carrying the parameter TensorDefs one device
holds. Static memory is read off these nodes; the activation part of the graph hangs its
ops off the same nodes. The graph does not know which rank holds a chunk — placement is the
schedule's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from timeline.graph.context import BuildCtx
from timeline.graph.families import (
    attention,
    bert,
    embedding,
    gdn,
    head,
    llava,
    mamba,
    mla,
    mlp,
    mtp,
    norm,
    t5,
)
from timeline.graph.families import moe as moe_block
from timeline.graph.tensors import TensorDef
from timeline.spec.run import ParallelSpec

if TYPE_CHECKING:
    import networkx as nx


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    kind: str  # embedding | norm | mha | mla | gdn | mlp | moe | mamba | head | mtp_proj
    layer: int | None
    params: tuple[TensorDef, ...]


def chunk_layers(parallel: ParallelSpec, num_layers: int) -> list[range]:
    """Global decoder-layer indices of each virtual stage (of ``pp·vpp``) of a model with ``num_layers``
    decoder layers, from ``layout`` or an even split."""
    chunks = parallel.pp * parallel.vpp
    layout = parallel.layout or (num_layers // chunks,) * chunks
    out, start = [], 0
    for n in layout:
        out.append(range(start, start + n))
        start += n
    return out


def decoder_layer(ctx: BuildCtx, layer: int, prefix: str, *, moe: bool) -> list[Node]:
    """A decoder layer's module nodes: attention then MLP/MoE, or in a hybrid model the one block its
    pattern names (:meth:`~timeline.spec.model.ModelSpec.layer_kind`) with the norm fused before it."""
    m = ctx.model
    kind = m.layer_kind(layer)
    if kind == "M":
        return [Node(f"{prefix}.input_layernorm", "norm", layer,
                     tuple(norm.params(ctx, f"{prefix}.input_layernorm", m.hidden_size))),
                Node(f"{prefix}.mixer", "mamba", layer, tuple(mamba.params(ctx, f"{prefix}.mixer")))]
    attn = mla.params(ctx, f"{prefix}.self_attn") if m.is_mla else attention.params(ctx, f"{prefix}.self_attn")
    mixer = Node(f"{prefix}.self_attn", "mla" if m.is_mla else "mha", layer, tuple(attn))
    if m.is_linear_attention(layer):  # a gated delta-net in attention's place (Qwen3-Next / Qwen3.5)
        mixer_params = gdn.train_params if ctx.structure.gdn == "megatron" else gdn.params
        mixer = Node(f"{prefix}.linear_attn", "gdn", layer, tuple(mixer_params(ctx, f"{prefix}.linear_attn")))
    ffn = moe_block.params(ctx, f"{prefix}.mlp") if moe else \
        mlp.params(ctx, f"{prefix}.mlp", m.intermediate_size, split=ctx.tp)
    def norm_node(name: str) -> Node:
        return Node(f"{prefix}.{name}", "norm", layer, tuple(norm.params(ctx, f"{prefix}.{name}", m.hidden_size)))

    attn_nodes = [norm_node("input_layernorm"), mixer]
    if m.is_t5_decoder_layer(layer):  # T5's decoder layer: pre_cross_attn_layernorm and CrossAttention
        attn_nodes += [norm_node("pre_cross_attn_layernorm"),
                       Node(f"{prefix}.cross_attn", "mha", layer,
                            tuple(attention.params(ctx, f"{prefix}.cross_attn")))]
    ffn_nodes = [Node(f"{prefix}.mlp", "moe" if moe else "mlp", layer, tuple(ffn))]
    if not m.parallel_residual:  # Phi's MLP reads the input norm's output
        ffn_nodes.insert(0, norm_node(mlp.pre_norm(m)))
    if m.sandwich_norms:  # Gemma2DecoderLayer: a norm on each sub-block's output, before its residual add
        attn_nodes.append(norm_node("post_attention_layernorm"))
        ffn_nodes.append(norm_node("post_feedforward_layernorm"))
    return attn_nodes if kind == "*" else ffn_nodes if kind in "-E" else attn_nodes + ffn_nodes


def mtp_chunk(parallel: ParallelSpec) -> int:
    """The virtual stage holding the MTP layers: ``parallel.mtp_stage``, else the last (with the loss)."""
    return parallel.pp * parallel.vpp - 1 if parallel.mtp_stage is None else parallel.mtp_stage


def final_norm_chunk(ranges: list[range], mtp_at: int) -> int:
    """The virtual stage that runs the final norm: the last, unless the MTP layers stand apart from the
    loss; then the stage of the last decoder layer (``transformer_block.py: TransformerBlock.
    has_final_layernorm_in_this_stage`` with MTP, from Megatron-LM 5247a1f460, core_v0.16.0 … d98e8a64dd)."""
    last = len(ranges) - 1
    if mtp_at == last:
        return last
    return max((c for c, r in enumerate(ranges) if len(r)), default=0)


def chunk_nodes(ctx: BuildCtx, ranges: list[range], chunk: int, mtp_at: int | None = None) -> list[Node]:
    """Module instances of virtual stage ``chunk`` (of ``ranges``) in dataflow order; ``mtp_at``: the
    stage holding the MTP layers (:func:`mtp_chunk`; None: the last).

    A standalone MTP stage (``mtp_at`` before the last) builds the embedding for its shifted tokens
    (``GPTModel.__init__``: ``pre_process or mtp_process``) and the MTP modules, but no output layer:
    the loss stage holds that (``post_process``) and computes every MTP loss
    (``GPTModel._postprocess``, Megatron-LM 5247a1f460)."""
    last = len(ranges) - 1
    at = last if mtp_at is None else mtp_at
    m = ctx.model
    nodes: list[Node] = []
    if chunk == 0 and m.architecture == "llava":  # LLaVAModel's ViT and projector live on the first stage
        nodes.append(Node("vision_model", "vision", None, tuple(llava.vision_params(ctx))))
        for k in range(m.vision_layers):
            nodes += decoder_layer(ctx, m.vision_layer(k), f"vision_model.layers.{k}", moe=False)
        nodes.append(Node("vision_projection", "mlp", None, tuple(llava.projector_params(ctx))))
    if chunk == first_decoder_chunk(ctx, ranges):
        nodes.append(Node("embedding", "embedding", None, tuple(embedding.params(ctx))))
    for i in ranges[chunk]:
        nodes += decoder_layer(ctx, i, f"layers.{i}", moe=m.is_moe_layer(i))
        if m.architecture == "t5" and i == m.encoder_layers - 1:  # the encoder's TransformerBlock final norm
            nodes.append(Node("encoder.final_norm", "norm", None,
                              tuple(norm.params(ctx, "encoder.final_norm", m.hidden_size))))
    fn = head.final_norm_params(ctx) if chunk == final_norm_chunk(ranges, at) else []
    if fn:
        nodes.append(Node("final_norm", "norm", None, tuple(fn)))
    if chunk == last and m.architecture == "bert":  # BertModel: LM head, output layer with bias, pooler, binary head
        nodes.append(Node("output_layer", "head", None, tuple(bert.head_params(ctx, shares_embedding=last == 0))))
    elif chunk == last and m.architecture == "t5":  # T5LMHead: the shared embedding's output layer with a bias
        nodes.append(Node("output_layer", "head", None, tuple(t5.head_params(ctx, shares_embedding=last == 0))))
    elif chunk == last:
        nodes.append(Node("output_layer", "head", None, tuple(head.params(ctx, shares_embedding=last == 0))))
    if m.frozen:  # LLaVAModel.freeze: requires_grad = False — weights only, no gradient or optimizer state
        prefixes = tuple(p for k in m.frozen for p in llava.FROZEN_PREFIXES[k])
        nodes = [replace(n, params=tuple(replace(t, trainable=False) if t.name.startswith(prefixes) else t
                                         for t in n.params)) for n in nodes]
    if chunk == at:
        if m.mtp_layers and ctx.profile.mtp_modules and ctx.profile.mtp_embedding and chunk != 0:
            nodes.append(Node("mtp.embedding", "embedding", None, tuple(mtp.embedding_params(ctx))))
        for k in range(m.mtp_layers if ctx.profile.mtp_modules else 0):
            layer = m.num_hidden_layers + k
            inner = decoder_layer(ctx, layer, f"mtp.{k}.layer", moe=m.is_moe_layer(layer))
            params = mtp.params(ctx, k, [t for n in inner for t in n.params])
            if k and m.mtp_repeated_layer:  # MultiTokenPredictionBlock: one layer, run at every depth
                params = []
            nodes.append(Node(f"mtp.{k}", "mtp", layer, tuple(params)))
    return nodes


def first_decoder_chunk(ctx: BuildCtx, ranges: list[range]) -> int:
    """The virtual stage holding the embedding: the first, unless a LLaVA model's ViT has a stage of its own
    (``parallel.encoder_pp``: the first stage's layout entry is 0 and the embedding is the next stage's,
    ``pretrain_vlm.py`` ``pre_process`` at the first decoder rank)."""
    return int(ctx.model.architecture == "llava" and ctx.encoder_pp > 0 and len(ranges) > 1)


def build_chunk_graph(nodes: Sequence[Node], chunk: int) -> nx.DiGraph:
    """The operator graph of virtual stage ``chunk``: its module ``nodes`` (a model source's) joined in
    dataflow order. networkx is imported here, not with the module: a chunk's nodes already come in
    dataflow order (:func:`node_params` reads them without it), and importing networkx cost a tenth
    of a summary-only ``simulate``."""
    import networkx as nx

    g = nx.DiGraph(chunk=chunk)
    prev = None
    for node in nodes:
        g.add_node(node.name, kind=node.kind, layer=node.layer, params=node.params)
        if prev is not None:
            g.add_edge(prev, node.name)
        prev = node.name
    return g


def graph_params(g: nx.DiGraph) -> list[TensorDef]:
    """Every parameter TensorDef of a chunk graph, in dataflow order."""
    import networkx as nx

    return [t for name in nx.topological_sort(g) for t in g.nodes[name]["params"]]


def node_params(nodes: Sequence[Node]) -> list[TensorDef]:
    """Every parameter TensorDef of a chunk's ``nodes`` in the order given — their dataflow order, the
    same list :func:`graph_params` reads off :func:`build_chunk_graph`'s chain."""
    return [t for n in nodes for t in n.params]
