"""The analytic model source: a chunk's parameters, forward ops and templates from the layer library.

:class:`AnalyticSource` (one of the two :mod:`~timeline.graph.source` implementations) builds the
chunk's forward ops with the layer families' ``forward`` (:mod:`timeline.graph.families`),
which read every local width off the chunk's parameter graph (``timeline.graph.build``), keeps
them in the dataflow order the families record them in, applies the profile's saved-tensor table
and the recompute policy (``timeline.graph.analysis``), and derives the backward
(``timeline.graph.backward``). Forward tensors are ``activations`` when kept for backward,
``comm`` for collective buffers, else ``temporary`` (freed by their last forward consumer).
The template covers one micro-batch; the simulator shifts and renames it. It does not know
which rank runs the chunk, except for ``pp_rank`` (full recompute's per-rank ``num_layers``).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from timeline.graph.analysis import Analysis, analyse
from timeline.graph.backward import delay_wgrads, place_frees, split_sides, to_op, unit_cost, unit_list
from timeline.graph.build import Node, chunk_layers, chunk_nodes, mtp_chunk
from timeline.graph.context import BuildCtx
from timeline.graph.families import (
    attention,
    batch,
    bert,
    decoder,
    embedding,
    fp8,
    head,
    llava,
    mtp,
    norm,
    sinks,
    t5,
)
from timeline.graph.ir import Builder, Dims, FOp
from timeline.graph.offload import offload_groups
from timeline.graph.ops import ChunkTemplate, Op, OpCost, SavedTensor
from timeline.graph.recompute import distribute_inputs, recompute_regions
from timeline.graph.tensors import Category, TensorDef
from timeline.spec.framework import FrameworkSpec
from timeline.spec.model import ModelSpec
from timeline.spec.run import OffloadSpec, ParallelSpec, RecomputeSpec, TrainingSpec


def forward_ops(ctx: BuildCtx, par: ParallelSpec, tr: TrainingSpec, chunk: int,
                nodes: Sequence[Node] | None = None) -> list[FOp]:
    """The forward ops of virtual stage ``chunk`` for one micro-batch, in dataflow order (``nodes``: the
    chunk's parameter nodes, when already built).

    With the MTP layers on a stage apart from the loss (``parallel.mtp_stage``), the stages from there
    on pass the main and MTP hidden states concatenated along the sequence, ``1 + mtp_layers`` times
    the usual rows (``p2p_communication.py: _communicate`` exchanges the shapes first under
    ``config.mtp_standalone``, Megatron-LM 5247a1f460), and the MTP stage gets the micro-batch as the
    first and last stages do (``pretrain_gpt.py: get_batch`` under ``mtp_on_this_rank``)."""
    ranges = chunk_layers(par, ctx.model.num_hidden_layers)
    at = mtp_chunk(par)
    if nodes is None:
        nodes = chunk_nodes(ctx, ranges, chunk, at)
    b = Builder(ctx, Dims.of(par, tr), tr, (t for n in nodes for t in n.params))
    m, d = ctx.model, b.dims
    if m.mtp_repeated_layer:  # every depth runs MTP module 0: its parameters stand for theirs (widths, gradients)
        for t in [t for name, t in b.params.items() if name.startswith("mtp.0.")]:
            for k in range(1, m.mtp_layers):
                b.params.setdefault(t.name.replace("mtp.0.", f"mtp.{k}.", 1), t)
    last = len(ranges) - 1
    if m.architecture == "t5":  # one stage holds the encoder, the decoder and the head (spec/arch_rules.py)
        loaded = t5.forward(b, ranges[chunk])
        if loaded:
            batch.release(b, loaded)
        return b.ops
    own_vit = m.architecture == "llava" and par.encoder_pp > 0  # the ViT on a stage of its own: chunk 0
    if chunk != 0 and not (own_vit and chunk == 1):
        rows = d.t_sp * (1 + m.mtp_layers) if at != last and chunk > at else d.t_sp
        x = b.tensor("input", (rows, m.hidden_size))
        b.op("recv_forward", "comm", None, {}, {"y": x}, kind="p2p", stream="pp")
    saved = ""
    if b.table.rerun_keeps_batch and d.tp == 1 and d.cp == 1:
        # megatron/core/utils.py: get_batch_on_this_tp_rank keeps every field where mtp_on_this_rank
        saved = "both" if last == 0 or (chunk == at and m.mtp_layers) else "first" if chunk == 0 else "last"
    loaded = batch.load(b, b.table.dataloader_batch == "mask", saved) \
        if b.table.dataloader_batch != "none" and chunk in (0, last, at) and m.architecture == "gpt" else {}
    if b.table.dataloader_batch != "none" and m.architecture == "bert":  # pretrain_bert.py: every stage
        loaded = bert.load_batch(b)
    if m.architecture == "llava":  # pretrain_vlm.py: get_batch on every stage
        loaded = llava.load_batch(b)
        if chunk == 0 and own_vit:
            x = llava.vision_stage(b, loaded)
        elif chunk == int(own_vit):
            image = llava.image_input(b) if own_vit else None
            x = llava.first_stage(b, loaded, last=chunk == last, image=image)
        elif chunk == last:
            llava.last_stage_batch(b, loaded)
    elif chunk == 0:
        x = embedding.forward(b, "embedding", None)
    if b.table.rope_cache and m.position_embedding == "rope":
        attention.rope_cache(b)
    if (m.attention_sinks and b.table.sink_attention == "eager") or (b.table.model_code and m.eager_attention):
        sinks.attention_masks(b)
    for i in ranges[chunk]:
        x = decoder.forward(b, i, f"layers.{i}", x, moe=m.is_moe_layer(i))
    mtps = [n.layer - m.num_hidden_layers for n in nodes if n.kind == "mtp" and n.layer is not None]
    if chunk == last and m.architecture == "bert":
        bert.head_forward(b, x)
    elif chunk == last and at == last:
        head.forward(b, "output", "final_norm", x, None)
        for k in mtps:  # the MTP modules the parameter graph holds
            mtp.forward(b, k, x)
    elif chunk == last:
        mtp.heads_apart(b, x, m.mtp_layers)
    else:
        if any(n.name == "final_norm" for n in nodes):
            x = norm.forward(b, "final_norm", x, None, final=True)
        if mtps:
            x = mtp.forward_apart(b, mtps, x)
        b.op("send_forward", "comm", None, {"x": x}, {}, kind="p2p", stream="pp")
    if m.architecture == "llava":
        loaded = {**loaded, **llava.held_to_step_end(b)}
        llava.mark_frozen(b)
    if loaded:
        batch.release(b, loaded)
    if tr.fp8_recipe != "none":
        fp8.rewrite(b)  # in place: no op is added or moved, the order below stays the dataflow order
    # the ops come in dataflow order: an op's inputs are made by ops recorded before it (or by none), so
    # every producer → consumer edge of the chunk's op graph points forward and its lexicographic
    # topological order is the recorded order itself (building the graph to sort it took 15 % of a template)
    return b.ops


def _made(a: Analysis, op: FOp) -> list[TensorDef]:
    """The tensors forward op ``op`` allocates: its outputs and the side tensors the profile keeps,
    but none it writes into a persistent workspace."""
    # a set: a CP ring's attention has one extra per ring step, and scanning them per tensor
    # made a cp = 1024 template quadratic (equal to the scan: TensorDef hashes what it compares)
    extras = set(op.extras.values())
    return [t for t in (*op.outputs.values(), *op.extras.values())
            if not (t in extras and t.storage not in a.savers)  # a side tensor this profile does not keep
            and t.storage not in op.buffered]  # written into a persistent workspace the profile places


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
        for t in _made(a, op):
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


def chunk_source(source: AnalyticSource, chunk: int) -> AnalyticSource:
    """``source`` as virtual stage ``chunk`` is sharded: a LLaVA ViT stage of its own (``parallel.encoder_pp``) over
    its ``encoder_tp`` ranks, without sequence parallelism (``pretrain_vlm.py``: the vision configs' tensor-parallel
    size is ``--encoder-tensor-model-parallel-size`` under an encoder stage); every other stage as it is."""
    par = source.parallel
    if chunk == 0 and par.encoder_pp and par.encoder_tp and par.encoder_tp != par.tp:
        return replace(source, parallel=replace(par, tp=par.encoder_tp, sp=False))
    return source


@lru_cache(maxsize=512)
def _forward_ops_cached(source: AnalyticSource, chunk: int) -> tuple[FOp, ...]:
    """Forward ops do not depend on the recompute policy: ``source`` comes with it reset, so every
    policy of a search (``timeline fit``, ``compare``) shares one build per chunk."""
    source = chunk_source(source, chunk)
    return tuple(forward_ops(source.ctx, source.parallel, source.training, chunk, source.nodes(chunk)))


@lru_cache(maxsize=256)
def _nodes_cached(source: AnalyticSource, chunk: int) -> tuple[Node, ...]:
    """A chunk's parameter nodes (``source``: reduced to what they read, :meth:`AnalyticSource.param_slice`)."""
    return tuple(chunk_nodes(source.ctx, chunk_layers(source.parallel, source.model.num_hidden_layers), chunk,
                             mtp_chunk(source.parallel)))


@lru_cache(maxsize=256)
def analytic_template(source: AnalyticSource, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
    """Op templates of virtual stage ``chunk`` for one micro-batch.

    ``pp_rank`` (default ``chunk % pp``) picks the entry of a per-rank ``recompute.num_layers``.
    The source's profile (:mod:`timeline.profiles`) is looked up once, here.
    """
    structure = source.ctx.structure
    a = _analysis(source, chunk, pp_rank)
    units = unit_list(a, structure.wgrad_transient)
    side_i, side_w = split_sides(units, "split")
    place_frees(side_i + side_w)
    backward_i, backward_w = tuple(to_op(u) for u in side_i), tuple(to_op(u) for u in side_w)
    if structure.delay_wgrad:  # --delay-wgrad-compute: the fused backward runs each node's wgrads late
        units = delay_wgrads(units, a.ops)
    place_frees(units)  # the same units as one fused backward: their frees again, in that order
    saved = _saved(a)
    per_layer = _per_layer(saved)
    core_attn_recomputed = source.recompute.policy == "selective" and "core_attn" in source.recompute.modules
    groups = offload_groups(a, units, source.offload, core_attn_recomputed=core_attn_recomputed)
    return ChunkTemplate(chunk=chunk, forward=tuple(_forward(a)), backward_i=backward_i, backward_w=backward_w,
                         layer_activation_bytes=per_layer, backward=tuple(to_op(u) for u in units), saved=saved,
                         offload=groups)


def analytic_costs(source: AnalyticSource, chunk: int) -> tuple[dict[str, list[OpCost]], dict[int, int]]:
    """Per phase (``F``, ``B``, ``I``, ``W``: the template's ``forward``, ``backward``, ``backward_i``,
    ``backward_w``) the :class:`OpCost` of each op of ``analytic_template(source, chunk)``, in order,
    and its ``layer_activation_bytes`` — without the template's tensors and frees: all a plan's probe
    reads (:func:`timeline.plan.bound.probe_stats`), a few thousand times per plan."""
    a = _analysis(source, chunk, None)
    units = unit_list(a, source.ctx.structure.wgrad_transient)

    cost: dict[int, OpCost] = {}  # by unit (its id): the split sides hold the same units
    for u in units:
        _, flops, moved = unit_cost(u)
        cost[id(u)] = OpCost(u.fop.layer, u.fop.kind, u.fop.stream, flops, float(moved))
    forward = [OpCost(op.layer, op.kind, op.stream, op.flops,
                      float(sum(t.size_bytes for t in _made(a, op)) + sum(t.size_bytes for t in op.dataflow_inputs())))
               for op in a.ops]
    side_i, side_w = split_sides(units, "split")
    fused = delay_wgrads(units, a.ops) if source.ctx.structure.delay_wgrad else units
    return {"F": forward, "B": [cost[id(u)] for u in fused], "I": [cost[id(u)] for u in side_i],
            "W": [cost[id(u)] for u in side_w]}, _layer_bytes(a)


def analytic_layer_bytes(source: AnalyticSource, chunk: int, *, pp_rank: int | None = None) -> dict[int, int]:
    """``analytic_template(source, chunk).layer_activation_bytes`` without building the backward
    (the same analysis, the same saved tensors)."""
    return _layer_bytes(_analysis(source, chunk, pp_rank))


def _layer_bytes(a: Analysis) -> dict[int, int]:
    """``_per_layer(_saved(a))`` without the saved tensors' copies."""
    per_layer: dict[int, int] = {}
    for s in a.kept:
        layer = a.ops[a.savers[s][0].op].layer
        layer = -1 if layer is None else layer
        per_layer[layer] = per_layer.get(layer, 0) + a.tensors[s].size_bytes
    return per_layer


def _analysis(source: AnalyticSource, chunk: int, pp_rank: int | None) -> Analysis:
    """The chunk's forward ops analysed under the source's recompute regions."""
    ctx = source.ctx
    ops = list(_forward_ops_cached(source.without_recompute(), chunk))
    par = source.parallel
    rank = chunk % par.pp if pp_rank is None else pp_rank
    layers = list(chunk_layers(par, source.model.num_hidden_layers)[chunk])
    regions = recompute_regions(source.recompute, ops, layers, rank, moe_split=ctx.structure.full_recompute_moe_split)
    # a checkpoint over ops no gradient reaches (a frozen ViT) is never recomputed: its output takes no gradient
    regions = [r for r in regions if not all(ops[i].no_grad for i in r.ops)]
    if source.recompute.distribute_saved and source.recompute.policy == "full" and regions:
        ops, regions = distribute_inputs(ops, regions, par.tp)
    return analyse(ops, ctx.saved, regions)


def _per_layer(saved: tuple[SavedTensor, ...]) -> dict[int, int]:
    per_layer: dict[int, int] = {}
    for st in saved:
        per_layer[st.layer] = per_layer.get(st.layer, 0) + st.tensor.size_bytes
    return per_layer


_LAYER = re.compile(r"layers\.(\d+)")


def ops_signature(source: AnalyticSource, chunk: int) -> Hashable:
    """Equal for two chunks of ``source`` only if their forward ops are equal up to renumbering
    their decoder layers from 0 (see :mod:`timeline.graph.signature`)."""
    ranges = chunk_layers(source.parallel, source.model.num_hidden_layers)
    layers = tuple(ranges[chunk])
    base = source.layer_base(chunk)

    renumbered: dict[str, str] = {}
    described: dict[int, tuple] = {}  # id(TensorDef) → its part (``ops`` keeps every one alive)

    def one(m: re.Match[str]) -> str:
        return f"layers.{int(m.group(1)) - base}"

    def s(text: str) -> str:
        got = renumbered.get(text)
        if got is None:
            got = renumbered[text] = _LAYER.sub(one, text) if "layers." in text else text
        return got

    def t(td: TensorDef) -> tuple:
        got = described.get(id(td))
        if got is None:
            got = described[id(td)] = (s(td.name), td.shape, td.dtype, td.category, s(td.module), s(td.storage),
                                       td.split, td.expert, td.trainable, td.in_moe)
        return got

    ops = _forward_ops_cached(source.without_recompute(), chunk)
    return (chunk == 0, chunk == len(ranges) - 1, tuple(x - base for x in layers), tuple(
        (s(o.name), s(o.module), None if o.layer is None else o.layer - base, o.rule,
         tuple((k, t(v)) for k, v in o.inputs.items()), tuple((k, t(v)) for k, v in o.outputs.items()),
         tuple((k, t(v)) for k, v in o.extras.items()), o.kind, o.stream, o.flops, o.wflops, o.tags,
         tuple((k, t(v)) for k, v in o.scratch.items()), tuple(sorted(s(x) for x in o.buffered)), o.frozen,
         o.no_grad)
        for o in ops))


@dataclass(frozen=True, slots=True, kw_only=True)
class AnalyticSource:
    """The model as the layer library builds it (a preset or a Hugging Face config): the slices
    of a run its layer builders, templates and recompute regions read."""

    model: ModelSpec
    profile: str
    framework: FrameworkSpec
    parallel: ParallelSpec
    training: TrainingSpec
    recompute: RecomputeSpec = RecomputeSpec()
    #: fine-grained activation offloading (``[offload]``): groups on each template, timed by the simulation
    offload: OffloadSpec = OffloadSpec()
    sms: int = 0  # the device's streaming multiprocessors (spec/hardware.py SM_COUNTS)
    sm: int = 0  # the device's compute capability × 10 (``[hardware] sm``: which SDPA kernel torch picks)

    @property
    def ctx(self) -> BuildCtx:
        return BuildCtx.of(self.model, self.profile, self.framework, self.parallel, self.training.dtype, self.sms,
                           self.sm)

    def without_recompute(self) -> AnalyticSource:
        return replace(self, recompute=RecomputeSpec())

    def under(self, *, recompute: RecomputeSpec | None = None, routing_skew: float | None = None) -> AnalyticSource:
        out = self if recompute is None else replace(self, recompute=recompute)
        if routing_skew is not None:
            out = replace(out, training=replace(out.training, routing_skew=routing_skew))
        return out

    def cut(self, model: ModelSpec, parallel: ParallelSpec, training: TrainingSpec,
            recompute: RecomputeSpec) -> AnalyticSource:
        return replace(self, model=model, parallel=parallel, training=training, recompute=recompute)

    def forward_ops(self, chunk: int) -> list[FOp]:
        """The forward ops of virtual stage ``chunk`` (no recompute: regions come with the template)."""
        return list(_forward_ops_cached(self.without_recompute(), chunk))

    def nodes(self, chunk: int) -> list[Node]:
        return list(_nodes_cached(chunk_source(self, chunk).param_slice(), chunk))

    def param_slice(self) -> AnalyticSource:
        """This source reduced to what its parameter nodes read — the model, profile, framework,
        weight dtype and SM count (:meth:`BuildCtx.of`), tp, ep, etp, the layer split
        (:func:`chunk_layers`), the MTP stage (:func:`mtp_chunk`) and a LLaVA ViT's own stage
        (:func:`timeline.graph.build.first_decoder_chunk`) — so that probes of other
        micro-batch sizes, CP degrees and recompute policies share one build of their parameters
        (thousands of expert tensors)."""
        par = self.parallel
        return replace(self, parallel=ParallelSpec(pp=par.pp, vpp=par.vpp, tp=par.tp, ep=par.ep, etp=par.etp,
                                                   layout=par.layout, mtp_stage=par.mtp_stage,
                                                   encoder_pp=par.encoder_pp, encoder_tp=par.encoder_tp),
                       training=TrainingSpec(dtype=self.training.dtype), recompute=RecomputeSpec(),
                       offload=OffloadSpec())

    def total_params(self) -> int:
        """Trainable parameters of the unsharded model, counted as the profile counts them."""
        ctx = self.ctx.unsharded()
        nodes = chunk_nodes(ctx, [range(self.model.num_hidden_layers)], 0)
        return sum(t.numel for n in nodes for t in n.params if t.trainable)

    def template(self, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
        return analytic_template(self, chunk, pp_rank=pp_rank)

    def signature(self, chunk: int) -> Hashable:
        return ops_signature(self, chunk)

    def layer_base(self, chunk: int) -> int:
        """The chunk's first decoder layer (0 for a chunk of none), which :func:`ops_signature` renumbers from."""
        layers = chunk_layers(self.parallel, self.model.num_hidden_layers)[chunk]
        return layers[0] if layers else 0
