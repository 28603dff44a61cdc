"""Full recompute of a captured trace: which run layers are checkpointed, and the rewritten rows.

The lowering (:mod:`timeline.graph.trace.lowering`) first turns the captured ops of a chunk into
*rows* — one per op, with the storage names it allocates, reads and frees. Under ``[recompute]
policy = "full"`` this module rewrites them the way ``torch.utils.checkpoint`` (non-reentrant)
runs a checkpointed group of layers:

- forward: the group keeps exactly its input (the first layer's hidden state, held until the end
  of the group's backward); every other storage autograd saved inside a layer is not kept — it is
  freed at the end of that layer's forward (an upper bound on when Python drops it);
- backward: just before the first backward op of the group that needs one of those storages, the
  group's captured forward ops run again (``recompute``), up to the last one that re-creates a
  saved storage (torch's early stop); the re-created storages (``NAME@recompute``, category
  ``recompute``) are freed by the backward ops that freed the originals, as captured; the other
  recomputed outputs are transient and freed as in the captured forward.

Groups follow :func:`timeline.graph.recompute.recompute_regions`: ``uniform`` checkpoints groups of
``num_layers`` consecutive layers of each chunk, ``block`` the first ``num_layers`` layers one by
one; ``num_layers`` may be one value per pipeline rank. Selective recompute needs module-level
knowledge the trace does not have (the run file refuses it). Builds no ops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from timeline.spec.run import RecomputeSpec
from timeline.spec.trace import TraceOp

RC = "@recompute"


@dataclass(slots=True)
class Row:
    """One op of a chunk's lowered forward (``F``) or backward (``B``), on storage names."""

    phase: str
    op: TraceOp | str  # a captured op, or the name of a P2P op
    k: int | str  # the run layer it runs as, "pre"/"post" outside the layers, "pp" for P2P
    allocs: list[tuple[int, str]]  # (captured storage id, name)
    frees: list[str]
    reads: list[str] = field(default_factory=list)
    recompute: bool = False
    module: str = ""  # a TP collective's (``op`` "tp.…"): the module whose GEMM it serves
    w: bool = False  # a TP collective serving weight-gradient (W) work


def recompute_groups(spec: RecomputeSpec, layers: range, pp_rank: int) -> list[list[int]]:
    """Run layers of one chunk checkpointed together under a full-recompute ``spec``."""
    if spec.policy != "full":
        return []
    n = spec.num_layers if isinstance(spec.num_layers, int) else spec.num_layers[pp_rank]
    if n <= 0:
        return []
    chosen = list(layers)
    if spec.method == "uniform":
        return [chosen[i:i + n] for i in range(0, len(chosen), n)]
    return [[k] for k in chosen[:n]]


def _layer_rows(rows: list[Row], phase: str, layers: set[int]) -> list[int]:
    return [i for i, r in enumerate(rows) if r.phase == phase and not isinstance(r.op, str) and r.k in layers]


def _kept(rows: list[Row], alive_at_end: Callable[[int], bool]) -> set[str]:
    """Names a forward row allocates that live into the backward (freed there, or never freed)."""
    freed_in = {n: r.phase for r in rows for n in r.frees}
    return {n for r in rows if r.phase == "F" for s, n in r.allocs
            if freed_in.get(n) == "B" or (n not in freed_in and alive_at_end(s))}


def apply_full_recompute(rows: list[Row], groups: list[list[int]], hidden_in: Callable[[int], str | None],
                         hidden_out: Callable[[int], str | None], saved: Callable[[int], bool],
                         alive_at_end: Callable[[int], bool]) -> tuple[list[Row], dict[str, int], set[str]]:
    """Rewrite ``rows`` for the checkpointed ``groups``.

    ``hidden_in(k)``/``hidden_out(k)``: the name of run layer ``k``'s input / output hidden state
    (None when the device does not make it, e.g. a module input);
    ``saved(s)``: autograd saved captured storage ``s``; ``alive_at_end(s)``: it outlived the capture.
    Returns (rows, kept input name → checkpointed layer, names re-created in category ``recompute``).
    """
    kept = _kept(rows, alive_at_end)
    inputs: dict[str, int] = {}
    recomputed: set[str] = set()
    for g in groups:
        members = set(g)
        f_rows = _layer_rows(rows, "F", members)
        if not f_rows:
            continue
        out_name = hidden_out(g[-1])
        dropped: set[str] = set()
        for k in g:
            mine = _layer_rows(rows, "F", {k})
            drop = [n for i in mine for s, n in rows[i].allocs if n in kept and saved(s) and n != out_name]
            if drop:
                rows[mine[-1]].frees += drop  # the layer's forward ends: its saved storages die
                dropped.update(drop)
        kept_input = hidden_in(g[0])
        if kept_input is not None:
            rows = _keep_input(rows, kept_input, g[0])
            inputs[kept_input] = g[0]
        if dropped:
            rows = _insert_recompute(rows, f_rows, members, dropped)
            recomputed |= {n + RC for n in dropped}
    return rows, inputs, recomputed


def _keep_input(rows: list[Row], name: str, first: int) -> list[Row]:
    """The checkpoint holds the group's input until the end of the group's backward (at least)."""
    b_rows = _layer_rows(rows, "B", {first})
    last_b = b_rows[-1] if b_rows else len(rows) - 1
    freed_at = next((i for i, r in enumerate(rows) if name in r.frees), None)
    if freed_at is not None and rows[freed_at].phase == "B" and freed_at > last_b:
        return rows
    for r in rows:
        if name in r.frees:
            r.frees.remove(name)
    rows[last_b].frees.append(name)
    return rows


def _insert_recompute(rows: list[Row], f_rows: list[int], members: set[int], dropped: set[str]) -> list[Row]:
    """Re-run the group's forward rows just before its first backward row that needs a dropped name."""
    last_needed = max(i for i in f_rows if any(n in dropped for _, n in rows[i].allocs))
    replay = [i for i in f_rows if i <= last_needed]  # torch's early stop: nothing after the last save
    made = list(dict.fromkeys(n for i in replay for _, n in rows[i].allocs))
    made_set = set(made)
    free_row: dict[str, int] = {}
    for j, i in enumerate(replay):
        for n in rows[i].frees:
            if n in made_set and n not in dropped:
                free_row.setdefault(n, j)
    rc_rows: list[Row] = []
    for j, i in enumerate(replay):
        r = rows[i]
        frees = [n + RC for n in made if n not in dropped and free_row.get(n, len(replay) - 1) == j]
        rc_rows.append(Row(phase="B", op=r.op, k=r.k, allocs=[(s, n + RC) for s, n in r.allocs],
                           frees=frees, reads=[n + RC if n in made_set else n for n in r.reads], recompute=True,
                           module=r.module))
    at = next((i for i, r in enumerate(rows) if r.phase == "B" and not isinstance(r.op, str) and r.k in members
               and any(n in dropped for n in (*r.reads, *r.frees))), None)
    if at is None:
        at = next(i for i, r in enumerate(rows) if r.phase == "B" and r.k in members)
    for r in rows[at:]:
        r.reads = [n + RC if n in dropped else n for n in r.reads]
        r.frees = [n + RC if n in dropped else n for n in r.frees]
    return rows[:at] + rc_rows + rows[at:]
