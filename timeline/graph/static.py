"""Static memory per device — weights, gradients, optimizer states — read off the graph.

Given the parameter TensorDefs one device holds (see :mod:`timeline.placement.devices` for which
chunks that is), this applies ZeRO as the profile defines it:
ZeRO-1 shards master weights and moments, ZeRO-2 also gradients, ZeRO-3 also weights. Dense
states shard over ``dp·cp`` ranks, expert states over ``EDP = dp·tp·cp/(ep·etp)``; which
parameters count as expert states is the profile's ``expert_state_group`` rule. A flat buffer
of ``n`` elements over ``g`` ranks gives rank ``i`` ``n // g`` elements plus one for the
first ``n % g`` ranks, so shards always sum back to the whole.
"""

from __future__ import annotations

from collections.abc import Sequence

from timeline.graph.tensors import DTYPE_BYTES, TensorDef
from timeline.spec.run import ParallelSpec, TrainingSpec


def zero_shard(n: int, group: int, rank: int = 0) -> int:
    """Elements of an ``n``-element flat buffer that shard ``rank`` of ``group`` holds."""
    base, extra = divmod(n, group)
    return base + (1 if rank < extra else 0)


def optimizer_element_bytes(tr: TrainingSpec) -> tuple[int, int]:
    """(master, moment) bytes per parameter element: an fp32 master copy only where
    ``master_dtype`` differs from the weights' ``dtype`` (TE's own under Megatron's precision-aware optimizer:
    ``master_dtype``, or int16 remainders), and each of Adam's two moments. The
    one copy of this rule: static bytes, the simulator's state tensors and the planner's bound
    all read it."""
    if tr.optimizer_cpu_offload:  # the hybrid optimizer's fp32 clone and its GPU FusedAdam's fp32 moments
        return DTYPE_BYTES["fp32"], DTYPE_BYTES["fp32"]
    if tr.master_remainders:  # TE FusedAdam store_param_remainders: an int16 per element
        return 2, DTYPE_BYTES[tr.moment_dtype]
    master = DTYPE_BYTES[tr.master_dtype] if tr.master_dtype != tr.dtype or tr.precision_aware else 0
    return master, DTYPE_BYTES[tr.moment_dtype]


def zero_groups(tr: TrainingSpec, par: ParallelSpec) -> tuple[int, int]:
    """(dense, expert) ranks that ZeRO shards a state over: ``dp·cp`` and ``EDP``, each split
    among Megatron's ``--num-distributed-optimizer-instances`` (megatron/core/parallel_state.py:
    intra_distributed_optimizer_instance group)."""
    return par.dp * par.cp // tr.optimizer_instances, max(1, par.edp // tr.optimizer_instances)


def is_expert_state(t: TensorDef, group_rule: str) -> bool:
    return t.expert if group_rule == "routed" else t.in_moe


def state_bytes(tr: TrainingSpec, par: ParallelSpec, rule: str, tensors: Sequence[TensorDef], *,
                dense_rank: int = 0, expert_rank: int = 0) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes of one device holding ``tensors``, under ``tr``'s ZeRO;
    ``rule``: the profile's ``expert_state_group``."""
    trainable = [t for t in tensors if t.trainable]
    buffers = sum(t.size_bytes for t in tensors if not t.trainable)
    expert_n = sum(t.numel for t in trainable if is_expert_state(t, rule))
    dense_n = sum(t.numel for t in trainable) - expert_n
    dense_g, expert_g = zero_groups(tr, par)

    def sharded(level: int) -> int:
        if tr.zero >= level:
            return zero_shard(dense_n, dense_g, dense_rank) + zero_shard(expert_n, expert_g, expert_rank)
        return dense_n + expert_n

    w = DTYPE_BYTES[tr.dtype]
    master, moment = optimizer_element_bytes(tr)
    per_opt = master + 2 * moment
    return (sharded(3) * w + buffers, sharded(2) * DTYPE_BYTES[tr.grad_dtype], sharded(1) * per_opt)

