"""The captured model as a :class:`~timeline.graph.source.ModelSource`: its parameters, templates
and total count come from the trace, whatever the profile says."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from timeline.graph.build import Node, chunk_layers
from timeline.graph.ops import ChunkTemplate
from timeline.graph.trace.lowering import trace_chunk_template
from timeline.graph.trace.params import trace_nodes, trace_total_params
from timeline.spec.run import RunSpec


@dataclass(frozen=True, slots=True)
class TraceSource:
    """A model captured as an op trace (``model_source`` "trace:…")."""

    run: RunSpec

    def nodes(self, chunk: int) -> list[Node]:
        return trace_nodes(self.run, chunk, chunk_layers(self.run))

    def total_params(self) -> int:
        return trace_total_params(self.run)

    def template(self, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
        return trace_chunk_template(self.run, chunk, chunk_layers(self.run), pp_rank=pp_rank)

    def signature(self, chunk: int) -> Hashable:
        """A captured trace's chunks never share a template."""
        return ("chunk", chunk)
