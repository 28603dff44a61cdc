"""``megatron`` profile before Megatron-LM 2659630721 (``[framework] moe_probs_in_experts = false``): the
dispatchers' combine multiplies the routing probs into the experts' output, which it keeps, instead of the
experts' activation; the bytes each variant keeps, from shapes (the shipped DeepSeek-V3 layer 4: b = 1,
s = 4096 over tp = 2, E = 256, top-8, ep = 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sources import forward_ops_of, template_of

from timeline.errors import UserError
from timeline.io.megatron_args import from_mapping
from timeline.io.megatron_write import convert
from timeline.io.runfile import load_run

SHIPPED = Path(__file__).resolve().parents[2] / "schedules" / "deepseek-v3-pp16-tp2-ep8.toml"
MEGATRON = ['model.profile="megatron"']
PRE = "framework.moe_probs_in_experts=false"
ALLGATHER_GELU = ['framework.moe_token_dispatcher="allgather"', 'model.hidden_act="gelu"']
P = "layers.4.mlp"
T, H, E, K, EP = 4096 // 2, 7168, 256, 8, 8
ROWS = T * K  # balanced: each EP rank's experts receive t·k rows (etp = 1)
FFN = 2048  # moe_intermediate_size


def saved(*overrides: str) -> dict[str, tuple[tuple[int, ...], str]]:
    run = load_run(SHIPPED, [*MEGATRON, *overrides])
    return {st.tensor.name: (st.tensor.shape, st.tensor.dtype)
            for st in template_of(run, 1).saved if st.layer == 4 and st.tensor.name.startswith(P)}


def combine_ops(*overrides: str) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
    run = load_run(SHIPPED, [*MEGATRON, *overrides])
    return {o.name: {k: (t.shape, t.dtype) for k, t in o.outputs.items()}
            for o in forward_ops_of(run, 1) if o.layer == 4 and ".combine." in o.name}


def test_alltoall_keeps_the_returned_rows_instead_of_the_probs_beside_the_tokens():
    """SwiGLU experts: from 2659630721 the probs travel with the tokens and WeightedSwiGLU keeps them; before
    it unpermute's multiply keeps the [t·k, h] rows the all-to-all returned and the permuted probs, and the
    transposed probs and map move from the dispatch's permute to the combine."""
    post, pre = saved(), saved(PRE)
    assert set(post) - set(pre) == {f"{P}.dispatch.probs_t", f"{P}.dispatch.routing_map_t",
                                    f"{P}.dispatch.received_probs"}
    assert {n: pre[n] for n in set(pre) - set(post)} == {
        f"{P}.combine.probs_t": ((E, T), "bf16"), f"{P}.combine.routing_map_t": ((E, T), "bool"),
        f"{P}.combine.received": ((ROWS, H), "bf16"), f"{P}.combine.permuted_probs": ((ROWS,), "bf16")}
    ops = combine_ops(PRE)
    assert ops[f"{P}.combine.weight"] == {"y": ((ROWS, H), "bf16")}
    assert ops[f"{P}.combine.unpermute"] == {"y": ((T, H), "bf16")}


def test_allgather_gelu_keeps_the_output_rows_not_the_activation():
    """GeLU experts, allgather, --moe-router-dtype fp32: from 2659630721 `activation_func(x) * probs` keeps the
    [rows, ffn] activation; before it the combine keeps the experts' [rows, h] output and weights it into an
    fp32 product, unpermuted and reduce-scattered in fp32 and cast back."""
    fp32 = 'framework.moe_router_dtype="fp32"'
    post, pre = saved(*ALLGATHER_GELU, fp32), saved(*ALLGATHER_GELU, fp32, PRE)
    local, gathered = E // EP, T * EP
    assert {n: post[n] for n in set(post) - set(pre)} == {
        f"{P}.experts.act.act": ((ROWS, FFN), "bf16"), f"{P}.dispatch.permuted_probs": ((ROWS,), "fp32"),
        f"{P}.dispatch.probs_t": ((local, gathered), "fp32"), f"{P}.dispatch.routing_map_t": ((local, gathered), "bool")}
    assert {n: pre[n] for n in set(pre) - set(post)} == {
        f"{P}.experts.linear_fc2.out": ((ROWS, H), "bf16"), f"{P}.combine.permuted_probs": ((ROWS,), "fp32"),
        f"{P}.combine.probs_t": ((local, gathered), "fp32"), f"{P}.combine.routing_map_t": ((local, gathered), "bool")}
    ops = combine_ops(*ALLGATHER_GELU, fp32, PRE)
    assert ops[f"{P}.combine.weight"] == {"y": ((ROWS, H), "fp32")}
    assert ops[f"{P}.combine.unpermute"] == {"y": ((gathered, H), "fp32")}
    assert ops[f"{P}.combine.reduce_scatter"] == {"y": ((T, H), "fp32")}
    assert ops[f"{P}.combine.cast_back"] == {"y": ((T, H), "bf16")}
    assert f"{P}.combine.cast" not in ops  # no second fp32 copy of the gathered rows


def test_sequential_experts_biases_are_weighted_and_kept():
    """Before 2659630721 experts could have biases (allgather only): SequentialMLP returns the cat of each local
    expert's expanded bias, a [rows, h] tensor the combine's bias multiply keeps, then unpermutes,
    reduce-scatters and adds."""
    bias = "model.linear_bias=true"
    got = saved(*ALLGATHER_GELU, bias, PRE)
    assert got[f"{P}.experts.bias_rows"] == ((ROWS, H), "bf16")
    ops = combine_ops(*ALLGATHER_GELU, bias, PRE)
    assert ops[f"{P}.combine.bias_unpermute"] == {"y": ((T * EP, H), "bf16")}
    assert ops[f"{P}.combine.bias_add"] == {"y": ((T, H), "bf16")}
    assert f"{P}.experts.bias_rows" not in saved(*ALLGATHER_GELU, bias)  # from 2659630721 on: no combine bias


def _convert(core: str, dispatcher: str = "alltoall") -> dict:
    margs = from_mapping({"--num-layers": 2, "--hidden-size": 256, "--num-attention-heads": 4, "--seq-length": 128,
                          "--max-position-embeddings": 128, "--micro-batch-size": 1, "--global-batch-size": 8,
                          "--num-experts": 8, "--expert-model-parallel-size": 8, "--disable-bias-linear": True,
                          "--moe-token-dispatcher-type": dispatcher, "--vocab-size": 1024, "--bf16": True,
                          "--tokenizer-type": "NullTokenizer"})
    return convert(margs, world_size=8, megatron_core=core).sections["framework"]


def test_from_megatron_reads_the_version():
    """Megatron-Core 0.13 is the first release with 2659630721; 0.12 releases never had it; the flex
    dispatcher's combine of then (DeepEP) is refused, not guessed."""
    assert _convert("0.13.0")["moe_probs_in_experts"] is True
    assert _convert("0.12.0")["moe_probs_in_experts"] is False
    with pytest.raises(UserError, match="--moe-token-dispatcher-type flex before Megatron-Core 0.13"):
        _convert("0.12.0", "flex")
