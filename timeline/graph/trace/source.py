"""The captured model as a :class:`~timeline.graph.source.ModelSource`: its parameters, templates
and total count come from the trace, whatever the profile says. The one place of the trace
front-end that reads the run; the modules under it take the trace and the slice they need."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from timeline.errors import UserError
from timeline.graph.build import Node, chunk_layers
from timeline.graph.ops import ChunkTemplate
from timeline.graph.trace.lowering import trace_chunk_template
from timeline.graph.trace.params import trace_nodes, trace_total_params
from timeline.spec.run import RunSpec
from timeline.spec.trace import NO_SELECTIVE, CapturedTrace


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A model captured as an op trace (``model_source`` "trace:…")."""

    run: RunSpec

    @property
    def trace(self) -> CapturedTrace:
        if self.run.trace is None:
            raise UserError(f"{self.run.model_source}: the run carries no captured trace")
        return self.run.trace

    @property
    def ranges(self) -> list[range]:
        return chunk_layers(self.run.parallel, self.run.model.num_hidden_layers)

    def nodes(self, chunk: int) -> list[Node]:
        return trace_nodes(self.trace, chunk, self.ranges, self.run.training.dtype)

    def total_params(self) -> int:
        return trace_total_params(self.trace, self.run.model.num_hidden_layers)

    def template(self, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
        """``pp_rank`` (default ``chunk % pp``) picks the entry of a per-rank ``recompute.num_layers``."""
        run = self.run
        trace = self.trace
        if run.recompute.policy == "selective":  # the run file refuses it; compare/fit variants reach here
            raise UserError(f"{run.model_source}: {NO_SELECTIVE}")
        return trace_chunk_template(trace, chunk, self.ranges, num_layers=run.model.num_hidden_layers,
                                    recompute=run.recompute,
                                    pp_rank=chunk % run.parallel.pp if pp_rank is None else pp_rank)

    def signature(self, chunk: int) -> Hashable:
        """A captured trace's chunks never share a template."""
        return ("chunk", chunk)
