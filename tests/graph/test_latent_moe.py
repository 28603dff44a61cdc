"""Megatron's latent MoE (``--moe-latent-size``, ``megatron/core/transformer/moe/moe_layer.py`` from b51db3e07a,
read at d98e8a64dd): ``fc1_latent_proj`` (hidden → latent) and ``fc2_latent_proj`` (latent → hidden) are
``TELinear(parallel_mode="duplicated")``, whole on every tensor-parallel rank; ``MoELayer.preprocess`` projects the
tokens down before the dispatcher's permutation, the routed experts read and write the latent width
(``experts.py``: ``TEGroupedMLP`` input and output ``moe_latent_size``), the combine runs in it, and
``MoELayer.postprocess`` projects back before the shared experts' output is added. The router and the shared
experts stay on the full hidden size."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers_run import tiny_run
from sources import devices_of, forward_ops_of

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.profiles import LIMITS
from timeline.result.build import build_timeline
from timeline.spec.presets import PRESETS
from timeline.spec.validate import validate_run

H, LATENT, FFN, EXPERTS, TOPK = 256, 64, 512, 8, 2


def _run(latent: int = LATENT, **kw):
    model = replace(PRESETS["mixtral-8x7b"], hidden_size=H, num_attention_heads=8, num_key_value_heads=8,
                    intermediate_size=FFN, moe_intermediate_size=FFN, vocab_size=1024, num_hidden_layers=2,
                    n_shared_experts=1, shared_expert_intermediate_size=FFN, moe_latent_size=latent)
    return tiny_run(model=model, moe_router_dtype="fp32", **kw)


def _param_numel(run, needle: str) -> int:
    (dev,) = devices_of(run)[:1]
    return sum(t.numel for t in dev.tensors if needle in t.name and t.category.name == "WEIGHTS")


def test_the_projections_are_whole_on_every_tp_rank_and_the_experts_are_latent():
    for tp in (1, 2):
        run = _run(tp=tp, sp=tp > 1)
        # two projections of latent × hidden per MoE layer, not split over tp ("duplicated")
        assert _param_numel(run, "latent_proj") == 2 * (2 * LATENT * H)
        # each routed expert: gate and up (ffn × latent) and down (latent × ffn), none of them on the hidden size
        assert _param_numel(run, ".experts.") == 2 * EXPERTS * 3 * FFN * LATENT
        # the shared experts keep the hidden size (split over tp)
        assert _param_numel(run, "shared_experts") == 2 * 3 * FFN * H // tp
    plain = _run(latent=0)
    assert _param_numel(plain, "latent_proj") == 0
    assert _param_numel(plain, ".experts.") == 2 * EXPERTS * 3 * FFN * H


def test_dispatch_experts_and_combine_run_in_the_latent_width():
    run = _run()
    tokens = run.training.micro_batch_size * run.training.seq_len
    ops = {op.name: op for op in forward_ops_of(run, 0)}
    p = "layers.0.mlp"
    down = ops[f"{p}.fc1_latent_proj"]
    x, (y,) = down.inputs["x"], down.outputs.values()
    assert x.shape == (tokens, H) and y.shape == (tokens, LATENT)
    # the router reads the full hidden states, the permutation the projected tokens
    router_in = [t.storage for t in ops[f"{p}.router"].inputs.values()]
    assert x.storage in router_in
    permute = ops[f"{p}.dispatch.permute"]
    assert permute.inputs["x"].storage == y.storage
    assert permute.outputs["y"].shape == (tokens * TOPK, LATENT)
    fc2 = ops[f"{p}.experts.linear_fc2"]
    assert next(iter(fc2.outputs.values())).shape[-1] == LATENT
    up = ops[f"{p}.fc2_latent_proj"]
    u, (v,) = up.inputs["x"], up.outputs.values()
    assert u.shape == (tokens, LATENT) and v.shape == (tokens, H)
    # the shared experts' output is added after the projection back
    add = ops[f"{p}.shared_add"]
    assert v.storage in [t.storage for t in add.inputs.values()]


def test_a_latent_moe_keeps_less_than_the_same_moe_without_it():
    latent, plain = build_timeline(_run()), build_timeline(_run(latent=0))
    assert latent.peak(0).allocated_bytes < plain.peak(0).allocated_bytes


def test_validation_and_from_megatron():
    problems = {k for k, _ in validate_run(_run(profile="paper"), LIMITS)}
    assert "model.moe_latent_size" in problems
    assert "framework.moe_legacy_grouped_gemm" in {k for k, _ in validate_run(_run(moe_legacy_grouped_gemm=True), LIMITS)}
    args = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
            "--vocab-size": 1000, "--num-experts": 4, "--moe-router-topk": 2, "--moe-grouped-gemm": True,
            "--moe-latent-size": 32}
    assert convert(from_mapping(args), world_size=2).sections["model"]["moe_latent_size"] == 32
    with pytest.raises(UserError, match="^--moe-latent-size 32 without --num-experts"):
        convert(from_mapping({k: v for k, v in args.items() if k != "--num-experts"}), world_size=2)
