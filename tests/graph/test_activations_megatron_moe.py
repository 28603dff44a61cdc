"""``megatron`` profile, MoE as ``[framework]`` configures it: the allgather token dispatcher
(``moe_token_dispatcher = "allgather"``, MoEAllGatherTokenDispatcher) and the sinkhorn router
(``moe_router_load_balancing = "sinkhorn"``, TopKRouter.sinkhorn_load_balancing) keep exactly the
tensors Megatron-Core 0.14's autograd saves, at their exact bytes."""

from __future__ import annotations

from pathlib import Path

import pytest
from sources import forward_ops_of, template_of

from timeline.io.runfile import load_run

# the shipped run (not via conftest: other test folders have a conftest module too)
SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
MEGATRON = ['model.profile="megatron"']
ALLGATHER = 'framework.moe_token_dispatcher="allgather"'
SINKHORN = 'framework.moe_router_load_balancing="sinkhorn"'
P = "layers.4.mlp"
T, H, E, K, EP, TP = 4096 // 2, 7168, 256, 8, 8, 2  # b = 1, s = 4096, SP over tp = 2; etp = 1
LOCAL = E // EP


def saved_bytes(*overrides: str) -> dict[str, tuple[tuple[int, ...], str, int]]:
    run = load_run(SHIPPED, [*MEGATRON, *overrides])
    return {st.tensor.name: (st.tensor.shape, st.tensor.dtype, st.tensor.size_bytes)
            for st in template_of(run, 1).saved if st.layer == 4 and st.tensor.name.startswith(P)}


def ops(*overrides: str) -> dict:
    return {o.name: o for o in forward_ops_of(load_run(SHIPPED, [*MEGATRON, *overrides]), 1)}


def test_allgather_dispatcher_saves_the_local_permutation():
    got = saved_bytes(ALLGATHER)
    gathered, rows = T * EP, T * K  # t·etp·ep gathered tokens; balanced: t·k rows for the local experts
    assert got[f"{P}.dispatch.sorted_idx"] == ((rows,), "int64", 8 * rows)
    assert got[f"{P}.dispatch.probs_t"] == ((LOCAL, gathered), "bf16", 2 * LOCAL * gathered)
    assert got[f"{P}.dispatch.routing_map_t"] == ((LOCAL, gathered), "bool", LOCAL * gathered)
    assert got[f"{P}.experts.linear_fc1.out"][0][0] == rows
    # no all-to-all, no sort_chunks copy: the experts read the permuted rows themselves
    assert f"{P}.dispatch.received" not in got and f"{P}.dispatch.permuted" in got
    assert {n for n in got if ".dispatch." in n} == {f"{P}.dispatch.sorted_idx", f"{P}.dispatch.probs_t",
                                                      f"{P}.dispatch.routing_map_t", f"{P}.dispatch.permuted",
                                                      f"{P}.dispatch.permuted_probs"}


def test_allgather_dispatcher_ops():
    o = ops(ALLGATHER)
    assert f"{P}.dispatch.all_to_all" not in o and f"{P}.combine.all_to_all" not in o
    assert o[f"{P}.dispatch.all_gather"].outputs["y"].shape == (T * EP, E)  # the probs; tokens: GlobalMemoryBuffer
    assert o[f"{P}.combine.unpermute"].outputs["y"].shape == (T * EP, H)  # every gathered row, then
    assert o[f"{P}.combine.reduce_scatter"].outputs["y"].shape == (T, H)  # reduce-scattered over etp·ep


def test_sinkhorn_router_saves_activation_and_map():
    got = saved_bytes(SINKHORN)
    # top-k > 1: torch.softmax(logits, dtype=fp32) keeps its fp32 result; logits * map keeps the bool map
    assert got[f"{P}.router.scores_saved"] == ((T, E), "fp32", 4 * T * E)
    assert got[f"{P}.router.routing_map"] == ((T, E), "bool", T * E)
    assert not {f"{P}.router.topk_idx", f"{P}.router.topk_raw_weights", f"{P}.router.topk_denominator"} & set(got)


