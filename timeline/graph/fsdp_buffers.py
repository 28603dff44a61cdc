"""Megatron-FSDP's parameter groups as it lays them out (``--use-megatron-fsdp`` / ``--use-custom-fsdp`` with
``--data-parallel-sharding-strategy``), as :class:`timeline.graph.dp_buffers.DdpBuffer` records the rest of the
profile reads: one buffer per parameter group, its slots, and the shard of it this rank keeps.

Rules, read at Megatron-LM d98e8a64dd (``MF`` = ``megatron/core/distributed/fsdp/src/megatron_fsdp/``, the
``megatron_fsdp`` package; the same rules at 0dd841a7d9 in ``megatron/core/distributed/custom_fsdp/``):

- ``MF/param_and_grad_buffer.py: _get_parameter_groups``: every parameter of a model chunk, in
  ``named_parameters()`` order, joins the first group of equal (dtype, expert-parallel, requires_grad, FSDP unit)
  — a group is not a run of neighbours: the embedding and, later, the final norm and output layer of one chunk
  share the non-unit group; a group outside any FSDP unit is then cut into buckets of ``bucket_size`` elements
  (``suggested_bucket_size``; ``training.py: get_model`` passes None without ``--overlap-grad-reduce`` and for
  every chunk after the first), a unit's group never.
- ``megatron/core/distributed/fsdp/mcore_fsdp_adapter.py: FullyShardedDataParallel.__init__``: the FSDP units are
  the decoder layers (``TransformerLayer``, ``MoETransformerLayer``, ``MambaLayer``; an MTP layer's inner
  transformer layer) under every strategy but ``no_shard`` from 342faa43cd (2026-08-18); before it (``@4e85d74ae9``,
  and ``custom_fsdp/fully_sharded_data_parallel.py@194b2be238``) under ``optim_grads_params`` alone, the other
  strategies' parameters all outside any unit. Before d677041da2 (2025-04-08) the
  legacy ``Float16Module`` hid ``share_embeddings_and_output_weights``, so ``LanguageModelEmbedding`` was a unit
  too (``custom_fsdp/fully_sharded_data_parallel.py@d165a8548b``); that version is not modelled.
- ``MF/param_and_grad_buffer.py: build_data_parallel_buffer_index``: a group's parameters lie back to back (no
  per-parameter padding), the group padded to a multiple of ``lcm(dp, 128)`` unless ``no_shard``; a rank keeps
  ``size / dp`` of it, the ``dp``-th slice (``ShardBucketIndex``). Dense groups shard over the dp·cp group,
  expert ones over the expert-DP group (``ParamAndGradBuffer._init_each_parameter_group_buffers``).
- ``_init_each_parameter_group_buffers``: the model weights are sharded under ``optim_grads_params``, the grads
  under ``optim_grads`` too, the fp32 main weights (the optimizer's parameters, ``_init_optimizer_named_parameters``)
  under every strategy but ``no_shard``.

This module computes layouts only; the events are :mod:`timeline.sim.megatron_fsdp`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from timeline.graph.dp_buffers import BUCKET_END_ALIGN, DdpBuffer, ParamSlot, megatron_order, round_up
from timeline.graph.static import is_expert_state, zero_groups
from timeline.graph.tensors import TensorDef
from timeline.spec.run import ParallelSpec, TrainingSpec

#: which buffers each strategy shards: (model weights, main grads, main weights)
SHARDED = {"no_shard": (False, False, False), "optim": (False, False, True),
           "optim_grads": (False, True, True), "optim_grads_params": (True, True, True)}

#: a decoder layer's or an MTP layer's transformer layer: the FSDP unit a parameter (or op) name belongs to
UNIT_PATTERN = re.compile(r"^(layers\.\d+|mtp\.\d+\.layer)\.")


def fsdp_unit(name: str, strategy: str, *, units_all: bool = False) -> str:
    """The FSDP unit (a decoder layer, or an MTP layer's transformer layer) a parameter belongs to, '' for none:
    under optim_grads_params, or under every strategy but no_shard where ``units_all`` (Megatron-LM from
    342faa43cd; :attr:`timeline.graph.dp_buffers.DdpRules.fsdp_units_all`)."""
    if strategy == "no_shard" or (strategy != "optim_grads_params" and not units_all):
        return ""
    m = UNIT_PATTERN.match(name)
    return m.group(1) if m else ""


def group_layout(params: Sequence[TensorDef], *, group: int, strategy: str) -> tuple[int, tuple[ParamSlot, ...]]:
    """(padded numel, slots) of one parameter group over ``group`` DP ranks; each slot carries the last DP
    rank's shard of the main weights (the whole parameter where they are not sharded)."""
    numel = sum(t.numel for t in params)
    if strategy != "no_shard":  # build_data_parallel_buffer_index: _pad_if_needed
        numel = round_up(numel, math.lcm(group, BUCKET_END_ALIGN))
    size = numel // group
    lo, hi = (size * (group - 1), size * group) if SHARDED[strategy][2] and group > 1 else (0, numel)
    slots, start = [], 0
    for t in params:
        end = start + t.numel
        slots.append(ParamSlot(t.name, start, end, 0, max(start, lo), min(end, hi)))
        start = end
    return numel, tuple(slots)


def fsdp_buffers(chunks: Sequence[tuple[int, Sequence[TensorDef]]], *, strategy: str, bucket_size: int | None,
                 tr: TrainingSpec, par: ParallelSpec, expert_rule: str, units_all: bool = False) -> tuple[DdpBuffer, ...]:
    """Every parameter group of one device, chunk by chunk, in ``_get_parameter_groups``' order (``bucket_size``
    cuts the first chunk's groups outside the units: ``get_model`` disables bucketing for the later chunks)."""
    dense_g, expert_g = zero_groups(tr, par)
    out = []
    for k, (c, ts) in enumerate(chunks):
        groups: dict[tuple[bool, bool, str], list[TensorDef]] = {}
        for t in megatron_order(ts):
            unit = fsdp_unit(t.name, strategy, units_all=units_all)
            groups.setdefault((is_expert_state(t, expert_rule), t.dtype == "fp8", unit), []).append(t)
        for (expert, fp8, unit), params in groups.items():
            cuts: list[list[TensorDef]] = [[]]
            for t in params:
                cuts[-1].append(t)
                if not unit and k == 0 and bucket_size and sum(p.numel for p in cuts[-1]) >= bucket_size:
                    cuts.append([])
            for cut in (x for x in cuts if x):
                g = expert_g if expert else dense_g
                numel, slots = group_layout(cut, group=g, strategy=strategy)
                out.append(DdpBuffer(chunk=c, expert=expert, numel=numel, group=g, slots=slots, fp8=fp8,
                                     fsdp=strategy, unit=unit))
    return tuple(out)


def weight_elements(b: DdpBuffer) -> int:
    """Elements of a group's persistent model-weight buffer (its shard under ``optim_grads_params``)."""
    return b.numel // b.group if SHARDED[b.fsdp][0] else b.numel


def grad_elements(b: DdpBuffer) -> int:
    """Elements of a group's persistent main-grad buffer (its shard under ``optim_grads*``)."""
    return b.numel // b.group if SHARDED[b.fsdp][1] else b.numel
