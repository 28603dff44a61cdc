"""What the static bound reads of a layout before any probe: its *frame*. A plan bounds about
110,000 layouts of the default 2,048-GPU space, and each one's bound is a sum over its pipeline
ranks of per-chunk sums of per-layer numbers; most of that work is the same for every layout that
shares a schedule and a split of the layers, whatever its probe. The frame does it once per
(schedule kind, pp, vpp, micro-batches, group size, layer split, layer kinds):

- each chunk's *composition* — the kinds of its parts in the order the bound sums them (its
  decoder layers, then the embedding on the first chunk, then the head and MTP block on the
  last) — and the few distinct compositions, so a probe's per-chunk sums are taken once per
  composition (chunks of one composition have equal sums, float ones included: the same values
  added in the same order);
- per pipeline rank, the compositions of its chunks, its in-flight vectors
  (:func:`~timeline.plan.schedule_profile.schedule_profile`), whether it holds the head and MoE
  layers (its workspaces), and its action counts as (composition, kind, count) in the schedule
  profile's order (the order the bound adds them in);
- ranks alike in their static part (same compositions and workspaces) and alike in time (same
  counts), so a bound computes each once.

This module builds no probe and no schedule of its own; :func:`timeline.plan.bound.bound` evaluates a
frame with a probe's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from timeline.pipeline.placement import stage_placement
from timeline.plan.schedule_profile import schedule_profile

#: a chunk's parts, by kind: decoder layers ("dense", "moe"), "embedding", "head", "mtp"
Composition = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StaticClass:
    """Pipeline ranks whose static state and workspaces are alike: the compositions of their chunks
    (in placement order), whether they hold the head and MoE decoder layers."""

    comps: tuple[int, ...]
    holds_head: bool
    has_moe: bool


@dataclass(frozen=True, slots=True)
class Frame:
    parts: tuple[Composition, ...]  # the distinct chunk compositions
    #: per rank: its static class (index into ``statics``) and its in-flight vectors over its chunks,
    #: each as (composition, micro-batches) pairs
    rank_static: tuple[int, ...]
    rank_vectors: tuple[tuple[tuple[tuple[int, int], ...], ...], ...]
    statics: tuple[StaticClass, ...]
    #: distinct per-rank action counts, as (composition, kind, count) in the profile's order, and the
    #: ranks that have them
    times: tuple[tuple[tuple[int, str, int], ...], ...]
    overlapped: bool


@lru_cache(maxsize=16384)
def frame(kind: str, pp: int, vpp: int, num_microbatches: int, group: int, split: tuple[int, ...],
          moe_layers: tuple[bool, ...]) -> Frame:
    """The frame of a layout: schedule ``kind`` on ``pp`` ranks and ``vpp`` chunks each,
    ``num_microbatches``, interleaved ``group`` size; ``split``: decoder layers per chunk;
    ``moe_layers``: per decoder layer, whether it is a MoE layer."""
    (vectors, counts), overlapped = schedule_profile(kind, pp, vpp, num_microbatches, group)
    placement = stage_placement(kind, pp, vpp)
    last = len(split) - 1
    comp_of: dict[Composition, int] = {}
    chunk_comp: list[int] = []
    chunk_moe: list[bool] = []
    start = 0
    for c, n in enumerate(split):
        layers = range(start, start + n)
        start += n
        comp: Composition = tuple("moe" if moe_layers[i] else "dense" for i in layers)
        comp += ("embedding",) * (c == 0) + ("head", "mtp") * (c == last)
        chunk_comp.append(comp_of.setdefault(comp, len(comp_of)))
        chunk_moe.append(any(moe_layers[i] for i in layers))
    static_of: dict[StaticClass, int] = {}
    rank_static, rank_vectors = [], []
    times: dict[tuple[tuple[int, str, int], ...], None] = {}
    for r, chunks in enumerate(placement):
        cls = StaticClass(comps=tuple(chunk_comp[c] for c in chunks), holds_head=last in chunks,
                          has_moe=any(chunk_moe[c] for c in chunks))
        rank_static.append(static_of.setdefault(cls, len(static_of)))
        rank_vectors.append(tuple(tuple(zip((chunk_comp[c] for c in chunks), vec, strict=True))
                                  for vec in vectors[r]))
        times.setdefault(tuple((chunk_comp[c], k, n) for (c, k), n in counts[r].items()))
    return Frame(parts=tuple(comp_of), rank_static=tuple(rank_static), rank_vectors=tuple(rank_vectors),
                 statics=tuple(static_of), times=tuple(times), overlapped=overlapped)
