"""Where a run's model comes from — chosen once, here.

A :class:`ModelSource` gives every part of the graph layer that depends on how the model is
described: each virtual stage's parameter nodes, the unsharded parameter count, the op templates
of a chunk and their sharing signature. Two implementations: the analytic layer library
(:class:`~timeline.graph.analytic.AnalyticSource`: a preset or a Hugging Face config) and a
captured op trace (:class:`~timeline.graph.trace.source.TraceSource`). :func:`model_source` picks
one from the run's ``model_source`` kind; nothing else in the graph layer asks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol

from timeline.graph.analytic import AnalyticSource
from timeline.graph.build import Node
from timeline.graph.context import BuildCtx
from timeline.graph.ops import ChunkTemplate
from timeline.graph.trace.source import TraceSource
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, RecomputeSpec, RunSpec, TrainingSpec


class ModelSource(Protocol):
    def __hash__(self) -> int:
        """Sources are frozen: caches key on them (the planner's probe numbers)."""
        ...

    def nodes(self, chunk: int) -> list[Node]:
        """Module nodes of virtual stage ``chunk`` in dataflow order, with the parameters one device holds."""
        ...

    def total_params(self) -> int:
        """Trainable parameters of the whole (unsharded) model."""
        ...

    def template(self, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
        """Op templates of virtual stage ``chunk`` for one micro-batch."""
        ...

    def signature(self, chunk: int) -> Hashable:
        """Equal for two chunks whose templates are equal up to layer numbers."""
        ...

    def layer_base(self, chunk: int) -> int:
        """The decoder-layer number :meth:`signature` renumbers chunk ``chunk``'s layers from."""
        ...

    def under(self, *, recompute: RecomputeSpec | None = None, routing_skew: float | None = None) -> ModelSource:
        """The same model under another recompute policy or simulated EP load (``routing_skew``)."""
        ...

    def cut(self, model: ModelSpec, parallel: ParallelSpec, training: TrainingSpec,
            recompute: RecomputeSpec) -> ModelSource:
        """The same source over other slices: a probe's model cut to a few layers, one rank, one micro-batch."""
        ...


#: how a door turns a run into its model source (:func:`model_source`; tests substitute their own)
SourceFn = Callable[[RunSpec], ModelSource]


def model_source(run: RunSpec) -> ModelSource:
    """The run's model source: a captured trace for ``model_source`` "trace:…", else the layer
    library. A door (``tests/test_layering.py``): the graph layer's one reader of a whole run."""
    if run.model_source.split(":", 1)[0] == "trace":
        ctx = BuildCtx.of(run.model, run.profile, run.framework, run.parallel, run.training.dtype)
        return TraceSource(label=run.model_source, trace=run.trace, parallel=run.parallel,
                           num_layers=run.model.num_hidden_layers, dtype=run.training.dtype, recompute=run.recompute,
                           vocab_pad=ctx.profile.vocab_pad, experts=run.model.n_routed_experts,
                           expert_ffn=run.model.moe_intermediate_size,
                           split_dims=_split_dims(run.model))
    return AnalyticSource(model=run.model, profile=run.profile, framework=run.framework, parallel=run.parallel,
                          training=run.training, recompute=run.recompute, offload=run.offload, sms=run.hardware.sms,
                          sm=run.hardware.sm)


def _split_dims(m: ModelSpec) -> tuple[int, ...]:
    """The sizes of a model that tensor parallelism splits: head counts and widths of the projections and FFN."""
    hd = m.attn_head_dim
    return tuple(dict.fromkeys((m.num_attention_heads, m.kv_heads, m.num_attention_heads * hd, m.kv_heads * hd,
                                m.intermediate_size, 2 * m.intermediate_size)))
