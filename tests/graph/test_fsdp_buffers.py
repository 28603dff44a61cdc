"""Megatron-FSDP's parameter groups (timeline.graph.fsdp_buffers): groups by (expert, FSDP unit) in
named_parameters() order, no per-parameter padding, each group padded to lcm(dp, 128) and sharded per strategy."""

from __future__ import annotations

import pytest

from timeline.graph.fsdp_buffers import fsdp_buffers, grad_elements, weight_elements
from timeline.graph.tensors import param
from timeline.spec.run import ParallelSpec, TrainingSpec

EMB = param("embedding.word_embeddings.weight", (1000, 8), module="embedding", dtype="bf16")
Q0 = param("layers.0.self_attention.linear_qkv.weight", (24, 8), module="attention", dtype="bf16")
N0 = param("layers.0.input_layernorm.weight", (8,), module="attention", dtype="bf16")
X0 = param("layers.0.mlp.experts.fc1", (4, 64), module="moe", dtype="bf16", expert=True)
Q1 = param("layers.1.self_attention.linear_qkv.weight", (24, 8), module="attention", dtype="bf16")
FN = param("final_layernorm.weight", (8,), module="head", dtype="bf16")
OUT = param("output_layer.weight", (1000, 8), module="head", dtype="bf16")
CHUNK = [EMB, Q0, N0, X0, Q1, FN, OUT]
TR = TrainingSpec(zero=1)
PAR = ParallelSpec(dp=4, ep=2)  # EDP = 2


def _bufs(strategy: str, bucket: int | None = None):
    return fsdp_buffers([(0, CHUNK)], strategy=strategy, bucket_size=bucket, tr=TR, par=PAR, expert_rule="routed")


def test_groups_follow_named_parameters_with_the_non_unit_ones_merged_and_padded_to_lcm_dp_128():
    bufs = _bufs("optim_grads_params")
    # the embedding, final norm and output layer share the first (non-unit) group; each layer's dense and expert
    # parameters are groups of their own
    assert [(b.label, b.group) for b in bufs] == [("chunk0.rest", 4), ("chunk0.layers.0", 4),
                                                  ("chunk0.layers.0.expert", 2), ("chunk0.layers.1", 4)]
    assert [[s.name for s in b.slots] for b in bufs][0] == [EMB.name, FN.name, OUT.name]
    # 8000 + 8 + 8000 = 16008 → 16128 (lcm(4, 128) = 128); 192 + 8 = 200 → 256; 256 → 256 (lcm(2,128)); 192 → 256
    assert [b.numel for b in bufs] == [16128, 256, 256, 256]
    # back to back, no per-parameter padding; the last DP rank keeps [12096, 16128) of the first group
    assert [(s.start, s.end, s.shard_numel) for s in bufs[0].slots] == [(0, 8000, 0), (8000, 8008, 0),
                                                                         (8008, 16008, 16008 - 12096)]
    assert [weight_elements(b) for b in bufs] == [4032, 64, 128, 64]
    assert [grad_elements(b) for b in bufs] == [4032, 64, 128, 64]


def _bufs_all(strategy: str):
    """The groups where every strategy but no_shard makes the decoder layers units (Megatron-LM 342faa43cd on)."""
    return fsdp_buffers([(0, CHUNK)], strategy=strategy, bucket_size=None, tr=TR, par=PAR, expert_rule="routed",
                        units_all=True)


@pytest.mark.parametrize(("strategy", "weights", "grads", "main"), [
    ("optim_grads_params", 4288, 4288, 4288),
    ("optim_grads", 16896, 4288, 4288),
    ("optim", 16896, 16896, 4288),
])
def test_each_strategy_shards_its_buffers_over_the_units_of_342faa43cd(strategy, weights, grads, main):
    bufs = _bufs_all(strategy)
    assert sum(weight_elements(b) for b in bufs) == weights
    assert sum(grad_elements(b) for b in bufs) == grads
    # main weights: the last rank's slice of each padded group (real elements only: 3912 + 0 + 128 + 0 … )
    assert sum(s.shard_numel for b in bufs for s in b.slots) == main - (16128 - 16008) - (256 - 200) - (256 - 192)


@pytest.mark.parametrize(("strategy", "weights", "grads"), [("optim_grads", 16768, 4256), ("optim", 16768, 16768)])
def test_before_342faa43cd_only_optim_grads_params_has_units(strategy, weights, grads):
    """mcore_fsdp_adapter.py@4e85d74ae9: fsdp_unit_modules = [TransformerLayer] under optim_grads_params, else []:
    one dense group 8000 + 192 + 8 + 192 + 8 + 8000 = 16400 → 16512 and the experts' 256."""
    bufs = _bufs(strategy)
    assert [(b.label, b.numel) for b in bufs] == [("chunk0.rest", 16512), ("chunk0.rest.expert", 256)]
    assert sum(weight_elements(b) for b in bufs) == weights
    assert sum(grad_elements(b) for b in bufs) == grads
    # the last rank's real elements: [12384, 16400) of the dense group, [128, 256) of the experts'
    assert sum(s.shard_numel for b in bufs for s in b.slots) == (16400 - 12384) + 128


def test_no_shard_has_no_units_no_padding_and_no_shards():
    bufs = _bufs("no_shard")
    assert [(b.label, b.numel) for b in bufs] == [("chunk0.rest", 16400), ("chunk0.rest.expert", 256)]
    assert sum(s.shard_numel for b in bufs for s in b.slots) == 16656


def test_non_unit_groups_are_cut_at_the_bucket_size_and_units_never():
    bufs = _bufs("optim_grads_params", bucket=100)
    assert [[s.name for s in b.slots] for b in bufs if not b.unit] == [[EMB.name], [FN.name, OUT.name]]
    assert [b.numel for b in bufs if b.unit == "layers.0" and not b.expert] == [256]
    # get_model disables bucketing for the chunks after the first
    later = fsdp_buffers([(0, [Q0]), (1, CHUNK)], strategy="optim_grads_params", bucket_size=100, tr=TR, par=PAR,
                         expert_rule="routed")
    assert [[s.name for s in b.slots] for b in later if not b.unit and b.chunk == 1] == [[EMB.name, FN.name, OUT.name]]


def test_the_rules_cut_only_under_overlap_grad_reduce_and_units_all_from_0_20():
    """training.py: get_model passes bucket_size None without --overlap-grad-reduce (before MegatronFSDP forces its
    own overlap on); mcore_fsdp_adapter.py makes units under every sharding strategy from 342faa43cd (main, 0.20)."""
    from timeline.graph.dp_buffers import ddp_rules
    from timeline.spec.framework import FrameworkSpec

    fw = FrameworkSpec(fsdp_sharding="optim_grads")
    assert ddp_rules(fw, TR, PAR, tied=True).bucket_size is None
    assert ddp_rules(FrameworkSpec(fsdp_sharding="optim_grads", overlap_grad_reduce=True), TR, PAR,
                     tied=True).bucket_size == 40_000_000
    assert not ddp_rules(fw, TR, PAR, tied=True).fsdp_units_all
    assert ddp_rules(FrameworkSpec(fsdp_sharding="optim_grads", megatron_core="0.20.0"), TR, PAR,
                     tied=True).fsdp_units_all
