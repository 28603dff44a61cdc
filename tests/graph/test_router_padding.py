"""Megatron's ``--moe-router-padding-for-quantization`` (``--moe-router-padding-for-fp8``, read at 4e85d74ae9): the
routing map is padded so each expert's token count is a multiple of the FP8 GEMM alignment (``fp8_utils.py:
get_fp8_align_size``: 16, MXFP8 32). The alltoall dispatcher pads each source rank's map per expert before the
first permutation (``MoEAlltoAllTokenDispatcher.dispatch_preprocess`` → ``moe_utils.py: pad_routing_map``), so the
permuted tokens, both all-to-alls and the experts' rows grow; the flex dispatcher pads what each local expert
received (``_DeepepManager._pad_routing_map``). Megatron refuses it without FP8 and with the allgather dispatcher."""

from __future__ import annotations

from dataclasses import replace

from helpers_run import TINY_MODEL, tiny_run
from sources import forward_ops_of

from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.profiles import LIMITS
from timeline.spec.validate import validate_run

S, K, E = 100, 2, 8  # 100 tokens × top-2 over 8 experts: 25 pairs an expert, 32 once padded to 16
FP8 = {"fp8_recipe": "tensorwise", "transformer_engine": "2.9", "megatron_core": "0.16.0", "pytorch": "2.9"}


def _run(**kw):
    model = replace(TINY_MODEL, num_hidden_layers=1, n_routed_experts=E, num_experts_per_tok=K,
                    moe_intermediate_size=128)
    return tiny_run(pp=1, dp=2, model=model, **({"seq_len": S} | FP8 | kw))


def _shape(run, name: str) -> tuple[int, ...]:
    for op in forward_ops_of(run, 0):
        for t in op.outputs.values():
            if t.name == name:
                return t.shape
    raise KeyError(name)


def test_the_alltoall_dispatcher_pads_each_experts_pairs_at_the_source():
    plain, padded = _run(ep=2), _run(ep=2, moe_router_padding=True)
    p = "layers.0.mlp.dispatch"
    assert _shape(plain, f"{p}.permuted")[0] == S * K
    assert _shape(padded, f"{p}.permuted")[0] == E * 32  # ceil(25 / 16) · 16 for each of the 8 experts
    assert _shape(padded, f"{p}.permuted_probs") == (E * 32,)
    assert _shape(padded, f"{p}.all_to_all.out")[0] == E * 32  # received: 4 local experts × 32 from each of 2 ranks
    assert _shape(padded, "layers.0.mlp.combine.received")[0] == E * 32
    assert validate_run(padded, LIMITS) == []
    # a count already aligned is not padded; 35 pairs an expert pad to 48, or to 64 under MXFP8's 32
    assert _shape(_run(ep=2, moe_router_padding=True, seq_len=128), f"{p}.permuted")[0] == 128 * K
    assert _shape(_run(ep=2, moe_router_padding=True, seq_len=140), f"{p}.permuted")[0] == E * 48
    mx = _run(ep=2, moe_router_padding=True, seq_len=140, fp8_recipe="mxfp8")
    assert _shape(mx, f"{p}.permuted")[0] == E * 64


def test_the_flex_dispatcher_pads_what_each_local_expert_received():
    padded = _run(ep=2, moe_router_padding=True, moe_token_dispatcher="flex")
    # 200 pairs reach this rank's 4 experts, 50 each, padded to 64
    assert _shape(padded, "layers.0.mlp.dispatch.received")[0] == 4 * 64


def test_megatrons_refusals_and_from_megatron():
    problems = {k for k, _ in validate_run(_run(ep=2, moe_router_padding=True, fp8_recipe="none"), LIMITS)}
    assert "training.moe_router_padding" in problems
    allgather = _run(ep=2, moe_router_padding=True, moe_token_dispatcher="allgather")
    assert "training.moe_router_padding" in {k for k, _ in validate_run(allgather, LIMITS)}
    args = {"--num-layers": 2, "--hidden-size": 64, "--num-attention-heads": 4, "--seq-length": 128,
            "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True,
            "--vocab-size": 1000, "--num-experts": 4, "--moe-router-topk": 2, "--moe-grouped-gemm": True,
            "--moe-token-dispatcher-type": "alltoall", "--fp8-format": "hybrid", "--fp8-recipe": "tensorwise"}
    for flag in ("--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization"):
        conv = convert(from_mapping(args | {flag: True}), world_size=2, gpu="h100", megatron_core="0.16.0")
        assert conv.sections["training"]["moe_router_padding"] is True
