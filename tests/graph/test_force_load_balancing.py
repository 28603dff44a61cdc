"""Megatron's ``--moe-router-force-load-balancing`` (``moe_utils.py: RandomSTE``, core_v0.13.0 … d98e8a64dd): the
router's logits are replaced by ``logits.clone().normal_()`` before routing; the copy keeps nothing for backward
and the gating output is freed once copied, so the routed path is the same and one logits-sized tensor exists
twice for a moment. from-megatron maps the flag instead of refusing it."""

from __future__ import annotations

from dataclasses import replace

from helpers_run import tiny_run
from sources import forward_ops_of

from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.result.build import build_timeline
from timeline.spec.presets import PRESETS


def _moe_run(**kw):
    model = replace(PRESETS["mixtral-8x7b"], hidden_size=256, num_attention_heads=8, num_key_value_heads=8,
                    intermediate_size=512, moe_intermediate_size=512, vocab_size=1024, num_hidden_layers=2)
    return tiny_run(model=model, moe_router_dtype="fp32", **kw)


def test_random_logits_follow_the_gating_output_and_keep_nothing():
    plain = build_timeline(_moe_run())
    forced = build_timeline(_moe_run(moe_router_force_load_balancing=True))
    tokens, experts = 128, 8
    fops = forward_ops_of(_moe_run(moe_router_force_load_balancing=True), 0)
    rnd = [i for i, op in enumerate(fops) if op.name.endswith("router.random_logits")]
    assert len(rnd) == 2  # one per MoE layer
    op = fops[rnd[0]]
    (x,), (y,) = op.inputs.values(), op.outputs.values()
    assert x.shape == y.shape == (tokens, experts) and x.dtype == y.dtype == "fp32"
    # the routing reads the random copy, never the gating output again
    assert not any(x.storage == t.storage for later in fops[rnd[0] + 1:] for t in later.inputs.values())
    logits = tokens * experts * 4  # fp32 (--moe-router-dtype fp32)
    # the same static state and the same saved activations: nothing is kept for backward
    assert forced.peak(0).breakdown_bytes.get("activations") == plain.peak(0).breakdown_bytes.get("activations")
    # one more logits-sized tensor at most, for the instant of the copy
    diff = forced.peak(0).allocated_bytes - plain.peak(0).allocated_bytes
    assert 0 <= diff <= 512 * -(-logits // 512)


def test_from_megatron_maps_the_flag():
    args = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
            "--vocab-size": 1000, "--num-experts": 4, "--moe-router-topk": 2, "--moe-grouped-gemm": True,
            "--moe-router-force-load-balancing": True}
    fw = convert(from_mapping(args), world_size=2).sections["framework"]
    assert fw["moe_router_force_load_balancing"] is True