def test_sinkhorn_top1_keeps_the_sigmoid_output():
    got = saved_bytes(SINKHORN, "model.num_experts_per_tok=1")
    assert got[f"{P}.router.scores"] == ((T, E), "bf16", 2 * T * E)
    assert got[f"{P}.router.routing_map"] == ((T, E), "bool", T * E)
    assert f"{P}.router.scores_saved" not in got


def test_defaults_keep_the_alltoall_topk_path():
    got = saved_bytes()
    assert f"{P}.dispatch.received" in got and f"{P}.router.topk_idx" in got
    assert got[f"{P}.dispatch.probs_t"][0] == (E, T)


def test_selective_moe_recomputes_the_allgather_path():
    from dataclasses import replace

    from timeline.spec.recompute import parse_recompute

    run = load_run(SHIPPED, [*MEGATRON, ALLGATHER, SINKHORN])
    base = {st.tensor.name for st in template_of(run, 1).saved if st.layer == 4}
    rc = replace(run, recompute=parse_recompute("selective:moe"))
    got = {st.tensor.name for st in template_of(rc, 1).saved if st.layer == 4}
    assert {f"{P}.dispatch.probs_t", f"{P}.dispatch.routing_map_t", f"{P}.dispatch.sorted_idx",
            f"{P}.router.routing_map", f"{P}.router.scores_saved", f"{P}.experts.linear_fc1.out"} <= base - got
    assert got <= base


def test_shared_expert_gate_keeps_the_shared_output_and_its_score():
    """--moe-shared-expert-gate (SharedExpertMLP.forward, core_v0.17.0): `output * sigmoid(F.linear(x, gate_weight))`
    on this rank's SP rows — MulBackward0 keeps the shared experts' output (T × H, bf16) and the score (T × 1), which
    nothing kept before; the logits are not kept."""
    plain, gated = saved_bytes(), saved_bytes("model.shared_expert_gate=true")
    added = {n: v for n, v in gated.items() if n not in plain}
    assert added == {f"{P}.shared_experts.linear_fc2.out": ((T, H), "bf16", 2 * T * H),
                     f"{P}.shared_expert_gate.sigmoid": ((T, 1), "bf16", 2 * T)}
    assert all(gated[n] == v for n, v in plain.items())


def test_from_megatron_maps_the_shared_expert_gate():
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    base = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
            "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True, "--num-experts": 4,
            "--moe-shared-expert-gate": True}
    model = convert(from_mapping(base | {"--moe-shared-expert-intermediate-size": 512}), world_size=1).sections["model"]
    assert model["shared_expert_gate"] is True and model["shared_expert_intermediate_size"] == 512
    # MoELayer builds the gate inside SharedExpertMLP: without shared experts the flag changes nothing
    assert "shared_expert_gate" not in convert(from_mapping(base), world_size=1).sections["model"]


