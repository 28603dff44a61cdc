"""Megatron-FSDP's static events and per-action gathers (timeline.sim.megatron_fsdp) on a tiny device."""

from __future__ import annotations

from timeline.graph.fsdp_buffers import fsdp_buffers
from timeline.graph.tensors import param
from timeline.placement.devices import StaticDevice
from timeline.sim.megatron_fsdp import fsdp_events, gathered_bytes
from timeline.spec.run import ParallelSpec, TrainingSpec

EMB = param("embedding.word_embeddings.weight", (1000, 8), module="embedding", dtype="bf16")
L = [param(f"layers.{i}.mlp.linear_fc1.weight", (64, 8), module="mlp", dtype="bf16") for i in range(3)]
TR = TrainingSpec(zero=1)  # bf16 weights, fp32 grads and main weights


def _device(strategy: str) -> StaticDevice:
    tensors = (EMB, *L)
    bufs = fsdp_buffers([(0, tensors)], strategy=strategy, bucket_size=None, tr=TR, par=ParallelSpec(dp=4),
                        expert_rule="routed")
    return StaticDevice(device=0, pp_rank=0, stages=(0,), represents=4, layers=(0, 1, 2), params_by_module={},
                        weights_bytes=0, grads_bytes=0, optimizer_bytes=0, tensors=tensors, dp_buffers=bufs)


def test_optim_grads_params_holds_shards_and_the_gathered_non_unit_group():
    ev = fsdp_events(TR, _device("optim_grads_params"))
    held: dict[str, int] = {}
    for _, name, size, _, sign in ev:
        held[name] = held.get(name, 0) + sign * size
    live = {k: v for k, v in held.items() if v}
    # embedding group 8000 → 8064 (lcm(4, 128)): bf16 shard 2016·2, fp32 main shard of real elements 8000 − 6048
    assert live["static.param_buffer.0.chunk0.rest"] == 2016 * 2
    assert live["static.master.0.chunk0.rest"] == (8000 - 6048) * 4
    # each layer 512 elements → 512: shard 128; the last rank's main shard 128 fp32
    assert live["static.param_buffer.1.chunk0.layers.0"] == 128 * 2
    assert live["static.grad_buffer.fsdp"] == (2016 + 3 * 128) * 4
    # the non-unit group stays gathered whole (bucket 0, re-gathered by the step's start_param_sync)
    assert live["fsdp.gathered.0.chunk0.rest"] == 8064 * 2
    # the parameters' own storages and the init buckets are gone
    assert not any(k.startswith(("static.weights.", "fsdp.init_bucket.")) for k in live)


def test_actions_hold_two_units_and_backward_their_grad_buckets_and_the_non_unit_grads():
    fwd, bwd = gathered_bytes(TR, _device("optim_grads_params"))
    assert fwd == 2 * 512 * 2
    assert bwd == fwd + 2 * 512 * 4 + 8064 * 4
    # optim_grads: nothing gathered, the grad buckets still whole in backward
    assert gathered_bytes(TR, _device("optim_grads")) == (0, 2 * 512 * 4 + 8064 * 4)
    assert gathered_bytes(TR, _device("optim")) == (0, 0)


def test_megatron_fsdp_needs_the_distributed_optimizer():
    from dataclasses import replace

    from helpers_run import tiny_run

    from timeline.profiles import LIMITS
    from timeline.spec.framework import FrameworkSpec
    from timeline.spec.validate import validate_run

    base = tiny_run()
    run = replace(base, framework=FrameworkSpec(fsdp_sharding="optim_grads_params"),
                  training=replace(base.training, zero=0))
    assert [k for k, _ in validate_run(run, LIMITS)] == ["framework.fsdp_sharding"]
    assert validate_run(replace(run, training=replace(base.training, zero=1)), LIMITS) == []
