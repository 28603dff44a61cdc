"""The captured model as a :class:`~timeline.graph.source.ModelSource`: its parameters, templates
and total count come from the trace, whatever the profile says. The one place of the trace
front-end that reads the run; the modules under it take the trace and the slice they need."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace

from timeline.errors import UserError
from timeline.graph.build import Node, chunk_layers
from timeline.graph.ops import ChunkTemplate
from timeline.graph.trace.lowering import trace_chunk_template
from timeline.graph.trace.params import trace_nodes, trace_total_params
from timeline.spec.model import ModelSpec
from timeline.spec.run import ParallelSpec, RecomputeSpec, TrainingSpec
from timeline.spec.trace import NO_SELECTIVE, CapturedTrace
from timeline.spec.trace_shard import TraceShard


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceSource:
    """A model captured as an op trace (``model_source`` "trace:…"), with the slices of the run
    its lowering reads."""

    label: str  # the run's ``model_source``, for messages
    trace: CapturedTrace | None
    parallel: ParallelSpec
    num_layers: int
    dtype: str
    recompute: RecomputeSpec = RecomputeSpec()
    vocab_pad: int = 1  # the profile's vocabulary padding multiple (Megatron: × tp), used when tp > 1
    experts: int = 0  # routed experts of the captured model (``n_routed_experts``)
    expert_ffn: int = 0  # each routed expert's FFN width (``moe_intermediate_size``)
    split_dims: tuple[int, ...] = ()  # sizes TP splits (heads, projection and FFN widths), see TraceShard

    @property
    def shard(self) -> TraceShard:
        """What ``parallel`` asks of the trace: the ranks and one TP rank's vocabulary rows."""
        par, trace = self.parallel, self.captured()
        vocab = next((p.shape[0] for p in trace.params if p.name.endswith(("embed_tokens.weight", "lm_head.weight"))
                      and p.shape), 0)
        multiple = self.vocab_pad * par.tp if par.tp > 1 else 1
        padded = -(-vocab // multiple) * multiple
        return TraceShard(tp=par.tp, sp=par.sp and par.tp > 1, ep=par.ep, vocab=vocab,
                          vocab_local=padded // par.tp, experts=self.experts, split_dims=self.split_dims,
                          etp=par.etp if self.experts else 1, ffn=self.expert_ffn)

    def captured(self) -> CapturedTrace:
        if self.trace is None:
            raise UserError(f"{self.label}: the run carries no captured trace")
        return self.trace

    @property
    def ranges(self) -> list[range]:
        return chunk_layers(self.parallel, self.num_layers)

    def under(self, *, recompute: RecomputeSpec | None = None, routing_skew: float | None = None) -> TraceSource:
        """The same trace under another recompute policy (a captured trace has no routing to skew)."""
        return self if recompute is None else replace(self, recompute=recompute)

    def cut(self, model: ModelSpec, parallel: ParallelSpec, training: TrainingSpec,
            recompute: RecomputeSpec) -> TraceSource:
        return replace(self, num_layers=model.num_hidden_layers, parallel=parallel, dtype=training.dtype,
                       recompute=recompute)

    def nodes(self, chunk: int) -> list[Node]:
        return trace_nodes(self.captured(), chunk, self.ranges, self.dtype, self.shard)

    def total_params(self) -> int:
        return trace_total_params(self.captured(), self.num_layers)

    def template(self, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
        """``pp_rank`` (default ``chunk % pp``) picks the entry of a per-rank ``recompute.num_layers``."""
        trace = self.captured()
        if trace.is_step:  # its ops run per iteration (graph/trace/steps.py), not per layer and chunk
            raise UserError(f"{self.label}: a whole-step trace (capture --step) has no decoder layers to lay out "
                            "in pipeline chunks; only timeline simulate runs it")
        if self.recompute.policy == "selective":  # the run file refuses it; compare/fit variants reach here
            raise UserError(f"{self.label}: {NO_SELECTIVE}")
        return trace_chunk_template(trace, chunk, self.ranges, num_layers=self.num_layers,
                                    recompute=self.recompute,
                                    pp_rank=chunk % self.parallel.pp if pp_rank is None else pp_rank,
                                    shard=self.shard)

    def signature(self, chunk: int) -> Hashable:
        """A captured trace's chunks never share a template."""
        return ("chunk", chunk)

    def layer_base(self, chunk: int) -> int:
        """Nothing is renumbered: no two chunks share a signature."""
        return 0