def test_unfused_swiglu_keeps_silu_and_the_weighted_product():
    """--no-bias-swiglu-fusion (framework.bias_swiglu_fusion = false): MLP.forward's glu keeps silu(gate) beside
    the fc1 output; the experts' bias_act_func (core_v0.17.0) also keeps the glu product for `* permuted_probs`.
    The fused kernels keep the fc1 output (and the probs) only."""
    fused, unfused = saved_bytes(), saved_bytes("framework.bias_swiglu_fusion=false")
    rows, ffn = fused[f"{P}.experts.linear_fc1.out"][0][0], fused[f"{P}.experts.linear_fc1.out"][0][1] // 2
    added = {n: v for n, v in unfused.items() if n not in fused}
    assert added == {f"{P}.experts.act.silu": ((rows, ffn), "bf16", 2 * rows * ffn),
                     f"{P}.experts.act.glu": ((rows, ffn), "bf16", 2 * rows * ffn),
                     # the shared experts' fc1 runs on the gathered sequence (T·TP rows), 2,048 / TP wide
                     f"{P}.shared_experts.act.silu": ((T * TP, 2048 // TP), "bf16", 2 * T * 2048)}
    assert all(unfused[n] == v for n, v in fused.items())


def test_from_megatron_maps_no_bias_swiglu_fusion_only_under_swiglu():
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    base = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
            "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True, "--no-bias-swiglu-fusion": True}
    assert convert(from_mapping(base | {"--swiglu": True}), world_size=1).sections["framework"]["bias_swiglu_fusion"] \
        is False
    assert "bias_swiglu_fusion" not in convert(from_mapping(base), world_size=1).sections["framework"]  # GELU


def test_fused_weighted_squared_relu_keeps_its_input_and_the_probs():
    """Squared-ReLU experts (Nemotron-3's): unfused, relu keeps its output and `* permuted_probs` the product and
    the probs; --use-fused-weighted-squared-relu (WeightedSquaredReLUFunction) keeps the input and the probs."""
    relu2 = 'model.hidden_act="relu2"'
    unfused, fused = saved_bytes(relu2), saved_bytes(relu2, "framework.fused_weighted_squared_relu=true")
    rows, ffn = unfused[f"{P}.experts.linear_fc1.out"][0]
    assert unfused[f"{P}.experts.act.act"] == ((rows, ffn), "bf16", 2 * rows * ffn)
    assert {n: v for n, v in unfused.items() if n not in fused} == {f"{P}.experts.act.act": unfused[f"{P}.experts.act.act"]}
    assert set(fused) < set(unfused) and f"{P}.experts.linear_fc1.out" in fused


def test_from_megatron_maps_the_fused_weighted_squared_relu():
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    base = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
            "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True, "--squared-relu": True,
            "--num-experts": 4, "--no-bias-gelu-fusion": True}
    fw = convert(from_mapping(base | {"--use-fused-weighted-squared-relu": True}), world_size=1).sections["framework"]
    assert fw["fused_weighted_squared_relu"] is True
    assert convert(from_mapping(base), world_size=1).sections["framework"]["fused_weighted_squared_relu"] is False


def test_fused_router_keeps_its_map_and_intermediate():
    """--moe-router-fusion (framework.moe_router_fusion): TE's FusedTopkScoreFunction keeps the bool routing map
    and the [t, E] intermediate in the logits' dtype (router.cpp), in place of the unfused sigmoid router's fp32
    scores, gathered top-k scores, their sum and int64 indices."""
    fused, plain = saved_bytes("framework.moe_router_fusion=true"), saved_bytes()
    router = {n: v for n, v in fused.items() if ".router." in n}
    assert router == {f"{P}.router.routing_map": ((T, E), "bool", T * E),
                      f"{P}.router.fused_intermediate": ((T, E), "bf16", 2 * T * E)}
    assert {n for n in plain if ".router." in n} == {f"{P}.router.{k}" for k in (
        "scores_saved", "scores", "topk_idx", "topk_denominator", "topk_raw_weights")}
    assert {n: v for n, v in fused.items() if ".router." not in n} == \
        {n: v for n, v in plain.items() if ".router." not in n}


def test_from_megatron_maps_the_fused_router_from_te_2_6():
    from timeline.errors import UserError
    from timeline.io.megatron_args import from_mapping
    from timeline.io.megatron_write import convert

    base = {"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 8, "--seq-length": 512,
            "--micro-batch-size": 1, "--global-batch-size": 8, "--bf16": True, "--num-experts": 4,
            "--moe-router-fusion": True}
    assert convert(from_mapping(base), world_size=1, te_version="2.6").sections["framework"]["moe_router_fusion"]
    with pytest.raises(UserError, match="--moe-router-fusion with Transformer Engine 2.5: Megatron-LM raises"):
        convert(from_mapping(base), world_size=1, te_version="2.5")
