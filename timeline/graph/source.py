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
from timeline.graph.ops import ChunkTemplate
from timeline.graph.trace.source import TraceSource
from timeline.spec.run import RunSpec


class ModelSource(Protocol):
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


#: ``model_source`` kind ("trace:PATH" → "trace") → its implementation; every other kind is analytic
SOURCES: dict[str, Callable[[RunSpec], ModelSource]] = {"trace": TraceSource}


def model_source(run: RunSpec) -> ModelSource:
    """The run's model source: a captured trace for ``model_source`` "trace:…", else the layer library."""
    return SOURCES.get(run.model_source.split(":", 1)[0], AnalyticSource)(run)
