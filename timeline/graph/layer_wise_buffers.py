"""Megatron's DDP buffers under Muon's layer-wise optimizer in the distributed optimizer's buffers
(``training.muon_layer_wise`` with ``zero = 1``): Muon's matrices in buffers of their own, laid out whole per
shard ("padded", Megatron-Core 0.18.0 on) or unpadded and dealt ping-pong ("compact", Megatron-LM's dev branch
from 3b9c248a1b); the other parameters in the distributed optimizer's byte-level layout
(:func:`timeline.graph.dp_buffers.layout`). A device is modelled as the last rank of its DP groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from timeline.graph.dp_buffers import (
    BUCKET_END_ALIGN,
    BUSBW_ALIGN,
    PARAM_START_ALIGN,
    DdpBuffer,
    DdpRules,
    ParamSlot,
    layout,
    megatron_order,
    round_up,
    shared_embeddings,
)
from timeline.graph.megatron_param import megatron_name, megatron_params, muon_managed
from timeline.graph.static import is_expert_state, zero_groups
from timeline.graph.tensors import TensorDef
from timeline.spec.run import ParallelSpec, TrainingSpec


def layer_wise_layout(params: Sequence[TensorDef], *, rules: DdpRules, group: int, bucket_size: int | None,
                      rank: int) -> tuple[int, tuple[ParamSlot, ...]]:
    """(padded numel, slots) of a buffer of Muon's matrices under the layer-wise optimizer in the distributed
    optimizer's buffers (``MC/optimizer/layer_wise_optimizer.py: LayerWiseDistributedOptimizer.
    _compute_per_buffer_param_layout``, c1e938b039 … 86ba3a66d5): Megatron's parameters in reverse order
    gathered into chunks (closed at ``max(bucket_size, int(group · largest · 0.9))`` elements; one chunk without
    a bucket size), each chunk's parameters, largest first (a stable sort), placed whole in the shard loaded
    least so far (the lowest index of equals) at a 64-element aligned start; every shard padded to the largest
    to a multiple of ``lcm(64, lcm(group, 128[, 2**16]) / group)``, shard ``r`` at bucket start + ``r`` ×
    that size. A parameter belongs to the rank whose shard holds it (``_shard_params_from_layout``): its slots
    (one per layer-library tensor, in order within it) carry the whole parameter as the shard of ``rank``
    when it is that rank's, none otherwise."""
    end_div = math.lcm(group, BUCKET_END_ALIGN, *((BUSBW_ALIGN,) if rules.pad_for_busbw else ()))
    divisor = math.lcm(PARAM_START_ALIGN, end_div // group)
    merged = megatron_params(list(params))
    slots: list[ParamSlot] = []
    cursor = 0
    chunk: list[tuple[str, list[TensorDef]]] = []

    def emit(chunk: list[tuple[str, list[TensorDef]]], bucket: int) -> None:
        nonlocal cursor
        loads = [0] * group
        placed: list[list[tuple[int, list[TensorDef]]]] = [[] for _ in range(group)]
        for _, ts in sorted(chunk, key=lambda p: -sum(t.numel for t in p[1])):
            s = min(range(group), key=lambda r: loads[r])
            start = round_up(loads[s], PARAM_START_ALIGN)
            placed[s].append((start, ts))
            loads[s] = start + sum(t.numel for t in ts)
        size = round_up(max(loads), divisor)
        for r in range(group):
            for start, ts in placed[r]:
                at = cursor + r * size + start
                for t in ts:
                    own = (at, at + t.numel) if r == rank else (0, 0)
                    slots.append(ParamSlot(t.name, at, at + t.numel, bucket, *own))
                    at += t.numel
        cursor += group * size

    numel = largest = buckets = 0
    for name, ts in reversed(merged):
        chunk.append((name, ts))
        n = sum(t.numel for t in ts)
        numel, largest = numel + n, max(largest, n)
        if bucket_size is not None and numel >= max(bucket_size, int(group * largest * 0.9)):
            emit(chunk, buckets)
            chunk, numel, largest, buckets = [], 0, 0, buckets + 1
    if chunk:
        emit(chunk, buckets)
    return cursor, tuple(slots)



def layer_wise_buffers(chunks: Sequence[tuple[int, Sequence[TensorDef]]], *, rules: DdpRules, tr: TrainingSpec,
                       par: ParallelSpec, expert_rule: str, pp_rank: int, num_chunks: int) -> tuple[DdpBuffer, ...]:
    """Each chunk's buffers under the layer-wise optimizer in the distributed optimizer's buffers:
    ``MC/distributed/param_and_grad_buffer.py: group_params_for_buffers`` (86ba3a66d5) keys them by (expert,
    ``is_managed_by_layer_wise_optimizer``: a Muon matrix, ``layer_wise_optimizer.py:
    is_managed_by_layer_wise_optimizer``) in the order of each key's first parameter; Muon's buffers get
    :func:`layer_wise_layout` ("padded"), or the plain unpadded layout without a param buffer whose parameters
    :func:`compact_deal` deals ("compact", the dev branch from 3b9c248a1b: ``_ParamAndGradBuffer.__init__``
    turns the distributed optimizer off for them); the rest the distributed optimizer's byte-level
    :func:`layout`. The layer-wise optimizer is first in the chain (``MC/optimizer/__init__.py:
    _get_megatron_emerging_optimizer``: ``ChainedOptimizer([layer_wise_optimizer] + results)``)."""
    groups = zero_groups(tr, par)
    shared = shared_embeddings(chunks, num_chunks, rules.tied_embeddings)
    compact = rules.layer_wise == "compact"
    out = []
    for i, (c, ts) in enumerate(chunks):
        bucket = rules.bucket_size if i == 0 and pp_rank == 0 else None
        keys: dict[tuple[bool, bool], list[TensorDef]] = {}
        for name, pieces in megatron_params(megatron_order(ts)):
            managed = muon_managed(name, pieces[0].shape)
            keys.setdefault((is_expert_state(pieces[0], expert_rule), managed), []).extend(pieces)
        for (expert, managed), mine in keys.items():
            group = groups[expert]
            if managed and compact:
                numel, slots = layout(mine, rules=replace(rules, distributed_optimizer=False), group=group,
                                      bucket_size=bucket)
            elif managed:
                numel, slots = layer_wise_layout(mine, rules=rules, group=group, bucket_size=bucket, rank=group - 1)
            else:
                numel, slots = layout(mine, rules=rules, group=group, bucket_size=bucket, shared=shared, rank=group - 1)
            out.append(DdpBuffer(chunk=c, expert=expert, numel=numel, group=group, slots=slots,
                                 optimizer=0 if managed else 1 + int(expert), param_buffer=not (managed and compact),
                                 muon=managed))
    if not compact:
        return tuple(out)
    dealt = compact_deal(out)
    mine_names = {n for n, _ in dealt[False][groups[False] - 1]} | {n for n, _ in dealt[True][groups[True] - 1]}
    return tuple(replace(b, slots=tuple(replace(s, shard_start=s.start, shard_end=s.end)
                                        if megatron_name(s.name) in mine_names else s for s in b.slots))
                 if b.muon else b for b in out)


def compact_deal(buffers: Sequence[DdpBuffer]) -> dict[bool, list[list[tuple[str, int]]]]:
    """Per rank, the Muon matrices (Megatron name, elements) the compact layer-wise layout deals to it, dense
    (False) over the ``dp·cp`` ranks and expert (True) over the expert-DP ranks: ``layer_wise_optimizer.py:
    _shard_params_ping_pong`` (3b9c248a1b … 86ba3a66d5) sorts them by ``(numel, chunk, buffer, start)`` — the
    buffer's index among the chunk's dense buffers then its expert ones, the parameter's start in it
    (``_build_param_sort_keys``) — and deals each kind in a ping-pong loop ``0 … g−1, g−1 … 0``."""
    entries: list[tuple[tuple[int, int, int, int], str, bool]] = []
    sizes = {False: 1, True: 1}
    for ci, c in enumerate(dict.fromkeys(b.chunk for b in buffers)):
        mine = [b for b in buffers if b.chunk == c]
        for bi, b in enumerate([b for b in mine if not b.expert] + [b for b in mine if b.expert]):
            if not b.muon:
                continue
            sizes[b.expert] = b.group
            spans: dict[str, list[int]] = {}
            for s in b.slots:
                span = spans.setdefault(megatron_name(s.name), [s.start, 0])
                span[0], span[1] = min(span[0], s.start), span[1] + (s.end - s.start)
            entries += [((n, ci, bi, start), name, b.expert) for name, (start, n) in spans.items()]
    dealt: dict[bool, list[list[tuple[str, int]]]] = {e: [[] for _ in range(g)] for e, g in sizes.items()}
    at = {False: 0, True: 0}
    for key, name, expert in sorted(entries):
        loop = [*range(sizes[expert]), *reversed(range(sizes[expert]))]
        dealt[expert][loop[at[expert]]].append((name, key[0]))
        at[expert] = (at[expert] + 1) % len(loop)
    return dealt
