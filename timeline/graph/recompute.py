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
MTP layers are never fully recomputed. Under ``distribute_saved`` (Megatron's
``--distribute-saved-activations``) each full region keeps its input as a 1/tp chunk
(:func:`distribute_inputs`). This module does not build backward ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from timeline.graph.ir import FOp
from timeline.graph.tensors import Category, TensorDef
from timeline.spec.run import RecomputeSpec

#: modules Megatron checkpoints with CheckpointWithoutOutput (outputs discarded, recomputed)
DISCARD_OUTPUT = frozenset({"layernorm", "moe_act", "mla_up_proj", "gdn_norm_out"})


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    ops: tuple[int, ...]  # forward op indices, ascending and contiguous
    discard_output: bool
    #: distribute_saved: the region's input (its first op's first dataflow input) and the 1/tp chunk of it the
    #: checkpoint keeps instead, made by the op right after the region (:func:`distribute_inputs`)
    distributed: tuple[TensorDef, TensorDef] | None = None


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


def distribute_inputs(ops: Sequence[FOp], regions: Sequence[Region], tp: int) -> tuple[list[FOp], list[Region]]:
    """``ops`` and full-recompute ``regions`` under Megatron's ``--distribute-saved-activations``.

    ``CheckpointFunction.forward`` (``megatron/core/tensor_parallel/random.py``, core_v0.12.0 … d98e8a64dd; TE's
    ``distributed.checkpoint`` alike under FP8) runs the region without gradients, then replaces the data of its
    first argument — the hidden states entering the region — by this rank's ``numel // tp`` elements of it
    (``split_tensor_into_1d_equal_chunks(new_buffer=True)``: a new buffer, the whole one released) and saves that.
    Its backward all-gathers the chunk into a whole tensor again (``gather_split_1d_tensor``) before the
    recompute. Each region gets an op right after it that reads the input and makes the chunk (no gradient);
    the analysis drops the input (the gather re-creates it: :func:`timeline.graph.backward.gather_unit`) and keeps
    the chunk."""
    out: list[FOp] = []
    moved: list[Region] = []
    at = 0
    index: dict[int, int] = {}
    for r in regions:
        while at <= r.ops[-1]:
            index[at] = len(out)
            out.append(ops[at])
            at += 1
        first = ops[r.ops[0]]
        x = first.dataflow_inputs()[0]
        numel = 1
        for d in x.shape:
            numel *= d
        shard = TensorDef(name=f"{x.name}.distributed", shape=(numel // tp,), dtype=x.dtype,
                          category=Category.ACTIVATIONS, module=x.module, storage=f"{x.storage}.distributed@{r.name}")
        out.append(FOp(name=f"checkpoint.{r.name}.distribute", module=x.module, layer=first.layer,
                       rule="distribute_saved", inputs={"x": x}, outputs={"chunk": shard}, no_grad=True))
        moved.append(replace(r, ops=tuple(index[i] for i in r.ops), distributed=(x, shard)))
    out += ops[at:]
    return out, moved
