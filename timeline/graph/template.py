"""``chunk_template(run, chunk)``: the forward and backward op templates of one virtual stage.

The run's :func:`~timeline.graph.source.model_source` builds them: the analytic layer library
(:mod:`timeline.graph.analytic`) or a captured trace (:mod:`timeline.graph.trace`), which decides
what is saved whatever the profile. The template covers one micro-batch; the simulator shifts and
renames it.
"""

from __future__ import annotations

from functools import lru_cache

from timeline.graph.ops import ChunkTemplate
from timeline.graph.source import model_source
from timeline.spec.run import RunSpec


@lru_cache(maxsize=256)
def chunk_template(run: RunSpec, chunk: int, *, pp_rank: int | None = None) -> ChunkTemplate:
    """Op templates of virtual stage ``chunk`` for one micro-batch.

    ``pp_rank`` (default ``chunk % pp``) picks the entry of a per-rank ``recompute.num_layers``.
    """
    return model_source(run).template(chunk, pp_rank=pp_rank)
