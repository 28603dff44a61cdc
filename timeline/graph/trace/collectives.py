"""The sequence-parallel collectives of a sharded trace, as rows around its tensor-parallel GEMMs.

Under SP (``tp > 1``), :func:`~timeline.graph.trace.shard.tp_collectives` names, per captured GEMM,
the ``[s/tp, b, h]`` inputs it reads whole and the outputs it makes whole as partial sums (and, under
``etp > 1``, the experts' rows over the expert-TP group). Each input becomes a ``tp.all_gather`` row
before the GEMM allocating the gathered rows (a ``comm`` buffer, ``group`` times the local rows) that
the GEMM frees; each such output is allocated by the GEMM as its whole partial sum (``….partial``) and
cut by a ``tp.reduce_scatter`` row that allocates the local shard under the storage's own name and
frees the partial — as the analytic path's ``column_linear`` / ``row_linear``
(:mod:`timeline.graph.families.common`), its MoE experts and their backward do. Without SP the TP
all-reduces work in place and add no rows. Nothing here sizes tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from timeline.graph.trace.recompute import Row
from timeline.graph.trace.shard import Collectives

GATHERED, PARTIAL = ".gathered", ".partial"


def comm_group(name: str) -> str:
    """The group whose whole a collective's buffer holds ("tp" | "etp"), "" for other tensors."""
    for g in ("tp", "etp"):
        tag = f"[{g}]"
        if f"{GATHERED}{tag}@" in name or name.endswith(PARTIAL + tag) or f"{PARTIAL}{tag}@" in name:
            return g
    return ""


def with_collectives(rows: list[Row], plan: Mapping[int, Collectives], groups: Collection[str],
                     name_of: Callable[[int, int | str], str | None], wgrad: Collection[int]) -> list[Row]:
    """``rows`` with each planned GEMM's all-gathers before it and reduce-scatters after it, for the
    collectives of ``groups`` ("tp" under SP, "etp" under expert tensor parallelism)."""
    out: list[Row] = []
    for r in rows:
        if isinstance(r.op, str) or r.op.index not in plan or plan[r.op.index][2] not in groups:
            out.append(r)
            continue
        o = r.op
        gathers, partials, group = plan[o.index]
        w = o.index in wgrad
        for s in gathers:
            n = name_of(s, r.k)
            if n is None or n not in r.reads:
                continue
            g = f"{n}{GATHERED}[{group}]@{r.k}.{o.index}"
            out.append(Row(phase=r.phase, op=f"{group}.all_gather", k=r.k, allocs=[(s, g)], frees=[], reads=[n],
                           module=o.module, w=w))
            r.reads = [g if x == n else x for x in r.reads]
            r.frees = [*r.frees, g]
        after: list[Row] = []
        for s in partials:
            n = next((m for t, m in r.allocs if t == s), None)
            if n is None:
                continue
            p = f"{n}{PARTIAL}[{group}]"
            r.allocs = [(t, p if m == n else m) for t, m in r.allocs]
            dead = [n] if n in r.frees else []  # an output nothing reads dies after its reduce-scatter
            r.frees = [x for x in r.frees if x != n]
            after.append(Row(phase=r.phase, op=f"{group}.reduce_scatter", k=r.k, allocs=[(s, n)], frees=[p, *dead],
                             reads=[p], module=o.module, w=w))
        out.append(r)
        out += after
    return out
