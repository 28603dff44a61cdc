"""Recompute policies as regions of forward ops (the ``--recompute`` grammar is in
:mod:`timeline.spec.recompute`).

A *region* is a contiguous run of one chunk's forward ops checkpointed together. Selective
recompute uses Megatron's module names (``recompute_modules``): ``core_attn``, ``mla_up_proj``,
``layernorm``, ``mlp``, ``moe``, ``moe_act``, ``shared_experts``, ``gdn_norm_out`` (a gated delta net's output
norm, gate and transpose: ``ssm/gated_delta_net.py``, ff5264c33d on); ``layernorm``, ``moe_act``, ``mla_up_proj``
and ``gdn_norm_out`` use ``CheckpointWithoutOutput`` in Megatron (their outputs are discarded even
though later ops saved them), the others ``tensor_parallel.checkpoint``. Full recompute
(``recompute_granularity = full``): ``uniform`` checkpoints groups of ``num_layers`` consecutive
layers of each chunk (Megatron ``TransformerBlock._checkpointed_forward``), ``block`` the first
``num_layers`` layers of each chunk one by one; ``num_layers`` may be one value per pipeline
rank. Where the profile's structure says so (``full_recompute_moe_split``: the paper) a MoE layer's
attention and MoE sub-blocks are checkpointed apart.
MTP layers are never fully recomputed. This module does not build backward ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from timeline.graph.ir import FOp
from timeline.spec.run import RecomputeSpec

#: modules Megatron checkpoints with CheckpointWithoutOutput (outputs discarded, recomputed)
DISCARD_OUTPUT = frozenset({"layernorm", "moe_act", "mla_up_proj", "gdn_norm_out"})


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    ops: tuple[int, ...]  # forward op indices, ascending and contiguous
    discard_output: bool


def _runs(ops: Sequence[FOp], tag: str) -> list[tuple[int, ...]]:
    """Maximal runs of consecutive ops of one layer tagged ``tag``."""
    out: list[tuple[int, ...]] = []
    cur: list[int] = []
    for i, op in enumerate(ops):
        if tag in op.tags and (not cur or ops[cur[-1]].layer == op.layer):
            cur.append(i)
        else:
            if cur:
                out.append(tuple(cur))
            cur = [i] if tag in op.tags else []
    if cur:
        out.append(tuple(cur))
    return out


def recompute_regions(spec: RecomputeSpec, ops: Sequence[FOp], layers: Sequence[int], pp_rank: int, *,
                      moe_split: bool) -> list[Region]:
    """Regions of one chunk (``layers`` = its decoder layers) under ``spec``; with ``moe_split`` (the
    profile's ``full_recompute_moe_split``) full recompute checkpoints a MoE layer's sub-blocks apart."""
    if spec.policy == "none":
        return []
    if spec.policy == "selective":
        cands = [Region(f"{mod}@{ops[r[0]].layer}", r, mod in DISCARD_OUTPUT)
                 for mod in spec.modules for r in _runs(ops, mod)]
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
        split = moe_split and any("moe" in ops[i].tags for i in idx)
        if split:
            for sub in ("sub:attn", "sub:ffn"):
                part = tuple(i for i in idx if sub in ops[i].tags)
                out.append(Region(f"full@{g[0]}:{sub[4:]}", part, False))
        else:
            out.append(Region(f"full@{g[0]}", idx, False))
    return out
