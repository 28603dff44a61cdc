"""Megatron's ``--optimizer-cpu-offload`` (``HybridDeviceOptimizer``, ``MC/optimizer/cpu_offloading/hybrid_optimizer.py``):
which main-parameter shards move to the CPU (:func:`timeline.graph.optim_state.hybrid_split`), what the rest keep
on the GPU (an fp32 clone and TE FusedAdam's fp32 moments, 12 bytes an element, whatever the precision-aware
dtypes), and from-megatron's mapping of the flags."""

from __future__ import annotations

import pytest
from helpers_run import tiny_run
from sources import devices_of, expert_rule

from timeline.errors import UserError
from timeline.graph.optim_state import cpu_offloaded, hybrid_split
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.result.build import build_timeline
from timeline.sim.optimizer_step import step_transients

#: two optimizers of a chain (0: dense, 1: expert), the dense one with a decayed and a no-decay group
GROUPS = [((0, False), [("a", 600, (600,), False), ("b", 300, (300,), False), ("c", 100, (100,), False)]),
          ((0, True), [("d", 100, (100,), False)]),
          ((1, False), [("e", 1000, (1000,), True)])]


def test_each_optimizer_moves_a_prefix_of_its_parameters_until_the_fraction_is_reached():
    # threshold 550 of 1,100 dense elements: "a" (600) crosses it and is the last moved; the expert one alone
    assert hybrid_split(GROUPS, 0.5) == {"a", "e"}
    # 660: "b" is met at 600 < 660, so it moves too (900); "c" is met at 900
    assert hybrid_split(GROUPS, 0.6) == {"a", "b", "e"}
    assert hybrid_split(GROUPS, 1.0) == {"a", "b", "c", "d", "e"}
    assert hybrid_split(GROUPS, 0.0) == set()


def _optimizer_bytes(**kw) -> tuple[int, int]:
    run = tiny_run(pp=1, layers=2, zero=1, dp=2, precision_aware=True, master_remainders=True, **kw)
    tl = build_timeline(run)
    return tl.devices[0].optimizer_bytes, tl.peak(0).breakdown_bytes.get("optimizer", 0)


def test_the_gpu_share_keeps_an_fp32_master_and_two_fp32_moments():
    # precision-aware Adam with int16 remainders: 2 + 4 + 4 bytes an element of the rank's shards
    base, base_sim = _optimizer_bytes()
    assert base == base_sim and base % 10 == 0
    elements = base // 10
    # nothing moved: the hybrid optimizer's fp32 clone and TE's default fp32 moments, 12 bytes an element
    kept, kept_sim = _optimizer_bytes(optimizer_cpu_offload=True, optimizer_offload_fraction=0.0)
    assert kept == kept_sim == 12 * elements
    # everything moved (Megatron's default fraction): no optimizer state on the device
    assert _optimizer_bytes(optimizer_cpu_offload=True) == (0, 0)
    # half: the shards the split leaves on the GPU, 12 bytes an element
    run = tiny_run(pp=1, layers=2, zero=1, dp=2, precision_aware=True, master_remainders=True,
                   optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    dev = devices_of(run, buffers=True)[0]
    moved = sum(k for _, k in cpu_offloaded(dev.tensors, dev.dp_buffers, run.training, expert_rule(run)))
    assert elements // 2 <= moved < elements and dev.optimizer_bytes == 12 * (elements - moved)
    assert build_timeline(run).peak(0).breakdown_bytes.get("optimizer", 0) == dev.optimizer_bytes


def test_the_copy_back_of_each_cpu_shard_goes_through_an_fp32_device_temporary():
    run = tiny_run(pp=1, layers=2, zero=1, dp=2, precision_aware=True, optimizer_cpu_offload=True)
    dev = devices_of(run, buffers=True)[0]
    shards = cpu_offloaded(dev.tensors, dev.dp_buffers, run.training, expert_rule(run))
    assert shards and sum(k for _, k in shards) * 12 == _optimizer_bytes(optimizer_cpu_offload=True,
                                                                          optimizer_offload_fraction=0.0)[0]
    steps = [e for e in step_transients(run.training, dev, expert_rule(run)) if e[0].startswith("step.hybrid_h2d.")]
    assert [(n, b, s) for n, b, s, _, _ in steps[::2]] == [(f"step.hybrid_h2d.{n}", 4 * k, 1) for n, k in shards]
    assert all(s == -1 for _, _, s, _, _ in steps[1::2])  # each dropped before the next is made


BASE = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
        "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
        "--vocab-size": 1000, "--use-distributed-optimizer": True}


def test_from_megatron_maps_the_offload_flags():
    args = BASE | {"--use-precision-aware-optimizer": True, "--optimizer-cpu-offload": True,
                   "--optimizer-offload-fraction": 0.25, "--overlap-cpu-optimizer-d2h-h2d": True,
                   "--no-pin-cpu-grads": True}
    conv = convert(from_mapping(args), world_size=2)
    tr = conv.sections["training"]
    assert (tr["optimizer_cpu_offload"], tr["optimizer_offload_fraction"]) == (True, 0.25)
    assert any("cyclic garbage collector" in n for n in conv.notes)  # the first hybrid optimizer's clones
    with pytest.raises(UserError, match="requires --use-precision-aware-optimizer"):
        convert(from_mapping(BASE | {"--optimizer-cpu-offload": True}), world_size=2)
