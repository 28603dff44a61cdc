"""Recompute policies as regions of forward ops, and the ``--recompute`` grammar.

A *region* is a contiguous run of one chunk's forward ops checkpointed together. Selective
recompute uses Megatron's module names (``recompute_modules``): ``core_attn``, ``mla_up_proj``,
``layernorm``, ``mlp``, ``moe``, ``moe_act``, ``shared_experts``; ``layernorm``, ``moe_act`` and
``mla_up_proj`` use ``CheckpointWithoutOutput`` in Megatron (their outputs are discarded even
though later ops saved them), the others ``tensor_parallel.checkpoint``. Full recompute
(``recompute_granularity = full``): ``uniform`` checkpoints groups of ``num_layers`` consecutive
layers of each chunk (Megatron ``TransformerBlock._checkpointed_forward``), ``block`` the first
``num_layers`` layers of each chunk one by one; ``num_layers`` may be one value per pipeline
rank. Under the ``paper`` table a MoE layer's attention and MoE sub-blocks are checkpointed apart.
MTP layers are never fully recomputed. This module does not build backward ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timeline.errors import UserError
from timeline.graph.ir import FOp
from timeline.graph.saved import SavedTable
from timeline.spec.run import RECOMPUTE_MODULES, RecomputeSpec

#: modules Megatron checkpoints with CheckpointWithoutOutput (outputs discarded, recomputed)
DISCARD_OUTPUT = frozenset({"layernorm", "moe_act", "mla_up_proj"})

FORMS = "none | selective (= selective:core_attn) | selective:MOD[+MOD…] | full:uniform|block:NUM_LAYERS[,NUM…]"
#: ``selective`` alone: Megatron's default ``--recompute-modules`` (as ``[recompute] modules`` defaults)
DEFAULT_SELECTIVE = ("core_attn",)


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    ops: tuple[int, ...]  # forward op indices, ascending and contiguous
    discard_output: bool


def parse_recompute(text: str) -> RecomputeSpec:
    """``none`` | ``selective[:MOD[+MOD…]]`` | ``full:METHOD:NUM_LAYERS`` → RecomputeSpec; ``selective``
    alone is ``selective:core_attn``, as ``policy = "selective"`` in a run file is."""
    parts = text.strip().split(":")
    bad = UserError(f"--recompute {text!r} is not valid; use {FORMS} (modules: {', '.join(RECOMPUTE_MODULES)})")
    if parts == ["none"]:
        return RecomputeSpec(policy="none")
    if parts == ["selective"]:
        return RecomputeSpec(policy="selective", modules=DEFAULT_SELECTIVE)
    if parts[0] == "selective" and len(parts) == 2 and parts[1]:
        mods = tuple(parts[1].split("+"))
        if any(m not in RECOMPUTE_MODULES for m in mods):
            raise bad
        return RecomputeSpec(policy="selective", modules=mods)
    if parts[0] == "full" and len(parts) == 3 and parts[1] in ("uniform", "block"):
        try:
            nums = tuple(int(n) for n in parts[2].split(","))
        except ValueError:
            raise bad from None
        if not nums or any(n < 0 for n in nums):
            raise bad
        return RecomputeSpec(policy="full", method=parts[1], num_layers=nums[0] if len(nums) == 1 else nums)
    raise bad


def _runs(ops: Sequence[FOp], pred) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = []
    cur: list[int] = []
    for i, op in enumerate(ops):
        if pred(op) and (not cur or ops[cur[-1]].layer == op.layer):
            cur.append(i)
        else:
            if cur:
                out.append(tuple(cur))
            cur = [i] if pred(op) else []
    if cur:
        out.append(tuple(cur))
    return out


def recompute_regions(spec: RecomputeSpec, ops: Sequence[FOp], layers: Sequence[int], pp_rank: int,
                      table: SavedTable) -> list[Region]:
    """Regions of one chunk (``layers`` = its decoder layers) under ``spec``."""
    if spec.policy == "none":
        return []
    if spec.policy == "selective":
        cands = [Region(f"{mod}@{ops[r[0]].layer}", r, mod in DISCARD_OUTPUT)
                 for mod in spec.modules for r in _runs(ops, lambda o, m=mod: m in o.tags)]
        cands.sort(key=lambda r: (-len(r.ops), r.ops[0]))
        taken: set[int] = set()
        out = []
        for r in cands:  # a module inside an already checkpointed one (moe_act in moe) adds nothing
            if taken.isdisjoint(r.ops):
                out.append(r)
                taken.update(r.ops)
        return sorted(out, key=lambda r: r.ops[0])
    n = spec.num_layers if isinstance(spec.num_layers, int) else spec.num_layers[pp_rank]
    if n <= 0:
        return []
    chosen = list(layers)
    if spec.method == "uniform":
        groups = [chosen[i:i + n] for i in range(0, len(chosen), n)]
    else:
        groups = [[layer] for layer in chosen[:n]]
    out = []
    for g in groups:
        members = set(g)
        idx = tuple(i for i, o in enumerate(ops) if o.layer in members)
        if not idx:
            continue
        split = table.full_recompute_moe_split and any("moe" in ops[i].tags for i in idx)
        if split:
            for sub in ("sub:attn", "sub:ffn"):
                part = tuple(i for i in idx if sub in ops[i].tags)
                out.append(Region(f"full@{g[0]}:{sub[4:]}", part, False))
        else:
            out.append(Region(f"full@{g[0]}", idx, False))
    return out
